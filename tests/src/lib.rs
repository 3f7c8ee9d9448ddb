//! prefix-router lab harness.
//!
//! Starts backend simulators (`prefix-router-backend`) and Envoy (with or without the
//! prefix-router wasm filter) on free loopback ports, drives a deterministic multi-turn chat
//! workload through Envoy, and reports what happened (per-replica counts, prefix-cache hit rate,
//! conversation stickiness, TTFT).
//!
//! Every spawned process is owned by a [`process::ChildGuard`]: it is killed when the guard is
//! dropped (also while unwinding from a panic) and, through `PR_SET_PDEATHSIG`, when the harness
//! process dies without unwinding (SIGKILL, Ctrl-C).
//!
//! Binaries and files are found as follows (see [`paths`]):
//! * Envoy: `$ENVOY_BIN`, else `<repo>/.venv/bin/envoy` (`./build.sh setup` creates it).
//! * backend simulator: `$PREFIX_ROUTER_BACKEND`, else `<target>/native/prefix-router-backend`,
//!   else `<target>/debug/prefix-router-backend` (`./build.sh native` builds the first).
//! * filter: `$PREFIX_ROUTER_WASM`, else the newer of `<target>/prefix_router.wasm` (`./build.sh
//!   wasm`: cargo's build after wasm-opt) and `<target>/wasm32-wasip1/release/prefix_router.wasm`.
//! * sglang-router (only for the demo's `--sglang` columns): `$SGLANG_ROUTER_PYTHON`, else
//!   `<repo>/.venv-peers/bin/python` (`./build.sh peers`).
//! * Envoy config templates: `<repo>/envoy/envoy.yaml` and `<repo>/envoy/envoy-round-robin.yaml`.

pub mod backend;
pub mod envoy;
pub mod gossip_cost;
pub mod hostcalls;
pub mod hostile_cpu;
pub mod http;
pub mod lab;
pub mod overhead;
pub mod overhead_cpu;
pub mod paths;
pub mod peer;
pub mod process;
pub mod prom;
pub mod report;
pub mod spike;
pub mod workload;

pub use backend::{Backend, BackendOptions};
pub use envoy::{Envoy, EnvoyMode, EnvoyOptions, FilterConfig};
pub use lab::{Lab, LabOptions};
pub use report::Report;
pub use workload::{RequestRecord, RunResult, Workload, WorkloadOptions};

use std::fmt;

/// Error of the lab harness: a human-readable message (with context such as log tails).
#[derive(Debug)]
pub struct LabError(pub String);

impl fmt::Display for LabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LabError {}

impl From<std::io::Error> for LabError {
    fn from(e: std::io::Error) -> Self {
        LabError(format!("I/O error: {e}"))
    }
}

impl From<ureq::Error> for LabError {
    fn from(e: ureq::Error) -> Self {
        LabError(format!("HTTP error: {e}"))
    }
}

impl From<serde_json::Error> for LabError {
    fn from(e: serde_json::Error) -> Self {
        LabError(format!("JSON error: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, LabError>;

/// Shorthand for `Err(LabError(format!(...)))`.
#[macro_export]
macro_rules! lab_err {
    ($($arg:tt)*) => { Err($crate::LabError(format!($($arg)*))) };
}
