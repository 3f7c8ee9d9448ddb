//! # prefix-router-sim
//!
//! A deterministic discrete-event simulator of an LLM serving fleet, used to
//! measure routing policies: this project's router (the very
//! `prefix-router-core` the Envoy filter runs) next to re-implementations of
//! the peers' algorithms, on real traces and synthetic workloads, with
//! replicas modeled by `prefix-router-replica` (the same cache and cost code
//! as the HTTP backend simulator).
//!
//! * [`workload`]: traces (Mooncake JSONL, ShareGPT JSON, Azure CSV) and
//!   synthetic generators.
//! * [`policy`]: the policies.
//! * [`engine`]: the event loop ([`engine::simulate`]).
//! * [`bounds`]: oracle and single-server hit-rate bounds.
//! * [`metrics`], [`report`], [`plot`]: results, tables, JSON, plots.
//! * [`suite`]: `prefix-router-sim suite`, the fixed workload suite and its
//!   scoreboard.
//!
//! Operator documentation: `crates/sim/README.md`.

pub mod bounds;
pub mod cli;
pub mod engine;
pub mod hashers;
pub mod input;
pub mod metrics;
pub mod plot;
pub mod policy;
pub mod report;
pub mod rng;
pub mod suite;
pub mod text;
pub mod workload;

pub use engine::{simulate, SimConfig, SimError};
pub use metrics::RunResult;
pub use policy::PolicySpec;
pub use workload::Workload;
