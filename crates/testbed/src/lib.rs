//! Test-only proxy-wasm filters (built to `testbed_filter.wasm`), selected by
//! the plugin configuration string:
//!
//! - `noop`: does nothing on every callback. The baseline for measuring
//!   prefix-router's own overhead: both run on the same Envoy, same runtime,
//!   same request, in the same benchmark run.
//! - `panic-on-header`: panics (a trap in the VM) when a request carries
//!   `x-testbed-panic`. Used to test the failure policy chosen in
//!   `envoy/envoy.yaml` (`FAIL_OPEN`): after the VM dies, requests must still
//!   be served by Envoy's own load balancing.
//!
//! This crate is deliberately allowed to panic; it is never deployed.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, MapType};

#[derive(Default, Clone, Copy)]
struct Root {
    panic_mode: bool,
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
            b"panic-on-header" => {
                self.panic_mode = true;
                true
            }
            _ => false,
        }
    }
    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            panic_mode: self.panic_mode,
        }))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    panic_mode: bool,
}

impl Context for Http {}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if self.panic_mode {
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
}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}
