//! Host load: the router's own in-flight counts and the queue depth replicas
//! report.
//!
//! ## Effective load
//! `load_h = inflight_h + others_h` ([`HostLoad::effective`]) where
//! `inflight_h` counts the requests this proxy (all its worker threads) has
//! routed to `h` and not yet finished, and `others_h` is what the replica's
//! last report (if younger than `report_ttl_ms`) counts beyond this proxy's
//! own requests at the time of the report: waiting + running requests that
//! other proxies or clients sent ([`HostLoad::others`]). Unlike the queue
//! a request would wait in, which fades with the report's age
//! ([`Freshness`]), this count does not fade: admitted requests stay in
//! the replica until they finish. With one proxy and
//! no other clients this is exactly the in-flight count; with several, the
//! fleet's. One notion of load feeds the bound, so the ring's guarantee
//! (some host is always under capacity) still holds.
//!
//! ## Recent load
//! [`LoadTrend`] keeps, per host, an exponential moving average of the
//! effective load over time (time constant `hot_window_s`), sampled at
//! each decision: the cost rule's hot-host rule ([`crate::cost`]) compares
//! it with the fleet's mean.
//!
//! ## Reports
//! - ORCA `endpoint-load-metrics` (what vLLM sends when the request carries
//!   `endpoint-load-metrics-format`): `TEXT named_metrics.a=1.0, named_metrics.b=2`
//!   or `JSON {"named_metrics": {"a": 1.0}}`; the configured named metrics are
//!   summed. Top-level ORCA fields (`rps_fractional`, `cpu_utilization` …) are
//!   ignored.
//! - a plain header (e.g. `x-queue-depth: 3`).
//!
//! ## Sharing across worker threads
//! Envoy runs one wasm VM per worker thread. In-flight counts and reports live
//! in proxy-wasm shared data (process-wide), one record per host
//! ([`crate::host_state`]), reached through the small
//! [`crate::store::SharedStore`] trait so this module has no
//! proxy-wasm dependency. Counts are updated with compare-and-swap retry
//! loops: no lost updates.

use serde::Deserialize;
use std::collections::HashMap;

/// Replica-reported load, with the time it was received.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// Queue depth: requests waiting to be admitted (sum of the configured
    /// queue metrics).
    pub queue: f64,
    /// Requests the replica is running (prefilling or decoding; sum of the
    /// configured running metrics, 0 when none are configured or reported).
    /// Counted in the load the bound sees, not in the queue the cost rule
    /// prices.
    pub running: f64,
    /// This proxy's own in-flight requests at the host when the report was
    /// taken: they are part of the replica's counts, so the report's
    /// requests beyond them are someone else's ([`HostLoad::others`]).
    pub own: u64,
    /// This proxy's pending requests at the host when the report was
    /// taken ([`HostLoad::pending_requests`]): they are in the replica's
    /// waiting count (or prefilling), and [`HostLoad::fresh_queue`] counts
    /// them live instead.
    pub own_pending: u64,
    /// When it was received (ms, host clock).
    pub at_ms: u64,
}

/// How much a report's waiting count counts as it ages: fully when it
/// arrives, then linearly less until `fade_ms` (`load.report_fade_ms`;
/// 0 = no fading), and not at all past `ttl_ms` (`load.report_ttl_ms`),
/// when the whole report stops counting.
///
/// A report is a snapshot, and no new report comes from a replica this
/// proxy stops sending to. Its waiting requests are admitted within about
/// a prefill's time, so a busy queue goes stale in a second or two; fading
/// lets it expire at that pace instead of pricing the replica out (and
/// marking it hot) for the whole TTL. Only the queue fades: in the
/// bound's load ([`HostLoad::others`]) waiting and running requests hold
/// until the TTL, as admitted requests stay in the replica until they
/// finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Reports older than this count 0.
    pub ttl_ms: u64,
    /// Reports count `1 - age / fade_ms` (0 = fully until `ttl_ms`).
    pub fade_ms: u64,
}

impl Freshness {
    /// A step at `ttl_ms`: full weight, then none.
    pub const fn ttl(ttl_ms: u64) -> Freshness {
        Freshness { ttl_ms, fade_ms: 0 }
    }

    /// The weight of a report `age_ms` old, in `0.0..=1.0`.
    pub fn weight(&self, age_ms: u64) -> f64 {
        if age_ms > self.ttl_ms {
            0.0
        } else if self.fade_ms == 0 {
            1.0
        } else {
            (1.0 - age_ms as f64 / self.fade_ms as f64).max(0.0)
        }
    }

    /// A reported count `n` weighted for a report `age_ms` old, rounded up
    /// to whole requests: `n` itself while fresh, 0 only once faded.
    pub fn scale(&self, n: u64, age_ms: u64) -> u64 {
        let w = self.weight(age_ms);
        if w >= 1.0 {
            n
        } else {
            // `as` saturates; n * w < n.
            (n as f64 * w).ceil() as u64
        }
    }
}

/// What the router knows about one host.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostLoad {
    /// Requests routed by this proxy and not yet finished.
    pub inflight: u64,
    /// Requests routed by this proxy with no response byte yet: waiting
    /// at the replica or in their prefill (a stream's first byte is its
    /// first token; vLLM and SGLang send a stream's head before it). 0
    /// when the caller does not track it.
    pub pending_requests: u64,
    /// Last report, if any.
    pub report: Option<Report>,
    /// Out of rotation (passive health), see [`crate::health`].
    pub ejected: bool,
    /// Prompt tokens of the requests this router sent to the host that
    /// have not yet produced a first token: prefill work ahead of a new
    /// request. Read only by the cost rule with `queue = "tokens"`
    /// ([`crate::cost`]); 0 when the caller does not track it.
    pub pending_prefill_tokens: u64,
    /// Pending prefill tokens other Envoys reported at this host (load
    /// gossip, [`crate::gossip::read_peer_pending`]); 0 without it. Read
    /// by the cost rule ([`HostLoad::pending_ahead`]).
    pub peer_pending_tokens: u64,
    /// The host's recent effective load ([`LoadTrend`], written by
    /// [`crate::Router::track_recent`]); 0 when the caller does not track
    /// it. Read only by the cost rule's hot-host rule.
    pub recent: f64,
}

impl HostLoad {
    /// The fresh reported queue depth (0 without a fresh report), weighted
    /// by the report's age ([`Freshness::weight`]).
    pub fn reported(&self, now_ms: u64, f: Freshness) -> u64 {
        match self.report {
            Some(r) if r.queue.is_finite() => f.scale(
                r.queue.max(0.0).ceil() as u64,
                now_ms.saturating_sub(r.at_ms),
            ),
            _ => 0,
        }
    }

    /// The priced spill's `q` for a first turn ([`crate::spill`]); `None`
    /// without a fresh report. The report's waiting requests beyond this
    /// proxy's pending ones at the time, weighted by the report's age
    /// ([`Freshness::weight`]), plus this proxy's pending requests now:
    /// its own part of the queue is known live, only the rest must come
    /// from the report. With ORCA a proxy hears from a replica only on its
    /// own responses, so a busy replica's report is old exactly when its
    /// queue matters (several proxies: older still); in the simulator's
    /// suite with reports as ORCA delivers them, this estimate against
    /// the faded report alone gives TTFT p90 0.84x (tune half) and 0.91x
    /// (check half), docs/design.md.
    pub fn fresh_queue(&self, now_ms: u64, f: Freshness) -> Option<f64> {
        let r = self.report?;
        self.faded_waiting(now_ms, f, r.own_pending)
            .map(|others| others + self.pending_requests as f64)
    }

    /// The replica's own fresh report of its queue, weighted by the
    /// report's age ([`Freshness::weight`]); `None` without a fresh report.
    /// What the priced spill weighs for a later turn: every proxy that
    /// heard the same report weighs the same queue, so nothing only this
    /// proxy knows moves a conversation (its own pending requests are in
    /// the report as the replica counted them).
    pub fn reported_queue(&self, now_ms: u64, f: Freshness) -> Option<f64> {
        self.faded_waiting(now_ms, f, 0)
    }

    /// The fresh report's waiting requests beyond `less` of them, weighted
    /// by the report's age; `None` without a fresh report.
    fn faded_waiting(&self, now_ms: u64, f: Freshness, less: u64) -> Option<f64> {
        let r = self.report?;
        let age = now_ms.saturating_sub(r.at_ms);
        // `as` is exact: counts of requests are far below 2^53.
        (age <= f.ttl_ms && r.queue.is_finite())
            .then(|| (r.queue.max(0.0) - less as f64).max(0.0) * f.weight(age))
    }

    /// Requests in the replica that are someone else's (other proxies,
    /// direct clients): the fresh report's waiting + running requests
    /// beyond this proxy's own in flight there when the report was taken
    /// (0 without a fresh report). Subtracting the proxy's own count as of
    /// the report, not as of now, keeps a report that lags behind this
    /// proxy's own requests from counting them twice or after they ended.
    /// Waiting and running alike count at full weight until the TTL: an
    /// admitted request does not leave the replica, it decodes there, so
    /// the replica's load falls only as requests finish. (Only the queue
    /// a request would wait in fades, [`HostLoad::reported_queue`].)
    pub fn others(&self, now_ms: u64, f: Freshness) -> u64 {
        match self.report {
            Some(r) => {
                let age = now_ms.saturating_sub(r.at_ms);
                if age > f.ttl_ms {
                    return 0;
                }
                let t = r.queue.max(0.0) + r.running.max(0.0);
                // `as` saturates (and maps NaN to 0).
                (t.ceil() as u64).saturating_sub(r.own)
            }
            _ => 0,
        }
    }

    /// The load the bound counts: this proxy's in-flight requests plus
    /// [`HostLoad::others`] (with one proxy and no other clients, exactly
    /// its in-flight count; with several, the fleet's).
    pub fn effective(&self, now_ms: u64, f: Freshness) -> u64 {
        self.inflight.saturating_add(self.others(now_ms, f))
    }
}

/// Why a load report header was not understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportError(pub String);

/// Parse an ORCA `endpoint-load-metrics` value and sum `metrics`.
/// Returns `Ok(None)` when none of the metrics is present.
pub fn parse_orca(value: &str, metrics: &[String]) -> Result<Option<f64>, ReportError> {
    let v = value.trim();
    if let Some(rest) = strip_prefix_ci(v, "TEXT") {
        let mut sum = 0.0;
        let mut any = false;
        for item in rest.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (k, val) = item
                .split_once('=')
                .ok_or_else(|| ReportError(format!("ORCA TEXT item without '=': {item:?}")))?;
            let Some(name) = k.trim().strip_prefix("named_metrics.") else {
                continue;
            };
            if metrics.iter().any(|m| m == name) {
                let x: f64 = val
                    .trim()
                    .parse()
                    .map_err(|_| ReportError(format!("ORCA value not a number: {item:?}")))?;
                sum += in_range(x, item)?;
                any = true;
            }
        }
        Ok(any.then_some(sum))
    } else if let Some(rest) = strip_prefix_ci(v, "JSON") {
        #[derive(Deserialize)]
        struct Orca {
            #[serde(default)]
            named_metrics: HashMap<String, f64>,
        }
        let o: Orca = serde_json::from_str(rest.trim())
            .map_err(|e| ReportError(format!("ORCA JSON: {e}")))?;
        let mut sum = 0.0;
        let mut any = false;
        for m in metrics {
            if let Some(&x) = o.named_metrics.get(m) {
                sum += in_range(x, m)?;
                any = true;
            }
        }
        Ok(any.then_some(sum))
    } else {
        Err(ReportError(format!(
            "ORCA format not TEXT or JSON (BIN is not supported): {:?}",
            v.get(..v.len().min(16)).unwrap_or("")
        )))
    }
}

/// A request count must be finite and not negative: a report of `inf`
/// running requests would hold its replica over every bound until it
/// expired (serde_json never yields a non-finite number; `parse` does).
fn in_range(x: f64, item: &str) -> Result<f64, ReportError> {
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(ReportError(format!("ORCA value out of range: {item:?}")))
    }
}

/// Parse a plain queue-depth header.
pub fn parse_queue_header(value: &str) -> Result<f64, ReportError> {
    let x: f64 = value
        .trim()
        .parse()
        .map_err(|_| ReportError(format!("queue depth not a number: {value:?}")))?;
    if !x.is_finite() || x < 0.0 {
        return Err(ReportError(format!("queue depth out of range: {value:?}")));
    }
    Ok(x)
}

fn strip_prefix_ci<'a>(s: &'a str, p: &str) -> Option<&'a str> {
    let head = s.get(..p.len())?;
    if head.eq_ignore_ascii_case(p) {
        s.get(p.len()..)
    } else {
        None
    }
}

/// Each host's recent load: an exponential moving average over time of its
/// effective load, with time constant `tau_s` seconds.
///
/// Sampled at decisions ([`LoadTrend::observe`]): after `dt` seconds the
/// average moves `1 - exp(-dt / tau_s)` of the way to the load seen now, so
/// it weighs the last `tau_s` seconds most whatever the request rate. The
/// load seen at a sample stands for the whole interval before it (a sample
/// and hold; decisions are frequent where the average matters). No clock
/// inside: the caller passes the time. O(hosts) per sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadTrend {
    avg: Vec<f64>,
    last_ms: Option<u64>,
}

impl LoadTrend {
    /// An empty trend (the first sample sets every average).
    pub fn new() -> LoadTrend {
        LoadTrend::default()
    }

    /// Fold in `loads` (one per host) seen at `now_ms`. A change in the
    /// number of hosts, or a first sample, starts over from `loads`; a time
    /// earlier than the last sample counts as no time passing.
    pub fn observe(&mut self, now_ms: u64, tau_s: f64, loads: &[u64]) {
        let restart = self.last_ms.is_none() || self.avg.len() != loads.len();
        if restart || !(tau_s.is_finite() && tau_s > 0.0) {
            self.avg = loads.iter().map(|&l| l as f64).collect();
            self.last_ms = Some(now_ms);
            return;
        }
        let last = self.last_ms.unwrap_or(now_ms);
        let dt = now_ms.saturating_sub(last) as f64 / 1000.0;
        let keep = (-dt / tau_s).exp();
        for (a, &l) in self.avg.iter_mut().zip(loads) {
            *a = keep * *a + (1.0 - keep) * l as f64;
        }
        self.last_ms = Some(now_ms.max(last));
    }

    /// The averages, one per host (empty before the first sample).
    pub fn recent(&self) -> &[f64] {
        &self.avg
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn m(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn orca_text_and_json() {
        let ms = m(&["num_requests_waiting"]);
        assert_eq!(
            parse_orca(
                "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0",
                &ms
            ),
            Ok(Some(3.0))
        );
        assert_eq!(
            parse_orca(
                r#"JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 7.0}}"#,
                &ms
            ),
            Ok(Some(7.0))
        );
        let both = m(&["num_requests_waiting", "num_requests_running"]);
        assert_eq!(
            parse_orca(
                "TEXT named_metrics.num_requests_running=2, named_metrics.num_requests_waiting=3",
                &both
            ),
            Ok(Some(5.0))
        );
        assert_eq!(parse_orca("TEXT cpu_utilization=0.3", &ms), Ok(None));
        assert!(parse_orca("BIN abc", &ms).is_err());
        assert!(parse_orca("TEXT named_metrics.num_requests_waiting=x", &ms).is_err());
        assert!(parse_orca("JSON {", &ms).is_err());
        // Counts are finite and not negative, in either format.
        for v in ["inf", "-inf", "NaN", "-1", "1e999"] {
            let text = format!("TEXT named_metrics.num_requests_waiting={v}");
            assert!(parse_orca(&text, &ms).is_err(), "{text}");
        }
        assert!(parse_orca(
            r#"JSON {"named_metrics": {"num_requests_waiting": -2}}"#,
            &ms
        )
        .is_err());
        // A metric not asked for is not judged.
        assert_eq!(
            parse_orca(
                "TEXT named_metrics.other=-1, named_metrics.num_requests_waiting=0",
                &ms
            ),
            Ok(Some(0.0))
        );
    }

    #[test]
    fn queue_header() {
        assert_eq!(parse_queue_header(" 4 "), Ok(4.0));
        assert!(parse_queue_header("-1").is_err());
        assert!(parse_queue_header("NaN").is_err());
        assert!(parse_queue_header("").is_err());
    }

    #[test]
    fn load_trend_is_a_time_weighted_average() {
        let mut t = LoadTrend::new();
        assert!(t.recent().is_empty());
        // The first sample sets it.
        t.observe(1_000, 10.0, &[4, 0]);
        assert_eq!(t.recent(), &[4.0, 0.0]);
        // After one time constant it has moved 1 - 1/e of the way.
        t.observe(11_000, 10.0, &[0, 10]);
        let e = (-1.0f64).exp();
        assert!((t.recent()[0] - 4.0 * e).abs() < 1e-12);
        assert!((t.recent()[1] - 10.0 * (1.0 - e)).abs() < 1e-12);
        // No time passing (or time going back) changes nothing.
        let before = t.recent().to_vec();
        t.observe(11_000, 10.0, &[100, 100]);
        t.observe(5_000, 10.0, &[100, 100]);
        assert_eq!(t.recent(), before.as_slice());
        // The rate of sampling does not matter: ten 1 s steps = one 10 s step.
        let (mut fine, mut coarse) = (LoadTrend::new(), LoadTrend::new());
        fine.observe(0, 10.0, &[0]);
        coarse.observe(0, 10.0, &[0]);
        for s in 1..=10 {
            fine.observe(s * 1_000, 10.0, &[5]);
        }
        coarse.observe(10_000, 10.0, &[5]);
        assert!((fine.recent()[0] - coarse.recent()[0]).abs() < 1e-9);
        // A new host list starts over.
        t.observe(12_000, 10.0, &[1, 2, 3]);
        assert_eq!(t.recent(), &[1.0, 2.0, 3.0]);
    }

    #[test]
    fn the_priced_queue_counts_this_proxys_pending_requests_live() {
        let f = Freshness {
            ttl_ms: 10_000,
            fade_ms: 2_000,
        };
        // 5 waiting when the report was taken, 2 of them this proxy's.
        let mut l = reported(4, 5.0, 1.0, 4, 1_000);
        if let Some(r) = l.report.as_mut() {
            r.own_pending = 2;
        }
        l.pending_requests = 2;
        assert_eq!(l.fresh_queue(1_000, f), Some(5.0));
        // A second later the others' 3 weigh half; this proxy's 2 were
        // answered and 1 sent since: 1.5 + 1.
        l.pending_requests = 1;
        assert_eq!(l.fresh_queue(2_000, f), Some(2.5));
        // Faded out: this proxy's own part still counts.
        assert_eq!(l.fresh_queue(3_000, f), Some(1.0));
        // The report alone (a later turn's queue): the replica's 5, this
        // proxy's included as it counted them, faded alike.
        assert_eq!(l.reported_queue(1_000, f), Some(5.0));
        assert_eq!(l.reported_queue(2_000, f), Some(2.5));
        assert_eq!(l.reported_queue(3_000, f), Some(0.0));
        assert_eq!(l.reported_queue(11_001, f), None);
        // Past the TTL: no fresh report (as before).
        assert_eq!(l.fresh_queue(11_001, f), None);
        // More pending at the report than waiting (some were prefilling):
        // the others' part is 0, not negative.
        if let Some(r) = l.report.as_mut() {
            r.own_pending = 9;
        }
        assert_eq!(l.fresh_queue(1_000, f), Some(1.0));
        // Untracked (0 pending, 0 at the report): the faded report alone.
        let plain = reported(0, 4.0, 0.0, 0, 0);
        assert_eq!(plain.fresh_queue(1_000, f), Some(2.0));
    }

    /// A host with `inflight` requests of this proxy and one report.
    fn reported(inflight: u64, queue: f64, running: f64, own: u64, at_ms: u64) -> HostLoad {
        HostLoad {
            pending_requests: 0,
            inflight,
            report: Some(Report {
                own_pending: 0,
                queue,
                running,
                own,
                at_ms,
            }),
            ejected: false,
            pending_prefill_tokens: 0,
            peer_pending_tokens: 0,
            recent: 0.0,
        }
    }

    #[test]
    fn effective_load_uses_fresh_reports_only() {
        // 9.2 waiting reported while this proxy had nothing there: all
        // someone else's, on top of the 2 now in flight.
        let l = reported(2, 9.2, 0.0, 0, 1000);
        assert_eq!(l.others(1500, Freshness::ttl(1000)), 10);
        assert_eq!(l.effective(1500, Freshness::ttl(1000)), 12);
        assert_eq!(l.effective(2001, Freshness::ttl(1000)), 2);
        // The replica counted 1 of this proxy's requests, and the 5 now in
        // flight include it: nobody else's.
        let own = reported(5, 1.0, 0.0, 5, 0);
        assert_eq!(own.effective(0, Freshness::ttl(10)), 5);
        // Running requests count in the bound's load (the fleet's view with
        // several proxies), not in the reported queue; this proxy's own 3
        // at report time are not counted twice, and a report taken while 3
        // of its requests ran does not keep counting them after they ended.
        let fleet = reported(1, 2.0, 6.5, 3, 0);
        assert_eq!(fleet.reported(0, Freshness::ttl(10)), 2);
        assert_eq!(fleet.others(0, Freshness::ttl(10)), 6);
        assert_eq!(fleet.effective(0, Freshness::ttl(10)), 7);
        assert_eq!(fleet.effective(11, Freshness::ttl(10)), 1);
        let stale = reported(0, 0.0, 3.0, 3, 0);
        assert_eq!(stale.effective(5, Freshness::ttl(10)), 0);
        // Garbage never overflows.
        let huge = reported(u64::MAX, f64::INFINITY, f64::NAN, 0, 0);
        assert_eq!(huge.effective(0, Freshness::ttl(10)), u64::MAX);
    }

    #[test]
    fn reports_fade_with_age() {
        let f = Freshness {
            ttl_ms: 10_000,
            fade_ms: 2_000,
        };
        assert_eq!(f.weight(0), 1.0);
        assert_eq!(f.weight(500), 0.75);
        assert_eq!(f.weight(2_000), 0.0);
        assert_eq!(f.weight(5_000), 0.0);
        // Without fading, full weight up to the TTL and none after it.
        assert_eq!(Freshness::ttl(1_000).weight(1_000), 1.0);
        assert_eq!(Freshness::ttl(1_000).weight(1_001), 0.0);
        // A fade longer than the TTL still stops at the TTL.
        let long = Freshness {
            ttl_ms: 1_000,
            fade_ms: 4_000,
        };
        assert_eq!(long.weight(1_000), 0.75);
        assert_eq!(long.weight(1_001), 0.0);
        // 3 waiting + 5 running reported with 2 of this proxy's requests in
        // the replica: 6 others'. The waiting 3 fade (rounded up) as a
        // queue; in the bound's load all 6 count until the TTL (admitted
        // requests stay in the replica).
        let l = reported(4, 3.0, 5.0, 2, 1_000);
        assert_eq!(l.others(1_000, f), 6);
        assert_eq!(l.reported(1_000, f), 3);
        assert_eq!(l.effective(1_000, f), 10);
        assert_eq!(l.reported(1_500, f), 3); // 3 x 0.75 = 2.25
        assert_eq!(l.reported(2_000, f), 2); // 3 x 0.5
        assert_eq!(l.reported(2_900, f), 1); // 3 x 0.05 = 0.15
        assert_eq!(l.reported(3_000, f), 0);
        for at in [1_500, 2_000, 2_900, 3_000, 11_000] {
            assert_eq!(l.others(at, f), 6, "at {at} ms");
            assert_eq!(l.effective(at, f), 10, "at {at} ms");
        }
        // Past the TTL, nothing.
        assert_eq!(l.others(11_001, f), 0);
        assert_eq!(l.effective(11_001, f), 4);
        // When this proxy's own requests were most of the report, nothing
        // below 0.
        let mine = reported(3, 3.0, 1.0, 3, 0);
        assert_eq!(mine.others(0, f), 1);
        assert_eq!(mine.others(2_000, f), 1);
        // A report from the future (clock skew between workers) is fresh.
        assert_eq!(l.others(0, f), 6);
        // Huge counts saturate instead of wrapping.
        assert_eq!(f.scale(u64::MAX, 0), u64::MAX);
        assert!(f.scale(u64::MAX, 1_000) > 0);
    }
}
