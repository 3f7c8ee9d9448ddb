//! Running the suite: every (workload, seed) built once, then every (load,
//! proxies, policy) simulated on it, on `threads` threads; results in a
//! fixed order whatever the scheduling.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::defs::{self, WorkloadDef, BUSY_WINDOW_S, PROXIES, REPLICAS, RING, ROUND_ROBIN};
use super::load::{offered, LoadFacts};
use crate::bounds;
use crate::engine::{simulate, SimConfig};
use crate::metrics::RunResult;
use crate::policy::PolicySpec;
use crate::workload::Workload;

/// What to run.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub defs: Vec<WorkloadDef>,
    pub seeds: Vec<u64>,
    pub threads: usize,
    pub quick: bool,
    /// Directory of the trace files.
    pub traces: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
    /// The filter's `scrape` period, seconds ([`SimConfig::scrape_interval_s`];
    /// 0: off, the default config).
    pub scrape_s: f64,
    /// Replicas with the memory-bound batch cost
    /// ([`prefix_router_replica::CostModel::with_batch_cost`]).
    pub batch_cost: bool,
}

/// One seed of one workload: its size, bound and runs.
#[derive(Debug, Clone)]
pub struct SeedRuns {
    pub seed: u64,
    pub requests: usize,
    pub prompt_tokens: u64,
    pub oracle_hit: f64,
    /// Per load: the facts its definition is checked on.
    pub facts: Vec<LoadFacts>,
    /// `[load][proxies index][policy index]`.
    pub results: Vec<Vec<Vec<RunResult>>>,
}

/// One workload's runs, seeds in order.
#[derive(Debug, Clone)]
pub struct WorkloadRuns {
    pub def: WorkloadDef,
    pub seeds: Vec<SeedRuns>,
}

/// Everything the suite measured.
#[derive(Debug, Clone)]
pub struct SuiteResult {
    pub policies: Vec<String>,
    pub seeds: Vec<u64>,
    pub quick: bool,
    /// [`SuiteOptions::scrape_s`].
    pub scrape_s: f64,
    /// [`SuiteOptions::batch_cost`].
    pub batch_cost: bool,
    pub workloads: Vec<WorkloadRuns>,
    /// Simulations run.
    pub runs: usize,
}

/// A fleet config for the suite.
pub fn suite_config(block_tokens: u32, seed: u64, scale: f64, proxies: usize) -> SimConfig {
    let mut c = SimConfig {
        replicas: REPLICAS,
        proxies,
        seed,
        rate_scale: scale,
        busy_window_s: BUSY_WINDOW_S,
        ..SimConfig::default()
    };
    c.cost.block_tokens = block_tokens;
    c
}

/// Run `jobs` on `threads` threads, calling `tick` after each; results in
/// job order.
pub fn par_map<J: Sync, T: Send>(
    jobs: &[J],
    threads: usize,
    f: impl Fn(&J) -> Result<T, String> + Sync,
    tick: impl Fn(&J) + Sync,
) -> Result<Vec<T>, String> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<T, String>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::SeqCst);
                let Some(job) = jobs.get(j) else {
                    break;
                };
                let r = f(job);
                tick(job);
                if let Ok(mut g) = out.lock() {
                    if let Some(slot) = g.get_mut(j) {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    out.into_inner()
        .map_err(|_| "a suite thread panicked".to_string())?
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a suite job did not finish".into())))
        .collect()
}

/// Progress on stderr: a bar on a terminal, a line every 10 % otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    done: AtomicUsize,
    t0: Instant,
    label: &'static str,
}

impl Progress {
    pub fn new(total: usize, show: bool, label: &'static str) -> Progress {
        let bar = (show && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix} [{elapsed_precise}] {bar:40} {pos}/{len} runs, eta {eta} {msg}",
            ) {
                b.set_style(style);
            }
            b.set_prefix(label);
            b
        });
        Progress {
            bar,
            total: if show { total } else { 0 },
            done: AtomicUsize::new(0),
            t0: Instant::now(),
            label,
        }
    }

    pub fn tick(&self, msg: &str) {
        let d = self.done.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
            b.inc(1);
        } else if self.total > 0 {
            let step = (self.total / 10).max(1);
            if d.is_multiple_of(step) || d == self.total {
                eprintln!(
                    "{}: {d}/{} runs, {:.0} s",
                    self.label,
                    self.total,
                    self.t0.elapsed().as_secs_f64()
                );
            }
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

struct Built {
    wl: Workload,
    oracle_hit: f64,
}

/// Run the suite.
pub fn run_suite(o: &SuiteOptions) -> Result<SuiteResult, String> {
    let policies: Vec<String> = defs::policies().iter().map(|s| s.to_string()).collect();
    let specs: Vec<PolicySpec> = policies
        .iter()
        .map(|p| PolicySpec::parse(p).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let ring = policies
        .iter()
        .position(|p| p == RING)
        .ok_or("the suite runs the ring")?;
    let rr = policies
        .iter()
        .position(|p| p == ROUND_ROBIN)
        .ok_or("the suite runs round robin")?;
    let ws: Vec<(usize, usize)> = (0..o.defs.len())
        .flat_map(|w| (0..o.seeds.len()).map(move |s| (w, s)))
        .collect();
    let n_runs = ws.len() * defs::LOADS.len() * PROXIES.len() * specs.len();
    let progress = Progress::new(ws.len() + n_runs, o.progress, "suite");
    let built: Vec<Built> = par_map(
        &ws,
        o.threads,
        |&(w, s)| {
            let def = o.defs.get(w).ok_or("no such workload")?;
            let seed = o.seeds.get(s).copied().unwrap_or(1);
            let wl = defs::build(def, &o.traces, seed, o.quick)?;
            let c = suite_config(wl.block_tokens, seed, 1.0, 1);
            let total = c.cost.cache_capacity_tokens.saturating_mul(REPLICAS as u64);
            let b = bounds::compute_with(&wl, total, c.output_kv);
            Ok(Built {
                wl,
                oracle_hit: b.oracle_hit,
            })
        },
        |&(w, _)| progress.tick(o.defs.get(w).map(|d| d.name).unwrap_or("")),
    )?;
    // (workload-seed index, load, proxies index, policy index)
    let mut jobs: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(n_runs);
    for i in 0..ws.len() {
        for l in 0..defs::LOADS.len() {
            for k in 0..PROXIES.len() {
                for p in 0..specs.len() {
                    jobs.push((i, l, k, p));
                }
            }
        }
    }
    let results: Vec<RunResult> = par_map(
        &jobs,
        o.threads,
        |&(i, l, k, p)| {
            let (&(w, s), b) = ws.get(i).zip(built.get(i)).ok_or("job out of range")?;
            let def = o.defs.get(w).ok_or("no such workload")?;
            let spec = specs.get(p).ok_or("no such policy")?;
            let scale = def.scales.get(l).copied().unwrap_or(1.0);
            let seed = o.seeds.get(s).copied().unwrap_or(1);
            let proxies = PROXIES.get(k).copied().unwrap_or(1);
            let mut c = SimConfig {
                scrape_interval_s: o.scrape_s,
                ..suite_config(b.wl.block_tokens, seed, scale, proxies)
            };
            if o.batch_cost {
                c.cost = c.cost.with_batch_cost();
            }
            simulate(&b.wl, spec, &c).map_err(|e| {
                format!(
                    "{} seed {seed} x{scale} {proxies}p {}: {e}",
                    def.name, spec.label
                )
            })
        },
        |&(i, l, _, _)| {
            let name = ws
                .get(i)
                .and_then(|&(w, _)| o.defs.get(w))
                .map(|d| d.name)
                .unwrap_or("");
            progress.tick(&format!("{name} {}", defs::LOADS.get(l).unwrap_or(&"")));
        },
    )?;
    progress.finish();
    let mut it = results.into_iter();
    let mut workloads: Vec<WorkloadRuns> = o
        .defs
        .iter()
        .map(|d| WorkloadRuns {
            def: d.clone(),
            seeds: Vec::new(),
        })
        .collect();
    for (&(w, s), b) in ws.iter().zip(&built) {
        let def = o.defs.get(w).ok_or("no such workload")?;
        let seed = o.seeds.get(s).copied().unwrap_or(1);
        let mut res: Vec<Vec<Vec<RunResult>>> = Vec::new();
        for _ in 0..defs::LOADS.len() {
            let mut per_k = Vec::new();
            for _ in 0..PROXIES.len() {
                let v: Vec<RunResult> = it.by_ref().take(specs.len()).collect();
                per_k.push(v);
            }
            res.push(per_k);
        }
        let pick = |l: usize, p: usize| res.get(l).and_then(|x| x.first()).and_then(|x| x.get(p));
        let ring_hit = pick(0, ring).map(|r| r.hit_rate).unwrap_or(0.0);
        let c = suite_config(b.wl.block_tokens, seed, 1.0, 1);
        let facts = (0..defs::LOADS.len())
            .map(|l| LoadFacts {
                ring_hit,
                offered: offered(
                    &b.wl,
                    &c.cost,
                    REPLICAS,
                    def.scales.get(l).copied().unwrap_or(1.0),
                    ring_hit,
                ),
                rr_p50: pick(l, rr).map(|r| r.ttft.p50).unwrap_or(0.0),
                rr_p90: pick(l, rr).map(|r| r.ttft.p90).unwrap_or(0.0),
            })
            .collect();
        if let Some(wr) = workloads.get_mut(w) {
            wr.seeds.push(SeedRuns {
                seed,
                requests: b.wl.len(),
                prompt_tokens: b.wl.prompt_tokens(),
                oracle_hit: b.oracle_hit,
                facts,
                results: res,
            });
        }
    }
    Ok(SuiteResult {
        policies,
        seeds: o.seeds.clone(),
        quick: o.quick,
        scrape_s: o.scrape_s,
        batch_cost: o.batch_cost,
        workloads,
        runs: n_runs,
    })
}
