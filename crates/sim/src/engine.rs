//! The discrete-event engine.
//!
//! ## Clock and events
//! Virtual time in seconds (`f64`), no wall clock. The next event is the
//! earliest of: a replica event (first token / completion, from
//! [`Replica::next_event_time`]), a load-report delivery, a load-report
//! sample, a request arrival. Ties are processed in that order (a
//! completion at `t` frees capacity before an arrival at `t` is routed),
//! replicas by index, arrivals by request index. Every choice that could
//! vary is seeded, so a run is a pure function of (workload, policy,
//! config).
//!
//! ## Load signal
//! Each router instance ("proxy") counts its own in-flight requests per
//! replica, updated immediately (as the filter's shared-data counters are).
//! Each also counts its requests per replica that have no first token yet
//! (the filter: no response byte yet).
//! Replica reports (waiting, running, KV usage) reach the filter's policies
//! (`prefix-router`, `prefix-router-cost`) as the filter's default config
//! gets them: ORCA on the proxy's own responses, at each first token, each
//! proxy its own, with its own in-flight and pending counts at that moment
//! (`orca_reports`). Every other reader (GIE's picker, which scrapes) sees
//! samples taken every `report_interval_s`, visible `report_delay_s` later;
//! `orca_reports = false` gives the filter's policies those samples too
//! (a `scrape` at that period), each proxy's copy with its own in-flight
//! and pending counts as of the sample's arrival, as the filter records
//! them; `scrape_interval_s` gives them, besides ORCA, one sample a period
//! (the filter's `scrape`), the proxies staggered over it. Interval 0
//! turns the samples off.
//!
//! ## Multi-proxy
//! With `proxies = K`, K independent instances of the policy route requests
//! in turn (request i to instance i mod K); each keeps its own in-flight
//! counts and learned state, reports and the replicas are shared. With index
//! gossip (`prefix-router-cost:gossip_ms=D`) what one proxy learns at a
//! first token reaches the others D seconds later ([`Policy::gossip_out`],
//! [`Policy::gossip_in`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;

use prefix_router_replica::{CostModel, Event, Replica};

use crate::input::RouteInput;
use crate::metrics::{Collector, RunResult};
use crate::policy::{Outcome, Policy, PolicySpec, Snapshot, View};
use crate::workload::Workload;

/// Simulation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Number of replicas.
    pub replicas: usize,
    /// Replica cost model (shared with the HTTP backend simulator).
    pub cost: CostModel,
    /// Router instances.
    pub proxies: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Arrival-time compression: session starts and think times are divided
    /// by this (2 = twice the offered load).
    pub rate_scale: f64,
    /// Report sampling period, seconds (0: no reports).
    pub report_interval_s: f64,
    /// Extra delay before a sampled report is visible, seconds.
    pub report_delay_s: f64,
    /// Policies that read ORCA reports (the filter's) get a replica's
    /// report only with their own responses' first tokens, each proxy its
    /// own, instead of every sample (`--sampled-reports` turns it off).
    pub orca_reports: bool,
    /// The filter's `scrape` (`scrape.interval_ms`), seconds (0: off): with
    /// ORCA, each of the filter's proxies also reads one sample in every
    /// `scrape_interval_s / report_interval_s`, the proxies' scrapes
    /// staggered over the period.
    pub scrape_interval_s: f64,
    /// Load-balance window, seconds.
    pub window_s: f64,
    /// Busy-balance window, seconds (see [`crate::metrics`]).
    pub busy_window_s: f64,
    /// Replicas keep the KV of generated tokens (vLLM does): a finished chat
    /// turn leaves prompt + answer cached for the next turn.
    pub output_kv: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            replicas: 8,
            cost: CostModel::default(),
            proxies: 1,
            seed: 1,
            rate_scale: 1.0,
            report_interval_s: 0.05,
            report_delay_s: 0.0,
            orca_reports: true,
            scrape_interval_s: 0.0,
            window_s: 60.0,
            busy_window_s: 5.0,
            output_kv: true,
        }
    }
}

/// Why a run could not be done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError(pub String);

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}

fn tbits(t: f64) -> u64 {
    // Times are finite and >= 0: their bit patterns sort like the numbers.
    t.max(0.0).to_bits()
}

/// Proxy `p`'s count at replica `h` as a report carries it.
fn count_at(counts: &[Vec<u64>], p: usize, h: usize) -> Option<u32> {
    counts
        .get(p)
        .and_then(|v| v.get(h))
        .map(|&c| c.min(u64::from(u32::MAX)) as u32)
}

/// Whether proxy `p` of `proxies` scrapes sample `sample`
/// ([`SimConfig::scrape_interval_s`]; every sample with `--sampled-reports`).
fn scrapes(cfg: &SimConfig, sample: u64, p: usize, proxies: usize) -> bool {
    if !cfg.orca_reports {
        return true;
    }
    if cfg.scrape_interval_s <= 0.0 || cfg.report_interval_s <= 0.0 {
        return false;
    }
    // `as` saturates; at least one sample a period.
    let every = ((cfg.scrape_interval_s / cfg.report_interval_s).round() as u64).max(1);
    let offset = p as u64 * every / proxies.max(1) as u64;
    (sample + offset).is_multiple_of(every)
}

/// Make sampled reports visible: to every policy as they are, and to the
/// filter's policies that scrape this sample ([`scrapes`]) each proxy's copy with its own
/// in-flight and pending counts at the replica as of now, as the filter's
/// scrape records them when the sample arrives
/// ([`prefix_router_core::host_state::record_report`]).
fn publish(
    (sample, snaps): (u64, Vec<Snapshot>),
    reports: &mut [Option<Snapshot>],
    orca: &mut [Vec<Option<Snapshot>>],
    inflight: &[Vec<u64>],
    pending: &[Vec<u64>],
    cfg: &SimConfig,
) {
    let proxies = orca.len();
    for (p, mine) in orca.iter_mut().enumerate() {
        if scrapes(cfg, sample, p, proxies) {
            for (h, (slot, s)) in mine.iter_mut().zip(&snaps).enumerate() {
                *slot = Some(Snapshot {
                    own: count_at(inflight, p, h),
                    own_pending: count_at(pending, p, h),
                    ..*s
                });
            }
        }
    }
    for (r, s) in reports.iter_mut().zip(snaps) {
        *r = Some(s);
    }
}

/// Run `spec` on `wl`.
pub fn simulate(wl: &Workload, spec: &PolicySpec, cfg: &SimConfig) -> Result<RunResult, SimError> {
    if cfg.replicas == 0 || cfg.replicas > 4096 {
        return Err(SimError(format!(
            "replicas must be 1..=4096, got {}",
            cfg.replicas
        )));
    }
    if cfg.proxies == 0 {
        return Err(SimError("proxies must be >= 1".into()));
    }
    if !(cfg.rate_scale.is_finite() && cfg.rate_scale > 0.0) {
        return Err(SimError(format!(
            "rate scale must be > 0, got {}",
            cfg.rate_scale
        )));
    }
    if cfg.cost.block_tokens != wl.block_tokens {
        return Err(SimError(format!(
            "workload hashed for {}-token blocks, replicas use {}",
            wl.block_tokens, cfg.cost.block_tokens
        )));
    }
    let n = cfg.replicas;
    let k = cfg.proxies;
    let mut policies: Vec<Box<dyn Policy>> = spec
        .build_fleet(n, cfg.seed, k, Some(cfg.cost.cache_capacity_tokens))
        .map_err(|e| SimError(e.to_string()))?;
    let mut replicas: Vec<Replica> = (0..n).map(|_| Replica::new(cfg.cost.clone())).collect();
    let mut inflight = vec![vec![0u64; n]; k];
    let mut pending = vec![vec![0u64; n]; k];
    let mut reports: Vec<Option<Snapshot>> = vec![None; n];
    // What each of the filter's proxies has read: with `orca_reports` the
    // reports on its own responses, else its copies of the samples
    // ([`publish`]).
    let mut orca: Vec<Vec<Option<Snapshot>>> = vec![vec![None; n]; k];
    let mut deliveries: VecDeque<(f64, (u64, Vec<Snapshot>))> = VecDeque::new();
    let reports_on = cfg.report_interval_s > 0.0;
    let mut sample_k: u64 = 0;
    // Index gossip between proxies: (arrival time, sender, batch); the delay
    // is the same for every proxy, so arrivals come in order.
    let gossip_delay = if k > 1 {
        policies.first().and_then(|p| p.gossip_delay_s())
    } else {
        None
    };
    let mut gossip: VecDeque<(f64, usize, Vec<u8>)> = VecDeque::new();

    // Per-request routing state.
    let mut proxy_of = vec![u32::MAX; wl.len()];
    let mut host_of = vec![u32::MAX; wl.len()];

    let mut arrivals: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
    for s in &wl.sessions {
        if let Some(&r) = s.requests.first() {
            arrivals.push(Reverse((tbits(s.start / cfg.rate_scale), r)));
        }
    }
    let mut col = Collector::new(wl, cfg);
    let mut alive: u64 = 0;
    let mut routed: u64 = 0;
    let mut now = 0.0f64;

    loop {
        // Earliest replica event.
        let mut tr = f64::INFINITY;
        let mut ri = usize::MAX;
        for (i, r) in replicas.iter().enumerate() {
            if let Some(t) = r.next_event_time() {
                if t < tr {
                    tr = t;
                    ri = i;
                }
            }
        }
        let ta = arrivals
            .peek()
            .map(|Reverse((b, _))| f64::from_bits(*b))
            .unwrap_or(f64::INFINITY);
        let td = deliveries.front().map(|d| d.0).unwrap_or(f64::INFINITY);
        let tg = gossip.front().map(|g| g.0).unwrap_or(f64::INFINITY);
        let ts = if reports_on && (alive > 0 || ta.is_finite()) {
            let mut t = sample_k as f64 * cfg.report_interval_s;
            if alive == 0 && t < ta {
                // Idle: skip to the last sampling tick before the arrival.
                sample_k = sample_k.max((ta / cfg.report_interval_s).floor() as u64);
                t = sample_k as f64 * cfg.report_interval_s;
            }
            t
        } else {
            f64::INFINITY
        };
        let t = tr.min(ta).min(td).min(ts).min(tg);
        if !t.is_finite() {
            break;
        }
        now = now.max(t);

        if tr <= t {
            let Some(rep) = replicas.get_mut(ri) else {
                break;
            };
            let events = rep.advance(tr);
            for ev in events {
                match ev {
                    Event::FirstToken {
                        req_id,
                        t,
                        cached_tokens,
                    } => {
                        col.first_token(req_id as usize, t, cached_tokens);
                        let p = proxy_of.get(req_id as usize).copied().unwrap_or(0) as usize;
                        if let Some(c) = pending.get_mut(p).and_then(|v| v.get_mut(ri)) {
                            *c = c.saturating_sub(1);
                        }
                        if cfg.orca_reports {
                            // The ORCA header rides on the response's
                            // headers: the replica's counts now, and this
                            // proxy's own requests there now.
                            let (own, own_pending) =
                                (count_at(&inflight, p, ri), count_at(&pending, p, ri));
                            if let Some(slot) = orca.get_mut(p).and_then(|v| v.get_mut(ri)) {
                                *slot = Some(Snapshot {
                                    waiting: rep.num_waiting() as u32,
                                    running: rep.num_running() as u32,
                                    kv_usage: rep.kv_usage(),
                                    at: t,
                                    own,
                                    own_pending,
                                });
                            }
                        }
                        if let Some(pol) = policies.get_mut(p) {
                            pol.on_first_token_at(req_id, ri, t);
                            if let Some(d) = gossip_delay {
                                if let Some(b) = pol.gossip_out() {
                                    gossip.push_back((t + d, p, b));
                                }
                            }
                        }
                    }
                    Event::Done { req_id, t } => {
                        let id = req_id as usize;
                        col.done(id, t, ri);
                        alive = alive.saturating_sub(1);
                        let p = proxy_of.get(id).copied().unwrap_or(0) as usize;
                        let h = host_of.get(id).copied().unwrap_or(0) as usize;
                        if let Some(c) = inflight.get_mut(p).and_then(|v| v.get_mut(h)) {
                            *c = c.saturating_sub(1);
                        }
                        if let Some(pol) = policies.get_mut(p) {
                            pol.on_done_at(req_id, h, t);
                        }
                        if cfg.output_kv {
                            if let Some(m) = wl.requests.get(id).and_then(|r| r.remember.as_ref()) {
                                rep.remember(m);
                            }
                        }
                        // Release the session's next turn.
                        if let Some(r) = wl.requests.get(id) {
                            if let Some(s) = wl.sessions.get(r.session as usize) {
                                let next = r.turn as usize + 1;
                                if let Some(&nr) = s.requests.get(next) {
                                    let think = s.think.get(next).copied().unwrap_or(0.0);
                                    arrivals.push(Reverse((tbits(t + think / cfg.rate_scale), nr)));
                                }
                            }
                        }
                    }
                }
            }
            continue;
        }
        if tg <= t {
            if let Some((_, from, batch)) = gossip.pop_front() {
                for (i, pol) in policies.iter_mut().enumerate() {
                    if i != from {
                        pol.gossip_in(&batch, t);
                    }
                }
            }
            continue;
        }
        if td <= t {
            if let Some((_, sample)) = deliveries.pop_front() {
                publish(sample, &mut reports, &mut orca, &inflight, &pending, cfg);
            }
            continue;
        }
        if ts <= t {
            let at = t + cfg.report_delay_s;
            let snaps: Vec<Snapshot> = replicas
                .iter_mut()
                .map(|r| {
                    // No replica has an event before t (it would have been
                    // processed first), so this only moves its clock.
                    let _ = r.advance(t);
                    Snapshot {
                        waiting: r.num_waiting() as u32,
                        running: r.num_running() as u32,
                        kv_usage: r.kv_usage(),
                        at,
                        own: None,
                        own_pending: None,
                    }
                })
                .collect();
            if cfg.report_delay_s > 0.0 {
                deliveries.push_back((at, (sample_k, snaps)));
            } else {
                publish(
                    (sample_k, snaps),
                    &mut reports,
                    &mut orca,
                    &inflight,
                    &pending,
                    cfg,
                );
            }
            sample_k += 1;
            continue;
        }
        // Arrival.
        let Some(Reverse((_, idx))) = arrivals.pop() else {
            break;
        };
        let id = idx as usize;
        let Some(req) = wl.requests.get(id) else {
            return Err(SimError(format!("request {id} out of range")));
        };
        let p = (routed % k as u64) as usize;
        routed += 1;
        let input = RouteInput::new(wl, req, idx as u64);
        let Some(pol) = policies.get_mut(p) else {
            break;
        };
        let own = inflight.get(p).map(|v| v.as_slice()).unwrap_or(&[]);
        let seen = match orca.get(p) {
            Some(o) if pol.reads_orca() => o.as_slice(),
            _ => reports.as_slice(),
        };
        let view = View {
            now: t,
            inflight: own,
            pending: pending.get(p).map(|v| v.as_slice()).unwrap_or(&[]),
            reports: seen,
            replicas: &replicas,
        };
        let mut choice = pol.route(&input, &view);
        if choice.host >= n {
            choice.host %= n;
            choice.outcome = Outcome::Fallback;
        }
        drop(input);
        let h = choice.host;
        if let Some(c) = inflight.get_mut(p).and_then(|v| v.get_mut(h)) {
            *c += 1;
        }
        if let Some(c) = pending.get_mut(p).and_then(|v| v.get_mut(h)) {
            *c += 1;
        }
        if let Some(x) = proxy_of.get_mut(id) {
            *x = p as u32;
        }
        if let Some(x) = host_of.get_mut(id) {
            *x = h as u32;
        }
        col.arrive(id, t, h, choice.outcome);
        alive += 1;
        let Some(rep) = replicas.get_mut(h) else {
            break;
        };
        rep.submit(idx as u64, req.prompt.clone(), req.output_tokens, t)
            .map_err(|e| SimError(format!("request {id}: {e}")))?;
    }
    let mut res = col.finish(&spec.label, now, &replicas);
    res.credited_tokens = policies
        .iter()
        .map(|p| p.credited_tokens())
        .try_fold(0u64, |a, c| c.map(|c| a.saturating_add(c)));
    // With K proxies each learns its own rate: report their mean.
    let learned: Option<Vec<f64>> = policies.iter().map(|p| p.learned_prefill_tps()).collect();
    res.learned_prefill_tps = learned
        .filter(|v| !v.is_empty())
        .map(|v| v.iter().sum::<f64>() / v.len() as f64);
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_reaches_each_filter_proxy_with_its_own_counts_as_of_its_arrival() {
        let snap = |waiting| Snapshot {
            waiting,
            running: 4,
            kv_usage: 0.5,
            at: 2.0,
            own: None,
            own_pending: None,
        };
        let mut reports = vec![None; 2];
        let mut mine = vec![vec![None; 2]; 2];
        let inflight = vec![vec![3, 0], vec![1, 2]];
        let pending = vec![vec![2, 0], vec![0, 1]];
        let sampled = SimConfig {
            orca_reports: false,
            ..SimConfig::default()
        };
        publish(
            (0, vec![snap(5), snap(6)]),
            &mut reports,
            &mut mine,
            &inflight,
            &pending,
            &sampled,
        );
        // Every reader sees the sample as the replica wrote it...
        assert_eq!(reports, vec![Some(snap(5)), Some(snap(6))]);
        // ...and each filter proxy records its own requests there now, as
        // the filter's scrape does when the sample arrives.
        let own =
            |p: usize, h: usize| mine[p][h].map(|s: Snapshot| (s.waiting, s.own, s.own_pending));
        assert_eq!(own(0, 0), Some((5, Some(3), Some(2))));
        assert_eq!(own(1, 1), Some((6, Some(2), Some(1))));
        // With ORCA the filter's proxies read only their own responses'.
        let mut orca = vec![vec![None; 2]; 2];
        publish(
            (0, vec![snap(5), snap(6)]),
            &mut reports,
            &mut orca,
            &inflight,
            &pending,
            &SimConfig::default(),
        );
        assert_eq!(orca, vec![vec![None; 2]; 2]);
    }

    #[test]
    fn with_the_scrape_each_filter_proxy_reads_one_sample_a_period_staggered() {
        // 1 s scrape over 50 ms samples: every 20th sample, the 4 proxies
        // 5 samples apart.
        let cfg = SimConfig {
            scrape_interval_s: 1.0,
            ..SimConfig::default()
        };
        let read: Vec<Vec<u64>> = (0..4)
            .map(|p| (0..40).filter(|&k| scrapes(&cfg, k, p, 4)).collect())
            .collect();
        assert_eq!(
            read,
            vec![vec![0, 20], vec![15, 35], vec![10, 30], vec![5, 25]]
        );
        // Off by default; every sample with `--sampled-reports`.
        assert!((0..40).all(|k| !scrapes(&SimConfig::default(), k, 0, 1)));
        let sampled = SimConfig {
            orca_reports: false,
            ..SimConfig::default()
        };
        assert!((0..40).all(|k| scrapes(&sampled, k, 3, 4)));
    }
}
