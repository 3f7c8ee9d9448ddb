//! What a workload run did: per-replica counts, hit rate, stickiness, latency.

use crate::backend::CacheCounters;
use crate::workload::RunResult;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Report {
    pub label: String,
    pub requests: usize,
    pub ok: usize,
    /// Requests answered by each replica (`x-backend-name`), every replica listed.
    pub per_replica: BTreeMap<String, usize>,
    pub max_per_replica: usize,
    pub mean_per_replica: f64,
    /// Prefix-cache hit rate from the backends' `/metrics` (hits / queries, token deltas over
    /// the run), when available.
    pub hit_rate: Option<f64>,
    /// Σ cached_tokens / Σ prompt_tokens as reported to the client.
    pub client_cached_ratio: Option<f64>,
    /// Share of turns served by their conversation's majority replica.
    pub majority_share: f64,
    /// Conversations whose majority replica each replica is, every replica listed (ties go to
    /// the replica named first).
    pub homes: BTreeMap<String, usize>,
    pub ttft_p50: Option<Duration>,
    pub ttft_p90: Option<Duration>,
    pub latency_p50: Option<Duration>,
    pub latency_p90: Option<Duration>,
    pub wall: Duration,
    /// The cost rule's index against the replicas: (tokens the index credited the chosen
    /// replicas with, from the decision header's `cached=` bytes at 4 bytes per token; of
    /// those, tokens the replica did not serve from its cache), over requests that report both.
    pub index_credit: Option<(u64, u64)>,
    /// The filter's `prefix_router.index.forget.*` counters after the run (cost rule only).
    pub forgets: Vec<(String, u64)>,
    /// Count of each decision-header `outcome=` (and `none` when absent),
    /// by `turn=` when the header has one (`moved/first`).
    pub outcomes: BTreeMap<String, usize>,
    /// A few error messages, for diagnosis.
    pub sample_errors: Vec<String>,
}

/// The `q`-quantile of `values` (unsorted), through an HDR histogram of
/// microseconds with 3 significant digits (as the simulator takes its
/// percentiles): the top of the bucket holding the nearest-rank value.
pub fn quantile(values: &[Duration], q: f64) -> Option<Duration> {
    let us: Vec<f64> = values.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    quantile_us(&us, q).map(|v| Duration::from_secs_f64(v / 1e6))
}

/// [`quantile`] of values in microseconds (negative values count as 0);
/// `None` when empty.
pub fn quantile_us(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut h = hdrhistogram::Histogram::<u64>::new(3).ok()?;
    for &v in values {
        // `record` grows the histogram; past what it can grow to, clamp.
        let us = v.max(0.0).round() as u64;
        if h.record(us).is_err() {
            h.saturating_record(us);
        }
    }
    Some(h.value_at_quantile(q.clamp(0.0, 1.0)) as f64)
}

/// Per conversation: its turns, and its successful turns per replica.
fn per_conversation(run: &RunResult) -> BTreeMap<usize, (usize, BTreeMap<&str, usize>)> {
    let mut per_conv: BTreeMap<usize, (usize, BTreeMap<&str, usize>)> = BTreeMap::new();
    for r in &run.records {
        let e = per_conv.entry(r.conversation).or_default();
        e.0 += 1;
        if let (true, Some(b)) = (r.ok(), r.backend.as_deref()) {
            *e.1.entry(b).or_default() += 1;
        }
    }
    per_conv
}

/// Conversations per majority replica (ties: the replica named first), every one of
/// `replicas` listed.
pub fn homes(run: &RunResult, replicas: &[String]) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = replicas.iter().map(|r| (r.clone(), 0)).collect();
    for (_, m) in per_conversation(run).values() {
        let top = m.values().copied().max().unwrap_or(0);
        if let Some((b, _)) = m.iter().find(|(_, &n)| n == top && n > 0) {
            *out.entry(b.to_string()).or_default() += 1;
        }
    }
    out
}

/// Share of turns served by their conversation's majority replica (failed turns count as not).
pub fn majority_share(run: &RunResult) -> f64 {
    let per_conv = per_conversation(run);
    let total: usize = per_conv.values().map(|(n, _)| n).sum();
    let on_majority: usize = per_conv
        .values()
        .map(|(_, m)| m.values().copied().max().unwrap_or(0))
        .sum();
    if total == 0 {
        0.0
    } else {
        on_majority as f64 / total as f64
    }
}

impl Report {
    /// `replicas`: every replica name (so idle ones show 0). `cache`: summed backend counter
    /// deltas over the run.
    pub fn new(
        label: &str,
        run: &RunResult,
        replicas: &[String],
        cache: Option<CacheCounters>,
    ) -> Report {
        let mut per_replica: BTreeMap<String, usize> =
            replicas.iter().map(|r| (r.clone(), 0)).collect();
        let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
        let mut ttfts = Vec::new();
        let mut lats = Vec::new();
        let mut sample_errors = Vec::new();
        let (mut cached, mut prompt, mut have_usage) = (0u64, 0u64, false);
        let mut credit: Option<(u64, u64)> = None;
        for r in &run.records {
            if let Some(b) = &r.backend {
                *per_replica.entry(b.clone()).or_default() += 1;
            }
            // With the priced spill, by turn: `moved/first`, `hit/later`.
            let turn = r
                .decision
                .as_deref()
                .and_then(|d| crate::workload::decision_field(d, "turn"));
            let outcome = r.outcome().unwrap_or("none");
            let key = match turn {
                Some(t) => format!("{outcome}/{t}"),
                None => outcome.to_string(),
            };
            *outcomes.entry(key).or_default() += 1;
            if r.ok() {
                if let Some(t) = r.ttft {
                    ttfts.push(t);
                }
                lats.push(r.latency);
            }
            let credited = r
                .decision
                .as_deref()
                .and_then(|d| crate::workload::decision_field(d, "cached"))
                .and_then(|v| v.parse::<u64>().ok());
            if let (Some(b), Some(c)) = (credited, r.cached_tokens) {
                let t = b.div_ceil(4);
                let e = credit.get_or_insert((0, 0));
                e.0 += t;
                e.1 += t.saturating_sub(c);
            }
            if let (Some(c), Some(p)) = (r.cached_tokens, r.prompt_tokens) {
                cached += c;
                prompt += p;
                have_usage = true;
            }
            if let Some(e) = &r.error {
                if sample_errors.len() < 5 {
                    sample_errors.push(format!("conv {} turn {}: {e}", r.conversation, r.turn));
                }
            }
        }
        let n_replicas = per_replica.len().max(1);
        let served: usize = per_replica.values().sum();
        Report {
            label: label.to_string(),
            requests: run.records.len(),
            ok: run.records.iter().filter(|r| r.ok()).count(),
            max_per_replica: per_replica.values().copied().max().unwrap_or(0),
            mean_per_replica: served as f64 / n_replicas as f64,
            per_replica,
            hit_rate: cache
                .filter(|c| c.queries > 0.0)
                .map(|c| c.hits / c.queries),
            client_cached_ratio: (have_usage && prompt > 0).then(|| cached as f64 / prompt as f64),
            majority_share: majority_share(run),
            homes: homes(run, replicas),
            ttft_p50: quantile(&ttfts, 0.5),
            ttft_p90: quantile(&ttfts, 0.9),
            latency_p50: quantile(&lats, 0.5),
            latency_p90: quantile(&lats, 0.9),
            wall: run.wall,
            index_credit: credit,
            forgets: Vec::new(),
            outcomes,
            sample_errors,
        }
    }

    fn rows(&self) -> Vec<(String, String)> {
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.1}%", v * 100.0));
        let ms =
            |d: Option<Duration>| d.map_or("n/a".to_string(), |d| format!("{} ms", d.as_millis()));
        let per: Vec<String> = self
            .per_replica
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        vec![
            (
                "requests ok".into(),
                format!("{}/{}", self.ok, self.requests),
            ),
            (
                "prefix-cache hit rate (backend /metrics)".into(),
                pct(self.hit_rate),
            ),
            (
                "cached/prompt tokens (client usage)".into(),
                pct(self.client_cached_ratio),
            ),
            (
                "turns on conversation's majority replica".into(),
                pct(Some(self.majority_share)),
            ),
            ("requests per replica".into(), per.join(" ")),
            (
                "conversations per majority replica".into(),
                self.homes
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            (
                "max / mean requests per replica".into(),
                format!("{} / {:.1}", self.max_per_replica, self.mean_per_replica),
            ),
            ("TTFT p50".into(), ms(self.ttft_p50)),
            ("TTFT p90".into(), ms(self.ttft_p90)),
            ("latency p50".into(), ms(self.latency_p50)),
            ("latency p90".into(), ms(self.latency_p90)),
            (
                "wall time".into(),
                format!("{:.1} s", self.wall.as_secs_f64()),
            ),
            ("decision outcomes".into(), outcomes.join(" ")),
            (
                "index forgets".into(),
                if self.forgets.is_empty() {
                    "n/a".to_string()
                } else {
                    self.forgets
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                },
            ),
            (
                "index credit, of it not cached".into(),
                self.index_credit.map_or("n/a".to_string(), |(t, over)| {
                    format!(
                        "{t} tok, {:.1}%",
                        if t > 0 {
                            over as f64 * 100.0 / t as f64
                        } else {
                            0.0
                        }
                    )
                }),
            ),
        ]
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&side_by_side(&[self]))
    }
}

/// A table with one column per report.
pub fn side_by_side(reports: &[&Report]) -> String {
    let rows: Vec<Vec<(String, String)>> = reports.iter().map(|r| r.rows()).collect();
    let Some(first) = rows.first() else {
        return String::new();
    };
    let label_w = first.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let col_w: Vec<usize> = reports
        .iter()
        .zip(&rows)
        .map(|(r, rs)| {
            rs.iter()
                .map(|(_, v)| v.len())
                .chain(std::iter::once(r.label.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(out, "{:label_w$}", "");
    for (r, w) in reports.iter().zip(&col_w) {
        let _ = write!(out, " | {:w$}", r.label);
    }
    out.push('\n');
    let _ = write!(out, "{}", "-".repeat(label_w));
    for w in &col_w {
        let _ = write!(out, "-+-{}", "-".repeat(*w));
    }
    out.push('\n');
    for (i, (k, _)) in first.iter().enumerate() {
        let _ = write!(out, "{k:label_w$}");
        for (rs, w) in rows.iter().zip(&col_w) {
            let v = rs.get(i).map_or("", |(_, v)| v.as_str());
            let _ = write!(out, " | {v:w$}");
        }
        out.push('\n');
    }
    for r in reports {
        for e in &r.sample_errors {
            let _ = writeln!(out, "[{}] error: {e}", r.label);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::RequestRecord;

    fn rec(conv: usize, turn: usize, backend: &str) -> RequestRecord {
        RequestRecord {
            conversation: conv,
            turn,
            status: 200,
            backend: Some(backend.to_string()),
            ttft: Some(Duration::from_millis((10 * (turn + 1)) as u64)),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn majority_and_counts() {
        let run = RunResult {
            records: vec![
                rec(0, 0, "r1"),
                rec(0, 1, "r1"),
                rec(0, 2, "r2"),
                rec(1, 0, "r3"),
                rec(1, 1, "r3"),
                rec(1, 2, "r3"),
            ],
            wall: Duration::from_secs(1),
        };
        assert!((majority_share(&run) - 5.0 / 6.0).abs() < 1e-9);
        let names: Vec<String> = ["r1", "r2", "r3", "r4"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = Report::new(
            "x",
            &run,
            &names,
            Some(CacheCounters {
                queries: 100.0,
                hits: 25.0,
            }),
        );
        assert_eq!(r.per_replica.get("r4"), Some(&0));
        let homes: Vec<(&str, usize)> = r.homes.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(homes, [("r1", 1), ("r2", 0), ("r3", 1), ("r4", 0)]);
        assert_eq!(r.per_replica.get("r3"), Some(&3));
        assert_eq!(r.max_per_replica, 3);
        assert!((r.mean_per_replica - 1.5).abs() < 1e-9);
        assert_eq!(r.hit_rate, Some(0.25));
        assert_eq!(r.ok, 6);
        // An HDR bucket's top: within 0.1 % above the sample.
        let p50 = r.ttft_p50.map(|d| d.as_secs_f64()).unwrap_or(0.0);
        assert!((0.020..=0.02002).contains(&p50), "{p50}");
        assert!(side_by_side(&[&r, &r]).contains("requests per replica"));
    }

    #[test]
    fn quantiles() {
        let v: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let near = |got: Option<Duration>, ms: f64| {
            let got = got.map(|d| d.as_secs_f64() * 1e3).unwrap_or(f64::NAN);
            assert!((got - ms).abs() <= ms * 1e-3, "{got} ms, want {ms} ms");
        };
        near(quantile(&v, 0.5), 5.0);
        near(quantile(&v, 0.9), 9.0);
        near(quantile(&v, 1.0), 10.0);
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile_us(&[7.0], 0.5), Some(7.0));
    }
}
