//! Per-run measurements.
//!
//! * **Hit rate** (tokens): prompt tokens served from the replica's prefix
//!   cache / prompt tokens, over all requests (vLLM's
//!   `prefix_cache_hits / prefix_cache_queries`).
//! * **TTFT** and **end-to-end latency**: first token / last token minus
//!   arrival at the router (routing itself takes no virtual time).
//! * **Throughput**: output tokens (and requests) per second of makespan
//!   (first arrival to last completion).
//! * **Load balance**: each replica's load is its time-averaged number of
//!   requests (waiting + running) in each `window_s` window; per window,
//!   max over replicas / mean over replicas. Reported: the worst window and
//!   the mean over windows, over the full windows that end before the last
//!   arrival (at least one): the window the last arrival falls in, and those
//!   after it, are mostly the drain at the end, where a few stragglers set
//!   the ratio. Also the same ratio for the number of requests assigned per
//!   window.
//! * **Outcomes**: affinity / spill / fallback / balance decisions (see
//!   [`crate::policy::Outcome`]).
//! * **Prefill GPU-seconds**: the cost model's prefill time of every
//!   request's uncached tokens, summed.

use prefix_router_replica::{CostModel, Replica};

use crate::engine::SimConfig;
use crate::policy::Outcome;
use crate::workload::Workload;

/// A latency distribution summary, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Dist {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Dist {
    /// Significant decimal digits the percentiles keep.
    pub const SIGFIG: u8 = 3;

    /// Percentiles of `v` (seconds) from an HDR histogram (`hdrhistogram`)
    /// of microseconds with [`Self::SIGFIG`] significant digits: nearest
    /// rank, each reported as the highest value its histogram bucket holds
    /// (at most 0.1 % above the sample's own value, exact below 2 ms). The
    /// mean is exact.
    pub fn of(v: &[f64]) -> Dist {
        if v.is_empty() {
            return Dist::default();
        }
        // `new` only fails for sigfig > 5; the histogram grows as needed.
        let Ok(mut h) = hdrhistogram::Histogram::<u64>::new(Self::SIGFIG) else {
            return Dist::default();
        };
        for &x in v {
            // Negative and NaN become 0 (`as` saturates).
            let us = (x * 1e6).round() as u64;
            if h.record(us).is_err() {
                // Past what it can grow to (not for any latency): clamp.
                h.saturating_record(us);
            }
        }
        let pick = |q: f64| h.value_at_quantile(q) as f64 / 1e6;
        Dist {
            p50: pick(0.5),
            p90: pick(0.9),
            p99: pick(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// Everything measured in one run of one policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    pub policy: String,
    pub requests: usize,
    pub completed: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub hit_rate: f64,
    pub ttft: Dist,
    pub e2e: Dist,
    pub output_tokens: u64,
    pub makespan_s: f64,
    pub throughput_tok_s: f64,
    pub requests_per_s: f64,
    /// Worst and mean per-window max/mean of time-averaged replica load.
    pub load_ratio_worst: f64,
    pub load_ratio_mean: f64,
    /// Worst per-window max/mean of requests assigned.
    pub assigned_ratio_worst: f64,
    pub windows: usize,
    pub affinity: u64,
    pub spill: u64,
    pub fallback: u64,
    pub balance: u64,
    pub per_replica_requests: Vec<u64>,
    pub prefill_gpu_s: f64,
    pub evicted_blocks: u64,
    /// `[window][replica]` time-averaged load (requests in the replica).
    pub window_load: Vec<Vec<f64>>,
    /// Tokens the policy's prefix index credited the chosen replicas with
    /// (summed over proxies; `None` without an index), to compare with
    /// `cached_tokens`, what the replicas then served from cache.
    pub credited_tokens: Option<u64>,
    /// The prefill rate the policy learned by the end (mean over proxies;
    /// `None` unless it learns one).
    pub learned_prefill_tps: Option<f64>,
    /// Busy balance: mean and worst max/mean per-replica busy time over
    /// the windows in which the fleet is at least half busy, and how many
    /// such windows there were (0: none, both ratios 0).
    pub busy_ratio_mean: f64,
    pub busy_ratio_worst: f64,
    pub busy_windows: usize,
}

/// Per-replica busy time (holding at least one request) per window.
struct BusyTrack {
    window: f64,
    last: Vec<f64>,
    busy: Vec<Vec<f64>>,
    n: usize,
}

impl BusyTrack {
    /// Replica `h` held `held` requests from its last change until `t`.
    fn accrue(&mut self, h: usize, t: f64, held: u64) {
        let Some(&last) = self.last.get(h) else {
            return;
        };
        if held > 0 {
            let mut a = last;
            while a < t {
                let w = (a / self.window).floor().max(0.0) as usize;
                let wend = (w as f64 + 1.0) * self.window;
                let end = if wend > a { wend.min(t) } else { t };
                while self.busy.len() <= w {
                    self.busy.push(vec![0.0; self.n]);
                }
                if let Some(x) = self.busy.get_mut(w).and_then(|v| v.get_mut(h)) {
                    *x += end - a;
                }
                a = end;
            }
        }
        if let Some(l) = self.last.get_mut(h) {
            *l = l.max(t);
        }
    }

    /// (mean, worst, count) of max/mean busy time over the windows, up to
    /// `end`, in which the fleet is at least half busy.
    fn summary(&self, end: f64) -> (f64, f64, usize) {
        let (mut sum, mut worst, mut count) = (0.0, 0.0f64, 0usize);
        for (w, row) in self.busy.iter().enumerate() {
            let start = w as f64 * self.window;
            let len = (end - start).min(self.window);
            if len <= 0.0 || self.n == 0 {
                continue;
            }
            let total: f64 = row.iter().sum();
            // (A tolerance for the float sums: exactly half counts.)
            if total < 0.5 * self.n as f64 * len * (1.0 - 1e-9) {
                continue;
            }
            let mean = total / self.n as f64;
            let max = row.iter().copied().fold(0.0, f64::max);
            let r = max / mean;
            sum += r;
            worst = worst.max(r);
            count += 1;
        }
        let mean = if count > 0 { sum / count as f64 } else { 0.0 };
        (mean, worst, count)
    }
}

struct LoadTrack {
    window: f64,
    last: Vec<f64>,
    conc: Vec<u64>,
    area: Vec<Vec<f64>>,
    assigned: Vec<Vec<u32>>,
    n: usize,
}

impl LoadTrack {
    fn widx(&self, t: f64) -> usize {
        (t / self.window).floor().max(0.0) as usize
    }

    fn grow(&mut self, w: usize) {
        while self.area.len() <= w {
            self.area.push(vec![0.0; self.n]);
            self.assigned.push(vec![0; self.n]);
        }
    }

    fn accrue(&mut self, h: usize, t: f64) {
        let Some(&last) = self.last.get(h) else {
            return;
        };
        let c = self.conc.get(h).copied().unwrap_or(0) as f64;
        let mut a = last;
        while a < t {
            let w = self.widx(a);
            let wend = (w as f64 + 1.0) * self.window;
            let end = if wend > a { wend.min(t) } else { t };
            self.grow(w);
            if let Some(x) = self.area.get_mut(w).and_then(|v| v.get_mut(h)) {
                *x += c * (end - a);
            }
            a = end;
        }
        if let Some(l) = self.last.get_mut(h) {
            *l = l.max(t);
        }
    }

    fn change(&mut self, h: usize, t: f64, up: bool) {
        self.accrue(h, t);
        if let Some(c) = self.conc.get_mut(h) {
            if up {
                *c += 1;
            } else {
                *c = c.saturating_sub(1);
            }
        }
    }
}

/// Collects events of one run.
pub struct Collector {
    cost: CostModel,
    n: usize,
    arrival: Vec<f64>,
    first: Vec<f64>,
    done: Vec<f64>,
    cached: Vec<u64>,
    prompt: Vec<u64>,
    output: Vec<u64>,
    host: Vec<u32>,
    outcomes: [u64; 4],
    load: LoadTrack,
    busy: BusyTrack,
    first_arrival: f64,
    last_arrival: f64,
}

impl Collector {
    pub fn new(wl: &Workload, cfg: &SimConfig) -> Self {
        let m = wl.len();
        let n = cfg.replicas;
        Collector {
            cost: cfg.cost.clone(),
            n,
            arrival: vec![f64::NAN; m],
            first: vec![f64::NAN; m],
            done: vec![f64::NAN; m],
            cached: vec![0; m],
            prompt: wl.requests.iter().map(|r| r.prompt.tokens()).collect(),
            output: wl.requests.iter().map(|r| r.output_tokens).collect(),
            host: vec![u32::MAX; m],
            outcomes: [0; 4],
            load: LoadTrack {
                window: if cfg.window_s > 0.0 {
                    cfg.window_s
                } else {
                    60.0
                },
                last: vec![0.0; n],
                conc: vec![0; n],
                area: Vec::new(),
                assigned: Vec::new(),
                n,
            },
            busy: BusyTrack {
                window: if cfg.busy_window_s > 0.0 {
                    cfg.busy_window_s
                } else {
                    10.0
                },
                last: vec![0.0; n],
                busy: Vec::new(),
                n,
            },
            first_arrival: f64::INFINITY,
            last_arrival: 0.0,
        }
    }

    pub fn arrive(&mut self, id: usize, t: f64, host: usize, outcome: Outcome) {
        if let Some(x) = self.arrival.get_mut(id) {
            *x = t;
        }
        if let Some(x) = self.host.get_mut(id) {
            *x = host as u32;
        }
        let o = match outcome {
            Outcome::Affinity => 0,
            Outcome::Spill => 1,
            Outcome::Fallback => 2,
            Outcome::Balance => 3,
        };
        if let Some(x) = self.outcomes.get_mut(o) {
            *x += 1;
        }
        self.first_arrival = self.first_arrival.min(t);
        self.last_arrival = self.last_arrival.max(t);
        self.busy_change(host, t);
        self.load.change(host, t, true);
        let w = self.load.widx(t);
        self.load.grow(w);
        if let Some(x) = self.load.assigned.get_mut(w).and_then(|v| v.get_mut(host)) {
            *x += 1;
        }
    }

    pub fn first_token(&mut self, id: usize, t: f64, cached: u64) {
        if let Some(x) = self.first.get_mut(id) {
            *x = t;
        }
        if let Some(x) = self.cached.get_mut(id) {
            *x = cached;
        }
    }

    pub fn done(&mut self, id: usize, t: f64, host: usize) {
        if let Some(x) = self.done.get_mut(id) {
            *x = t;
        }
        self.busy_change(host, t);
        self.load.change(host, t, false);
    }

    /// Accrue replica `h`'s busy time up to `t`, before its count changes.
    fn busy_change(&mut self, h: usize, t: f64) {
        let held = self.load.conc.get(h).copied().unwrap_or(0);
        self.busy.accrue(h, t, held);
    }

    pub fn finish(mut self, label: &str, end: f64, replicas: &[Replica]) -> RunResult {
        for h in 0..self.n {
            self.busy_change(h, end);
            self.load.accrue(h, end);
        }
        let (busy_ratio_mean, busy_ratio_worst, busy_windows) = self.busy.summary(end);
        let m = self.arrival.len();
        let mut ttft = Vec::with_capacity(m);
        let mut e2e = Vec::with_capacity(m);
        let mut prompt_tokens = 0;
        let mut cached_tokens = 0;
        let mut output_tokens = 0;
        let mut completed = 0;
        let mut prefill = 0.0;
        let mut per_replica = vec![0u64; self.n];
        let mut last_done: f64 = 0.0;
        for i in 0..m {
            let a = self.arrival.get(i).copied().unwrap_or(f64::NAN);
            let f = self.first.get(i).copied().unwrap_or(f64::NAN);
            let d = self.done.get(i).copied().unwrap_or(f64::NAN);
            if a.is_nan() {
                continue;
            }
            if let Some(x) = per_replica.get_mut(self.host.get(i).copied().unwrap_or(0) as usize) {
                *x += 1;
            }
            let p = self.prompt.get(i).copied().unwrap_or(0);
            let c = self.cached.get(i).copied().unwrap_or(0);
            if !f.is_nan() {
                ttft.push(f - a);
                prompt_tokens += p;
                cached_tokens += c;
                prefill += self.cost.prefill_time(p.saturating_sub(c), c);
            }
            if !d.is_nan() {
                e2e.push(d - a);
                completed += 1;
                output_tokens += self.output.get(i).copied().unwrap_or(0);
                last_done = last_done.max(d);
            }
        }
        let makespan = if self.first_arrival.is_finite() {
            (last_done - self.first_arrival).max(1e-9)
        } else {
            0.0
        };
        // Load balance over the full windows before the last arrival (at
        // least one): the window the last arrival falls in is mostly drain.
        let wmax = self.load.widx(self.last_arrival).max(1);
        let window = self.load.window;
        let mut worst: f64 = 0.0;
        let mut sum = 0.0;
        let mut count = 0usize;
        let mut aworst: f64 = 0.0;
        for w in 0..wmax.min(self.load.area.len()) {
            if let Some(row) = self.load.area.get(w) {
                let mean = row.iter().sum::<f64>() / self.n as f64;
                let max = row.iter().copied().fold(0.0, f64::max);
                if mean > 0.0 {
                    let r = max / mean;
                    worst = worst.max(r);
                    sum += r;
                    count += 1;
                }
            }
            if let Some(row) = self.load.assigned.get(w) {
                let tot: u32 = row.iter().sum();
                let max = row.iter().copied().max().unwrap_or(0);
                if tot > 0 {
                    aworst = aworst.max(f64::from(max) * self.n as f64 / f64::from(tot));
                }
            }
        }
        let window_load = self
            .load
            .area
            .iter()
            .map(|row| row.iter().map(|a| a / window).collect())
            .collect();
        RunResult {
            policy: label.to_string(),
            requests: m,
            completed,
            prompt_tokens,
            cached_tokens,
            hit_rate: if prompt_tokens > 0 {
                cached_tokens as f64 / prompt_tokens as f64
            } else {
                0.0
            },
            ttft: Dist::of(&ttft),
            e2e: Dist::of(&e2e),
            output_tokens,
            makespan_s: makespan,
            throughput_tok_s: if makespan > 0.0 {
                output_tokens as f64 / makespan
            } else {
                0.0
            },
            requests_per_s: if makespan > 0.0 {
                completed as f64 / makespan
            } else {
                0.0
            },
            load_ratio_worst: worst,
            load_ratio_mean: if count > 0 { sum / count as f64 } else { 0.0 },
            assigned_ratio_worst: aworst,
            windows: count,
            affinity: self.outcomes[0],
            spill: self.outcomes[1],
            fallback: self.outcomes[2],
            balance: self.outcomes[3],
            per_replica_requests: per_replica,
            prefill_gpu_s: prefill,
            evicted_blocks: replicas.iter().map(|r| r.cache().evictions()).sum(),
            window_load,
            credited_tokens: None,
            learned_prefill_tps: None,
            busy_ratio_mean,
            busy_ratio_worst,
            busy_windows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Dist;

    /// Nearest-rank percentile of sorted `v`.
    fn exact(v: &[f64], q: f64) -> f64 {
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }

    #[test]
    fn percentiles_within_the_histogram_precision() {
        assert_eq!(Dist::of(&[]), Dist::default());
        // Latencies from 0.5 ms to ~300 s, in a scrambled order.
        let mut v: Vec<f64> = (0..5000u64)
            .map(|i| 0.0005 * 1.0013f64.powf(((i * 7919) % 5000) as f64))
            .collect();
        let d = Dist::of(&v);
        v.sort_by(f64::total_cmp);
        for (got, q) in [(d.p50, 0.5), (d.p90, 0.9), (d.p99, 0.99)] {
            let want = exact(&v, q);
            assert!(
                got >= want - 1e-6 && got <= want * 1.001 + 1e-6,
                "q {q}: {got} vs {want}"
            );
        }
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!((d.mean - mean).abs() < 1e-9 * mean);
        // Below 2 ms, to the microsecond.
        let d = Dist::of(&[0.001, 0.0015, 0.002]);
        assert_eq!((d.p50, d.p99), (0.0015, 0.002));
    }
}
