//! The `prefix-router-sim` command line (hand-rolled parsing; see
//! `crates/sim/README.md` for the operator guide).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use prefix_router_replica::CostModel;

use crate::bounds;
use crate::engine::{simulate, SimConfig};
use crate::metrics::RunResult;
use crate::policy::PolicySpec;
use crate::report::{to_json, to_table, Report, RunSet};
use crate::svg::{line_chart, slug, Scale, Series};
use crate::workload::{self, synthetic, Format, TraceOptions, Workload};

pub const USAGE: &str = "\
prefix-router-sim: what would prefix-router (and its peers) do on my traffic?

USAGE:
  prefix-router-sim --trace FILE [options]
  prefix-router-sim --synthetic SPEC [options]

WORKLOAD
  --trace FILE            Mooncake JSONL, ShareGPT JSON or Azure CSV (detected)
  --format F              mooncake | sharegpt | azure (skip detection)
  --synthetic SPEC        shared-prefix | shared-prefix-long-q | zipf | long-context |
                          multi-turn, with options NAME:key=value,... (see README)
  --limit N               first N requests (trace) / sessions (ShareGPT)
  --spread-ms X           spread each session's start uniformly over X ms
                          after its timestamp (default 0; the Mooncake
                          conversation trace's timestamps are on a 3000 ms grid)
  --session-rate R        ShareGPT: sessions per second (default 2)
  --think-s S             ShareGPT: mean think time between turns (default 10)
  --max-turns N           ShareGPT: at most N turns per conversation

FLEET
  --replicas N            replicas (default 8)
  --cache-tokens T        KV cache per replica, tokens (default 400000)
  --prefill-tps X         prefill tokens/s (default 16000)
  --decode-step-ms X      decode step (default 15)
  --max-running N         max running batch (default 64)
  --block-tokens N        KV block size, tokens (default 16; 512 for Mooncake
                          traces, their own granularity)
  --attention             add the quadratic attention term (Llama-8B coefficient)
  --no-output-kv          replicas do not keep generated tokens' KV (vLLM does)

ROUTING
  --policy NAME           repeatable, or 'all' (default all); NAME[:key=value,...]
  --proxies K[,K2...]     router instances (default 1); a list runs each and
                          prints hit-rate ratios against 1 proxy
  --rate-scale X[,X2...]  arrival-time compression (default 1); a list sweeps
  --report-interval-ms X  replica load report period (default 50; 0 = off)
  --report-delay-ms X     extra report delay (default 0)

OUTPUT
  --json                  JSON on stdout instead of the table
  --plots DIR             write SVG plots (hit rate / TTFT p90 vs load, per-replica load)
  --window-s S            load-balance window (default 60)
  --seed S                seed of every random choice (default 1)
  --threads N             policies simulated in parallel (default 2)
  -h, --help
";

/// Parsed arguments.
#[derive(Debug, Clone)]
pub struct Args {
    pub trace: Option<PathBuf>,
    pub synthetic: Option<String>,
    pub trace_opts: TraceOptions,
    pub policies: Vec<String>,
    pub proxies: Vec<usize>,
    pub rate_scales: Vec<f64>,
    /// `--spread-ms`: session starts spread over this many ms.
    pub spread_ms: f64,
    pub json: bool,
    pub plots: Option<PathBuf>,
    pub threads: usize,
    /// KV block size (None: 512 for Mooncake traces, else 16).
    pub block_tokens: Option<u32>,
    pub cfg: SimConfig,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            trace: None,
            synthetic: None,
            trace_opts: TraceOptions::default(),
            policies: Vec::new(),
            proxies: vec![1],
            rate_scales: vec![1.0],
            spread_ms: 0.0,
            json: false,
            plots: None,
            threads: 2,
            block_tokens: None,
            cfg: SimConfig::default(),
        }
    }
}

fn list<T: std::str::FromStr>(flag: &str, v: &str) -> Result<Vec<T>, String> {
    v.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("{flag}: bad value {x:?}"))
        })
        .collect()
}

fn one<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse::<T>()
        .map_err(|_| format!("{flag}: bad value {v:?}"))
}

/// Parse the arguments (without the program name).
pub fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args::default();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (flag.clone(), None),
        };
        let mut val = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--trace" => a.trace = Some(PathBuf::from(val()?)),
            "--format" => {
                let v = val()?;
                a.trace_opts.format =
                    Some(Format::parse(&v).ok_or_else(|| {
                        format!("--format: {v:?} is not mooncake, sharegpt or azure")
                    })?)
            }
            "--synthetic" => a.synthetic = Some(val()?),
            "--limit" => a.trace_opts.limit = one("--limit", &val()?)?,
            "--spread-ms" => a.spread_ms = one("--spread-ms", &val()?)?,
            "--session-rate" => a.trace_opts.session_rate = one("--session-rate", &val()?)?,
            "--think-s" => a.trace_opts.think_s = one("--think-s", &val()?)?,
            "--max-turns" => a.trace_opts.max_turns = one("--max-turns", &val()?)?,
            "--replicas" => a.cfg.replicas = one("--replicas", &val()?)?,
            "--cache-tokens" => a.cfg.cost.cache_capacity_tokens = one("--cache-tokens", &val()?)?,
            "--prefill-tps" => a.cfg.cost.prefill_tokens_per_s = one("--prefill-tps", &val()?)?,
            "--decode-step-ms" => {
                a.cfg.cost.decode_step_s = one::<f64>("--decode-step-ms", &val()?)? / 1000.0
            }
            "--max-running" => a.cfg.cost.max_running = one("--max-running", &val()?)?,
            "--block-tokens" => {
                a.block_tokens = Some(one::<u32>("--block-tokens", &val()?)?.max(1))
            }
            "--attention" => a.cfg.cost.attention_coeff = CostModel::LLAMA_8B_ATTENTION_COEFF,
            "--policy" => a.policies.push(val()?),
            "--proxies" => a.proxies = list("--proxies", &val()?)?,
            "--rate-scale" => a.rate_scales = list("--rate-scale", &val()?)?,
            "--report-interval-ms" => {
                a.cfg.report_interval_s = one::<f64>("--report-interval-ms", &val()?)? / 1000.0
            }
            "--report-delay-ms" => {
                a.cfg.report_delay_s = one::<f64>("--report-delay-ms", &val()?)? / 1000.0
            }
            "--json" => a.json = true,
            "--no-output-kv" => a.cfg.output_kv = false,
            "--plots" => a.plots = Some(PathBuf::from(val()?)),
            "--window-s" => a.cfg.window_s = one("--window-s", &val()?)?,
            "--seed" => a.cfg.seed = one("--seed", &val()?)?,
            "--threads" => a.threads = one::<usize>("--threads", &val()?)?.max(1),
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if a.trace.is_some() == a.synthetic.is_some() {
        return Err("give exactly one of --trace FILE or --synthetic SPEC".into());
    }
    if a.policies.is_empty() {
        a.policies.push("all".into());
    }
    if a.proxies.is_empty() || a.proxies.contains(&0) {
        return Err("--proxies: values must be >= 1".into());
    }
    if a.rate_scales.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return Err("--rate-scale: values must be > 0".into());
    }
    if !(a.spread_ms.is_finite() && a.spread_ms >= 0.0) {
        return Err("--spread-ms: must be >= 0".into());
    }
    if a.cfg.window_s.is_nan()
        || a.cfg.window_s <= 0.0
        || a.cfg.report_interval_s < 0.0
        || a.cfg.report_delay_s < 0.0
    {
        return Err("--window-s must be > 0, report interval and delay >= 0".into());
    }
    if a.cfg.replicas == 0 || a.cfg.replicas > 4096 {
        return Err("--replicas must be 1..=4096".into());
    }
    if a.cfg.cost.prefill_tokens_per_s <= 0.0 || a.cfg.cost.max_running == 0 {
        return Err("--prefill-tps must be > 0 and --max-running >= 1".into());
    }
    Ok(Some(a))
}

/// Block size when not given: the trace's own granularity for Mooncake
/// (512-token `hash_ids`: 16-token sub-blocks of one id carry no extra
/// sharing information and cost 32x the simulation time), vLLM's default 16
/// otherwise.
pub fn default_block_tokens(a: &Args) -> u32 {
    if let Some(b) = a.block_tokens {
        return b;
    }
    let Some(p) = &a.trace else { return 16 };
    let fmt = a.trace_opts.format.or_else(|| {
        use std::io::Read;
        let mut head = vec![0u8; 4096];
        let n = std::fs::File::open(p)
            .and_then(|mut f| f.read(&mut head))
            .unwrap_or(0);
        Format::detect(head.get(..n).unwrap_or(&[]))
    });
    if fmt == Some(Format::Mooncake) {
        512
    } else {
        16
    }
}

/// Build the workload the arguments describe (prompts hashed for
/// [`default_block_tokens`]).
pub fn load_workload(a: &Args) -> Result<Workload, String> {
    let bt = default_block_tokens(a);
    let mut wl = if let Some(p) = &a.trace {
        workload::load_trace(p, &a.trace_opts, a.cfg.seed, bt)
            .map_err(|e| format!("{}: {e}", p.display()))?
    } else if let Some(s) = &a.synthetic {
        let spec = synthetic::Spec::parse(s).map_err(|e| e.to_string())?;
        let mut wl = synthetic::build(&spec, a.cfg.seed, bt);
        if a.trace_opts.limit > 0 {
            wl.truncate_sessions(a.trace_opts.limit);
        }
        wl
    } else {
        return Err("no workload".into());
    };
    wl.spread_starts(a.spread_ms / 1000.0, a.cfg.seed);
    Ok(wl)
}

/// Run every (rate scale, proxies, policy) combination; results in that
/// order regardless of thread scheduling.
pub fn run_matrix(
    wl: &Workload,
    specs: &[PolicySpec],
    base: &SimConfig,
    rate_scales: &[f64],
    proxies: &[usize],
    threads: usize,
) -> Result<Vec<RunSet>, String> {
    let mut jobs = Vec::new();
    for &s in rate_scales {
        for &k in proxies {
            for (i, spec) in specs.iter().enumerate() {
                jobs.push((s, k, i, spec));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<RunResult, String>>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(s, k, _, spec)) = jobs.get(j) else {
                    break;
                };
                let cfg = SimConfig {
                    rate_scale: s,
                    proxies: k,
                    ..base.clone()
                };
                let r = simulate(wl, spec, &cfg).map_err(|e| format!("{}: {e}", spec.label));
                if let Ok(mut g) = out.lock() {
                    if let Some(slot) = g.get_mut(j) {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    let results = out
        .into_inner()
        .map_err(|_| "a simulation thread panicked".to_string())?;
    let mut sets: Vec<RunSet> = Vec::new();
    for (j, r) in results.into_iter().enumerate() {
        let r = r.ok_or_else(|| "a simulation did not finish".to_string())??;
        let Some(&(s, k, _, _)) = jobs.get(j) else {
            continue;
        };
        match sets.last_mut() {
            Some(set) if set.rate_scale == s && set.proxies == k => set.results.push(r),
            _ => sets.push(RunSet {
                rate_scale: s,
                proxies: k,
                results: vec![r],
            }),
        }
    }
    Ok(sets)
}

/// Write the plots.
pub fn write_plots(dir: &std::path::Path, rep: &Report) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: String, body: String| -> Result<(), String> {
        let p = dir.join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))?;
        written.push(p);
        Ok(())
    };
    let proxies: Vec<usize> = {
        let mut v: Vec<usize> = rep.runs.iter().map(|s| s.proxies).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    for &k in &proxies {
        let sets: Vec<&RunSet> = rep.runs.iter().filter(|s| s.proxies == k).collect();
        if sets.len() >= 2 {
            let labels: Vec<String> = sets
                .first()
                .map(|s| s.results.iter().map(|r| r.policy.clone()).collect())
                .unwrap_or_default();
            let series = |f: &dyn Fn(&RunResult) -> f64| -> Vec<Series> {
                labels
                    .iter()
                    .map(|l| Series {
                        label: l.clone(),
                        points: sets
                            .iter()
                            .filter_map(|s| {
                                s.results
                                    .iter()
                                    .find(|r| &r.policy == l)
                                    .map(|r| (s.rate_scale, f(r)))
                            })
                            .collect(),
                    })
                    .collect()
            };
            let title = format!(
                "{}, {} replicas, {} prox{}",
                rep.workload,
                rep.config.replicas,
                k,
                if k == 1 { "y" } else { "ies" }
            );
            put(
                format!("hit_rate_vs_load_k{k}.svg"),
                line_chart(
                    &format!("Prefix-cache hit rate vs offered load ({title})"),
                    "offered load (rate scale x)",
                    "hit rate (% of prompt tokens)",
                    &series(&|r| r.hit_rate * 100.0),
                    Scale::LinearZero,
                ),
            )?;
            put(
                format!("ttft_p90_vs_load_k{k}.svg"),
                line_chart(
                    &format!("TTFT p90 vs offered load ({title})"),
                    "offered load (rate scale x)",
                    "TTFT p90 (s, log scale)",
                    &series(&|r| r.ttft.p90),
                    Scale::Log,
                ),
            )?;
        }
    }
    for set in &rep.runs {
        for r in &set.results {
            let n = r.window_load.first().map(|v| v.len()).unwrap_or(0);
            let series: Vec<Series> = (0..n)
                .map(|h| Series {
                    label: format!("replica {h}"),
                    points: r
                        .window_load
                        .iter()
                        .enumerate()
                        .map(|(w, row)| {
                            (
                                (w as f64 + 0.5) * rep.config.window_s / 60.0,
                                row.get(h).copied().unwrap_or(0.0),
                            )
                        })
                        .collect(),
                })
                .collect();
            put(
                format!("load_{}_x{}_k{}.svg", slug(&r.policy), set.rate_scale, set.proxies),
                line_chart(
                    &format!(
                        "Per-replica load, {} (rate x{}, {} prox{}): requests in replica, {:.0} s windows",
                        r.policy,
                        set.rate_scale,
                        set.proxies,
                        if set.proxies == 1 { "y" } else { "ies" },
                        rep.config.window_s
                    ),
                    "time (min)",
                    "requests in replica (waiting + running)",
                    &series,
                    Scale::LinearZero,
                ),
            )?;
        }
    }
    Ok(written)
}

/// The whole program; returns the process exit code.
pub fn main_with_args(argv: &[String]) -> i32 {
    let a = match parse(argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return 2;
        }
    };
    match run(&a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let t0 = Instant::now();
    let mut specs = Vec::new();
    for p in &a.policies {
        specs.extend(PolicySpec::expand(p).map_err(|e| e.to_string())?);
    }
    let wl = load_workload(a)?;
    let mut cfg = a.cfg.clone();
    cfg.cost.block_tokens = wl.block_tokens;
    let t_load = t0.elapsed();
    let total_cache = cfg
        .cost
        .cache_capacity_tokens
        .saturating_mul(cfg.replicas as u64);
    let b = bounds::compute_with(&wl, total_cache, cfg.output_kv);
    let sets = run_matrix(&wl, &specs, &cfg, &a.rate_scales, &a.proxies, a.threads)?;
    let rep = Report::new(&wl, &cfg, b, sets);
    if a.json {
        let s = serde_json::to_string_pretty(&to_json(&rep)).map_err(|e| e.to_string())?;
        println!("{s}");
    } else {
        print!("{}", to_table(&rep));
    }
    if let Some(dir) = &a.plots {
        let files = write_plots(dir, &rep)?;
        eprintln!("wrote {} plots to {}", files.len(), dir.display());
    }
    eprintln!(
        "simulated {} run(s) of {} requests in {:.1} s (workload load {:.1} s, {} thread(s))",
        rep.runs.iter().map(|s| s.results.len()).sum::<usize>(),
        wl.len(),
        t0.elapsed().as_secs_f64(),
        t_load.as_secs_f64(),
        a.threads
    );
    Ok(())
}
