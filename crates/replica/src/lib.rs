//! # prefix-router-replica: a model-server replica model
//!
//! A deterministic, clock-free model of one model-server replica (think: one
//! vLLM instance serving an 8B model on one H100). It is shared by
//!
//! * the HTTP backend simulator (`crates/backend-sim`), which drives it with
//!   the real clock, and
//! * the discrete-event routing simulator, which drives it with a virtual
//!   clock.
//!
//! It has **no clock, no RNG and no IO**: every operation that depends on
//! time takes the current time as an argument.
//!
//! ## Time
//!
//! Time is an [`f64`] number of **seconds** ([`Time`]) on whatever clock the
//! caller uses (virtual or wall-clock-since-start). Times passed to one
//! [`Replica`] must be non-decreasing; an earlier time is clamped to the
//! latest time seen.
//!
//! ## Pieces
//!
//! * [`prompt`]: the replica's own tokenizer approximation (tokens =
//!   ceil(bytes / 4)) and chained block hashing (FNV-1a 64 + a splitmix64
//!   finalizer, seeded by the previous block hash). It deliberately shares
//!   nothing with the router core's hashing (xxh3), so router and server are
//!   independent. Also builds prompts from explicit block ids (e.g. Mooncake
//!   `hash_ids`).
//! * [`cache`]: [`PrefixCache`], a block-granular prefix KV cache with
//!   ref-count pinning, LRU eviction of unpinned blocks and vLLM-style
//!   query/hit counters (in tokens).
//! * [`cost`]: [`CostModel`], the timing model and its defaults (with
//!   sources).
//! * [`replica`]: [`Replica`], the scheduler state machine (waiting queue,
//!   running batch, FIFO prefill server, batched decode).
//!
//! ## Example
//!
//! ```
//! use prefix_router_replica::{CostModel, Event, Prompt, Replica};
//!
//! let mut r = Replica::new(CostModel::default());
//! let p = Prompt::from_bytes(&[b'x'; 4096], r.cost().block_tokens);
//! let info = r.submit(1, p.clone(), 8, 0.0).unwrap();
//! assert_eq!(info.cached_tokens, Some(0));
//! let mut t = 0.0;
//! let mut events = Vec::new();
//! while let Some(next) = r.next_event_time() {
//!     t = next;
//!     events.extend(r.advance(t));
//! }
//! assert!(matches!(events.last(), Some(Event::Done { req_id: 1, .. })));
//! // The same prompt again hits the cache (all but the last block).
//! let info = r.submit(2, p, 8, t).unwrap();
//! assert_eq!(info.cached_tokens, Some(1008));
//! ```

pub mod cache;
pub mod cost;
pub mod prompt;
pub mod replica;

pub use cache::PrefixCache;
pub use cost::CostModel;
pub use prompt::{approx_tokens, BlockHash, Prompt, BYTES_PER_TOKEN, DEFAULT_BLOCK_TOKENS};
pub use replica::{Event, Replica, ReqId, SubmitError, SubmitInfo};

/// Time in seconds, on the caller's clock (virtual or real).
pub type Time = f64;
