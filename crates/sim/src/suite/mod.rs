//! `prefix-router-sim suite`: a fixed workload suite and one scoreboard
//! (issue 19, "How it is judged").
//!
//! * [`defs`]: the workloads (and their tuning / check halves), loads,
//!   fleet, seeds and policies;
//! * [`load`]: what moderate, heavy and overload mean, and the offered-load
//!   figure they are checked on;
//! * [`run`]: running every cell; [`score`]: the scoreboard (text and
//!   JSON); [`calibrate`]: `suite --calibrate`.

pub mod calibrate;
pub mod defs;
pub mod load;
pub mod run;
pub mod score;

pub use defs::{workloads, Half, WorkloadDef};
pub use run::{run_suite, SuiteOptions, SuiteResult};
pub use score::{score, Scoreboard};
