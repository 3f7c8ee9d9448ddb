//! This project's router with the index rule (`cost.mode = index`): the
//! core's [`Router::decide`] with an index (estimated TTFT over the key's owner
//! and its ring successors under the load bound, see
//! `prefix_router_core::cost`) with a learned
//! [`PrefixIndex`] (`prefix_router_core::index`).
//!
//! Like the filter would, each proxy instance owns its own index and feeds
//! it from the replica that actually served a request, when its first token
//! arrives (the filter's response headers): with K proxies each index sees
//! only 1/K of the responses, so multi-proxy runs show what the divergence
//! costs. Loads are built exactly as in [`super::prefix_router`] (this
//! proxy's in-flight count, the replica's reported `num_requests_waiting`).
//!
//! Options: everything `prefix-router` takes (`mode`, `c`, `min_capacity`,
//! ...); the filter's `cost` knobs `service_s` (0.5), `prefill_tps`
//! (`cost.prefill_tokens_per_s`, 16000), `host_tokens` (default: the
//! replicas' KV cache, `--cache-tokens`, as the README tells an operator
//! to set it; 0 = off; the index forgets by the filter's capacity clock,
//! `PrefixIndex::take_in`) and `host_frac` (without `host_tokens`, that
//! share of the KV cache, 1); `learn=0|1` (1, as the filter: learn the
//! prefill rate from each request's time to first token with the core's
//! `learn_prefill_rate`; JSON `learned_prefill_tps`); `gossip_ms=D` (index
//! gossip, the filter's `gossip`: each observation this proxy makes is
//! encoded with the core's `gossip` codec and reaches every other proxy D
//! ms later, which records it as its own; the filter sends a batch every
//! `interval_ms`, so D stands for half that plus the network).
//!
//! Research options for the rule's constants, which the filter does not
//! expose (defaults are the core's: `prefix_router_core::cost::CostParams`,
//! `prefix_router_core::index::IndexConfig`): `candidates` (6), `stride`
//! (index stride in chunks, 16), `dense` (boundaries kept before thinning,
//! 16; 0 keeps all), `max_entries` (65536), `queue` (`tokens` |
//! `requests`), `stay` (0.1 s), `inflight_s` (0.1), `hot_window_s` and
//! `hot_factor` (20, 1.12: the hot-host rule, each proxy keeping its own
//! `LoadTrend`), `hot_rule` (`mean` | `half_floor`), `hot_keep` (`within` |
//! `ceil`), and `pending=prompt` (count whole prompts as pending prefill,
//! not their uncached part).
//!
//! With `queue=tokens` the policy tracks, per host, the uncached prompt
//! tokens (canonical prompt bytes minus the prefix the index credited the
//! chosen host with, over `bytes_per_token`: what the filter counts,
//! [`prefix_router_core::cost::CostParams::pending_tokens`]) of the
//! requests it routed that have not yet produced a first token, and
//! passes them as `HostLoad::pending_prefill_tokens`. The counts are kept
//! in every mode (they are only read with `tokens`). The core adds the
//! replica's reported waiting requests beyond this proxy's own in-flight
//! ones ([`prefix_router_core::cost::pending_with_report`]): with K
//! proxies, that is how one proxy sees the others' work.

use std::collections::BTreeMap;

use prefix_router_core::index::PrefixIndex;
use prefix_router_core::load::{HostLoad, LoadTrend};
use prefix_router_core::{Config, Decision, Request, Router};

use super::prefix_router::{refresh_loads, round_robin_fallback};
use super::{num, prefix_router, Choice, Outcome, Policy, SpecError, View};
use crate::input::RouteInput;

/// `host_tokens` as a share of the replicas' KV cache when the spec does not
/// set it: all of it, as the README tells an operator (`cost.host_tokens`).
pub const DEFAULT_HOST_FRAC: f64 = 1.0;

/// Options (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub base: prefix_router::Params,
    pub candidates: u32,
    pub service_s: f64,
    pub prefill_tps: f64,
    pub stride_chunks: u32,
    pub dense_boundaries: u32,
    /// `None`: the replicas' KV-cache capacity (see [`PrefixRouterCost::new`]).
    pub host_tokens: Option<u64>,
    /// `host_frac=F`: without `host_tokens`, the index's per-host capacity
    /// is F x the replicas' KV cache (default [`DEFAULT_HOST_FRAC`]).
    pub host_frac: f64,
    pub max_entries: u64,
    pub queue: String,
    pub stay_margin_s: f64,
    pub ties: String,
    pub inflight_s: f64,
    pub hot_window_s: f64,
    pub hot_factor: f64,
    pub hot_rule: String,
    /// `hot_keep=within|ceil` (`hot_keep`).
    pub hot_keep: prefix_router_core::cost::HotKeep,
    /// `learn=1`: learn the prefill rate online (`learn_prefill`).
    pub learn_prefill: bool,
    /// Experiment: `pending=prompt` counts whole prompts as pending
    /// prefill (the filter before it subtracted the credited prefix);
    /// default `uncached`, the filter's rule.
    pub pending_whole_prompt: bool,
    /// `load_gossip_ms=D`: the filter's load gossip (`gossip.name`): every
    /// proxy adds the other proxies' pending prefill tokens per host, as
    /// they were D ms ago, to its own.
    pub load_gossip_ms: Option<f64>,
    /// `gossip_ms=D`: share observations with the other proxies, D ms late.
    pub gossip_ms: Option<f64>,
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Params, SpecError> {
        let d = prefix_router_core::config::RawCost::default();
        let c = prefix_router_core::cost::CostParams::default();
        let ix = prefix_router_core::index::IndexConfig::default();
        let mut p = Params {
            base: prefix_router::Params::default(),
            candidates: c.candidates,
            service_s: d.service_s,
            prefill_tps: d.prefill_tokens_per_s,
            stride_chunks: ix.stride_chunks,
            dense_boundaries: ix.dense_boundaries,
            host_tokens: None,
            host_frac: DEFAULT_HOST_FRAC,
            max_entries: ix.max_entries as u64,
            queue: "tokens".into(),
            stay_margin_s: c.stay_margin_s,
            ties: "ring".into(),
            inflight_s: c.inflight_s,
            hot_window_s: c.hot_window_s,
            hot_factor: c.hot_factor,
            hot_rule: "mean".into(),
            hot_keep: c.hot_keep,
            // The filter learns the prefill rate with the index rule.
            learn_prefill: true,
            pending_whole_prompt: false,
            load_gossip_ms: None,
            gossip_ms: None,
        };
        let mut rest = Vec::new();
        for (k, v) in opts {
            match k.as_str() {
                "candidates" => p.candidates = num(k, v)? as u32,
                "service_s" => p.service_s = num(k, v)?,
                "prefill_tps" => p.prefill_tps = num(k, v)?,
                "stride" => p.stride_chunks = num(k, v)? as u32,
                "dense" => p.dense_boundaries = num(k, v)? as u32,
                "host_tokens" => p.host_tokens = Some(num(k, v)? as u64),
                "host_frac" => p.host_frac = num(k, v)?,
                "max_entries" => p.max_entries = num(k, v)? as u64,
                "queue" => p.queue = v.clone(),
                "stay" | "stay_margin_s" => p.stay_margin_s = num(k, v)?,
                "ties" => p.ties = v.clone(),
                "inflight_s" => p.inflight_s = num(k, v)?,
                "hot_window_s" => p.hot_window_s = num(k, v)?,
                "hot_factor" => p.hot_factor = num(k, v)?,
                "hot_rule" => p.hot_rule = v.clone(),
                "hot_keep" => {
                    p.hot_keep = match v.as_str() {
                        "within" => prefix_router_core::cost::HotKeep::Within,
                        "ceil" => prefix_router_core::cost::HotKeep::Ceil,
                        _ => {
                            return Err(SpecError(format!(
                                "prefix-router-cost: hot_keep={v}: expected within or ceil"
                            )))
                        }
                    }
                }
                "learn" | "learn_prefill" => p.learn_prefill = num(k, v)? != 0.0,
                "gossip_ms" => {
                    let d = num(k, v)?;
                    if !(d.is_finite() && d >= 0.0) {
                        return Err(SpecError(format!(
                            "prefix-router-cost: gossip_ms={v}: must be >= 0"
                        )));
                    }
                    p.gossip_ms = Some(d);
                }
                "load_gossip_ms" => p.load_gossip_ms = Some(num(k, v)?),
                "pending" => {
                    p.pending_whole_prompt = match v.as_str() {
                        "uncached" => false,
                        "prompt" => true,
                        _ => {
                            return Err(SpecError(format!(
                                "prefix-router-cost: pending={v}: expected uncached or prompt"
                            )))
                        }
                    }
                }
                _ => rest.push((k.clone(), v.clone())),
            }
        }
        p.base = prefix_router::Params::parse(&rest)?;
        p.config(2)?;
        Ok(p)
    }

    /// The filter config for `hosts` replicas, validated by the core.
    pub fn config(&self, hosts: usize) -> Result<Config, SpecError> {
        let base = self.base.config(hosts)?;
        let mut raw = prefix_router_core::config::RawConfig::default_without_hosts();
        raw.cost.mode = "index".into();
        raw.cost.service_s = self.service_s;
        raw.cost.prefill_tokens_per_s = self.prefill_tps;
        raw.cost.host_tokens = self.host_tokens.unwrap_or(raw.cost.host_tokens);
        raw.chunk_bytes = base.chunk_bytes as u32;
        raw.hosts = vec![prefix_router_core::config::RawHost {
            address: "127.0.0.1:1".into(),
            name: None,
            weight: None,
        }];
        let mut cost = raw
            .compile()
            .map_err(|e| SpecError(format!("prefix-router-cost: {e}")))?
            .cost;
        // The rules' constants, which the filter does not let an operator
        // change (`cost` has five knobs): the simulator varies them to
        // measure the alternatives (docs/design.md, "Constants").
        self.override_constants(&mut cost)?;
        Ok(Config { cost, ..base })
    }

    fn override_constants(
        &self,
        cost: &mut prefix_router_core::config::CostConfig,
    ) -> Result<(), SpecError> {
        use prefix_router_core::cost::{HotRule, QueueMode, Ties};
        let bad = |what: &str| SpecError(format!("prefix-router-cost: {what}"));
        let unit = |v: f64, lo: f64| v.is_finite() && v >= lo && v <= 3600.0;
        if !(1..=64).contains(&self.candidates) {
            return Err(bad("candidates: must be 1..=64"));
        }
        if !(1..=65_536).contains(&self.stride_chunks) {
            return Err(bad("stride: must be 1..=65536"));
        }
        if !self.dense_boundaries.is_multiple_of(2) || self.dense_boundaries > 65_536 {
            return Err(bad("dense: must be 0 or an even number up to 65536"));
        }
        if self.max_entries == 0 || self.max_entries > 1 << 24 {
            return Err(bad("max_entries: must be 1..=2^24"));
        }
        if !(unit(self.stay_margin_s, 0.0) && unit(self.inflight_s, 0.0)) {
            return Err(bad("stay / inflight_s: must be 0..=3600"));
        }
        if !(unit(self.hot_window_s, 0.0) && unit(self.hot_factor, 1.0)) {
            return Err(bad("hot_window_s: 0..=3600, hot_factor: 1..=3600"));
        }
        let p = &mut cost.params;
        p.candidates = self.candidates;
        p.stay_margin_s = self.stay_margin_s;
        p.inflight_s = self.inflight_s;
        p.hot_window_s = self.hot_window_s;
        p.hot_factor = self.hot_factor;
        p.hot_keep = self.hot_keep;
        p.queue = match self.queue.as_str() {
            "tokens" => QueueMode::Tokens,
            "requests" => QueueMode::Requests,
            _ => return Err(bad("queue: expected tokens or requests")),
        };
        p.ties = match self.ties.as_str() {
            "ring" => Ties::Ring,
            "load" => Ties::Load,
            _ => return Err(bad("ties: expected ring or load")),
        };
        p.hot_rule = match self.hot_rule.as_str() {
            "mean" => HotRule::Mean,
            "half_floor" => HotRule::HalfFloor,
            _ => return Err(bad("hot_rule: expected mean or half_floor")),
        };
        cost.index.stride_chunks = self.stride_chunks;
        cost.index.dense_boundaries = self.dense_boundaries;
        cost.index.max_entries = usize::try_from(self.max_entries).unwrap_or(usize::MAX);
        cost.learn_prefill = self.learn_prefill;
        Ok(())
    }
}

/// `load_gossip_ms`: per proxy, its pending prefill tokens per host over
/// time (time s, tokens), written by that proxy at every change and pruned
/// by the readers.
pub type PendingBoard =
    std::sync::Arc<std::sync::Mutex<Vec<std::collections::VecDeque<(f64, Vec<u64>)>>>>;

/// The router with the cost rule and this proxy's index.
pub struct PrefixRouterCost {
    router: Router,
    index: PrefixIndex,
    loads: Vec<HostLoad>,
    use_reports: super::prefix_router::Reports,
    /// Chains of routed requests until their first token, with the host
    /// they were sent to and their prompt tokens.
    pending: BTreeMap<u64, (Vec<u64>, usize, u64)>,
    /// Per host: uncached prompt tokens of `pending` requests sent there.
    pending_tokens: Vec<u64>,
    /// `load_gossip_ms`: the board, this proxy's slot on it,
    /// the time of its last entry, and the delay (s).
    board: Option<PendingBoard>,
    board_slot: usize,
    board_last_s: f64,
    board_delay_s: f64,
    params: prefix_router_core::cost::CostParams,
    pending_whole_prompt: bool,
    last_ms: u64,
    rr: usize,
    /// Prompt tokens the index credited the chosen hosts with.
    credited_tokens: u64,
    /// `learn_prefill`: the learned rate, and per routed request its
    /// routing time (ms) and the prefill tokens known ahead of it.
    learned_tps: Option<f64>,
    samples: BTreeMap<u64, (u64, u64)>,
    /// Each host's recent load (`hot_window_s`).
    trend: LoadTrend,
    /// `gossip_ms`: the delay, and observations not yet handed out.
    gossip_s: Option<f64>,
    outbox: prefix_router_core::gossip::Outbox,
}

impl PrefixRouterCost {
    /// `cache_tokens`: the replicas' KV-cache capacity, used as
    /// `host_tokens` unless the spec sets it.
    pub fn new(p: &Params, hosts: usize, cache_tokens: Option<u64>) -> Result<Self, SpecError> {
        let mut p = p.clone();
        if p.host_tokens.is_none() {
            p.host_tokens = cache_tokens.map(|c| (c as f64 * p.host_frac).round() as u64);
        }
        let p = &p;
        if p.base.capped() {
            return Err(SpecError(
                "prefix-router-cost: mode=capped is not supported".into(),
            ));
        }
        let router = Router::new(p.config(hosts)?);
        let index = router.new_index();
        let params = router.config().cost.params;
        Ok(PrefixRouterCost {
            router,
            index,
            loads: vec![HostLoad::default(); hosts],
            use_reports: p.base.use_reports,
            pending: BTreeMap::new(),
            pending_tokens: vec![0; hosts],
            board: None,
            board_slot: 0,
            board_last_s: f64::NEG_INFINITY,
            board_delay_s: p.load_gossip_ms.unwrap_or(0.0) / 1000.0,
            params,
            pending_whole_prompt: p.pending_whole_prompt,
            last_ms: 0,
            rr: 0,
            credited_tokens: 0,
            learned_tps: p.learn_prefill.then_some(params.prefill_tokens_per_s),
            samples: BTreeMap::new(),
            trend: LoadTrend::new(),
            gossip_s: p.gossip_ms.map(|d| d / 1000.0),
            outbox: Default::default(),
        })
    }

    /// `load_gossip_ms`: write to `board` at `slot` and read
    /// the other slots.
    pub fn join_board(&mut self, board: PendingBoard, slot: usize) {
        self.board = Some(board);
        self.board_slot = slot;
    }

    /// Write this proxy's pending table to its board slot.
    fn publish(&mut self, now_s: f64) {
        self.board_last_s = self.board_last_s.max(now_s);
        if let Some(f) = &self.board {
            if let Ok(mut f) = f.lock() {
                if let Some(slot) = f.get_mut(self.board_slot) {
                    slot.push_back((self.board_last_s, self.pending_tokens.clone()));
                }
            }
        }
    }

    /// The index (tests).
    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }

    fn fallback(&mut self) -> Choice {
        round_robin_fallback(&mut self.rr, self.loads.len())
    }

    /// Forget a pending request: its prefill is no longer ahead of anyone.
    /// Returns its chain and uncached tokens.
    fn settle(&mut self, id: u64) -> Option<(Vec<u64>, u64)> {
        let (hashes, host, tokens) = self.pending.remove(&id)?;
        if let Some(t) = self.pending_tokens.get_mut(host) {
            *t = t.saturating_sub(tokens);
        }
        Some((hashes, tokens))
    }
}

impl Policy for PrefixRouterCost {
    fn reads_orca(&self) -> bool {
        true
    }
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        refresh_loads(&mut self.loads, view, self.use_reports);
        for (l, &t) in self.loads.iter_mut().zip(&self.pending_tokens) {
            l.pending_prefill_tokens = t;
            l.peer_pending_tokens = 0;
        }
        if let Some(f) = &self.board {
            if let Ok(mut f) = f.lock() {
                let seen = view.now - self.board_delay_s;
                for (i, hist) in f.iter_mut().enumerate() {
                    if i == self.board_slot {
                        continue;
                    }
                    // The newest entry at least the delay old.
                    while hist.len() > 1 && hist.get(1).is_some_and(|e| e.0 <= seen) {
                        hist.pop_front();
                    }
                    let Some((at, t)) = hist.front() else {
                        continue;
                    };
                    if *at > seen {
                        continue;
                    }
                    for (h, l) in self.loads.iter_mut().enumerate() {
                        let other_t = t.get(h).copied().unwrap_or(0);
                        l.peer_pending_tokens = l.peer_pending_tokens.saturating_add(other_t);
                    }
                }
            }
        }
        let now = view.now_ms();
        self.last_ms = self.last_ms.max(now);
        self.router
            .track_recent(&mut self.trend, &mut self.loads, now);
        // With learning on, the cost rule uses the learned rate, as the
        // filter does.
        let params = match self.learned_tps {
            Some(r) => self.params.with_prefill_rate(r),
            None => self.params,
        };
        let prefix_router_core::Decided { decision: d, chain } = self.router.decide(
            &Request::new(input.api(), input.body(), &self.loads, now)
                .with_index(&self.index)
                .with_params(&params),
        );
        let mut credited = 0;
        let choice = match d {
            Decision::Routed {
                host,
                skipped,
                cached,
                ..
            } => {
                credited = cached.unwrap_or(0);
                Choice {
                    host,
                    outcome: if skipped == 0 {
                        Outcome::Affinity
                    } else {
                        Outcome::Spill
                    },
                }
            }
            Decision::Fallback(_) => self.fallback(),
        };
        if chain.bytes > 0 || !chain.hashes.is_empty() {
            self.credited_tokens += self.params.pending_tokens(credited, 0);
            if self.pending_whole_prompt {
                credited = 0;
            }
            let tokens = self.params.pending_tokens(chain.bytes, credited);
            if let Some(t) = self.pending_tokens.get_mut(choice.host) {
                *t += tokens;
            }
            if self.learned_tps.is_some() {
                // Work known ahead of it at its host, as the filter counts it.
                let fresh = self.router.config().load.freshness();
                let ahead = self
                    .loads
                    .get(choice.host)
                    .map_or(0, |l| l.pending_ahead(now, fresh, &params));
                self.samples.insert(input.id, (now, ahead));
            }
            self.pending
                .insert(input.id, (chain.hashes, choice.host, tokens));
        }
        self.publish(view.now);
        choice
    }

    fn on_first_token_at(&mut self, id: u64, host: usize, t: f64) {
        let sample = self.samples.remove(&id);
        let uncached = self.pending.get(&id).map(|p| p.2);
        if let (Some(rate), Some((at, ahead)), Some(uncached)) =
            (self.learned_tps, sample, uncached)
        {
            let s = prefix_router_core::cost::PrefillSample {
                uncached_tokens: uncached,
                ttfb_ms: ((t * 1000.0).max(0.0) as u64).saturating_sub(at),
                ahead_tokens: ahead,
            };
            let configured = self.params.prefill_tokens_per_s;
            if let Some(next) = prefix_router_core::cost::learn_prefill_rate(rate, configured, &s) {
                self.learned_tps = Some(next);
            }
        }
        self.on_first_token(id, host);
        self.publish(t);
    }

    fn on_first_token(&mut self, id: u64, host: usize) {
        if let Some((hashes, tokens)) = self.settle(id) {
            // As the filter does on a response: record the prefix, then
            // advance the host's capacity clock by what it newly cached.
            self.index.observe(host, &hashes, self.last_ms);
            self.index.take_in(host, tokens, self.last_ms);
            if self.gossip_s.is_some() {
                if let Some(h) = self.router.config().hosts.get(host) {
                    let o = prefix_router_core::gossip::Observation {
                        host: h.address.clone(),
                        tokens,
                        hashes,
                    };
                    self.outbox.push(o, usize::MAX);
                }
            }
        }
    }

    fn on_done(&mut self, id: u64, _host: usize) {
        self.samples.remove(&id);
        self.settle(id);
    }

    fn credited_tokens(&self) -> Option<u64> {
        Some(self.credited_tokens)
    }

    fn learned_prefill_tps(&self) -> Option<f64> {
        self.learned_tps
    }

    fn gossip_delay_s(&self) -> Option<f64> {
        self.gossip_s
    }

    fn gossip_out(&mut self) -> Option<Vec<u8>> {
        if self.outbox.is_empty() {
            return None;
        }
        let fp = prefix_router_core::gossip::fingerprint(&self.router.config().cost.index);
        Some(prefix_router_core::gossip::encode(fp, &self.outbox.take()))
    }

    fn gossip_in(&mut self, batch: &[u8], t: f64) {
        let Ok((fp, obs)) = prefix_router_core::gossip::decode(batch) else {
            return;
        };
        let cfg = self.router.config();
        if fp != prefix_router_core::gossip::fingerprint(&cfg.cost.index) {
            return;
        }
        self.last_ms = self.last_ms.max((t * 1000.0).max(0.0) as u64);
        for o in obs {
            if let Some(h) = cfg.host_index(&o.host) {
                self.index.observe(h, &o.hashes, self.last_ms);
                self.index.take_in(h, o.tokens, self.last_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::cost::QueueMode;

    fn opts(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn queue_option() {
        let p = Params::parse(&opts(&[])).unwrap();
        assert_eq!(p.config(4).unwrap().cost.params.queue, QueueMode::Tokens);
        assert_eq!(p.config(4).unwrap().cost.params.candidates, 6);
        let p = Params::parse(&opts(&[("queue", "requests")])).unwrap();
        assert_eq!(p.config(4).unwrap().cost.params.queue, QueueMode::Requests);
        let e = Params::parse(&opts(&[("queue", "bytes")])).unwrap_err();
        assert!(e.0.contains("queue: expected"), "{}", e.0);
    }

    #[test]
    fn hot_keep_option() {
        use prefix_router_core::cost::HotKeep;
        let keep = |o: &[(&str, &str)]| {
            let p = Params::parse(&opts(o)).unwrap();
            p.config(4).unwrap().cost.params.hot_keep
        };
        assert_eq!(keep(&[]), HotKeep::Within);
        assert_eq!(keep(&[("hot_keep", "ceil")]), HotKeep::Ceil);
        assert_eq!(keep(&[("hot_keep", "within")]), HotKeep::Within);
        let e = Params::parse(&opts(&[("hot_keep", "floor")])).unwrap_err();
        assert!(e.0.contains("hot_keep=floor"), "{}", e.0);
    }

    #[test]
    fn host_tokens_default_to_a_share_of_the_cache() {
        let p = Params::parse(&opts(&[])).unwrap();
        let r = PrefixRouterCost::new(&p, 2, Some(300_000)).unwrap();
        assert_eq!(r.router.config().cost.index.host_tokens, 300_000);
        let p = Params::parse(&opts(&[("host_frac", "0.5")])).unwrap();
        let r = PrefixRouterCost::new(&p, 2, Some(300_000)).unwrap();
        assert_eq!(r.router.config().cost.index.host_tokens, 150_000);
        // An explicit host_tokens wins over the share.
        let p = Params::parse(&opts(&[("host_tokens", "7"), ("host_frac", "0.5")])).unwrap();
        let r = PrefixRouterCost::new(&p, 2, Some(300_000)).unwrap();
        assert_eq!(r.router.config().cost.index.host_tokens, 7);
        assert_eq!(r.credited_tokens(), Some(0));
    }

    #[test]
    fn pending_tokens_settle_once() {
        let p = Params::parse(&opts(&[("queue", "tokens")])).unwrap();
        let mut r = PrefixRouterCost::new(&p, 2, None).unwrap();
        r.pending.insert(7, (vec![1, 2], 1, 500));
        r.pending_tokens[1] = 500;
        r.on_first_token(7, 0);
        assert_eq!(r.pending_tokens, vec![0, 0]);
        r.on_done(7, 0);
        assert_eq!(r.pending_tokens, vec![0, 0]);
    }
}
