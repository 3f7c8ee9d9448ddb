//! # prefix-router-core
//!
//! The routing core of prefix-router, as plain Rust: no proxy-wasm, no clock,
//! no randomness (time comes in as an argument, shared state through the
//! [`store::SharedStore`] trait). The Envoy filter, the simulator and the
//! benchmarks all run this same code.
//!
//! Pipeline: [`extract`] (request body → canonical prompt bytes) →
//! [`key`] (which prefix is the routing key, hashed with [`hash`]'s chained
//! xxh3) → [`ring`] (consistent hashing with bounded loads over [`load`]) →
//! [`router::Decision`]. Optionally ([`config::CostConfig`], off by
//! default) [`cost`] chooses among the key's owner and its ring successors
//! by estimated TTFT, with a learned [`index`] of which host holds which
//! prefix.

// Tests may unwrap, index and panic; the library may not (workspace lints).
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod config;
pub mod cost;
pub mod extract;
pub mod gossip;
pub mod hash;
pub mod health;
pub mod host_state;
pub mod index;
pub mod json_stream;
pub mod key;
pub mod load;
pub mod membership;
pub mod ring;
pub mod router;
pub mod scrape;
pub mod shared_index;
pub mod spill;
pub mod store;

pub use config::{Config, ConfigError};
pub use router::{
    Decided, Decision, FallbackCause, Key, KeySource, PromptChain, Request, RequestHead, Router,
};
