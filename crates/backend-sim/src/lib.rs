//! # prefix-router-backend: an OpenAI-compatible vLLM stand-in
//!
//! A model-server simulator that speaks enough of vLLM's HTTP API for the
//! prefix router's end-to-end tests and demos, with timing and prefix-cache
//! behaviour from [`prefix_router_replica`] driven by the real clock.
//!
//! * [`cli`]: command-line flags and defaults.
//! * [`http`]: the HTTP/1.1 side, on hyper (keep-alive, Content-Length and
//!   chunked bodies, `Expect: 100-continue`, chunked streamed responses):
//!   requests in, responses out.
//! * [`openai`]: request parsing, the simulator's own chat template, and
//!   OpenAI-format response/chunk bodies.
//! * [`server`]: the scheduler thread that owns the [`Replica`], the tokio
//!   runtime serving the connections, and the
//!   endpoints (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/metrics`, `/admin/queue`, `/admin/reset`, `/reset_prefix_cache`), response headers
//!   (`x-backend-name`, `x-cached-tokens`, `x-queue-depth`, ORCA
//!   `endpoint-load-metrics`) and Prometheus metrics with vLLM names.
//!
//! ## Time
//!
//! The replica runs on *simulated* seconds: `sim = real_elapsed / time_scale`.
//! With `--time-scale 0.1` every simulated duration (prefill, decode) takes a
//! tenth of the time in reality; reported latencies (metrics histograms) are
//! in simulated seconds.
//!
//! [`Replica`]: prefix_router_replica::Replica

pub mod cli;
pub mod http;
pub mod openai;
pub mod server;

pub use cli::Config;
pub use server::{Server, ServerHandle};
