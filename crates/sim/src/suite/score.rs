//! The scoreboard: per cell (workload, load, proxies) every policy's
//! figures, averaged over the seeds, and the acceptance questions of issue
//! 19 answered for the default policy.
//!
//! * TTFT p50 / p90 / p99, hit rate, fraction of the oracle, busy balance:
//!   per policy, the mean over seeds of each run's figure.
//! * Best peer: among [`super::defs::PEERS`], the lowest mean TTFT p90, and
//!   (separately) the highest mean hit rate.
//! * Checks of the default (each a ratio of seed means):
//!   * `p90/peer`: its TTFT p90 / the best peer's, at most 1.0;
//!   * `hit/peer`: its hit rate / the best peer's, at least 0.95 (not
//!     applicable when the best peer's hit rate is below 1 %: nothing to
//!     share, e.g. the Azure control);
//!   * on the 4-proxy cell: its 4-proxy hit rate / its 1-proxy hit rate, at
//!     least 0.95 (not applicable below 1 % hit rate at 1 proxy), and its
//!     4-proxy TTFT p90 / its 1-proxy TTFT p90, at most 1.1;
//!   * overload cells: TTFT p90 / the best peer's at most 1.1 (no collapse;
//!     weaker than `p90/peer`, reported apart).
//! * A cell passes when every applicable check passes.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::defs::{self, Half, Source, LOADS, PEERS, PROXIES, REPLICAS};
use super::load::{self, LoadFacts};
use super::run::SuiteResult;
use crate::metrics::RunResult;
use crate::policy::DEFAULT_POLICY;

pub const P90_VS_PEER_MAX: f64 = 1.0;
pub const HIT_VS_PEER_MIN: f64 = 0.95;
pub const PROXY_HIT_MIN: f64 = 0.95;
pub const PROXY_P90_MAX: f64 = 1.1;
pub const OVERLOAD_P90_VS_PEER_MAX: f64 = 1.1;
/// Below this hit rate there is nothing to share: hit ratios do not apply.
pub const NO_SHARING_HIT: f64 = 0.01;

/// One policy in one cell, averaged over seeds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Agg {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub hit: f64,
    pub frac_oracle: f64,
    /// Mean over seeds with at least one half-busy window (`None`: none).
    pub busy_mean: Option<f64>,
    pub busy_worst: Option<f64>,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n > 0 {
        s / n as f64
    } else {
        0.0
    }
}

fn aggregate(runs: &[(&RunResult, f64)]) -> Agg {
    let busy: Vec<&RunResult> = runs
        .iter()
        .map(|(r, _)| *r)
        .filter(|r| r.busy_windows > 0)
        .collect();
    Agg {
        p50: mean(runs.iter().map(|(r, _)| r.ttft.p50)),
        p90: mean(runs.iter().map(|(r, _)| r.ttft.p90)),
        p99: mean(runs.iter().map(|(r, _)| r.ttft.p99)),
        hit: mean(runs.iter().map(|(r, _)| r.hit_rate)),
        frac_oracle: mean(
            runs.iter()
                .map(|(r, o)| if *o > 0.0 { r.hit_rate / o } else { 0.0 }),
        ),
        busy_mean: (!busy.is_empty()).then(|| mean(busy.iter().map(|r| r.busy_ratio_mean))),
        busy_worst: busy.iter().map(|r| r.busy_ratio_worst).reduce(f64::max),
    }
}

/// The default policy's answers in one cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub best_p90: f64,
    pub best_p90_peer: String,
    pub p90_ratio: f64,
    pub best_hit: f64,
    pub best_hit_peer: String,
    /// `None`: not applicable (no sharing).
    pub hit_ratio: Option<f64>,
    /// 4-proxy cells only.
    pub proxy_hit_ratio: Option<f64>,
    pub proxy_p90_ratio: Option<f64>,
    /// Overload cells only.
    pub overload_ratio: Option<f64>,
    /// Names of the failed checks.
    pub fails: Vec<&'static str>,
}

impl Verdict {
    pub fn pass(&self) -> bool {
        self.fails.is_empty()
    }
}

/// One cell.
#[derive(Debug, Clone)]
pub struct Cell {
    pub workload: usize,
    pub load: usize,
    pub proxies: usize,
    pub scale: f64,
    /// Per policy (the suite's order).
    pub aggs: Vec<Agg>,
    pub verdict: Option<Verdict>,
}

/// The checks, for counting.
pub const CHECKS: [&str; 5] = ["p90/peer", "hit/peer", "4p/1p hit", "4p/1p p90", "overload"];

/// Per half: cells passed, and per check (applicable, passed).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HalfSummary {
    pub cells: usize,
    pub passed: usize,
    pub checks: Vec<(usize, usize)>,
    /// (workload, load) pairs whose load definition held on every seed.
    pub loads: usize,
    pub loads_held: usize,
}

/// The whole scoreboard.
#[derive(Debug, Clone)]
pub struct Scoreboard {
    pub cells: Vec<Cell>,
    /// `[workload][load]`: the definition held on the seed means.
    pub load_held: Vec<Vec<bool>>,
}

fn find(policies: &[String], name: &str) -> Option<usize> {
    policies.iter().position(|p| p == name)
}

/// Build the scoreboard.
pub fn score(s: &SuiteResult) -> Scoreboard {
    let def_i = find(&s.policies, DEFAULT_POLICY);
    let peers: Vec<(usize, &str)> = PEERS
        .iter()
        .filter_map(|p| find(&s.policies, p).map(|i| (i, *p)))
        .collect();
    let mut cells = Vec::new();
    let mut load_held = Vec::new();
    for (w, wr) in s.workloads.iter().enumerate() {
        load_held.push(
            (0..LOADS.len())
                .map(|l| {
                    LoadFacts::pooled(wr.seeds.iter().filter_map(|sr| sr.facts.get(l)))
                        .is_some_and(|f| load::holds(l, &f))
                })
                .collect(),
        );
        for l in 0..LOADS.len() {
            let mut one: Option<Agg> = None;
            for (k, &proxies) in PROXIES.iter().enumerate() {
                let aggs: Vec<Agg> = (0..s.policies.len())
                    .map(|p| {
                        let runs: Vec<(&RunResult, f64)> = wr
                            .seeds
                            .iter()
                            .filter_map(|sr| {
                                sr.results
                                    .get(l)
                                    .and_then(|x| x.get(k))
                                    .and_then(|x| x.get(p))
                                    .map(|r| (r, sr.oracle_hit))
                            })
                            .collect();
                        aggregate(&runs)
                    })
                    .collect();
                let verdict = def_i.and_then(|d| aggs.get(d)).map(|d| {
                    let best_p90 = peers
                        .iter()
                        .filter_map(|&(i, n)| aggs.get(i).map(|a| (a.p90, n)))
                        .min_by(|a, b| a.0.total_cmp(&b.0));
                    let best_hit = peers
                        .iter()
                        .filter_map(|&(i, n)| aggs.get(i).map(|a| (a.hit, n)))
                        .max_by(|a, b| a.0.total_cmp(&b.0));
                    let (bp, bpn) = best_p90.unwrap_or((0.0, "-"));
                    let (bh, bhn) = best_hit.unwrap_or((0.0, "-"));
                    let p90_ratio = if bp > 0.0 { d.p90 / bp } else { f64::INFINITY };
                    let hit_ratio = (bh >= NO_SHARING_HIT).then(|| d.hit / bh);
                    let (proxy_hit_ratio, proxy_p90_ratio) = match (&one, proxies > 1) {
                        (Some(o), true) => (
                            (o.hit >= NO_SHARING_HIT).then(|| d.hit / o.hit),
                            Some(if o.p90 > 0.0 {
                                d.p90 / o.p90
                            } else {
                                f64::INFINITY
                            }),
                        ),
                        _ => (None, None),
                    };
                    let overload_ratio = (l == LOADS.len() - 1).then_some(p90_ratio);
                    let mut fails = Vec::new();
                    if p90_ratio > P90_VS_PEER_MAX {
                        fails.push(CHECKS[0]);
                    }
                    if hit_ratio.is_some_and(|r| r < HIT_VS_PEER_MIN) {
                        fails.push(CHECKS[1]);
                    }
                    if proxy_hit_ratio.is_some_and(|r| r < PROXY_HIT_MIN) {
                        fails.push(CHECKS[2]);
                    }
                    if proxy_p90_ratio.is_some_and(|r| r > PROXY_P90_MAX) {
                        fails.push(CHECKS[3]);
                    }
                    if overload_ratio.is_some_and(|r| r > OVERLOAD_P90_VS_PEER_MAX) {
                        fails.push(CHECKS[4]);
                    }
                    Verdict {
                        best_p90: bp,
                        best_p90_peer: bpn.to_string(),
                        p90_ratio,
                        best_hit: bh,
                        best_hit_peer: bhn.to_string(),
                        hit_ratio,
                        proxy_hit_ratio,
                        proxy_p90_ratio,
                        overload_ratio,
                        fails,
                    }
                });
                if proxies == 1 {
                    one = def_i.and_then(|d| aggs.get(d)).cloned();
                }
                cells.push(Cell {
                    workload: w,
                    load: l,
                    proxies,
                    scale: wr.def.scales.get(l).copied().unwrap_or(1.0),
                    aggs,
                    verdict,
                });
            }
        }
    }
    Scoreboard { cells, load_held }
}

/// Summary of one half.
pub fn summarize(s: &SuiteResult, b: &Scoreboard, half: Half) -> HalfSummary {
    let mut h = HalfSummary {
        checks: vec![(0, 0); CHECKS.len()],
        ..HalfSummary::default()
    };
    for c in &b.cells {
        if s.workloads.get(c.workload).map(|w| w.def.half) != Some(half) {
            continue;
        }
        let Some(v) = &c.verdict else { continue };
        h.cells += 1;
        if v.pass() {
            h.passed += 1;
        }
        let applicable = [
            true,
            v.hit_ratio.is_some(),
            v.proxy_hit_ratio.is_some(),
            v.proxy_p90_ratio.is_some(),
            v.overload_ratio.is_some(),
        ];
        for (i, (name, app)) in CHECKS.iter().zip(applicable).enumerate() {
            if let Some(x) = h.checks.get_mut(i) {
                if app {
                    x.0 += 1;
                    if !v.fails.contains(name) {
                        x.1 += 1;
                    }
                }
            }
        }
    }
    for (w, held) in b.load_held.iter().enumerate() {
        if s.workloads.get(w).map(|w| w.def.half) != Some(half) {
            continue;
        }
        h.loads += held.len();
        h.loads_held += held.iter().filter(|x| **x).count();
    }
    h
}

/// One line: `tune: 20/30 cells pass; p90/peer 22/30, ...`.
pub fn summary_line(half: Half, h: &HalfSummary) -> String {
    let mut s = format!("{}: {}/{} cells pass;", half.name(), h.passed, h.cells);
    let limits = [
        format!("<= {P90_VS_PEER_MAX}"),
        format!(">= {HIT_VS_PEER_MIN}"),
        format!(">= {PROXY_HIT_MIN}"),
        format!("<= {PROXY_P90_MAX}"),
        format!("<= {OVERLOAD_P90_VS_PEER_MAX}"),
    ];
    for ((name, (app, ok)), lim) in CHECKS.iter().zip(&h.checks).zip(limits) {
        let _ = write!(s, " {name} {lim}: {ok}/{app},");
    }
    let _ = write!(s, " load definitions held {}/{}", h.loads_held, h.loads);
    s
}

fn r6(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e6).round() / 1e6
    } else {
        0.0
    }
}

fn opt(x: Option<f64>) -> Value {
    x.map(|v| json!(r6(v))).unwrap_or(Value::Null)
}

fn agg_json(policy: &str, a: &Agg) -> Value {
    json!({
        "policy": policy,
        "ttft_s": {"p50": r6(a.p50), "p90": r6(a.p90), "p99": r6(a.p99)},
        "hit_rate": r6(a.hit),
        "fraction_of_oracle": r6(a.frac_oracle),
        "busy_balance": {"max_over_mean_mean": opt(a.busy_mean), "max_over_mean_worst": opt(a.busy_worst)},
    })
}

fn run_json(r: &RunResult) -> Value {
    json!({
        "policy": r.policy,
        "ttft_s": {"p50": r6(r.ttft.p50), "p90": r6(r.ttft.p90), "p99": r6(r.ttft.p99)},
        "e2e_s": {"p50": r6(r.e2e.p50), "p90": r6(r.e2e.p90)},
        "hit_rate": r6(r.hit_rate),
        "completed": r.completed,
        "busy_balance": {
            "max_over_mean_mean": r6(r.busy_ratio_mean),
            "max_over_mean_worst": r6(r.busy_ratio_worst),
            "half_busy_windows": r.busy_windows,
        },
        "load_max_over_mean_worst_60s": r6(r.load_ratio_worst),
    })
}

fn facts_json(seed: u64, f: &LoadFacts) -> Value {
    json!({
        "seed": seed,
        "ring_hit_rate": r6(f.ring_hit),
        "u_prefill": r6(f.offered.prefill),
        "u_slots": r6(f.offered.slots),
        "round_robin_ttft_p50_s": r6(f.rr_p50),
        "round_robin_ttft_p90_s": r6(f.rr_p90),
    })
}

fn source_json(src: &Source) -> Value {
    match src {
        Source::Trace {
            file,
            limit,
            spread_ms,
            session_rate,
            think_s,
            max_turns,
            ..
        } => json!({
            "trace": file, "limit": limit, "spread_ms": spread_ms,
            "session_rate": session_rate, "think_s": think_s, "max_turns": max_turns,
        }),
        Source::Synthetic(spec) => json!({"synthetic": spec}),
    }
}

/// The suite's JSON document (no wall-clock value: byte-identical for the
/// same inputs).
pub fn to_json(s: &SuiteResult, b: &Scoreboard) -> Value {
    let workloads: Vec<Value> = s
        .workloads
        .iter()
        .enumerate()
        .map(|(w, wr)| {
            json!({
                "name": wr.def.name,
                "half": wr.def.half.name(),
                "what": wr.def.what,
                "source": source_json(&wr.def.source),
                "block_tokens": defs::block_tokens(&wr.def),
                "scales": LOADS.iter().zip(wr.def.scales).map(|(l, x)| (l.to_string(), json!(x))).collect::<serde_json::Map<_, _>>(),
                "load_definition_held": LOADS.iter().enumerate().map(|(l, n)| (n.to_string(), json!(b.load_held.get(w).and_then(|v| v.get(l)).copied().unwrap_or(false)))).collect::<serde_json::Map<_, _>>(),
                "seeds": wr.seeds.iter().map(|sr| json!({
                    "seed": sr.seed,
                    "requests": sr.requests,
                    "prompt_tokens": sr.prompt_tokens,
                    "oracle_hit_rate": r6(sr.oracle_hit),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let cells: Vec<Value> = b
        .cells
        .iter()
        .map(|c| {
            let wr = s.workloads.get(c.workload);
            let k = PROXIES.iter().position(|&p| p == c.proxies).unwrap_or(0);
            json!({
                "workload": wr.map(|w| w.def.name).unwrap_or(""),
                "half": wr.map(|w| w.def.half.name()).unwrap_or(""),
                "load": LOADS.get(c.load).unwrap_or(&""),
                "rate_scale": c.scale,
                "proxies": c.proxies,
                "load_facts": wr.map(|w| w.seeds.iter().filter_map(|sr| sr.facts.get(c.load).map(|f| facts_json(sr.seed, f))).collect::<Vec<_>>()).unwrap_or_default(),
                "policies": s.policies.iter().zip(&c.aggs).enumerate().map(|(i, (p, a))| {
                    let mut v = agg_json(p, a);
                    // Each policy's own hit rate with K proxies over 1.
                    let one = b.cells.iter().find(|o| o.workload == c.workload && o.load == c.load && o.proxies == 1);
                    let ratio = one
                        .filter(|_| c.proxies > 1)
                        .and_then(|o| o.aggs.get(i))
                        .filter(|o| o.hit >= NO_SHARING_HIT)
                        .map(|o| a.hit / o.hit);
                    if let Some(m) = v.as_object_mut() {
                        m.insert("hit_kp_over_1p".into(), opt(ratio));
                    }
                    v
                }).collect::<Vec<_>>(),
                "runs": wr.map(|w| w.seeds.iter().map(|sr| json!({
                    "seed": sr.seed,
                    "results": sr.results.get(c.load).and_then(|x| x.get(k)).map(|v| v.iter().map(run_json).collect::<Vec<_>>()).unwrap_or_default(),
                })).collect::<Vec<_>>()).unwrap_or_default(),
                "default": c.verdict.as_ref().map(|v| json!({
                    "pass": v.pass(),
                    "fails": v.fails,
                    "best_peer_p90": {"policy": v.best_p90_peer, "p90_s": r6(v.best_p90)},
                    "best_peer_hit": {"policy": v.best_hit_peer, "hit_rate": r6(v.best_hit)},
                    "p90_over_best_peer": r6(v.p90_ratio),
                    "hit_over_best_peer": opt(v.hit_ratio),
                    "hit_4p_over_1p": opt(v.proxy_hit_ratio),
                    "p90_4p_over_1p": opt(v.proxy_p90_ratio),
                    "overload_p90_over_best_peer": opt(v.overload_ratio),
                })).unwrap_or(Value::Null),
            })
        })
        .collect();
    let summary: serde_json::Map<String, Value> = [Half::Tune, Half::Check]
        .into_iter()
        .map(|half| {
            let h = summarize(s, b, half);
            (
                half.name().to_string(),
                json!({
                    "cells": h.cells,
                    "cells_passed": h.passed,
                    "checks": CHECKS.iter().zip(&h.checks).map(|(n, (app, ok))| (n.to_string(), json!({"applicable": app, "passed": ok}))).collect::<serde_json::Map<_, _>>(),
                    "load_definitions": h.loads,
                    "load_definitions_held": h.loads_held,
                }),
            )
        })
        .collect();
    json!({
        "default_policy": DEFAULT_POLICY,
        "suite": {
            "replicas": REPLICAS,
            "proxies": PROXIES,
            "seeds": s.seeds,
            "quick": s.quick,
            "filter_scrape_ms": s.scrape_s * 1000.0,
            "batch_cost": s.batch_cost,
            "policies": s.policies,
            "peers": PEERS,
            "busy_window_s": defs::BUSY_WINDOW_S,
            "runs": s.runs,
            "loads": LOADS.iter().enumerate().map(|(l, n)| (n.to_string(), json!(load::definition(l)))).collect::<serde_json::Map<_, _>>(),
            "criteria": {
                "p90_over_best_peer_max": P90_VS_PEER_MAX,
                "hit_over_best_peer_min": HIT_VS_PEER_MIN,
                "hit_4p_over_1p_min": PROXY_HIT_MIN,
                "p90_4p_over_1p_max": PROXY_P90_MAX,
                "overload_p90_over_best_peer_max": OVERLOAD_P90_VS_PEER_MAX,
                "no_sharing_below_hit_rate": NO_SHARING_HIT,
            },
        },
        "workloads": workloads,
        "cells": cells,
        "summary": summary,
    })
}

fn secs(x: f64) -> String {
    if !x.is_finite() {
        "inf".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn ratio(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.2}"),
        Some(_) => "inf".into(),
        None => "-".into(),
    }
}

/// Short column titles of the per-policy table.
fn short(p: &str) -> String {
    let s = match p {
        "prefix-router-cost" => "index",
        "prefix-router" => "spill",
        "prefix-router:cost=off" => "ring",
        "sglang-cache-aware" => "sglang",
        "least-loaded" => "least-ld",
        "round-robin" => "rr",
        other => other,
    };
    let mut s: String = s.chars().take(11).collect();
    if p == DEFAULT_POLICY {
        s.push('*');
    }
    s
}

/// The scoreboard as text.
pub fn to_table(s: &SuiteResult, b: &Scoreboard) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "prefix-router-sim suite: {} workloads x {} loads x {:?} proxies x seeds {:?}; {} replicas; {} runs{}",
        s.workloads.len(),
        LOADS.len(),
        PROXIES,
        s.seeds,
        REPLICAS,
        s.runs,
        if s.quick { " (--quick: shortened workloads, load definitions not guaranteed)" } else { "" }
    );
    if s.batch_cost {
        let c = prefix_router_replica::CostModel::default().with_batch_cost();
        let _ = writeln!(
            out,
            "replicas with the memory-bound batch cost (--batch-cost: {:.0} ms steps plus {:.0} ns per context token decoding; not the suite's own model)",
            c.decode_step_s * 1e3,
            c.kv_read_s_per_token * 1e9
        );
    }
    if s.scrape_s > 0.0 {
        let _ = writeln!(
            out,
            "the filter's policies with the scrape on every {} ms (not the default config; peers unchanged)",
            s.scrape_s * 1000.0
        );
    }
    let _ = writeln!(
        out,
        "default policy: {DEFAULT_POLICY}; peers: {} (best peer per cell: lowest TTFT p90 / highest hit rate)",
        PEERS.join(", ")
    );
    for (l, n) in LOADS.iter().enumerate() {
        let _ = writeln!(out, "  {n:<9} {}", load::definition(l));
    }
    for half in [Half::Tune, Half::Check] {
        let ws: Vec<usize> = (0..s.workloads.len())
            .filter(|&w| s.workloads.get(w).map(|x| x.def.half) == Some(half))
            .collect();
        if ws.is_empty() {
            continue;
        }
        let names: Vec<&str> = ws
            .iter()
            .filter_map(|&w| s.workloads.get(w).map(|x| x.def.name))
            .collect();
        let _ = writeln!(out, "\n=== {} half: {} ===", half.name(), names.join(", "));
        let _ = writeln!(
            out,
            "\nloads (seed means, 1 proxy; held = the load's definition holds on them)"
        );
        let _ = writeln!(
            out,
            "{:<14} {:<9} {:>7} {:>6} {:>6} {:>6} {:>6}  held",
            "workload", "load", "scale", "U_pre", "U_slot", "rr9/5", "ringh%"
        );
        for &w in &ws {
            let Some(wr) = s.workloads.get(w) else {
                continue;
            };
            for (l, ln) in LOADS.iter().enumerate() {
                let f = LoadFacts::pooled(wr.seeds.iter().filter_map(|x| x.facts.get(l)))
                    .unwrap_or_default();
                let held = b
                    .load_held
                    .get(w)
                    .and_then(|v| v.get(l))
                    .copied()
                    .unwrap_or(false);
                let _ = writeln!(
                    out,
                    "{:<14} {:<9} {:>7} {:>6.2} {:>6.2} {:>6.2} {:>6.1}  {}",
                    wr.def.name,
                    ln,
                    wr.def.scales.get(l).copied().unwrap_or(0.0),
                    f.offered.prefill,
                    f.offered.slots,
                    f.rr_spread(),
                    f.ring_hit * 100.0,
                    if held { "yes" } else { "NO" }
                );
            }
        }
        let _ = writeln!(
            out,
            "\ndefault ({DEFAULT_POLICY}) per cell: its figures, then vs the best peer, then 4 proxies vs 1"
        );
        let _ = writeln!(
            out,
            "{:<14} {:<9} {:>2} | {:>6} {:>6} {:>6} {:>5} {:>5} {:>5} | {:>6} {:<18} {:>6} {:>5} {:<18} {:>6} | {:>6} {:>6} | verdict",
            "workload", "load", "K", "TTFT50", "TTFT90", "TTFT99", "hit%", "%orcl", "busy",
            "peer90", "(peer)", "p90/pr", "hit%", "(peer)", "hit/pr", "hit4/1", "p90_41"
        );
        for c in b.cells.iter().filter(|c| ws.contains(&c.workload)) {
            let Some(wr) = s.workloads.get(c.workload) else {
                continue;
            };
            let d = find(&s.policies, DEFAULT_POLICY).and_then(|i| c.aggs.get(i));
            let (Some(d), Some(v)) = (d, &c.verdict) else {
                continue;
            };
            let _ = writeln!(
                out,
                "{:<14} {:<9} {:>2} | {:>6} {:>6} {:>6} {:>5.1} {:>5.1} {:>5} | {:>6} {:<18} {:>6} {:>5.1} {:<18} {:>6} | {:>6} {:>6} | {}",
                wr.def.name,
                LOADS.get(c.load).unwrap_or(&""),
                c.proxies,
                secs(d.p50),
                secs(d.p90),
                secs(d.p99),
                d.hit * 100.0,
                d.frac_oracle * 100.0,
                d.busy_mean.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
                secs(v.best_p90),
                v.best_p90_peer,
                ratio(Some(v.p90_ratio)),
                v.best_hit * 100.0,
                v.best_hit_peer,
                ratio(v.hit_ratio),
                ratio(v.proxy_hit_ratio),
                ratio(v.proxy_p90_ratio),
                if v.pass() {
                    "ok".to_string()
                } else {
                    format!("FAIL {}", v.fails.join(", "))
                }
            );
        }
        let _ = writeln!(
            out,
            "\nevery policy: TTFT p90 (s) / hit %  (* = the default)"
        );
        let mut head = format!("{:<14} {:<9} {:>2} |", "workload", "load", "K");
        for p in &s.policies {
            let _ = write!(head, " {:>12}", short(p));
        }
        let _ = writeln!(out, "{head}");
        for c in b.cells.iter().filter(|c| ws.contains(&c.workload)) {
            let Some(wr) = s.workloads.get(c.workload) else {
                continue;
            };
            let mut line = format!(
                "{:<14} {:<9} {:>2} |",
                wr.def.name,
                LOADS.get(c.load).unwrap_or(&""),
                c.proxies
            );
            for a in &c.aggs {
                let _ = write!(
                    line,
                    " {:>12}",
                    format!("{}/{:.1}", secs(a.p90), a.hit * 100.0)
                );
            }
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(out);
    for half in [Half::Tune, Half::Check] {
        if s.workloads.iter().any(|w| w.def.half == half) {
            let _ = writeln!(out, "{}", summary_line(half, &summarize(s, b, half)));
        }
    }
    let _ = writeln!(
        out,
        "\nTTFT in s; hit% = prompt tokens served from cache; %orcl = hit / oracle; busy = mean over {} s windows with the fleet at least half busy of max/mean replica busy time (busy: holding a waiting or running request); peer90 / hit% (peer) = the best peer's; p90/pr, hit/pr = default / best peer; hit4/1, p90_41 = default with 4 proxies / with 1; U_pre, U_slot = offered prefill / running-slot utilization at the ring's hit rate (ringh%); rr9/5 = round robin's mean TTFT p90 / its mean p50; figures are means over seeds",
        defs::BUSY_WINDOW_S
    );
    out
}
