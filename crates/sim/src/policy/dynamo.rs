//! NVIDIA Dynamo's KV-aware router cost, re-implemented from
//! `ai-dynamo/dynamo` `lib/llm/src/kv_router/scheduler.rs` (the
//! `DefaultWorkerSelector`) and its indexer (`lib/llm/src/kv_router/
//! indexer.rs`):
//!
//! ```text
//! overlap_w        = leading request blocks cached on worker w  (KV events)
//! prefill_blocks_w = (prefill tokens in flight on w + isl - overlap_w * block) / block
//! decode_blocks_w  = KV blocks of the requests active on w
//! logit_w          = overlap_score_weight * prefill_blocks_w + decode_blocks_w
//! ```
//!
//! and the lowest logit wins (`router_temperature` 0: argmin, ties at
//! random). Defaults: `overlap_score_weight` 1.0, temperature 0, block size
//! = the engine's KV block (16 tokens here).
//!
//! Dynamo learns the cache contents from the workers' KV events (block
//! stored / removed), so its overlap is exact up to event latency: here it
//! is read from the replicas' caches directly (zero latency, the best case).
//! In-flight prefill tokens and active blocks are tracked by each router
//! instance for the requests it routed (active blocks deduplicated across
//! sequences sharing a prefix, as Dynamo's `ActiveSequences` does); a
//! request's prefill ends at its first token.

use std::collections::HashMap;

use super::{num, Choice, Outcome, Policy, SpecError, View};
use crate::hashers::IdMap;
use crate::input::RouteInput;
use crate::rng::Rng;

/// `overlap_weight`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub overlap_weight: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            overlap_weight: 1.0,
        }
    }
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "overlap_weight" => p.overlap_weight = num(k, v)?,
                _ => return Err(SpecError(format!("dynamo: unknown option {k:?}"))),
            }
        }
        Ok(p)
    }
}

struct Active {
    host: usize,
    new_tokens: u64,
    prefilling: bool,
    blocks: Vec<u64>,
    extra_block: bool,
}

#[derive(Default)]
struct Worker {
    prefill_tokens: u64,
    /// Distinct active blocks (refcounted) plus private partial blocks.
    blocks: IdMap<u64, u32>,
    private_blocks: u64,
}

/// Dynamo KV router.
pub struct Dynamo {
    p: Params,
    workers: Vec<Worker>,
    active: IdMap<u64, Active>,
    rng: Rng,
    best: Vec<usize>,
}

impl Dynamo {
    pub fn new(p: Params, hosts: usize, seed: u64) -> Self {
        Dynamo {
            p,
            workers: (0..hosts).map(|_| Worker::default()).collect(),
            active: HashMap::default(),
            rng: Rng::new(seed),
            best: Vec::new(),
        }
    }
}

impl Policy for Dynamo {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let prompt = input.prompt();
        let bs = u64::from(prompt.block_tokens().max(1));
        let isl = prompt.tokens();
        let blocks = prompt.blocks();
        let mut best = f64::INFINITY;
        self.best.clear();
        let mut best_overlap = 0;
        let mut max_overlap = 0;
        for (h, w) in self.workers.iter().enumerate() {
            let overlap = view
                .replicas
                .get(h)
                .map(|r| r.cache().lookup(blocks) as u64)
                .unwrap_or(0);
            max_overlap = max_overlap.max(overlap);
            let new_tokens = isl.saturating_sub(overlap * bs);
            let prefill_blocks = (w.prefill_tokens + new_tokens) as f64 / bs as f64;
            let decode_blocks = (w.blocks.len() as u64 + w.private_blocks) as f64;
            let logit = self.p.overlap_weight * prefill_blocks + decode_blocks;
            if logit < best {
                best = logit;
                self.best.clear();
                best_overlap = overlap;
            }
            if logit == best {
                self.best.push(h);
            }
        }
        let i = self.rng.below(self.best.len() as u64) as usize;
        let host = self.best.get(i).copied().unwrap_or(0);
        let overlap = view
            .replicas
            .get(host)
            .map(|r| r.cache().lookup(blocks) as u64)
            .unwrap_or(best_overlap);
        let new_tokens = isl.saturating_sub(overlap * bs);
        let extra_block = !isl.is_multiple_of(bs);
        if let Some(w) = self.workers.get_mut(host) {
            w.prefill_tokens += new_tokens;
            for &b in blocks {
                *w.blocks.entry(b).or_insert(0) += 1;
            }
            w.private_blocks += u64::from(extra_block);
        }
        self.active.insert(
            input.id,
            Active {
                host,
                new_tokens,
                prefilling: true,
                blocks: blocks.to_vec(),
                extra_block,
            },
        );
        let outcome = if max_overlap == 0 {
            Outcome::Balance
        } else if overlap == max_overlap {
            Outcome::Affinity
        } else {
            Outcome::Spill
        };
        Choice { host, outcome }
    }

    fn on_first_token(&mut self, id: u64, _host: usize) {
        if let Some(a) = self.active.get_mut(&id) {
            if a.prefilling {
                a.prefilling = false;
                if let Some(w) = self.workers.get_mut(a.host) {
                    w.prefill_tokens = w.prefill_tokens.saturating_sub(a.new_tokens);
                }
            }
        }
    }

    fn on_done(&mut self, id: u64, _host: usize) {
        let Some(a) = self.active.remove(&id) else {
            return;
        };
        let Some(w) = self.workers.get_mut(a.host) else {
            return;
        };
        if a.prefilling {
            w.prefill_tokens = w.prefill_tokens.saturating_sub(a.new_tokens);
        }
        for b in &a.blocks {
            if let Some(c) = w.blocks.get_mut(b) {
                *c -= 1;
                if *c == 0 {
                    w.blocks.remove(b);
                }
            }
        }
        w.private_blocks = w.private_blocks.saturating_sub(u64::from(a.extra_block));
    }
}
