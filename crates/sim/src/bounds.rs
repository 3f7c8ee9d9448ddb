//! Workload bounds printed next to every result.
//!
//! * **Oracle** hit rate: one server with unlimited cache sees every
//!   request in (nominal) arrival order; a block is a hit when the request's
//!   whole prefix through that block was seen before. No routing policy over
//!   any number of replicas can beat it.
//! * **Single-server bound**: one server whose cache is the fleet's total
//!   (`replicas x cache_tokens`), LRU as in the replicas, no queueing (each
//!   request's blocks are inserted and released at once). What perfect
//!   routing would get if the fleet were one big cache.
//!
//! Both count hits like the replicas do (16-token blocks, at least one
//! prompt token recomputed) and, like them, keep a finished chat turn's
//! answer cached for the next turn.

use prefix_router_replica::PrefixCache;

use crate::hashers::IdSet;
use crate::workload::Workload;

/// The bounds of a workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub prompt_tokens: u64,
    pub oracle_hit: f64,
    pub single_server_hit: f64,
    pub single_server_cache_tokens: u64,
}

/// Compute both bounds for a fleet cache of `total_cache_tokens`.
pub fn compute(wl: &Workload, total_cache_tokens: u64) -> Bounds {
    compute_with(wl, total_cache_tokens, true)
}

/// [`compute`], choosing whether finished chat turns leave their answer's
/// KV cached (as the replicas do with `output_kv`).
pub fn compute_with(wl: &Workload, total_cache_tokens: u64, output_kv: bool) -> Bounds {
    let order = wl.nominal_order();
    let bt = u64::from(wl.block_tokens.max(1));
    let mut seen: IdSet<u64> = IdSet::default();
    let mut cache = PrefixCache::new(total_cache_tokens, wl.block_tokens);
    let mut total = 0u64;
    let mut oracle = 0u64;
    for i in order {
        let Some(r) = wl.requests.get(i as usize) else {
            continue;
        };
        let blocks = r.prompt.blocks();
        let tokens = r.prompt.tokens();
        total += tokens;
        let lead = blocks.iter().take_while(|b| seen.contains(b)).count() as u64;
        oracle += lead.min(tokens.saturating_sub(1) / bt) * bt;
        seen.extend(blocks.iter().copied());
        cache.query(blocks, tokens);
        cache.acquire(blocks, 0, true);
        cache.release(blocks, 0);
        if let Some(m) = r.remember.as_ref().filter(|_| output_kv) {
            seen.extend(m.blocks().iter().copied());
            cache.acquire(m.blocks(), 0, true);
            cache.release(m.blocks(), 0);
        }
    }
    let f = |x: u64| {
        if total > 0 {
            x as f64 / total as f64
        } else {
            0.0
        }
    };
    Bounds {
        prompt_tokens: total,
        oracle_hit: f(oracle),
        single_server_hit: f(cache.hits()),
        single_server_cache_tokens: total_cache_tokens,
    }
}
