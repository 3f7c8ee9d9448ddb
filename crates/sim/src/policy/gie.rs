//! The Gateway API Inference Extension (GIE) endpoint picker (EPP) with the
//! approximate prefix-cache scorer, the queue scorer and the
//! KV-cache-utilization scorer. GIE's EPP moved to `llm-d/llm-d-router` in
//! June 2026 (GIE commit `a70292c1` removed it); re-implemented from
//! `llm-d/llm-d-router` at commit `ebab6879` (2026-08-22):
//!
//! * `pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/
//!   plugin.go`, `types.go`, `indexer.go` and `.../dataproducer/prefixhash/
//!   hashing.go`: the prompt is cut into blocks of `blockSizeTokens` tokens
//!   (autoTune: the model server's KV block size, 16 for vLLM, raised to
//!   `minBlockSizeTokens` = 64), at most `131072 / 64` = 2048 blocks, the
//!   trailing partial block included; block hashes chain from a seed that
//!   is the hash of the model name (`hash_0 = h(block_0, h(model))`: the
//!   model is folded into block 0, it is no entry of its own). Without a
//!   tokenizer the default "estimate" token producer (`.../tokenizer/
//!   estimate.go`) packs 4 bytes into one pseudo-token, so a block is 256
//!   bytes of the prompt (completions) or of the messages (chat; llm-d
//!   concatenates role and content, here the messages JSON: the same prefix
//!   structure). A per-server LRU of block hashes (golang-lru, size
//!   `NumOfGPUBlocks`: with autoTune the server's `CacheNumBlocks`, i.e.
//!   its KV tokens / 16, vLLM's block size; 31,250 without) remembers which
//!   server each hash was sent to. Score = matched blocks / total, a server
//!   scoring one for every leading hash (while any server has it) that it
//!   holds. After the pick, the request's hashes are added for the chosen
//!   server (`PreRequest`). Note that an entry stands for 64 tokens while
//!   the LRU is sized in 16-token blocks: the index can believe a server
//!   holds up to 4 times what fits in its cache (upstream as it is).
//! * `pkg/epp/framework/plugins/scheduling/scorer/queuedepth`: `(maxQ - q) /
//!   (maxQ - minQ)` over the waiting-queue sizes, 1 when all are equal.
//! * `.../scorer/kvcacheutilization`: `1 - kv_cache_usage`.
//! * `.../picker/maxscore`: highest weighted sum, ties broken at random.
//! * `pkg/epp/config/loader/defaults.go`: weights 3 (prefix) / 2 (queue) /
//!   2 (KV) in the default config.
//!
//! One EPP serves every gateway replica of an InferencePool, so with
//! several proxies the simulator runs one picker for all of them
//! ([`SharedGie`], built by `PolicySpec::build_fleet`). Queue and KV usage
//! come from the replicas' periodic reports (the EPP scrapes vLLM metrics).
//! Hashes are xxh3 seeded by the previous hash (upstream: xxhash64 over
//! block || prev); the chaining is the same.
//!
//! Options reproduce GIE's last in-tree EPP (`1748e829`, 2026-06-16):
//! `block=64,max_blocks=256` (16-token blocks of 4 bytes, at most 256).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::{num, Choice, Outcome, Policy, SpecError, View};
use crate::hashers::IdMap;
use crate::input::RouteInput;
use crate::rng::{Draw, Rng};

/// `block` (bytes), `max_blocks`, `lru` (entries per server; default
/// autoTune), `w_prefix`, `w_queue`, `w_kv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub block_bytes: usize,
    pub max_blocks: usize,
    /// LRU entries per server; `None`: autoTune (KV tokens / 16).
    pub lru_per_server: Option<usize>,
    pub w_prefix: f64,
    pub w_queue: f64,
    pub w_kv: f64,
}

/// vLLM's default KV block size, which autoTune's `CacheNumBlocks` counts in.
pub const VLLM_BLOCK_TOKENS: u64 = 16;
/// The LRU size without autoTune (`defaultLRUCapacityPerServer`).
pub const DEFAULT_LRU: usize = 31_250;

impl Default for Params {
    fn default() -> Self {
        Params {
            block_bytes: 256,
            max_blocks: 2048,
            lru_per_server: None,
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
                "lru" => p.lru_per_server = Some((num(k, v)? as usize).max(1)),
                "w_prefix" => p.w_prefix = num(k, v)?,
                "w_queue" => p.w_queue = num(k, v)?,
                "w_kv" => p.w_kv = num(k, v)?,
                _ => return Err(SpecError(format!("gie: unknown option {k:?}"))),
            }
        }
        Ok(p)
    }

    /// LRU entries per server for replicas of `cache_tokens` KV tokens.
    pub fn lru_for(&self, cache_tokens: Option<u64>) -> usize {
        self.lru_per_server.unwrap_or_else(|| {
            cache_tokens
                .map(|t| ((t / VLLM_BLOCK_TOKENS) as usize).max(1))
                .unwrap_or(DEFAULT_LRU)
        })
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
    lru_cap: usize,
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
    /// A picker for `hosts` replicas of `cache_tokens` KV tokens each.
    pub fn new(p: Params, hosts: usize, seed: u64, cache_tokens: Option<u64>) -> Self {
        Gie {
            lru_cap: p.lru_for(cache_tokens),
            p,
            lrus: (0..hosts).map(|_| Lru::default()).collect(),
            pods: HashMap::default(),
            tick: 0,
            rng: crate::rng::rng(seed),
            hashes: Vec::new(),
            counts: vec![0; hosts],
            best: Vec::new(),
        }
    }

    fn hash_prompt(&mut self, model: &str, prompt: &[u8]) {
        self.hashes.clear();
        let bs = self.p.block_bytes.max(1);
        let mut prev = xxh3_64(model.as_bytes());
        for block in prompt.chunks(bs).take(self.p.max_blocks) {
            prev = xxh3_64_with_seed(block, prev);
            self.hashes.push(prev);
        }
    }

    fn add(&mut self, server: usize) {
        let cap = self.lru_cap;
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
        let outcome = if max_prefix > 0 {
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

/// The one endpoint picker every proxy of a fleet calls.
pub struct SharedGie(pub Arc<Mutex<Gie>>);

impl Policy for SharedGie {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        match self.0.lock() {
            Ok(mut g) => g.route(input, view),
            Err(_) => Choice {
                host: 0,
                outcome: Outcome::Fallback,
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;
    use crate::workload::synthetic;

    fn workload() -> crate::workload::Workload {
        let spec = synthetic::Spec::parse(
            "shared-prefix:groups=1,prompts=8,system=3000,question=200,output=10",
        )
        .unwrap();
        synthetic::build(&spec, 1, 16)
    }

    #[test]
    fn one_picker_learns_from_every_proxy() {
        let wl = workload();
        let spec = PolicySpec::parse("gie").unwrap();
        let mut fleet = spec.build_fleet(8, 1, 4, Some(150_000)).unwrap();
        let reports = [None; 8];
        let view = View {
            now: 0.0,
            inflight: &[0; 8],
            pending: &[],
            reports: &reports,
            replicas: &[],
        };
        // Proxy 0 places the group's first prompt; every other proxy then
        // finds the shared system prompt on that replica.
        let first = RouteInput::new(&wl, &wl.requests[0], 0);
        let h = fleet[0].route(&first, &view).host;
        for (i, pol) in fleet.iter_mut().enumerate().skip(1) {
            let input = RouteInput::new(&wl, &wl.requests[i], i as u64);
            let c = pol.route(&input, &view);
            assert_eq!((c.host, c.outcome), (h, Outcome::Affinity), "proxy {i}");
        }
        // Independent pickers (the old harness) would not: a fresh picker
        // sees no match.
        let mut alone = spec.build(8, 1, 1, Some(150_000)).unwrap();
        let input = RouteInput::new(&wl, &wl.requests[5], 5);
        assert_eq!(alone.route(&input, &view).outcome, Outcome::Balance);
    }

    #[test]
    fn lru_follows_autotune_and_model_is_folded_into_block_zero() {
        let p = Params::default();
        assert_eq!(p.lru_for(Some(150_000)), 9375);
        assert_eq!(p.lru_for(None), DEFAULT_LRU);
        let p = Params::parse(&[("lru".into(), "77".into())]).unwrap();
        assert_eq!(p.lru_for(Some(150_000)), 77);
        let mut g = Gie::new(Params::default(), 2, 1, Some(150_000));
        // One full 256-byte block and a partial one: two entries, no
        // separate entry for the model.
        g.hash_prompt("m", &[b'x'; 300]);
        assert_eq!(g.hashes.len(), 2);
        let a = g.hashes.clone();
        g.hash_prompt("other-model", &[b'x'; 300]);
        assert_ne!(g.hashes[0], a[0]);
        // A prompt shorter than a block still gets its (partial) block.
        g.hash_prompt("m", b"hi");
        assert_eq!(g.hashes.len(), 1);
        // At most max_blocks.
        g.hash_prompt("m", &vec![b'y'; 256 * 3000]);
        assert_eq!(g.hashes.len(), 2048);
    }
}
