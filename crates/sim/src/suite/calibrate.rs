//! `suite --calibrate`: recompute every workload's rate scales from the
//! load definitions ([`super::load`]) and check that the stored ones
//! ([`super::defs::workloads`]) still meet them.
//!
//! Per workload, with 1 proxy, on every seed:
//! * moderate: the largest scale with `max(U_prefill, U_slots)` at 0.45
//!   (the ring's hit rate measured there, twice, as it moves with load), the
//!   smallest over seeds, rounded down to 3 digits;
//! * overload: the scale with `U_prefill` at 1.5, the largest over seeds,
//!   rounded up;
//! * heavy: on 10 scales spaced evenly on a log scale from
//!   `max(U_prefill, U_slots)` at 0.65 to `U_prefill` at 1.15 (the largest
//!   and the smallest over seeds), the heaviest at which round robin's mean
//!   TTFT p90 over seeds is at least 3.15 x its mean p50; if there is none,
//!   the one with the largest spread (reported as not meeting the
//!   definition). Rounded down to 3 digits.
//!
//! The targets sit inside the definitions (0.6, 3, 1.2) so that the
//! stored, rounded scales keep a margin.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::defs::{self, WorkloadDef, LOADS, REPLICAS, RING, ROUND_ROBIN};
use super::load::{self, offered, round3, scale_for, LoadFacts};
use super::run::{par_map, suite_config, Progress, SuiteOptions};
use crate::engine::simulate;
use crate::metrics::RunResult;
use crate::policy::{PolicySpec, DEFAULT_POLICY};
use crate::workload::Workload;

/// One workload's calibration.
#[derive(Debug, Clone)]
pub struct Calibration {
    pub name: &'static str,
    pub stored: [f64; 3],
    /// `[seed][load]` at the stored scales.
    pub stored_facts: Vec<Vec<LoadFacts>>,
    /// Per load: the stored scale meets its definition (on the seed means).
    pub stored_held: [bool; 3],
    /// Recomputed scales (`None`: the definition cannot be met).
    pub computed: [Option<f64>; 3],
    /// Round robin's mean TTFT p90 / mean p50 over seeds at the computed
    /// heavy scale (below 3.15: no scale met the heavy target, and this is
    /// the best one found).
    pub heavy_spread: Option<f64>,
}

impl Calibration {
    /// Can `load` be met at all (a scale was found that meets it)?
    pub fn attainable(&self, load: usize) -> bool {
        match self.computed.get(load).copied().flatten() {
            None => false,
            Some(_) if load == 1 => self
                .heavy_spread
                .is_some_and(|w| w >= load::HEAVY_MIN_RR_SPREAD),
            Some(_) => true,
        }
    }

    /// A stored scale that fails its definition where another scale meets
    /// it: the suite definition is stale.
    pub fn stale(&self, load: usize) -> bool {
        !self.stored_held.get(load).copied().unwrap_or(false) && self.attainable(load)
    }
}

fn run1(wl: &Workload, policy: &str, seed: u64, scale: f64) -> Result<RunResult, String> {
    let spec = PolicySpec::parse(policy).map_err(|e| e.to_string())?;
    simulate(wl, &spec, &suite_config(wl.block_tokens, seed, scale, 1))
        .map_err(|e| format!("{}: {policy} x{scale}: {e}", wl.name))
}

fn cost() -> prefix_router_replica::CostModel {
    suite_config(16, 1, 1.0, 1).cost
}

fn calibrate_one(def: &WorkloadDef, o: &SuiteOptions) -> Result<Calibration, String> {
    let wls: Vec<(u64, Workload)> = o
        .seeds
        .iter()
        .map(|&seed| defs::build(def, &o.traces, seed, o.quick).map(|w| (seed, w)))
        .collect::<Result<_, _>>()?;
    let c = cost();
    let u = |wl: &Workload, s: f64, h: f64| offered(wl, &c, REPLICAS, s, h);
    let ring_hit = |wl: &Workload, seed: u64, s: f64| run1(wl, RING, seed, s).map(|r| r.hit_rate);
    let rr = |wl: &Workload, seed: u64, s: f64| {
        run1(wl, ROUND_ROBIN, seed, s).map(|r| (r.ttft.p50, r.ttft.p90))
    };
    // Round robin's mean p90 / mean p50 over the seeds at `s`.
    let rr_spread = |s: f64| -> Result<f64, String> {
        let mut facts = Vec::new();
        for (seed, wl) in &wls {
            let (rr_p50, rr_p90) = rr(wl, *seed, s)?;
            facts.push(LoadFacts {
                rr_p50,
                rr_p90,
                ..LoadFacts::default()
            });
        }
        Ok(LoadFacts::pooled(&facts)
            .map(|f| f.rr_spread())
            .unwrap_or(0.0))
    };

    // The stored scales.
    let mut stored_facts = Vec::new();
    for (seed, wl) in &wls {
        let h = ring_hit(wl, *seed, def.scales[0])?;
        let mut v = Vec::new();
        for &s in &def.scales {
            let (rr_p50, rr_p90) = rr(wl, *seed, s)?;
            v.push(LoadFacts {
                ring_hit: h,
                offered: u(wl, s, h),
                rr_p50,
                rr_p90,
            });
        }
        stored_facts.push(v);
    }
    let mut stored_held = [false; 3];
    for (l, held) in stored_held.iter_mut().enumerate() {
        *held = LoadFacts::pooled(stored_facts.iter().filter_map(|v| v.get(l)))
            .is_some_and(|f| load::holds(l, &f));
    }

    // Moderate.
    let (lo, hi) = (1e-3, 1e5);
    let mut moderate: Option<f64> = None;
    for (seed, wl) in &wls {
        let mut h = ring_hit(wl, *seed, def.scales[0])?;
        let mut s = None;
        for _ in 0..2 {
            s = scale_for(load::TARGET_MODERATE_U, lo, hi, |x| u(wl, x, h).max());
            if let Some(x) = s {
                h = ring_hit(wl, *seed, x)?;
            }
        }
        let s = s.map(|x| round3(x, false));
        moderate = match (moderate, s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let Some(m) = moderate else {
        return Ok(Calibration {
            name: def.name,
            stored: def.scales,
            stored_facts,
            stored_held,
            computed: [None; 3],
            heavy_spread: None,
        });
    };
    let mut hits = Vec::new();
    for (seed, wl) in &wls {
        hits.push(ring_hit(wl, *seed, m)?);
    }

    // Overload.
    let mut overload = Some(m);
    for ((_, wl), &h) in wls.iter().zip(&hits) {
        let s = scale_for(load::TARGET_OVERLOAD_U, m, hi, |x| u(wl, x, h).prefill);
        overload = match (overload, s) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let overload = overload.map(|x| round3(x, true));

    // Heavy.
    let mut a = m;
    let mut b = f64::INFINITY;
    for ((_, wl), &h) in wls.iter().zip(&hits) {
        if let Some(x) = scale_for(load::TARGET_HEAVY_LOW_U, m, hi, |x| u(wl, x, h).max()) {
            a = a.max(x);
        }
        if let Some(x) = scale_for(load::TARGET_HEAVY_HIGH_U, m, hi, |x| u(wl, x, h).prefill) {
            b = b.min(x);
        }
    }
    let mut heavy = None;
    let mut heavy_spread = None;
    if b.is_finite() && b > a {
        const STEPS: usize = 10;
        let mut best: Option<(f64, f64)> = None; // (spread, scale)
        for i in (0..STEPS).rev() {
            let x = round3(a * (b / a).powf(i as f64 / (STEPS - 1) as f64), false);
            let spread = rr_spread(x)?;
            if spread >= load::TARGET_HEAVY_RR_SPREAD {
                heavy = Some(x);
                heavy_spread = Some(spread);
                break;
            }
            if best.is_none_or(|(w, _)| spread > w) {
                best = Some((spread, x));
            }
        }
        if heavy.is_none() {
            heavy = best.map(|(_, x)| x);
            heavy_spread = best.map(|(w, _)| w);
        }
    }
    Ok(Calibration {
        name: def.name,
        stored: def.scales,
        stored_facts,
        stored_held,
        computed: [Some(m), heavy, overload],
        heavy_spread,
    })
}

/// Calibrate every workload of `o`; the text report, the JSON, and whether
/// the stored scales are up to date: every one meets its definition, except
/// where no scale can (those are reported, not failed).
pub fn calibrate(o: &SuiteOptions) -> Result<(String, Value, bool), String> {
    let progress = Progress::new(o.defs.len(), o.progress, "calibrate");
    let cals: Vec<Calibration> = par_map(
        &o.defs,
        o.threads,
        |d| calibrate_one(d, o),
        |d| progress.tick(d.name),
    )?;
    progress.finish();
    let all = cals.iter().all(|c| (0..LOADS.len()).all(|l| !c.stale(l)));
    let mut t = String::new();
    let _ = writeln!(
        t,
        "suite --calibrate: seeds {:?}{}; default policy {DEFAULT_POLICY}",
        o.seeds,
        if o.quick { " (--quick workloads)" } else { "" }
    );
    for (l, n) in LOADS.iter().enumerate() {
        let _ = writeln!(t, "  {n:<9} {}", load::definition(l));
    }
    let _ = writeln!(
        t,
        "\n{:<14} {:<9} {:>8} {:>10} | {:>6} {:>6} {:>6} {:>6} | held",
        "workload", "load", "stored", "computed", "U_pre", "U_slot", "rr9/5", "ringh%"
    );
    let fmt = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_else(|| "none".into());
    for c in &cals {
        for (l, n) in LOADS.iter().enumerate() {
            let f = LoadFacts::pooled(c.stored_facts.iter().filter_map(|v| v.get(l)))
                .unwrap_or_default();
            let _ = writeln!(
                t,
                "{:<14} {:<9} {:>8} {:>10} | {:>6.2} {:>6.2} {:>6.2} {:>6.1} | {}",
                c.name,
                n,
                c.stored[l],
                fmt(c.computed[l]),
                f.offered.prefill,
                f.offered.slots,
                f.rr_spread(),
                f.ring_hit * 100.0,
                if c.stored_held[l] {
                    "yes"
                } else if c.attainable(l) {
                    "NO (stale: update defs.rs)"
                } else {
                    "NO (no scale meets it)"
                }
            );
        }
    }
    for c in &cals {
        if let Some(w) = c.heavy_spread.filter(|w| *w < load::TARGET_HEAVY_RR_SPREAD) {
            let _ = writeln!(
                t,
                "note: {}: no heavy scale gives round robin mean TTFT p90 >= {} x mean p50; computed heavy is the best found (spread {w:.2}; the definition needs {})",
                c.name,
                load::TARGET_HEAVY_RR_SPREAD,
                load::HEAVY_MIN_RR_SPREAD
            );
        }
    }
    let _ = writeln!(t, "\ncomputed scales, for crates/sim/src/suite/defs.rs:");
    for c in &cals {
        let _ = writeln!(
            t,
            "  {:<14} scales: [{}, {}, {}],",
            c.name,
            fmt(c.computed[0]),
            fmt(c.computed[1]),
            fmt(c.computed[2])
        );
    }
    let _ = writeln!(
        t,
        "\n{}",
        if all {
            "the stored scales are up to date: each meets its load definition, or no scale does (noted above)"
        } else {
            "some stored scales do NOT meet a load definition that another scale meets: update defs.rs"
        }
    );
    let j = json!({
        "default_policy": DEFAULT_POLICY,
        "seeds": o.seeds,
        "quick": o.quick,
        "up_to_date": all,
        "workloads": cals.iter().map(|c| json!({
            "name": c.name,
            "stored": c.stored,
            "stored_held": c.stored_held,
            "attainable": (0..LOADS.len()).map(|l| c.attainable(l)).collect::<Vec<_>>(),
            "computed": c.computed,
            "computed_heavy_min_rr_spread": c.heavy_spread,
            "stored_facts": c.stored_facts.iter().zip(&o.seeds).map(|(v, seed)| json!({
                "seed": seed,
                "loads": v.iter().map(|f| json!({
                    "ring_hit_rate": f.ring_hit,
                    "u_prefill": f.offered.prefill,
                    "u_slots": f.offered.slots,
                    "round_robin_ttft_p50_s": f.rr_p50,
                    "round_robin_ttft_p90_s": f.rr_p90,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    Ok((t, j, all))
}
