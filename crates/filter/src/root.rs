//! Root context: configuration and the HTTP context factory.

use std::rc::Rc;

use prefix_router_core::{Config, Router};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

use crate::host;
use crate::http::Http;
use crate::metrics::Metrics;

/// Per-VM root: the compiled router and metric ids, shared with requests.
#[derive(Default)]
pub struct Root {
    state: Option<Rc<State>>,
}

/// What every request of this VM needs.
pub struct State {
    pub router: Router,
    pub metrics: Metrics,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match host::plugin_configuration() {
            Ok(b) => b,
            Err(s) => {
                host::log(
                    LogLevel::Error,
                    &format!("prefix-router: cannot read plugin configuration: {s:?}"),
                );
                return false;
            }
        };
        match Config::from_json(&bytes) {
            Ok(cfg) => {
                host::log(
                    LogLevel::Info,
                    &format!(
                        "prefix-router: configured {} hosts, capacity_factor {}, min_capacity {}, {} vnodes/host, chunk {} bytes, key mode {:?}, max body {} bytes",
                        cfg.hosts.len(),
                        cfg.capacity_factor,
                        cfg.min_capacity,
                        cfg.vnodes,
                        cfg.chunk_bytes,
                        cfg.key.mode,
                        cfg.max_body_bytes
                    ),
                );
                let metrics = Metrics::define(&cfg);
                self.state = Some(Rc::new(State {
                    router: Router::new(cfg),
                    metrics,
                }));
                true
            }
            Err(e) => {
                // Envoy rejects the filter config when this returns false.
                host::log(LogLevel::Error, &format!("prefix-router: {e}"));
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let state = self.state.clone()?;
        Some(Box::new(Http::new(state)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
