//! Test-only proxy-wasm filters (built to `testbed_filter.wasm`), selected by
//! the plugin configuration string:
//!
//! - `noop`: does nothing on every callback. The baseline for measuring
//!   prefix-router's own overhead: both run on the same Envoy, same runtime,
//!   same request, in the same benchmark run.
//! - `buffer-body`: pauses on request headers and resumes at the end of the
//!   body without looking at it: the cost any body-based router pays before
//!   doing its own work (needs `allow_on_headers_stop_iteration`).
//! - `panic-on-header`: panics (a trap in the VM) when a request carries
//!   `x-testbed-panic`. Used to test `FAIL_OPEN` (the failure policy before
//!   `FAIL_RELOAD`): after the VM dies, requests must still be served by
//!   Envoy's own load balancing. The committed `FAIL_RELOAD` is tested with
//!   prefix-router itself built with feature `test-trap`.
//!
//! This crate is deliberately allowed to panic; it is never deployed.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};

#[derive(Default, Clone, Copy, PartialEq)]
enum Mode {
    #[default]
    Noop,
    BufferBody,
    PanicOnHeader,
}

#[derive(Default, Clone, Copy)]
struct Root {
    mode: Mode,
}

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
            b"panic-on-header" => {
                self.mode = Mode::PanicOnHeader;
                true
            }
            _ => false,
        }
    }
    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http { mode: self.mode }))
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
        if self.mode == Mode::BufferBody && !eos {
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
        if self.mode == Mode::BufferBody && !eos {
            return Action::Pause;
        }
        Action::Continue
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
