//! Test-only proxy-wasm filters (built to `testbed_filter.wasm`), selected by
//! the plugin configuration string:
//!
//! - `noop`: does nothing on every callback. The baseline for measuring
//!   prefix-router's own overhead: both run on the same Envoy, same runtime,
//!   same request, in the same benchmark run.
//! - `buffer-body`: pauses on request headers and resumes at the end of the
//!   body without looking at it: the cost any body-based router pays before
//!   doing its own work (needs `allow_on_headers_stop_iteration`).
//! - `skeleton <ip:port>`: what Envoy sees of any filter that routes by the
//!   body, and nothing else: on request headers it asks the replica for an
//!   ORCA report (`endpoint-load-metrics-format: TEXT`) and pauses; at the end
//!   of the body it sets the destination header
//!   (`x-gateway-destination-endpoint`) to the configured replica; on response
//!   headers it adds a decision header of the filter's usual length. No body
//!   read, no shared data, no metrics. `prefix-router - skeleton` is the
//!   filter's own work; `skeleton - noop` is the floor any body router pays
//!   in Envoy's runtime (`prefix-router-lab overhead`).
//! - `panic-on-header`: panics (a trap in the VM) when a request carries
//!   `x-testbed-panic`. Used to test `FAIL_OPEN` (the failure policy before
//!   `FAIL_RELOAD`): after the VM dies, requests must still be served by
//!   Envoy's own load balancing. The committed `FAIL_RELOAD` is tested with
//!   prefix-router itself built with feature `test-trap`.
//!
//! This crate is deliberately allowed to panic; it is never deployed.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};

#[derive(Default, Clone, PartialEq)]
enum Mode {
    #[default]
    Noop,
    BufferBody,
    Skeleton(String),
    PanicOnHeader,
}

#[derive(Default, Clone)]
struct Root {
    mode: Mode,
}

/// The skeleton's decision header: as long as prefix-router's usual one.
const SKELETON_DECISION: &str = "outcome=hit;host=127.0.0.1:8000;pos=0;key=0123456789abcdef;\
source=prompt;bytes=4096;turn=later;why=owner;wait_ms=0/0;held_ms=125";

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let cfg = proxy_wasm::hostcalls::get_buffer(
            proxy_wasm::types::BufferType::PluginConfiguration,
            0,
            usize::MAX,
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        match cfg.as_slice() {
            b"noop" | b"" => true,
            b"buffer-body" => {
                self.mode = Mode::BufferBody;
                true
            }
            s if s.starts_with(b"skeleton ") => {
                let host = String::from_utf8_lossy(&s[9..]).trim().to_string();
                self.mode = Mode::Skeleton(host);
                true
            }
            b"panic-on-header" => {
                self.mode = Mode::PanicOnHeader;
                true
            }
            _ => false,
        }
    }
    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            mode: self.mode.clone(),
        }))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    mode: Mode,
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _n: usize, eos: bool) -> Action {
        if let Mode::Skeleton(_) = self.mode {
            self.set_http_request_header("endpoint-load-metrics-format", Some("TEXT"));
        }
        if matches!(self.mode, Mode::BufferBody | Mode::Skeleton(_)) && !eos {
            return Action::Pause;
        }
        if self.mode == Mode::PanicOnHeader {
            let hit = proxy_wasm::hostcalls::get_map_value(
                MapType::HttpRequestHeaders,
                "x-testbed-panic",
            )
            .ok()
            .flatten()
            .is_some();
            #[allow(clippy::panic)]
            if hit {
                panic!("testbed: panic requested by x-testbed-panic");
            }
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, _size: usize, eos: bool) -> Action {
        if matches!(self.mode, Mode::BufferBody | Mode::Skeleton(_)) && !eos {
            return Action::Pause;
        }
        if let Mode::Skeleton(host) = &self.mode {
            self.set_http_request_header("x-gateway-destination-endpoint", Some(host));
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if let Mode::Skeleton(_) = self.mode {
            self.add_http_response_header("x-prefix-router-decision", SKELETON_DECISION);
        }
        Action::Continue
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
