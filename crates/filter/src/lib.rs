//! # prefix-router (proxy-wasm filter)
//!
//! The thin proxy-wasm adapter over [`prefix_router_core`]. It owns no
//! routing logic: it reads headers and the body through host calls, asks the
//! core for a [`prefix_router_core::Decision`], writes the destination header
//! that Envoy's `envoy.load_balancing_policies.override_host` honours, and
//! keeps load accounting in proxy-wasm shared data.
//!
//! - [`host`]: every host call, each returning a `Result` (no SDK method that
//!   unwraps internally is used), plus the [`prefix_router_core::store::SharedStore`]
//!   implementation over shared data.
//! - [`metrics`]: counters defined once per VM, incremented from decisions.
//! - [`root`]: `on_configure` (two-phase config; bad config → `false`, so
//!   Envoy rejects it) and the HTTP context factory.
//! - [`http`]: the per-request state machine.
//! - [`scrape`]: the optional active `/metrics` scrape (one elected VM).
//! - [`gossip`]: the optional index gossip between Envoys.
//! - [`membership`]: the optional host list from an Envoy cluster.
//! - `fake` (native builds only): an in-process host, so `cargo test` drives
//!   the contexts without Envoy (`tests/contexts.rs`).

pub mod abi;
#[cfg(not(target_arch = "wasm32"))]
pub mod fake;
pub mod gossip;
pub mod host;
pub mod http;
pub mod loads;
pub mod membership;
pub mod metrics;
pub mod root;
pub mod scrape;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::new(id))
    });
}}
