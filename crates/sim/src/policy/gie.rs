//! Gateway API Inference Extension (GIE, `kubernetes-sigs/
//! gateway-api-inference-extension`) endpoint picker with the approximate
//! prefix-cache scorer, the queue scorer and the KV-cache-utilization
//! scorer, re-implemented from:
//!
//! * `pkg/epp/scheduling/framework/plugins/multi/prefix/plugin.go` and
//!   `indexer.go`: the prompt (the completions `prompt`, or the chat
//!   `messages` as JSON) is cut into 64-byte blocks (at most 256; a trailing
//!   partial block is ignored), hashed in a chain seeded by the model name
//!   (`hash_0 = h(model)`, `hash_i = h(block_i, hash_{i-1})`); a per-server
//!   LRU index (31,250 entries each) remembers which server each hash was
//!   sent to. Score = matched blocks / total, where a server scores one for
//!   every leading hash (while any server has it) that it holds. After the
//!   pick, the request's hashes are added for the chosen server
//!   (`PreRequest`).
//! * `pkg/epp/scheduling/framework/plugins/scorer/queue.go`: `(maxQ - q) /
//!   (maxQ - minQ)` over the waiting-queue sizes, 1 when all are equal.
//! * `.../scorer/kvcache_utilization.go`: `1 - kv_cache_usage`.
//! * `.../picker/max_score_picker.go`: highest weighted sum, ties broken at
//!   random.
//!
//! Weights 3 (prefix) / 2 (queue) / 2 (KV), the defaults of the published
//! GIE/llm-d prefix-aware configuration. Queue and KV usage come from the
//! replicas' periodic reports (the EPP scrapes vLLM metrics). Hashes are
//! xxh3 seeded by the previous hash (GIE: xxhash64 over block || prev);
//! the chaining is the same.

use std::collections::{BTreeMap, HashMap};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::{num, Choice, Outcome, Policy, SpecError, View};
use crate::hashers::IdMap;
use crate::input::RouteInput;
use crate::rng::Rng;

/// `block`, `max_blocks`, `lru` (entries per server), `w_prefix`,
/// `w_queue`, `w_kv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub block_bytes: usize,
    pub max_blocks: usize,
    pub lru_per_server: usize,
    pub w_prefix: f64,
    pub w_queue: f64,
    pub w_kv: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            block_bytes: 64,
            max_blocks: 256,
            lru_per_server: 31_250,
            w_prefix: 3.0,
            w_queue: 2.0,
            w_kv: 2.0,
        }
    }
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "block" => p.block_bytes = (num(k, v)? as usize).max(1),
                "max_blocks" => p.max_blocks = num(k, v)? as usize,
                "lru" => p.lru_per_server = (num(k, v)? as usize).max(1),
                "w_prefix" => p.w_prefix = num(k, v)?,
                "w_queue" => p.w_queue = num(k, v)?,
                "w_kv" => p.w_kv = num(k, v)?,
                _ => return Err(SpecError(format!("gie: unknown option {k:?}"))),
            }
        }
        Ok(p)
    }
}

/// One server's LRU of block hashes.
#[derive(Default)]
struct Lru {
    tick_of: IdMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
}

/// The endpoint picker.
pub struct Gie {
    p: Params,
    lrus: Vec<Lru>,
    /// hash -> servers holding it (sorted).
    pods: IdMap<u64, Vec<u16>>,
    tick: u64,
    rng: Rng,
    hashes: Vec<u64>,
    counts: Vec<u32>,
    best: Vec<usize>,
}

impl Gie {
    pub fn new(p: Params, hosts: usize, seed: u64) -> Self {
        Gie {
            p,
            lrus: (0..hosts).map(|_| Lru::default()).collect(),
            pods: HashMap::default(),
            tick: 0,
            rng: Rng::new(seed),
            hashes: Vec::new(),
            counts: vec![0; hosts],
            best: Vec::new(),
        }
    }

    fn hash_prompt(&mut self, model: &str, prompt: &[u8]) {
        self.hashes.clear();
        let bs = self.p.block_bytes;
        if prompt.len() < bs {
            return;
        }
        let lim = prompt.len().min(bs * self.p.max_blocks);
        let mut prev = xxh3_64(model.as_bytes());
        self.hashes.push(prev);
        for block in prompt.get(..lim).unwrap_or(prompt).chunks_exact(bs) {
            prev = xxh3_64_with_seed(block, prev);
            self.hashes.push(prev);
        }
    }

    fn add(&mut self, server: usize) {
        let cap = self.p.lru_per_server;
        let Some(lru) = self.lrus.get_mut(server) else {
            return;
        };
        for &h in &self.hashes {
            self.tick += 1;
            if let Some(old) = lru.tick_of.insert(h, self.tick) {
                lru.by_tick.remove(&old);
            }
            lru.by_tick.insert(self.tick, h);
            if lru.tick_of.len() > cap {
                if let Some((_, victim)) = lru.by_tick.pop_first() {
                    lru.tick_of.remove(&victim);
                    if let Some(set) = self.pods.get_mut(&victim) {
                        set.retain(|&s| s as usize != server);
                        if set.is_empty() {
                            self.pods.remove(&victim);
                        }
                    }
                }
            }
        }
        for &h in &self.hashes {
            let set = self.pods.entry(h).or_default();
            if let Err(i) = set.binary_search(&(server as u16)) {
                set.insert(i, server as u16);
            }
        }
    }
}

impl Policy for Gie {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let n = self.lrus.len();
        self.hash_prompt(&input.wl.model, input.gie_prompt());
        // Prefix scores.
        self.counts.iter_mut().for_each(|c| *c = 0);
        for h in &self.hashes {
            match self.pods.get(h) {
                Some(set) if !set.is_empty() => {
                    for &s in set {
                        if let Some(c) = self.counts.get_mut(s as usize) {
                            *c += 1;
                        }
                    }
                }
                _ => break,
            }
        }
        let total = self.hashes.len();
        // Queue and KV from the latest reports.
        let q = |h: usize| {
            view.reports
                .get(h)
                .copied()
                .flatten()
                .map(|s| s.waiting)
                .unwrap_or(0)
        };
        let kv = |h: usize| {
            view.reports
                .get(h)
                .copied()
                .flatten()
                .map(|s| s.kv_usage)
                .unwrap_or(0.0)
        };
        let qmin = (0..n).map(q).min().unwrap_or(0);
        let qmax = (0..n).map(q).max().unwrap_or(0);
        let mut best_score = f64::NEG_INFINITY;
        self.best.clear();
        let mut best_prefix = 0.0;
        for h in 0..n {
            let prefix = if total == 0 {
                0.0
            } else {
                f64::from(self.counts.get(h).copied().unwrap_or(0)) / total as f64
            };
            let queue = if qmax == qmin {
                1.0
            } else {
                f64::from(qmax - q(h)) / f64::from(qmax - qmin)
            };
            let s = self.p.w_prefix * prefix + self.p.w_queue * queue + self.p.w_kv * (1.0 - kv(h));
            if s > best_score {
                best_score = s;
                self.best.clear();
                best_prefix = prefix;
            }
            if s == best_score {
                self.best.push(h);
            }
        }
        let i = self.rng.below(self.best.len() as u64) as usize;
        let host = self.best.get(i).copied().unwrap_or(0);
        let max_prefix = (0..n)
            .map(|h| self.counts.get(h).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let outcome = if total > 1 && max_prefix > 1 {
            // Some server had a real (beyond the model hash) match.
            if best_prefix * total as f64 >= f64::from(max_prefix) {
                Outcome::Affinity
            } else {
                Outcome::Spill
            }
        } else {
            Outcome::Balance
        };
        self.add(host);
        Choice { host, outcome }
    }
}
