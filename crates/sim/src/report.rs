//! Output: the table on stdout and the JSON document (`--json`).
//!
//! The JSON is built from `serde_json::Value` maps (sorted keys) and
//! contains no wall-clock value, so the same inputs give byte-identical
//! output.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::bounds::Bounds;
use crate::engine::SimConfig;
use crate::metrics::{Dist, RunResult};
use crate::workload::Workload;

/// Results for one (rate scale, proxies) point.
#[derive(Debug, Clone)]
pub struct RunSet {
    pub rate_scale: f64,
    pub proxies: usize,
    pub results: Vec<RunResult>,
}

/// A complete report.
#[derive(Debug, Clone)]
pub struct Report {
    pub workload: String,
    pub requests: usize,
    pub prompt_tokens: u64,
    pub span_s: f64,
    pub config: SimConfig,
    pub bounds: Bounds,
    pub runs: Vec<RunSet>,
}

impl Report {
    /// Describe a workload and config.
    pub fn new(wl: &Workload, config: &SimConfig, bounds: Bounds, runs: Vec<RunSet>) -> Report {
        Report {
            workload: wl.name.clone(),
            requests: wl.len(),
            prompt_tokens: wl.prompt_tokens(),
            span_s: wl.span_s(),
            config: config.clone(),
            bounds,
            runs,
        }
    }
}

/// Round to 6 decimals (keeps the JSON readable; still deterministic).
fn r6(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e6).round() / 1e6
    } else {
        0.0
    }
}

fn dist(d: &Dist) -> Value {
    json!({"p50": r6(d.p50), "p90": r6(d.p90), "p99": r6(d.p99), "mean": r6(d.mean)})
}

/// The busy-balance figures of a run (see [`crate::metrics`]).
pub fn busy_json(r: &RunResult, window_s: Value) -> Value {
    json!({
        "window_s": window_s,
        "max_over_mean_mean": r6(r.busy_ratio_mean),
        "max_over_mean_worst": r6(r.busy_ratio_worst),
        "half_busy_windows": r.busy_windows,
    })
}

fn result_json(r: &RunResult, b: &Bounds) -> Value {
    json!({
        "policy": r.policy,
        "requests": r.requests,
        "completed": r.completed,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "hit_rate": r6(r.hit_rate),
        "fraction_of_oracle": r6(if b.oracle_hit > 0.0 { r.hit_rate / b.oracle_hit } else { 0.0 }),
        "ttft_s": dist(&r.ttft),
        "e2e_s": dist(&r.e2e),
        "output_tokens": r.output_tokens,
        "makespan_s": r6(r.makespan_s),
        "throughput_output_tok_s": r6(r.throughput_tok_s),
        "throughput_req_s": r6(r.requests_per_s),
        "load_max_over_mean": {
            "window_s": Value::Null,
            "worst": r6(r.load_ratio_worst),
            "mean": r6(r.load_ratio_mean),
            "windows": r.windows,
            "assigned_worst": r6(r.assigned_ratio_worst),
            "per_window": r
                .window_load
                .iter()
                .map(|row| row.iter().map(|&x| r6(x)).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
        },
        "decisions": {
            "affinity": r.affinity,
            "spill": r.spill,
            "fallback": r.fallback,
            "balance": r.balance,
        },
        "per_replica_requests": r.per_replica_requests,
        "prefill_gpu_s": r6(r.prefill_gpu_s),
        "evicted_blocks": r.evicted_blocks,
        "busy_balance": busy_json(r, Value::Null),
        "index_credited_tokens": r.credited_tokens,
        "learned_prefill_tps": r.learned_prefill_tps.map(r6),
    })
}

/// The JSON document.
pub fn to_json(rep: &Report) -> Value {
    let c = &rep.config;
    let b = &rep.bounds;
    let runs: Vec<Value> = rep
        .runs
        .iter()
        .map(|s| {
            let mut results: Vec<Value> = s.results.iter().map(|r| result_json(r, b)).collect();
            for v in &mut results {
                if let Some(x) = v.pointer_mut("/load_max_over_mean/window_s") {
                    *x = json!(c.window_s);
                }
                if let Some(x) = v.pointer_mut("/busy_balance/window_s") {
                    *x = json!(c.busy_window_s);
                }
            }
            json!({"rate_scale": s.rate_scale, "proxies": s.proxies, "results": results})
        })
        .collect();
    json!({
        "default_policy": crate::policy::DEFAULT_POLICY,
        "workload": {
            "name": rep.workload,
            "requests": rep.requests,
            "prompt_tokens": rep.prompt_tokens,
            "arrival_span_s": r6(rep.span_s),
        },
        "config": {
            "replicas": c.replicas,
            "seed": c.seed,
            "report_interval_s": c.report_interval_s,
            "report_delay_s": c.report_delay_s,
            "orca_reports": c.orca_reports,
            "window_s": c.window_s,
            "busy_window_s": c.busy_window_s,
            "output_kv": c.output_kv,
            "cost_model": {
                "prefill_tokens_per_s": c.cost.prefill_tokens_per_s,
                "prefill_overhead_s": c.cost.prefill_overhead_s,
                "attention_coeff": c.cost.attention_coeff,
                "decode_step_s": c.cost.decode_step_s,
                "decode_step_per_seq_s": c.cost.decode_step_per_seq_s,
                "max_running": c.cost.max_running,
                "block_tokens": c.cost.block_tokens,
                "cache_capacity_tokens": c.cost.cache_capacity_tokens,
            },
        },
        "bounds": {
            "oracle_hit_rate": r6(b.oracle_hit),
            "single_server_hit_rate": r6(b.single_server_hit),
            "single_server_cache_tokens": b.single_server_cache_tokens,
        },
        "runs": runs,
        "proxy_ratios": proxy_ratios_json(rep),
    })
}

/// For every rate scale with a 1-proxy run and a K-proxy run: each
/// policy's hit rate at K over its hit rate at 1.
pub fn proxy_ratios(rep: &Report) -> Vec<(f64, usize, String, f64, f64, f64)> {
    let mut out = Vec::new();
    for base in rep.runs.iter().filter(|s| s.proxies == 1) {
        for multi in rep
            .runs
            .iter()
            .filter(|s| s.proxies > 1 && s.rate_scale == base.rate_scale)
        {
            for r1 in &base.results {
                if let Some(rk) = multi.results.iter().find(|r| r.policy == r1.policy) {
                    let ratio = if r1.hit_rate > 0.0 {
                        rk.hit_rate / r1.hit_rate
                    } else {
                        0.0
                    };
                    out.push((
                        base.rate_scale,
                        multi.proxies,
                        r1.policy.clone(),
                        r1.hit_rate,
                        rk.hit_rate,
                        ratio,
                    ));
                }
            }
        }
    }
    out
}

fn proxy_ratios_json(rep: &Report) -> Value {
    Value::Array(
        proxy_ratios(rep)
            .into_iter()
            .map(|(s, k, p, h1, hk, ratio)| {
                json!({"rate_scale": s, "proxies": k, "policy": p, "hit_rate_1": r6(h1), "hit_rate_k": r6(hk), "ratio": r6(ratio)})
            })
            .collect(),
    )
}

fn pct(x: f64) -> String {
    format!("{:.1}", x * 100.0)
}

fn secs(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The human-readable table.
pub fn to_table(rep: &Report) -> String {
    let c = &rep.config;
    let b = &rep.bounds;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "workload  {}: {} requests, {:.1}M prompt tokens, arrivals over {:.0} s",
        rep.workload,
        rep.requests,
        rep.prompt_tokens as f64 / 1e6,
        rep.span_s
    );
    let _ = writeln!(
        s,
        "fleet     {} replicas x {} KV tokens ({}-token blocks); prefill {:.0} tok/s{}, decode step {:.0} ms{}, max {} running",
        c.replicas,
        c.cost.cache_capacity_tokens,
        c.cost.block_tokens,
        c.cost.prefill_tokens_per_s,
        if c.cost.attention_coeff > 0.0 { " + attention" } else { "" },
        c.cost.decode_step_s * 1000.0,
        if c.cost.kv_read_s_per_token > 0.0 {
            format!(
                " + {:.0} ns per context token decoding (also per {}-token prefill chunk)",
                c.cost.kv_read_s_per_token * 1e9,
                c.cost.prefill_chunk_tokens
            )
        } else {
            String::new()
        },
        c.cost.max_running
    );
    let _ = writeln!(
        s,
        "signals   replica reports every {:.0} ms, +{:.0} ms delay{}; load windows {:.0} s; seed {}",
        c.report_interval_s * 1000.0,
        c.report_delay_s * 1000.0,
        if c.report_interval_s > 0.0 { "" } else { " (off)" },
        c.window_s,
        c.seed
    );
    s.push_str(&crate::policy::sees_header(rep));
    let _ = writeln!(
        s,
        "bounds    oracle {}% (one server, unlimited cache); single-server {}% (one server, {} KV tokens)",
        pct(b.oracle_hit),
        pct(b.single_server_hit),
        b.single_server_cache_tokens
    );
    for set in &rep.runs {
        let _ = writeln!(
            s,
            "\nrate x{}, {} prox{}",
            set.rate_scale,
            set.proxies,
            if set.proxies == 1 { "y" } else { "ies" }
        );
        let _ = writeln!(
            s,
            "{:<30} {:>5} {:>6} | {:>6} {:>6} {:>6} | {:>6} {:>6} | {:>7} | {:>5} {:>5} {:>5} | {:>6} {:>6} {:>6}",
            "policy", "hit%", "%orcl", "TTFT50", "TTFT90", "TTFT99", "E2E50", "E2E90", "tok/s", "LBmax", "LBavg", "busy", "spill", "fallbk", "evictM"
        );
        for r in &set.results {
            let frac = if b.oracle_hit > 0.0 {
                r.hit_rate / b.oracle_hit
            } else {
                0.0
            };
            let _ = writeln!(
                s,
                "{:<30} {:>5} {:>6} | {:>6} {:>6} {:>6} | {:>6} {:>6} | {:>7.0} | {:>5.2} {:>5.2} {:>5} | {:>6} {:>6} {:>6.1}",
                truncate(&r.policy, 30),
                pct(r.hit_rate),
                pct(frac),
                secs(r.ttft.p50),
                secs(r.ttft.p90),
                secs(r.ttft.p99),
                secs(r.e2e.p50),
                secs(r.e2e.p90),
                r.throughput_tok_s,
                r.load_ratio_worst,
                r.load_ratio_mean,
                if r.busy_windows > 0 {
                    format!("{:.2}", r.busy_ratio_mean)
                } else {
                    "-".to_string()
                },
                r.spill,
                r.fallback,
                r.evicted_blocks as f64 / 1e6,
            );
        }
    }
    let ratios = proxy_ratios(rep);
    if !ratios.is_empty() {
        let _ = writeln!(
            s,
            "\nmulti-proxy: hit rate with K proxies / hit rate with 1 proxy"
        );
        let _ = writeln!(
            s,
            "{:<8} {:>3} {:<30} {:>6} {:>6} {:>6}",
            "rate", "K", "policy", "hit1%", "hitK%", "ratio"
        );
        for (sc, k, p, h1, hk, ratio) in ratios {
            let _ = writeln!(
                s,
                "x{:<7} {:>3} {:<30} {:>6} {:>6} {:>6.3}",
                sc,
                k,
                truncate(&p, 30),
                pct(h1),
                pct(hk),
                ratio
            );
        }
    }
    let _ = writeln!(
        s,
        "\nhit% = prompt tokens served from cache; %orcl = hit / oracle; TTFT/E2E in seconds; LBmax/LBavg = worst / mean over {:.0} s windows of (max / mean replica load); busy = mean over {:.0} s windows with the fleet at least half busy of (max / mean replica busy time; a replica is busy while it holds a waiting or running request; - = no such window); evictM = blocks evicted (millions)",
        c.window_s, c.busy_window_s
    );
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect()
    }
}
