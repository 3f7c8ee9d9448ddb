//! The index rule (`cost.mode = "index"`, the default before the priced
//! spill): affinity against load as one explicit cost, the estimated time
//! to first token, with this proxy's learned prefix index.
//!
//! ## Algorithm
//! 1. **Candidates**: the first `candidates` hosts (default 6) on the
//!    key's ring walk ([`Ring::walk`]) that are eligible and under their
//!    bounded-load capacity ([`Ring::capacity`]), the owner first. A hot
//!    host (step 4) that is held does not count.
//! 2. **Estimate** for each candidate `h`:
//!
//!    ```text
//!    TTFT_h = wait_h + max(0, prompt_tokens - cached_tokens_h) / prefill_tokens_per_s
//!    ```
//!
//!    `cached_tokens_h`: the longest prefix of the prompt the index
//!    ([`crate::index::PrefixLookup`]: [`crate::index::PrefixIndex`] or
//!    the filter's [`crate::shared_index`]) credits `h` with. `wait_h`
//!    with `queue = "tokens"` (the default): this proxy's pending uncached
//!    prefill tokens at `h` plus the waiting requests `h` reports beyond
//!    this proxy's own in flight, each priced at `service_s` of prefill
//!    (or, with load gossip, the other Envoys' pending tokens there if
//!    more: [`pending_with_peers`]), over `prefill_tokens_per_s`, plus
//!    `inflight_s` per request of this proxy's in flight there; with
//!    `queue = "requests"`, `load_h x service_s` ([`HostLoad::effective`]).
//! 3. **Choose** the smallest estimate; estimates within [`EPSILON_S`] are
//!    equal and go to the earlier host on the walk ([`Ties::Ring`]) or to
//!    the lower load ([`Ties::Load`]). The candidate credited with the
//!    longest prefix keeps the request unless another is more than
//!    `stay_margin_s` (0.1 s, `inflight_s` left out) faster: the estimate
//!    prices what a move saves now, not the copy it leaves behind.
//! 4. **Hot hosts**: a host whose recent load (an average with time
//!    constant `hot_window_s`, [`crate::load::LoadTrend`]) is above
//!    `hot_factor` x the fleet's mean is held to a tighter bound
//!    ([`HotRule::Mean`]: the fleet's mean for a prompt it holds less than
//!    [`HOT_KEEP_FRACTION`] of, [`mean_rule_keep_floor`] otherwise;
//!    [`HotRule::HalfFloor`]: half the capacity floor), so the capacity
//!    floor (`min_capacity`) cannot pile requests onto one replica.
//! 5. If no eligible host is under capacity: [`Ring::place`].
//!
//! ## Guarantees
//! - Bounded loads: a host at or over its bound is never chosen while one
//!   under it exists; `candidates = 1` is exactly [`Ring::place`].
//! - Deterministic: no clock, no randomness; ring order breaks ties, so
//!   proxies with the same view agree (with an empty index and equal
//!   loads the owner wins).
//!
//! ## Complexity
//! The ring walk until `candidates` hosts qualify (usually `candidates`
//! steps), one index lookup of O(b) probes for a prompt of b kept
//! boundaries ([`crate::index`]), O(candidates) arithmetic, and O(hosts)
//! for the hot hosts' mean.
//!
//! ## Trade-offs
//! - The index is this proxy's own: several proxies each see only their
//!   share of the responses (the filter's `gossip` shares them), and it
//!   does not see evictions (bounded by `host_tokens`). So proxies without
//!   gossip place a conversation's turns differently; the priced spill
//!   ([`crate::spill`]) has no index for that reason.
//! - Only ring neighbours are candidates: a key's cache can only be on
//!   one of `candidates` hosts (plus spills), so proxies and restarts keep
//!   agreeing. Dynamo and GIE score every host.
//! - `service_s` prices a request someone else queued, whose length the
//!   report does not give; this proxy's own are counted in tokens.
//!
//! Worked examples: the tests `worked_example` and
//! `worked_example_tokens`. Measurements behind each constant and rule:
//! docs/design.md, "The index rule".

use crate::index::PrefixLookup;
use crate::load::{Freshness, HostLoad};
use crate::ring::{Bound, Placement, Ring};

/// A hot host at its hot bound still takes a prompt it is credited with
/// at least this share of (a conversation's next turn): see "Hot hosts
/// lose the floor".
pub const HOT_KEEP_FRACTION: f64 = 0.5;

/// The share of `min_capacity` a hot host keeps: see "Hot hosts lose the
/// floor".
pub const HOT_FLOOR_SHARE: f64 = 0.5;

/// Estimates within this many seconds are equal (ring order decides).
pub const EPSILON_S: f64 = 1e-9;

/// How the queue term counts the work ahead of a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueMode {
    /// `load * service_s`.
    Requests,
    /// `pending_prefill_tokens / prefill_tokens_per_s` (default).
    #[default]
    Tokens,
}

/// How the cost rule breaks ties between equal estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ties {
    /// The earlier host on the key's walk (the owner first): every proxy
    /// breaks a tie the same way.
    #[default]
    Ring,
    /// The host with the lower effective load, then ring order.
    Load,
}

/// What a hot host is held to (`hot_rule`; "Hot hosts lose the
/// floor").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HotRule {
    /// Half its floor, `max(ceil(c (L + 1) w / W), ceil(min_capacity / 2 x
    /// w))`; a prompt it is credited with at least half of still goes
    /// there up to the full floor (the default before the mean rule).
    HalfFloor,
    /// The fleet's mean, `ceil((L + 1) w / W)`; a prompt it is credited
    /// with at least half of still goes there while this proxy's own
    /// requests there stay within the pure bound `c (L + 1) w / W` or the
    /// receding floor ([`mean_rule_keep_floor`]), whichever is higher,
    /// as [`HotKeep`] says (the default).
    #[default]
    Mean,
}

/// How [`HotRule::Mean`] applies its keep bound to a hot host
/// (`hot_keep`; "The mean rule").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HotKeep {
    /// The host's own requests after taking this one stay within the keep
    /// bound, unrounded: `own + 1 <= max(c (L + 1) w / W, keep floor x w)`
    /// (the default).
    #[default]
    Within,
    /// Its own requests before this one are under the keep bound rounded
    /// up, as the capacity is: `own < max(ceil(c (L + 1) w / W), ceil(keep
    /// floor x w))` (the default before `within`).
    Ceil,
}

/// Cost-rule parameters, in plain units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostParams {
    /// Prefill throughput of a replica, tokens per second (default 16,000:
    /// the replica model's `CostModel` default, Llama-3.1-8B on one H100).
    pub prefill_tokens_per_s: f64,
    /// Prompt bytes per token (default 4).
    pub bytes_per_token: f64,
    /// Expected queue wait per request of effective load, seconds
    /// (default 0.5; see the module doc).
    pub service_s: f64,
    /// Hosts considered: the owner and its successors under capacity
    /// (default 6).
    pub candidates: u32,
    /// Queue term: pending prefill tokens (default) or requests.
    pub queue: QueueMode,
    /// Seconds another candidate must be estimated faster than the one
    /// holding the longest cached prefix to take the request from it
    /// (default 0.1; 0: pure argmin). See the module doc, step 3.
    pub stay_margin_s: f64,
    /// How estimates within [`EPSILON_S`] of each other are broken: ring
    /// order (default, proxies agree) or the lower effective load. See
    /// "Ties".
    pub ties: Ties,
    /// Seconds each request this router has in flight at a host adds to a
    /// newcomer's wait there with [`QueueMode::Tokens`] (default 0.1; 0:
    /// off).
    /// See [`pending_with_report`].
    pub inflight_s: f64,
    /// Time constant of each host's recent load, seconds (default 20; 0:
    /// the hot-host rule is off). See "Hot hosts lose the floor".
    pub hot_window_s: f64,
    /// A host whose recent load per unit weight is above this many times
    /// the fleet's mean is hot (default 1.12).
    pub hot_factor: f64,
    /// What a hot host is held to (default [`HotRule::Mean`]).
    pub hot_rule: HotRule,
    /// How the mean rule's keep bound is applied (default
    /// [`HotKeep::Within`]).
    pub hot_keep: HotKeep,
}

impl Default for CostParams {
    fn default() -> Self {
        CostParams {
            prefill_tokens_per_s: 16_000.0,
            bytes_per_token: 4.0,
            service_s: 0.5,
            candidates: 6,
            queue: QueueMode::Tokens,
            stay_margin_s: 0.1,
            ties: Ties::Ring,
            inflight_s: 0.1,
            hot_window_s: 20.0,
            hot_factor: 1.12,
            hot_rule: HotRule::Mean,
            hot_keep: HotKeep::Within,
        }
    }
}

impl CostParams {
    /// `TTFT = load * service_s + uncached tokens / prefill rate`.
    pub fn ttft_s(&self, load: u64, prompt_bytes: u64, cached_bytes: u64) -> f64 {
        let uncached = prompt_bytes.saturating_sub(cached_bytes) as f64 / self.bytes_per_token;
        load as f64 * self.service_s + uncached / self.prefill_tokens_per_s
    }

    /// The part of [`CostParams::wait_s`] that `inflight_s` adds for
    /// `own` requests of this router in flight at a host (what
    /// [`pending_with_peers`] adds, in seconds; 0 with
    /// [`QueueMode::Requests`]).
    pub fn inflight_wait_s(&self, own: u64) -> f64 {
        match self.queue {
            QueueMode::Requests => 0.0,
            QueueMode::Tokens => {
                let per_own = (self.inflight_s * self.prefill_tokens_per_s).max(0.0);
                ((own as f64 * per_own) as u64) as f64 / self.prefill_tokens_per_s
            }
        }
    }

    /// Queue wait ahead of a new request: `load * service_s`, or with
    /// [`QueueMode::Tokens`] `pending_tokens / prefill rate`.
    pub fn wait_s(&self, load: u64, pending_tokens: u64) -> f64 {
        match self.queue {
            QueueMode::Requests => load as f64 * self.service_s,
            QueueMode::Tokens => pending_tokens as f64 / self.prefill_tokens_per_s,
        }
    }

    /// The prefill work a routed request adds to its host's pending
    /// tokens ([`QueueMode::Tokens`]): its prompt tokens minus the tokens
    /// the index credited the host with (`cached_bytes`), rounded up. A
    /// hit adds only its uncached suffix, so a replica serving its own
    /// conversations' turns does not look as busy as one prefilling whole
    /// prompts.
    pub fn pending_tokens(&self, prompt_bytes: u64, cached_bytes: u64) -> u64 {
        let uncached = prompt_bytes.saturating_sub(cached_bytes) as f64;
        // `as` saturates for out-of-range floats (and maps NaN to 0).
        (uncached / self.bytes_per_token).ceil() as u64
    }

    /// The estimate the rule minimises: [`CostParams::wait_s`] plus the
    /// uncached prefill. With [`QueueMode::Requests`] it equals
    /// [`CostParams::ttft_s`].
    pub fn estimate_s(
        &self,
        load: u64,
        pending_tokens: u64,
        prompt_bytes: u64,
        cached_bytes: u64,
    ) -> f64 {
        let uncached = prompt_bytes.saturating_sub(cached_bytes) as f64 / self.bytes_per_token;
        self.wait_s(load, pending_tokens) + uncached / self.prefill_tokens_per_s
    }
}

/// Learning the prefill rate online (`learn_prefill`): the smallest
/// uncached prompt a sample may have, tokens (below it a response's fixed
/// costs, network and the first decode step, dominate its time).
pub const LEARN_MIN_TOKENS: u64 = 512;
/// Weight of a new sample in the learned rate's moving average (of its
/// logarithm: a sample twice as fast moves the rate as much as one twice
/// as slow).
pub const LEARN_ALPHA: f64 = 0.2;
/// The learned rate stays within `configured / LEARN_RANGE ..= configured x
/// LEARN_RANGE`, so one bad stretch of samples cannot take the estimate
/// anywhere.
pub const LEARN_RANGE: f64 = 8.0;

/// What one response says about a replica's prefill speed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillSample {
    /// Prompt tokens the replica had to prefill: the prompt minus what the
    /// index credited it with.
    pub uncached_tokens: u64,
    /// Milliseconds from routing the request to its first response byte
    /// (a streamed response's headers come with the first token).
    pub ttfb_ms: u64,
    /// Prefill work known to be ahead of the request at that host when it
    /// was routed (this router's pending tokens plus others' reported
    /// waiting requests), tokens. Only samples with nothing ahead are used:
    /// their time is the prefill itself.
    pub ahead_tokens: u64,
}

/// The learned prefill rate after `s`: a moving average of
/// `uncached_tokens / ttfb` (in log space, weight [`LEARN_ALPHA`]) clamped
/// to [`LEARN_RANGE`] around `configured`. `None` when the sample says
/// nothing about prefill speed (work was ahead of it, it was too small, or
/// its time is 0). A `current` that is not a positive number restarts from
/// `configured`.
///
/// The time to first byte also holds the network, the proxy and the first
/// decode step, so the learned rate is a little slower than the replica's
/// raw prefill: the rate a router should plan with.
pub fn learn_prefill_rate(current: f64, configured: f64, s: &PrefillSample) -> Option<f64> {
    if s.ahead_tokens > 0 || s.uncached_tokens < LEARN_MIN_TOKENS || s.ttfb_ms == 0 {
        return None;
    }
    if !(configured.is_finite() && configured > 0.0) {
        return None;
    }
    let cur = if current.is_finite() && current > 0.0 {
        current
    } else {
        configured
    };
    let sample = s.uncached_tokens as f64 * 1000.0 / s.ttfb_ms as f64;
    let next = (cur.ln() + LEARN_ALPHA * (sample.ln() - cur.ln())).exp();
    Some(next.clamp(configured / LEARN_RANGE, configured * LEARN_RANGE))
}

impl CostParams {
    /// These parameters with another prefill rate (the learned one); a rate
    /// that is not a positive number leaves them unchanged.
    pub fn with_prefill_rate(&self, tokens_per_s: f64) -> CostParams {
        if tokens_per_s.is_finite() && tokens_per_s > 0.0 {
            CostParams {
                prefill_tokens_per_s: tokens_per_s,
                ..*self
            }
        } else {
            *self
        }
    }
}

/// A cost-rule choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostPlacement {
    /// Chosen host.
    pub host: usize,
    /// Position of the host on the key's walk (0: the owner).
    pub rank: u32,
    /// Prefix bytes the index says the host holds.
    pub cached_bytes: u64,
    /// The estimate, seconds (NaN when [`Ring::place`] decided).
    pub ttft_s: f64,
    /// Whether a non-first candidate won on cost (affinity or load moved it
    /// off the first qualifying host).
    pub moved: bool,
    /// Hosts passed over on the walk only because they were hot: under
    /// their capacity, but at or over the hot bound (half the floor).
    pub hot_skipped: u32,
}

/// The floor (per unit weight) under which [`HotRule::Mean`] keeps a hot
/// host's conversations: the capacity floor less the fleet's mean load per
/// unit weight, `min_capacity - (L + 1) / W`, but at least
/// [`HOT_FLOOR_SHARE`] of the floor. A nearly idle fleet keeps almost the
/// whole floor; from a mean of half the floor on, half of it.
pub fn mean_rule_keep_floor(min_capacity: f64, total: u64, total_weight: f64) -> f64 {
    let mean = if total_weight > 0.0 {
        (total as f64 + 1.0) / total_weight
    } else {
        0.0
    };
    (min_capacity * HOT_FLOOR_SHARE).max(min_capacity - mean)
}

/// Whether a hot host with `own` of this proxy's requests is at its mean
/// rule keep bound `keep` ([`HotKeep`]): with [`HotKeep::Within`] whether
/// one more request would take it over `max(c (L + 1) w / W, keep floor x
/// w)` unrounded; with [`HotKeep::Ceil`] whether `own` is at or over
/// [`Ring::capacity`] of that bound.
fn over_keep(ring: &Ring, h: usize, total: u64, own: u64, keep: &Bound, p: &CostParams) -> bool {
    match p.hot_keep {
        HotKeep::Ceil => own >= ring.capacity(h, total, keep),
        HotKeep::Within => own.saturating_add(1) as f64 > ring.limit(h, total, keep) + EPSILON_S,
    }
}

/// Which hosts are hot: eligible hosts whose recent load per unit weight
/// (`recent[h] / w_h`) is above `factor` x the eligible hosts' mean
/// (`sum recent / sum w`). None while that mean is 0, or with
/// `p.hot_window_s = 0`. O(hosts).
pub fn hot_hosts(ring: &Ring, recent: &[f64], eligible: &[bool], p: &CostParams) -> Vec<bool> {
    let n = ring.hosts();
    let mut hot = vec![false; n];
    if p.hot_window_s <= 0.0 {
        return hot;
    }
    let live = |h: usize| eligible.get(h).copied().unwrap_or(true);
    let (mut sum, mut weight) = (0.0, 0.0);
    for h in (0..n).filter(|&h| live(h)) {
        sum += recent.get(h).copied().unwrap_or(0.0).max(0.0);
        weight += ring.weight(h);
    }
    if !(sum > 0.0 && weight > 0.0) {
        return hot;
    }
    let mean = sum / weight;
    for (h, x) in hot.iter_mut().enumerate() {
        let w = ring.weight(h);
        let r = recent.get(h).copied().unwrap_or(0.0) / w.max(f64::MIN_POSITIVE);
        *x = live(h) && w > 0.0 && r > p.hot_factor * mean;
    }
    hot
}

/// A host's pending prefill tokens for [`QueueMode::Tokens`]: this
/// router's own pending tokens plus, priced at `service_s` each
/// (`service_s x prefill_tokens_per_s` tokens), the reported waiting
/// requests beyond this router's own in-flight requests at the host (those
/// are someone else's), plus `inflight_s x prefill_tokens_per_s` tokens for
/// each of this router's own requests in flight there (`inflight_s`,
/// default 0.1: decode steps interleaved with a newcomer's prefill; see
/// [`place`] for how the stay rule leaves it out). Saturates instead of
/// overflowing.
pub fn pending_with_report(
    own_tokens: u64,
    own_inflight: u64,
    reported_queue: u64,
    p: &CostParams,
) -> u64 {
    pending_with_peers(own_tokens, 0, own_inflight, reported_queue, p)
}

/// [`pending_with_report`] with other Envoys' pending tokens at the host
/// (load gossip, [`crate::gossip::Loads`]): those requests are also in the
/// replica's reported waiting count, so the two are not added; the larger
/// of the peers' tokens and the report's others counts (the report also
/// sees clients that are not Envoys; the peers' tokens are exact and
/// fresher). With `peer_tokens` 0 it is [`pending_with_report`].
pub fn pending_with_peers(
    own_tokens: u64,
    peer_tokens: u64,
    own_inflight: u64,
    reported_queue: u64,
    p: &CostParams,
) -> u64 {
    let others = reported_queue.saturating_sub(own_inflight);
    let per_request = (p.service_s * p.prefill_tokens_per_s).max(0.0);
    // `as` saturates for floats out of range (and maps NaN to 0).
    let from_others = (others as f64 * per_request) as u64;
    let per_own = (p.inflight_s * p.prefill_tokens_per_s).max(0.0);
    let from_own = (own_inflight as f64 * per_own) as u64;
    own_tokens
        .saturating_add(from_others.max(peer_tokens))
        .saturating_add(from_own)
}

/// The cost rule's reading of a host's load (kept here, beside the rule,
/// so [`crate::load`] does not depend on the cost rule).
impl HostLoad {
    /// Prefill tokens ahead of a new request here for the cost rule's
    /// token queue: this proxy's pending tokens plus the larger of the
    /// peers' ([`HostLoad::peer_pending_tokens`]) and the fresh report's
    /// other waiting requests ([`pending_with_peers`]).
    pub fn pending_ahead(&self, now_ms: u64, f: Freshness, p: &CostParams) -> u64 {
        pending_with_peers(
            self.pending_prefill_tokens,
            self.peer_pending_tokens,
            self.inflight,
            self.reported(now_ms, f),
            p,
        )
    }
}

/// Choose a host for `key` by estimated TTFT.
///
/// `loads` are effective loads (indexed like the hosts), `own` this
/// proxy's own in-flight requests per host (the mean rule's keep bound
/// counts them; missing entries: the effective load), `pending` each
/// host's pending prefill tokens (only read with [`QueueMode::Tokens`];
/// missing entries count 0), `eligible` the
/// hosts that may be chosen, `chain` the request's strided boundary hashes,
/// `prompt_bytes` its canonical length. Returns `None` only if no host is
/// eligible.
#[allow(clippy::too_many_arguments)]
pub fn place<I: PrefixLookup + ?Sized>(
    ring: &Ring,
    key: u64,
    loads: &[u64],
    own: &[u64],
    pending: &[u64],
    bound: &Bound,
    eligible: &[bool],
    hot: &[bool],
    chain: &[u64],
    prompt_bytes: u64,
    index: &I,
    now_ms: u64,
    p: &CostParams,
) -> Option<CostPlacement> {
    let hosts = Hosts {
        total: loads.iter().sum(),
        load: &|h| loads.get(h).copied().unwrap_or(0),
        own: &|h| own.get(h).copied(),
        pending: &|h| pending.get(h).copied().unwrap_or(0),
        eligible: &|h| eligible.get(h).copied().unwrap_or(true),
        hot: &|h| hot.get(h).copied().unwrap_or(false),
    };
    place_by(
        ring,
        key,
        &hosts,
        bound,
        chain,
        prompt_bytes,
        index,
        now_ms,
        p,
    )
}

/// What [`place_by`] reads of the hosts, asked host by host as the walk
/// reaches them (a caller may read each host's state only then).
pub struct Hosts<'a> {
    /// The fleet's total effective load (the bound's `L`).
    pub total: u64,
    /// Effective load of a host.
    pub load: &'a dyn Fn(usize) -> u64,
    /// This proxy's own in-flight requests at a host (`None`: take the
    /// effective load for the keep bound, 0 for `inflight_s`).
    pub own: &'a dyn Fn(usize) -> Option<u64>,
    /// Pending prefill tokens ahead at a host.
    pub pending: &'a dyn Fn(usize) -> u64,
    /// Whether a host may be chosen.
    pub eligible: &'a dyn Fn(usize) -> bool,
    /// Whether a host is hot ([`hot_hosts`]).
    pub hot: &'a dyn Fn(usize) -> bool,
}

/// [`place`] reading the hosts through `x` as the walk reaches them.
#[allow(clippy::too_many_arguments)]
pub fn place_by<I: PrefixLookup + ?Sized>(
    ring: &Ring,
    key: u64,
    x: &Hosts<'_>,
    bound: &Bound,
    chain: &[u64],
    prompt_bytes: u64,
    index: &I,
    now_ms: u64,
    p: &CostParams,
) -> Option<CostPlacement> {
    let total = x.total;
    let (loads, own, pending, eligible, hot) = (x.load, x.own, x.pending, x.eligible, x.hot);
    let want = p.candidates.max(1) as usize;
    // (host, rank on the walk, held): a hot host at or over its hot bound
    // (but under its capacity) is "held": it stays a candidate only for a
    // prompt it is credited with at least half of, and does not count
    // towards `candidates`.
    let mut cands: Vec<(usize, u32, bool)> = Vec::with_capacity(want + 1);
    // A hot host at or over `hot_bound` is "held"; one at or over
    // `keep_bound` is passed over whatever it holds (with `HotRule::Mean`
    // the pure bound or half the floor, whichever is higher; with
    // `HalfFloor` the capacity itself, so never).
    let (hot_bound, keep_bound) = match p.hot_rule {
        HotRule::HalfFloor => (
            Bound {
                min_capacity: bound.min_capacity * HOT_FLOOR_SHARE,
                ..*bound
            },
            *bound,
        ),
        HotRule::Mean => (
            Bound {
                factor: 1.0,
                min_capacity: 0.0,
            },
            Bound {
                min_capacity: mean_rule_keep_floor(bound.min_capacity, total, ring.total_weight()),
                ..*bound
            },
        ),
    };
    let mut hot_skipped = 0u32;
    let mut firm = 0usize;
    for (rank, h) in ring.walk(key).enumerate() {
        if firm >= want {
            break;
        }
        if !eligible(h) {
            continue;
        }
        let load = loads(h);
        if load >= ring.capacity(h, total, bound) {
            continue;
        }
        let is_hot = hot(h);
        // The keep bound counts this proxy's own requests at the host (the
        // queue it did not cause is priced by the estimate instead).
        let own_load = own(h).unwrap_or(load);
        if is_hot
            && p.hot_rule == HotRule::Mean
            && over_keep(ring, h, total, own_load, &keep_bound, p)
        {
            hot_skipped += 1;
            continue;
        }
        let held = is_hot && load >= ring.capacity(h, total, &hot_bound);
        cands.push((h, rank as u32, held));
        firm += usize::from(!held);
    }
    let hosts: Vec<usize> = cands.iter().map(|c| c.0).collect();
    let cached = if cands.len() > 1 || cands.iter().any(|c| c.2) {
        index.lookup(chain, &hosts, now_ms)
    } else {
        vec![0; cands.len()]
    };
    let mut kept: Vec<(usize, u32, u64)> = Vec::with_capacity(cands.len());
    for (&(h, rank, held), &c) in cands.iter().zip(cached.iter()) {
        if held && (c as f64) < HOT_KEEP_FRACTION * prompt_bytes as f64 {
            hot_skipped += 1;
            continue;
        }
        kept.push((h, rank, c));
    }
    if kept.is_empty() {
        let Placement { host, skipped } = ring.place_by(key, total, bound, loads, eligible)?;
        return Some(CostPlacement {
            host,
            rank: skipped,
            cached_bytes: 0,
            ttft_s: f64::NAN,
            moved: false,
            hot_skipped,
        });
    }
    let mut best: Option<CostPlacement> = None;
    // The candidate with the longest cached prefix (earliest on ties), and
    // its estimate without the `inflight_s` term.
    let mut home: Option<(CostPlacement, f64)> = None;
    let mut best_base = f64::NAN;
    for (i, &(h, rank, c)) in kept.iter().enumerate() {
        let load = loads(h);
        let waiting = pending(h);
        let t = p.estimate_s(load, waiting, prompt_bytes, c);
        // `inflight_s` spreads requests that tie, never moves one off its
        // cache: the stay rule below compares estimates without it.
        let base = t - p.inflight_wait_s(own(h).unwrap_or(0));
        let here = CostPlacement {
            host: h,
            rank,
            cached_bytes: c,
            ttft_s: t,
            moved: i > 0,
            hot_skipped,
        };
        let better = |b: &CostPlacement| {
            t < b.ttft_s - EPSILON_S
                || (p.ties == Ties::Load && t <= b.ttft_s + EPSILON_S && load < loads(b.host))
        };
        if best.as_ref().is_none_or(better) {
            best = Some(here);
            best_base = base;
        }
        if c > 0 && home.is_none_or(|(m, _)| c > m.cached_bytes) {
            home = Some((here, base));
        }
    }
    match (best, home) {
        (Some(_), Some((m, m_base))) if m_base <= best_base + p.stay_margin_s + EPSILON_S => {
            Some(m)
        }
        _ => best,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{IndexConfig, PrefixIndex};
    use proptest::prelude::*;

    fn ring(n: usize) -> Ring {
        let names: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:8000")).collect();
        Ring::new(names.iter().map(|s| (s.as_str(), 1.0)), 50)
    }

    fn ix() -> PrefixIndex {
        PrefixIndex::new(IndexConfig {
            stride_chunks: 1,
            dense_boundaries: 0,
            chunk_bytes: 1000,
            max_entries: 10_000,
            host_tokens: 0,
            bytes_per_token: 4.0,
            max_age_ms: 0,
        })
    }

    /// A hit is worth exactly the prefill time it saves. Prompt 12,000
    /// tokens (48,000 bytes); owner A: load 3, holds 10,000 tokens of it;
    /// successor B: load 1, holds nothing (0.5 s a queued request,
    /// 16,000 prefill tokens/s):
    ///
    /// ```text
    /// A: 3 * 0.5 + (12000 - 10000) / 16000 = 1.500 + 0.125 = 1.625 s
    /// B: 1 * 0.5 + (12000 -     0) / 16000 = 0.500 + 0.750 = 1.250 s   <- chosen
    /// ```
    ///
    /// The cached 10,000 tokens are worth 0.625 s, less than A's extra
    /// 1.0 s of queue. At load 2, A costs 1.125 s and keeps it.
    #[test]
    fn worked_example() {
        let p = CostParams {
            queue: QueueMode::Requests,
            ..CostParams::default()
        };
        assert!((p.ttft_s(3, 48_000, 40_000) - 1.625).abs() < 1e-12);
        assert!((p.ttft_s(1, 48_000, 0) - 1.25).abs() < 1e-12);
        assert!((p.ttft_s(2, 48_000, 40_000) - 1.125).abs() < 1e-12);

        // The same on a ring: A = owner, B = its successor.
        let r = ring(4);
        let key = 12345u64;
        let walk: Vec<usize> = r.walk(key).collect();
        let (a, b) = (walk[0], walk[1]);
        let chain: Vec<u64> = (1..=48).collect(); // 1,000-byte strides
        let mut index = ix();
        index.observe(a, &chain[..40], 0);
        let bound = Bound {
            factor: 1.25,
            min_capacity: 8.0,
        };
        // The other hosts are busier (load 4: 2.75 s with nothing cached).
        let mut loads = vec![4u64; 4];
        loads[a] = 3;
        loads[b] = 1;
        let el = vec![true; 4];
        let c = place(
            &r,
            key,
            &loads,
            &[],
            &[],
            &bound,
            &el,
            &[],
            &chain,
            48_000,
            &index,
            0,
            &p,
        )
        .unwrap();
        assert_eq!((c.host, c.rank, c.cached_bytes), (b, 1, 0));
        loads[a] = 2;
        let c = place(
            &r,
            key,
            &loads,
            &[],
            &[],
            &bound,
            &el,
            &[],
            &chain,
            48_000,
            &index,
            0,
            &p,
        )
        .unwrap();
        assert_eq!((c.host, c.rank, c.cached_bytes), (a, 0, 40_000));
    }

    #[test]
    fn load_ties_go_to_the_lower_load_and_equal_loads_to_ring_order() {
        let r = ring(4);
        let key = 777u64;
        let walk: Vec<usize> = r.walk(key).collect();
        let bound = Bound {
            factor: 1.25,
            min_capacity: 8.0,
        };
        let el = vec![true; 4];
        let index = ix();
        let chain: Vec<u64> = (1..=8).collect();
        let at = |loads: &[u64], pending: &[u64], ties: Ties| {
            let p = CostParams {
                ties,
                ..CostParams::default()
            };
            place(
                &r,
                key,
                loads,
                &[],
                pending,
                &bound,
                &el,
                &[],
                &chain,
                8000,
                &index,
                0,
                &p,
            )
            .unwrap()
        };
        // Nothing cached, nothing pending: every estimate is the same prefill.
        let idle = [0u64; 4];
        let mut loads = vec![2u64; 4];
        loads[walk[0]] = 3;
        loads[walk[2]] = 1;
        // Ring ties: the owner, busier or not.
        assert_eq!(at(&loads, &idle, Ties::Ring).host, walk[0]);
        // Load ties: the least loaded candidate, and it counts as moved.
        let c = at(&loads, &idle, Ties::Load);
        assert_eq!((c.host, c.rank, c.moved), (walk[2], 2, true));
        // Equal loads: ring order either way, so proxies agree under even load.
        assert_eq!(at(&[2; 4], &idle, Ties::Load).host, walk[0]);
        // A lower estimate still wins over a lower load.
        let mut pending = [0u64; 4];
        pending[walk[2]] = 16_000; // a second of prefill ahead
        assert_eq!(at(&loads, &pending, Ties::Load).host, walk[1]);
    }

    #[test]
    fn reported_queue_counts_in_token_mode() {
        // 0.5 s x 16,000 tok/s = 8,000 tokens a request; own requests add
        // nothing (`inflight_s` is checked below).
        let p = CostParams {
            inflight_s: 0.0,
            ..CostParams::default()
        };
        assert_eq!(pending_with_report(0, 0, 0, &p), 0);
        assert_eq!(pending_with_report(5_000, 2, 0, &p), 5_000);
        // The 2 reported waiting requests are (at most) our own 2 in flight.
        assert_eq!(pending_with_report(5_000, 2, 2, &p), 5_000);
        // 3 waiting, 1 of ours: 2 are someone else's.
        assert_eq!(pending_with_report(5_000, 1, 3, &p), 21_000);
        assert_eq!(pending_with_report(0, 0, 3, &p), 24_000);
        assert_eq!(pending_with_report(7, 0, u64::MAX, &p), u64::MAX);
        assert_eq!(pending_with_report(u64::MAX, 0, 1, &p), u64::MAX);
        // `inflight_s`: 0.05 s x 16,000 tok/s = 800 tokens per own request.
        let q = CostParams {
            inflight_s: 0.05,
            ..p
        };
        assert_eq!(pending_with_report(5_000, 2, 0, &q), 6_600);
        assert_eq!(pending_with_report(5_000, 1, 3, &q), 21_800);
        assert_eq!(pending_with_report(0, u64::MAX, 0, &q), u64::MAX);
        // Peers' pending tokens are the larger of the two, never added.
        assert_eq!(pending_with_peers(5_000, 0, 1, 3, &p), 21_000);
        assert_eq!(pending_with_peers(5_000, 10_000, 1, 3, &p), 21_000);
        assert_eq!(pending_with_peers(5_000, 30_000, 1, 3, &p), 35_000);
        assert_eq!(pending_with_peers(5_000, 30_000, 2, 0, &p), 35_000);
        assert_eq!(pending_with_peers(5_000, 30_000, 1, 3, &q), 35_800);
        assert_eq!(
            pending_with_peers(5_000, 0, 1, 3, &q),
            pending_with_report(5_000, 1, 3, &q)
        );
    }

    /// The same prompt and cache, queues in tokens: A has 3 requests
    /// waiting for their first token, 6,000 prompt tokens in all; B one of
    /// 24,000 tokens (a long document):
    ///
    /// ```text
    /// A:  6000 / 16000 + (12000 - 10000) / 16000 = 0.375 + 0.125 = 0.500 s   <- chosen
    /// B: 24000 / 16000 + (12000 -     0) / 16000 = 1.500 + 0.750 = 2.250 s
    /// ```
    ///
    /// Counting requests sends it to B; counting tokens sees B's one
    /// request is four times A's three and keeps it on A, with its cache.
    #[test]
    fn worked_example_tokens() {
        let p = CostParams {
            queue: QueueMode::Tokens,
            ..CostParams::default()
        };
        assert!((p.estimate_s(3, 6_000, 48_000, 40_000) - 0.5).abs() < 1e-12);
        assert!((p.estimate_s(1, 24_000, 48_000, 0) - 2.25).abs() < 1e-12);
        // Requests mode ignores pending tokens and equals `ttft_s`.
        let q = CostParams {
            queue: QueueMode::Requests,
            ..CostParams::default()
        };
        assert_eq!(
            q.estimate_s(3, 6_000, 48_000, 40_000),
            q.ttft_s(3, 48_000, 40_000)
        );

        let r = ring(4);
        let key = 12345u64;
        let walk: Vec<usize> = r.walk(key).collect();
        let (a, b) = (walk[0], walk[1]);
        let chain: Vec<u64> = (1..=48).collect();
        let mut index = ix();
        index.observe(a, &chain[..40], 0);
        let bound = Bound {
            factor: 1.25,
            min_capacity: 8.0,
        };
        let mut loads = vec![4u64; 4];
        loads[a] = 3;
        loads[b] = 1;
        let mut pending = vec![100_000u64; 4];
        pending[a] = 6_000;
        pending[b] = 24_000;
        let el = vec![true; 4];
        let at = |pending: &[u64], p: &CostParams| {
            place(
                &r,
                key,
                &loads,
                &[],
                pending,
                &bound,
                &el,
                &[],
                &chain,
                48_000,
                &index,
                0,
                p,
            )
            .unwrap()
        };
        // Requests: B (as in the first example); tokens: A keeps it.
        assert_eq!(at(&pending, &q).host, b);
        let c = at(&pending, &p);
        assert_eq!((c.host, c.rank, c.cached_bytes), (a, 0, 40_000));
        assert!((c.ttft_s - 0.5).abs() < 1e-12);
        // A with 20,000 pending tokens (1.25 + 0.125 s) loses to an idle B
        // (0 + 0.75 s).
        pending[a] = 20_000;
        pending[b] = 0;
        assert_eq!(at(&pending, &p).host, b);
    }

    #[test]
    fn hot_hosts_are_above_the_weighted_mean() {
        let names = ["a:1", "b:1", "c:1", "d:1"];
        let r = Ring::new(names.iter().map(|n| (*n, 1.0)), 50);
        let p = CostParams::default();
        let el = vec![true; 4];
        // Mean 4.5: 1.1 x 4.5 = 4.95, so 6 is hot and 4.9 is not.
        assert_eq!(
            hot_hosts(&r, &[6.0, 4.9, 4.0, 3.1], &el, &p),
            vec![true, false, false, false]
        );
        // Ejected hosts neither count in the mean nor are hot.
        let el2 = vec![true, true, true, false];
        assert_eq!(
            hot_hosts(&r, &[6.0, 5.0, 4.0, 0.0], &el2, &p),
            vec![true, false, false, false]
        );
        assert_eq!(
            hot_hosts(&r, &[6.0, 5.0, 4.0, 9.0], &el2, &p),
            vec![true, false, false, false]
        );
        // Off, an idle fleet, or no samples: nobody is hot.
        let off = CostParams {
            hot_window_s: 0.0,
            ..p
        };
        assert_eq!(
            hot_hosts(&r, &[6.0, 0.0, 0.0, 0.0], &el, &off),
            vec![false; 4]
        );
        assert_eq!(hot_hosts(&r, &[0.0; 4], &el, &p), vec![false; 4]);
        assert_eq!(hot_hosts(&r, &[], &el, &p), vec![false; 4]);
        // Weights: a host of weight 2 carrying twice the load is not hot.
        let w = Ring::new([("a:1", 2.0), ("b:1", 1.0), ("c:1", 1.0)], 50);
        assert_eq!(
            hot_hosts(&w, &[8.0, 4.0, 4.0], &[true; 3], &p),
            vec![false; 3]
        );
        assert_eq!(
            hot_hosts(&w, &[8.0, 6.0, 2.0], &[true; 3], &p),
            vec![false, true, false]
        );
    }

    /// The hot-rule tests' fixture: 4 hosts, key 4242, a 12 KB prompt in
    /// 1 KB strides, `c` 1.25 and a floor of 8, every host eligible.
    struct HotCase {
        r: Ring,
        key: u64,
        walk: Vec<usize>,
        chain: Vec<u64>,
        bound: Bound,
    }

    impl HotCase {
        fn new() -> HotCase {
            let r = ring(4);
            let key = 4242u64;
            let walk = r.walk(key).collect();
            HotCase {
                r,
                key,
                walk,
                chain: (1..=12).collect(),
                bound: Bound {
                    factor: 1.25,
                    min_capacity: 8.0,
                },
            }
        }

        fn at(
            &self,
            index: &PrefixIndex,
            loads: &[u64],
            hot: &[bool],
            p: &CostParams,
        ) -> CostPlacement {
            let el = [true; 4];
            place(
                &self.r,
                self.key,
                loads,
                &[],
                &[],
                &self.bound,
                &el,
                hot,
                &self.chain,
                12_000,
                index,
                0,
                p,
            )
            .unwrap()
        }
    }

    #[test]
    fn a_hot_host_loses_its_floor_but_keeps_its_conversations() {
        // 4 hosts, 12 requests: the pure bound is ceil(1.25 x 13 / 4) = 5,
        // the floor 8, a hot host's floor 4: its hot bound is 5. The owner A
        // holds 6.
        let t = HotCase::new();
        let (a, b, chain) = (t.walk[0], t.walk[1], &t.chain);
        let mut loads = vec![2u64; 4];
        loads[a] = 6;
        let p = CostParams {
            hot_rule: HotRule::HalfFloor,
            ..CostParams::default()
        };
        let mut hot = vec![false; 4];
        hot[a] = true;
        let at = |index: &PrefixIndex, loads: &[u64], hot: &[bool]| t.at(index, loads, hot, &p);
        // A holds 5 of the prompt's 12 KB (under half).
        let mut some = ix();
        some.observe(a, &chain[..5], 0);
        // Not hot: the floor keeps A a candidate and its cache keeps the request.
        let c = at(&some, &loads, &[]);
        assert_eq!((c.host, c.cached_bytes, c.hot_skipped), (a, 5_000, 0));
        // Hot and over its hot bound: passed over, and counted.
        let c = at(&some, &loads, &hot);
        assert_eq!((c.host, c.rank, c.hot_skipped), (b, 1, 1));
        // Hot but under its hot bound (9 in all: max(ceil(1.25 x 10 / 4),
        // 4) = 4): still a candidate.
        let mut light = loads.clone();
        light[a] = 3;
        let c = at(&some, &light, &hot);
        assert_eq!((c.host, c.hot_skipped), (a, 0));
        // Credited with at least half the prompt (a conversation's next
        // turn): it keeps the request up to its floor.
        let mut most = ix();
        most.observe(a, &chain[..6], 0);
        let c = at(&most, &loads, &hot);
        assert_eq!((c.host, c.cached_bytes, c.hot_skipped), (a, 6_000, 0));
        // Never beyond the floor.
        let mut full = loads.clone();
        full[a] = 8;
        let c = at(&most, &full, &hot);
        assert_ne!(c.host, a);
    }

    #[test]
    fn the_mean_rule_holds_a_hot_host_to_the_mean_and_its_turns_to_the_pure_bound_or_the_receding_floor(
    ) {
        // 4 hosts, 26 requests: the mean bound is ceil(27 / 4) = 7, the
        // pure bound 1.25 x 27 / 4 = 8.44 unrounded, the floor 8. The owner
        // A holds 7.
        let t = HotCase::new();
        let (a, chain) = (t.walk[0], &t.chain);
        let mut loads = vec![6u64; 4];
        loads[a] = 7;
        loads[t.walk[3]] = 7;
        let p = CostParams {
            hot_rule: HotRule::Mean,
            ..CostParams::default()
        };
        assert_eq!(p.hot_keep, HotKeep::Within);
        let mut hot = vec![false; 4];
        hot[a] = true;
        let at = |index: &PrefixIndex, loads: &[u64], hot: &[bool]| t.at(index, loads, hot, &p);
        let mut some = ix();
        some.observe(a, &chain[..5], 0);
        let mut most = ix();
        most.observe(a, &chain[..6], 0);
        // Not hot: the floor keeps A, and its cache keeps the request.
        let c = at(&some, &loads, &[]);
        assert_eq!((c.host, c.hot_skipped), (a, 0));
        // Hot, at or over the mean: a prompt it holds under half of goes
        // elsewhere, and the pass is counted.
        let c = at(&some, &loads, &hot);
        assert_eq!(c.hot_skipped, 1);
        assert_ne!(c.host, a);
        // A conversation's next turn (half the prompt or more) stays while
        // one more request keeps A within the pure bound: 8 <= 8.44.
        let c = at(&most, &loads, &hot);
        assert_eq!((c.host, c.cached_bytes, c.hot_skipped), (a, 6_000, 0));
        // At 8 of 27 (1.25 x 28 / 4 = 8.75 < 9) it goes elsewhere though
        // under the floor and its capacity (ceil(8.75) = 9); not hot, the
        // floor keeps it. `hot_keep = "ceil"` (8 < ceil(8.75)) keeps it.
        let mut full = loads.clone();
        full[a] = 8;
        let c = at(&most, &full, &hot);
        assert_eq!(c.hot_skipped, 1);
        assert_ne!(c.host, a);
        assert_eq!(at(&most, &full, &[]).host, a);
        let ceil = CostParams {
            hot_keep: HotKeep::Ceil,
            ..p
        };
        assert_eq!(t.at(&most, &full, &hot, &ceil).host, a);
        // Under the mean (A at 5 of 24: ceil(25 / 4) = 7) it is a candidate
        // for any prompt.
        let mut light = loads.clone();
        light[a] = 5;
        let c = at(&some, &light, &hot);
        assert_eq!((c.host, c.hot_skipped), (a, 0));
        // In a light fleet the turn stays under the floor less the fleet's
        // mean (at least half the floor) where the pure bound is lower: A at
        // 3 of 3 in all (pure bound 1.25 x 4 / 4 = 1.25, mean 4 / 4 = 1,
        // so 8 - 1 = 7) keeps its conversation's turn and takes no new
        // prompt.
        let mut idle = vec![0u64; 4];
        idle[a] = 3;
        let c = at(&most, &idle, &hot);
        assert_eq!((c.host, c.hot_skipped), (a, 0));
        let c = at(&some, &idle, &hot);
        assert_eq!(c.hot_skipped, 1);
        assert_ne!(c.host, a);
        // 5 of 5: 8 - 6 / 4 = 6.5, and 6 <= 6.5, kept; 6 of 6: 8 - 7 / 4 =
        // 6.25 < 7, moved (`ceil` keeps it: 6 < ceil(6.25)).
        idle[a] = 5;
        assert_eq!(at(&most, &idle, &hot).host, a);
        idle[a] = 6;
        let c = at(&most, &idle, &hot);
        assert_ne!(c.host, a);
        assert_eq!(c.hot_skipped, 1);
        assert_eq!(t.at(&most, &idle, &hot, &ceil).host, a);
        // With the others at 2 the mean is higher and the floor recedes: A
        // at 4 of 10 (8 - 11 / 4 = 5.25, and 5 <= 5.25) keeps the turn, at
        // 5 of 11 (8 - 12 / 4 = 5 < 6; the pure bound 1.25 x 12 / 4 = 3.75)
        // does not.
        let mut busy = vec![2u64; 4];
        busy[a] = 4;
        assert_eq!(at(&most, &busy, &hot).host, a);
        busy[a] = 5;
        assert_ne!(at(&most, &busy, &hot).host, a);
        assert_eq!(mean_rule_keep_floor(8.0, 14, 4.0), 4.25);
        assert_eq!(mean_rule_keep_floor(8.0, 40, 4.0), 4.0);
        assert_eq!(mean_rule_keep_floor(8.0, 0, 0.0), 8.0);
        // The half-floor rule on the same loads keeps the turn up to the
        // floor.
        let half = CostParams {
            hot_rule: HotRule::HalfFloor,
            ..CostParams::default()
        };
        assert_eq!(t.at(&most, &full, &hot, &half).host, a);
    }

    #[test]
    fn the_mean_rule_keeps_a_turn_where_the_load_is_someone_elses() {
        // 4 hosts; the owner A holds 7 requests of 10 in all, 6 of them not
        // this proxy's (direct clients, another proxy): one more of this
        // proxy's must stay within max(1.25 x 11 / 4, 8 - 11 / 4) = 5.25,
        // the floor 8.
        let t = HotCase::new();
        let (a, chain) = (t.walk[0], &t.chain);
        let mut loads = vec![1u64; 4];
        loads[a] = 7;
        let p = CostParams {
            hot_rule: HotRule::Mean,
            // Price nothing: the bound alone decides.
            service_s: 0.0,
            ..CostParams::default()
        };
        let mut hot = vec![false; 4];
        hot[a] = true;
        let el = [true; 4];
        let at = |index: &PrefixIndex, own: &[u64]| {
            place(
                &t.r,
                t.key,
                &loads,
                own,
                &[],
                &t.bound,
                &el,
                &hot,
                chain,
                12_000,
                index,
                0,
                &p,
            )
            .unwrap()
        };
        let mut most = ix();
        most.observe(a, &chain[..6], 0);
        let mut none = ix();
        none.observe(t.walk[1], &chain[..1], 0);
        let mut own = vec![1u64; 4];
        own[a] = 1;
        // A conversation's next turn stays: this proxy has one request
        // there, under the keep bound; the other six are priced, not held
        // against it.
        let c = at(&most, &own);
        assert_eq!((c.host, c.cached_bytes, c.hot_skipped), (a, 6_000, 0));
        // A new prompt is still held to the mean, which counts everyone's.
        let c = at(&none, &own);
        assert_ne!(c.host, a);
        assert_eq!(c.hot_skipped, 1);
        // When the seven are this proxy's own, the turn goes elsewhere too
        // (as with no `own` counts, which judges the effective load).
        own[a] = 7;
        let c = at(&most, &own);
        assert_ne!(c.host, a);
        assert_eq!(c.hot_skipped, 1);
        assert_eq!(t.at(&most, &loads, &hot, &p).host, c.host);
    }

    #[test]
    fn inflight_s_spreads_ties_but_never_moves_a_cached_turn() {
        // 4 hosts, no hot host, 48 KB prompts (12,000 tokens, 0.75 s of
        // prefill). The owner A has 8 of this proxy's requests in flight,
        // the others none: with `inflight_s` 0.1 that is 0.8 s in A's
        // estimate, as the router adds it to the pending tokens.
        let r = ring(4);
        let key = 99u64;
        let walk: Vec<usize> = r.walk(key).collect();
        let a = walk[0];
        let chain: Vec<u64> = (1..=48).collect();
        let p = CostParams {
            candidates: 4,
            ..CostParams::default()
        };
        assert!((p.inflight_wait_s(8) - 0.8).abs() < 1e-9);
        let mut own = vec![0u64; 4];
        own[a] = 8;
        let bound = Bound {
            factor: 1.25,
            min_capacity: 16.0,
        };
        // `extra` pending prefill tokens at A besides the in-flight term.
        let at = |index: &PrefixIndex, extra: u64, p: &CostParams| {
            let pending: Vec<u64> = (0..4)
                .map(|h| pending_with_report(if h == a { extra } else { 0 }, own[h], 0, p))
                .collect();
            let (el, hot) = ([true; 4], [false; 4]);
            let (loads, prompt) = (&own, 48_000);
            place(
                &r, key, loads, &own, &pending, &bound, &el, &hot, &chain, prompt, index, 0, p,
            )
            .unwrap()
        };
        // A holds 40 KB of the prompt: 0.125 s of prefill + 0.8 s there
        // against 0.75 s elsewhere. Its own requests decoding there do
        // not move the turn off its cache.
        let mut held = ix();
        held.observe(a, &chain[..40], 0);
        let c = at(&held, 0, &p);
        assert_eq!((c.host, c.cached_bytes), (a, 40_000));
        assert!((c.ttft_s - 0.925).abs() < 1e-9, "{}", c.ttft_s);
        // A new prompt (nobody holds it) goes to a host with fewer requests
        // of this proxy in flight, not to its ring owner.
        let c = at(&ix(), 0, &p);
        assert_ne!(c.host, a);
        assert!(c.moved);
        // Real prefill queued at A still counts: with 0.5 s of it the turn
        // stays (0.625 s without the in-flight term, against 0.75 s + the
        // 0.1 s margin), with 1 s of it (1.125 s) it moves.
        let c = at(&held, 8_000, &p);
        assert_eq!((c.host, c.cached_bytes), (a, 40_000));
        let c = at(&held, 16_000, &p);
        assert_ne!(c.host, a);
        // With `inflight_s` 0 a new prompt goes to the ring owner.
        let q = CostParams {
            inflight_s: 0.0,
            ..p
        };
        assert_eq!(at(&ix(), 0, &q).host, a);
    }

    #[test]
    fn ties_go_to_ring_order() {
        let r = ring(5);
        let p = CostParams::default();
        let bound = Bound::factor(100.0);
        let el = vec![true; 5];
        for key in [1u64, 99, 1 << 40, u64::MAX] {
            let c = place(
                &r,
                key,
                &[2; 5],
                &[],
                &[],
                &bound,
                &el,
                &[],
                &[],
                4000,
                &ix(),
                0,
                &p,
            )
            .unwrap();
            assert_eq!(c.host, r.owner(key).unwrap());
            assert_eq!(c.rank, 0);
            assert!(!c.moved);
        }
    }

    /// Naive reference: all hosts in walk order, filtered, first
    /// `candidates`, strict argmin with first-wins ties.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        r: &Ring,
        key: u64,
        loads: &[u64],
        pending: &[u64],
        b: &Bound,
        el: &[bool],
        hot: &[bool],
        cached: &[u64],
        prompt: u64,
        p: &CostParams,
    ) -> Option<usize> {
        let total: u64 = loads.iter().sum();
        let walk: Vec<usize> = r.walk(key).collect();
        // Half floor: held at half the floor, kept up to the floor. Mean:
        // held at the mean, kept under max(pure bound, the floor less the
        // fleet's mean, half the floor).
        let half = Bound {
            factor: b.factor,
            min_capacity: b.min_capacity * HOT_FLOOR_SHARE,
        };
        let mean = Bound {
            factor: 1.0,
            min_capacity: 0.0,
        };
        let receding = Bound {
            factor: b.factor,
            min_capacity: (b.min_capacity / 2.0)
                .max(b.min_capacity - (total as f64 + 1.0) / r.hosts() as f64),
        };
        let (held_at, kept_to) = match p.hot_rule {
            HotRule::HalfFloor => (half, *b),
            HotRule::Mean => (mean, receding),
        };
        let mut under: Vec<usize> = Vec::new();
        let mut firm = 0;
        for &h in &walk {
            if firm >= p.candidates as usize {
                break;
            }
            if !el[h] || loads[h] >= r.capacity(h, total, b) {
                continue;
            }
            // The mean rule's keep bound: unrounded after this request
            // (`within`) or rounded up before it (`ceil`).
            let over_keep = match (p.hot_rule, p.hot_keep) {
                (HotRule::Mean, HotKeep::Within) => {
                    let share = kept_to.factor * (total as f64 + 1.0) / r.hosts() as f64;
                    (loads[h] + 1) as f64 > share.max(kept_to.min_capacity) + EPSILON_S
                }
                _ => loads[h] >= r.capacity(h, total, &kept_to),
            };
            if hot[h] && over_keep {
                continue;
            }
            let held = hot[h] && loads[h] >= r.capacity(h, total, &held_at);
            if !held {
                firm += 1;
            }
            if !held || cached[h] as f64 >= HOT_KEEP_FRACTION * prompt as f64 {
                under.push(h);
            }
        }
        if under.is_empty() {
            return r.place(key, loads, b, el).map(|x| x.host);
        }
        // The smallest estimate; among equal ones (within EPSILON_S) the
        // lower load with `Ties::Load`, then the earlier on the walk.
        let est = |h: usize| p.estimate_s(loads[h], pending[h], prompt, cached[h]);
        let tmin = under.iter().map(|&h| est(h)).fold(f64::INFINITY, f64::min);
        let best = under
            .iter()
            .copied()
            .filter(|&h| est(h) <= tmin + EPSILON_S)
            .min_by_key(|&h| if p.ties == Ties::Load { loads[h] } else { 0 })
            .unwrap();
        let bt = est(best);
        // The longest cached prefix (first on ties) keeps it within the margin.
        if under.len() > 1 {
            let most = under.iter().map(|&h| cached[h]).max().unwrap_or(0);
            if most > 0 {
                let home = under.iter().copied().find(|&h| cached[h] == most).unwrap();
                let ht = p.estimate_s(loads[home], pending[home], prompt, cached[home]);
                if ht <= bt + p.stay_margin_s + EPSILON_S {
                    return Some(home);
                }
            }
        }
        Some(best)
    }

    #[test]
    fn learns_the_prefill_rate_from_clean_samples() {
        let s = |tokens, ms, ahead| PrefillSample {
            uncached_tokens: tokens,
            ttfb_ms: ms,
            ahead_tokens: ahead,
        };
        // 4,000 tokens in 250 ms = 16,000 tok/s; configured 64,000.
        let one = learn_prefill_rate(64_000.0, 64_000.0, &s(4_000, 250, 0)).unwrap();
        let want = (64_000f64.ln() + 0.2 * (16_000f64.ln() - 64_000f64.ln())).exp();
        assert!((one - want).abs() < 1e-6, "{one}");
        // Converges: 30 samples bring it within 1 % of the truth.
        let mut r = 64_000.0;
        for _ in 0..30 {
            r = learn_prefill_rate(r, 64_000.0, &s(4_000, 250, 0)).unwrap();
        }
        assert!((r / 16_000.0 - 1.0).abs() < 0.01, "{r}");
        // Unusable samples: work ahead, too small, no time.
        assert_eq!(learn_prefill_rate(r, 64_000.0, &s(4_000, 250, 1)), None);
        assert_eq!(learn_prefill_rate(r, 64_000.0, &s(511, 250, 0)), None);
        assert_eq!(learn_prefill_rate(r, 64_000.0, &s(4_000, 0, 0)), None);
        assert_eq!(learn_prefill_rate(r, 0.0, &s(4_000, 250, 0)), None);
        // Clamped to 8x either way, whatever the samples say.
        let mut r = 16_000.0;
        for _ in 0..200 {
            r = learn_prefill_rate(r, 16_000.0, &s(1_000_000, 1, 0)).unwrap();
        }
        assert_eq!(r, 128_000.0);
        for _ in 0..200 {
            r = learn_prefill_rate(r, 16_000.0, &s(512, 3_600_000, 0)).unwrap();
        }
        assert_eq!(r, 2_000.0);
        // A garbage current value restarts from the configured rate.
        let g = learn_prefill_rate(f64::NAN, 16_000.0, &s(4_000, 250, 0)).unwrap();
        assert!((g - 16_000.0).abs() < 1e-6);
        // The rate reaches the estimate.
        let p = CostParams::default().with_prefill_rate(8_000.0);
        assert_eq!(p.prefill_tokens_per_s, 8_000.0);
        assert!((p.estimate_s(0, 0, 32_000, 0) - 1.0).abs() < 1e-12);
        assert_eq!(
            CostParams::default().with_prefill_rate(-1.0),
            CostParams::default()
        );
    }

    #[test]
    fn pending_tokens_are_the_uncached_part() {
        let p = CostParams::default();
        assert_eq!(p.pending_tokens(12_000, 0), 3_000);
        assert_eq!(p.pending_tokens(12_000, 8_000), 1_000);
        assert_eq!(p.pending_tokens(12_001, 8_000), 1_001);
        assert_eq!(p.pending_tokens(12_000, 20_000), 0);
        assert_eq!(p.pending_tokens(u64::MAX, 0), u64::MAX / 4 + 1);
    }

    #[test]
    fn stays_with_the_cache_within_the_margin() {
        // Owner A holds 2,000 of the prompt's 3,000 tokens but has 2,500
        // uncached tokens pending: 2,500/16,000 + 1,000/16,000 = 0.21875 s.
        // B is idle and holds nothing: 3,000/16,000 = 0.1875 s, 0.03125 s
        // faster, within the default 0.1 s margin: A keeps it.
        let r = ring(4);
        let key = 777u64;
        let walk: Vec<usize> = r.walk(key).collect();
        let (a, b) = (walk[0], walk[1]);
        let chain: Vec<u64> = (1..=12).collect();
        let mut index = ix();
        index.observe(a, &chain[..8], 0);
        let bound = Bound::factor(100.0);
        let el = vec![true; 4];
        let loads = vec![1u64; 4];
        let mut pending = vec![1_000_000u64; 4];
        pending[a] = 2_500;
        pending[b] = 0;
        let p = CostParams::default();
        let at = |p: &CostParams, pending: &[u64]| {
            place(
                &r,
                key,
                &loads,
                &[],
                pending,
                &bound,
                &el,
                &[],
                &chain,
                12_000,
                &index,
                0,
                p,
            )
            .unwrap()
        };
        let c = at(&p, &pending);
        assert_eq!((c.host, c.cached_bytes), (a, 8_000));
        assert!((c.ttft_s - 0.21875).abs() < 1e-12);
        // Pure argmin moves it.
        let argmin = CostParams {
            stay_margin_s: 0.0,
            ..p
        };
        assert_eq!(at(&argmin, &pending).host, b);
        // 4,000 more pending tokens at A (0.25 s more): beyond the margin.
        pending[a] = 6_500;
        assert_eq!(at(&p, &pending).host, b);
        // The margin never overrides the bound: A over capacity is not a candidate.
        pending[a] = 2_500;
        let mut busy = loads.clone();
        busy[a] = 9;
        let tight = Bound {
            factor: 1.25,
            min_capacity: 0.0,
        };
        let c = place(
            &r,
            key,
            &busy,
            &[],
            &pending,
            &tight,
            &el,
            &[],
            &chain,
            12_000,
            &index,
            0,
            &p,
        )
        .unwrap();
        assert_ne!(c.host, a);
    }

    proptest! {
        #[test]
        fn bound_kept_and_matches_reference(
            n in 1usize..9,
            key in any::<u64>(),
            loads in proptest::collection::vec(0u64..20, 8),
            ejected in proptest::collection::vec(any::<bool>(), 8),
            held in proptest::collection::vec(0usize..6, 8),
            cands in 1u32..6,
            c in 1.0f64..2.0,
            floor in 0.0f64..4.0,
            service in 0.0f64..2.0,
            pending in proptest::collection::vec(0u64..200_000, 8),
            tokens in any::<bool>(),
            margin in prop_oneof![Just(0.0f64), 0.0f64..0.5],
            hot in proptest::collection::vec(any::<bool>(), 8),
            load_ties in any::<bool>(),
            mean_rule in any::<bool>(),
            within in any::<bool>(),
        ) {
            let r = ring(n);
            let loads = &loads[..n];
            let mut el: Vec<bool> = ejected[..n].iter().map(|e| !e).collect();
            if !el.iter().any(|e| *e) { el.iter_mut().for_each(|e| *e = true); }
            let bound = Bound { factor: c, min_capacity: floor };
            let queue = if tokens { QueueMode::Tokens } else { QueueMode::Requests };
            let ties = if load_ties { Ties::Load } else { Ties::Ring };
            let hot_rule = if mean_rule { HotRule::Mean } else { HotRule::HalfFloor };
            let hot_keep = if within { HotKeep::Within } else { HotKeep::Ceil };
            let p = CostParams { service_s: service, candidates: cands, queue, stay_margin_s: margin, ties, hot_rule, hot_keep, ..CostParams::default() };
            let pending = &pending[..n];
            let chain: Vec<u64> = (1..=5).collect();
            let mut index = ix();
            for h in 0..n { index.observe(h, &chain[..held[h]], 0); }
            let cached: Vec<u64> = (0..n).map(|h| held[h] as u64 * 1000).collect();
            let hot = &hot[..n];
            let got = place(&r, key, loads, &[], pending, &bound, &el, hot, &chain, 5000, &index, 0, &p).unwrap();
            let want = naive(&r, key, loads, pending, &bound, &el, hot, &cached, 5000, &p).unwrap();
            prop_assert_eq!(got.host, want);
            // The bound: never a host at/over capacity when an eligible one is
            // under; and a hot host is held to its hot bound (half the floor,
            // or with the mean rule the fleet's mean), and for a prompt it
            // holds half of to its keep bound (the floor, or with the mean
            // rule the pure bound or the floor less the fleet's mean, at
            // least half the floor).
            let total: u64 = loads.iter().sum();
            let half = Bound { factor: c, min_capacity: floor * HOT_FLOOR_SHARE };
            let mean = Bound { factor: 1.0, min_capacity: 0.0 };
            let receding = Bound {
                factor: c,
                min_capacity: (floor / 2.0).max(floor - (total as f64 + 1.0) / n as f64),
            };
            let (pure, keep) = if mean_rule { (mean, receding) } else { (half, bound) };
            let cap = |h: usize| r.capacity(h, total, if hot[h] { &pure } else { &bound });
            let any_under = (0..n).any(|h| el[h] && loads[h] < cap(h));
            if any_under {
                prop_assert!(el[got.host]);
                prop_assert!(loads[got.host] < r.capacity(got.host, total, &bound));
                if loads[got.host] >= cap(got.host) {
                    prop_assert!(got.cached_bytes as f64 >= HOT_KEEP_FRACTION * 5000.0);
                }
            }
            // With every host eligible and hot, nobody at or over the hot
            // bound but for a prompt it holds at least half of.
            let all_hot = vec![true; n];
            let everyone = vec![true; n];
            let g = place(&r, key, loads, &[], pending, &bound, &everyone, &all_hot, &chain, 5000, &index, 0, &p).unwrap();
            if loads[g.host] >= r.capacity(g.host, total, &pure) {
                prop_assert!(g.cached_bytes as f64 >= HOT_KEEP_FRACTION * 5000.0);
                prop_assert!(loads[g.host] < r.capacity(g.host, total, &bound));
                // Unless nobody was under its keep bound (then the ring
                // decides); with the mean rule's `within`, one more request
                // keeps it within the unrounded bound.
                let under_keep = |h: usize| {
                    if mean_rule && within {
                        let share = c * (total as f64 + 1.0) / n as f64;
                        ((loads[h] + 1) as f64) <= share.max(keep.min_capacity) + EPSILON_S
                    } else {
                        loads[h] < r.capacity(h, total, &keep)
                    }
                };
                if (0..n).any(under_keep) {
                    prop_assert!(under_keep(g.host));
                }
            }
            // Without hot hosts nothing is counted as skipped for heat.
            let cold = place(&r, key, loads, &[], pending, &bound, &el, &[], &chain, 5000, &index, 0, &p).unwrap();
            prop_assert_eq!(cold.hot_skipped, 0);
            // One candidate is plain bounded loads.
            let one = CostParams { candidates: 1, ..p };
            let g1 = place(&r, key, loads, &[], pending, &bound, &el, &[], &chain, 5000, &index, 0, &one).unwrap();
            prop_assert_eq!(g1.host, r.place(key, loads, &bound, &el).unwrap().host);
        }
    }
}
