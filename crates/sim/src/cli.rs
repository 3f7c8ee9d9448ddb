//! The `prefix-router-sim` command line (clap, derive; see
//! `crates/sim/README.md` for the operator guide).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prefix_router_replica::CostModel;

use crate::bounds;
use crate::engine::{simulate, SimConfig};
use crate::metrics::RunResult;
use crate::plot::{line_chart, slug, Scale, Series};
use crate::policy::PolicySpec;
use crate::report::{to_json, to_table, Report, RunSet};
use crate::suite::{self, Half};
use crate::workload::{self, synthetic, Format, TraceOptions, Workload};

const ABOUT: &str = "prefix-router-sim: what would prefix-router (and its peers) do on my traffic?";

const AFTER: &str = "\
Plain run: give exactly one of --trace FILE or --synthetic SPEC.
  prefix-router-sim --trace mooncake_conversation_trace.jsonl --replicas 8 --rate-scale 1,3
  prefix-router-sim --synthetic shared-prefix:rate=20 --policy gie --policy prefix-router --proxies 1,4
The suite (every workload, load, proxy count and seed; one scoreboard):
  prefix-router-sim suite [--json] [--half tune|check|all] [--quick] [--calibrate]
See crates/sim/README.md.";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "prefix-router-sim",
    version,
    about = ABOUT,
    after_help = AFTER,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the fixed workload suite and print one scoreboard.
    #[command(long_about = SUITE_ABOUT)]
    Suite(SuiteArgs),
}

const SUITE_ABOUT: &str = "\
Run the fixed workload suite (crates/sim/src/suite/defs.rs) and print one scoreboard:
every workload at 3 loads (moderate, heavy, overload), with 1 and 4 proxies (no
gossip), on every seed, with the default policy, the plain bounded ring and every
peer. The workloads are split into a tuning half and a check half, reported apart.

Loads: each workload's rate scale per load is stored in the suite definition.
The scoreboard checks on every run that each stored scale meets its load's
definition (the 'loads' table); `suite --calibrate` recomputes the scales from the
definitions, prints them and exits with status 1 if a stored scale fails a
definition that another scale meets (it names the definitions no scale meets).";

/// Which half of the suite to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HalfArg {
    Tune,
    Check,
    All,
}

/// `prefix-router-sim suite` options.
#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// JSON on stdout instead of the scoreboard
    #[arg(long)]
    pub json: bool,
    /// Which half of the workloads
    #[arg(long, value_enum, default_value_t = HalfArg::All)]
    pub half: HalfArg,
    /// Seeds (every cell runs each)
    #[arg(long, value_delimiter = ',', default_values_t = suite::defs::SEEDS)]
    pub seeds: Vec<u64>,
    /// Simulations run in parallel (results do not depend on it)
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Smoke run: first seed only, shortened workloads (load definitions
    /// are checked but not guaranteed)
    #[arg(long)]
    pub quick: bool,
    /// Recompute the rate scales of every load and check the stored ones
    /// (exit status 1 if one is stale)
    #[arg(long)]
    pub calibrate: bool,
    /// Only this workload (repeatable)
    #[arg(long = "workload", value_name = "NAME")]
    pub workloads: Vec<String>,
    /// Directory of the trace files
    #[arg(long, value_name = "DIR", default_value = "/work/shared/traces")]
    pub traces: PathBuf,
    /// No progress display on stderr
    #[arg(long)]
    pub no_progress: bool,
    /// The filter's policies with its `scrape` on at this period, ms (its
    /// `scrape.interval_ms`; 0 = off, the default config). Peers unchanged
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub scrape_ms: f64,
    /// Every replica with the memory-bound batch cost (as the plain runs'
    /// --batch-cost), every policy alike: a check that the scoreboard's
    /// order holds where a large batch slows its replica
    #[arg(long)]
    pub batch_cost: bool,
}

fn parse_format(v: &str) -> Result<Format, String> {
    Format::parse(v).ok_or_else(|| format!("{v:?} is not mooncake, sharegpt or azure"))
}

/// The plain-run flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Mooncake JSONL, ShareGPT JSON (optionally gzipped) or Azure CSV (detected)
    #[arg(long, value_name = "FILE", help_heading = "Workload")]
    pub trace: Option<PathBuf>,
    /// mooncake | sharegpt | azure (skip detection)
    #[arg(long, value_name = "F", value_parser = parse_format, help_heading = "Workload")]
    pub format: Option<Format>,
    /// shared-prefix | shared-prefix-long-q | zipf | long-context | multi-turn |
    /// doc-qa | bursty | agentic | rag | mix, with options NAME:key=value,... (see README)
    #[arg(long, value_name = "SPEC", help_heading = "Workload")]
    pub synthetic: Option<String>,
    /// First N requests (trace) / sessions (synthetic); 0 = all
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Workload")]
    pub limit: usize,
    /// Spread each session's start uniformly over X ms after its timestamp
    /// (the Mooncake conversation trace's timestamps are on a 3000 ms grid)
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        help_heading = "Workload"
    )]
    pub spread_ms: f64,
    /// ShareGPT: sessions per second
    #[arg(long, value_name = "R", default_value_t = TraceOptions::default().session_rate, help_heading = "Workload")]
    pub session_rate: f64,
    /// ShareGPT: mean think time between turns, seconds
    #[arg(long, value_name = "S", default_value_t = TraceOptions::default().think_s, help_heading = "Workload")]
    pub think_s: f64,
    /// ShareGPT: at most N turns per conversation (0 = all)
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Workload")]
    pub max_turns: usize,

    /// Replicas
    #[arg(long, value_name = "N", default_value_t = SimConfig::default().replicas, help_heading = "Fleet")]
    pub replicas: usize,
    /// KV cache per replica, tokens
    #[arg(long, value_name = "T", default_value_t = CostModel::default().cache_capacity_tokens, help_heading = "Fleet")]
    pub cache_tokens: u64,
    /// Prefill tokens per second
    #[arg(long, value_name = "X", default_value_t = CostModel::default().prefill_tokens_per_s, help_heading = "Fleet")]
    pub prefill_tps: f64,
    /// Decode step, milliseconds
    #[arg(long, value_name = "X", default_value_t = 15.0, help_heading = "Fleet")]
    pub decode_step_ms: f64,
    /// Max running batch
    #[arg(long, value_name = "N", default_value_t = CostModel::default().max_running, help_heading = "Fleet")]
    pub max_running: usize,
    /// KV block size, tokens [default: 16; 512 for Mooncake traces, their own granularity]
    #[arg(long, value_name = "N", help_heading = "Fleet")]
    pub block_tokens: Option<u32>,
    /// Add the quadratic attention term (Llama-8B coefficient)
    #[arg(long, help_heading = "Fleet")]
    pub attention: bool,
    /// Memory-bound batch cost (Llama-3.1-8B, H100): a decode step is 5 ms
    /// plus 39 ns per context token decoding, and each 8,192-token prefill
    /// chunk pays the same read (replaces --decode-step-ms)
    #[arg(long, help_heading = "Fleet")]
    pub batch_cost: bool,
    /// Replicas do not keep generated tokens' KV (vLLM does)
    #[arg(long, help_heading = "Fleet")]
    pub no_output_kv: bool,

    /// Policy NAME[:key=value,...], repeatable, or 'all' [default: all]
    #[arg(long, value_name = "NAME", help_heading = "Routing")]
    pub policy: Vec<String>,
    /// Router instances; a list runs each and prints hit-rate ratios against 1 proxy
    #[arg(
        long,
        value_name = "K[,K2...]",
        value_delimiter = ',',
        default_value = "1",
        help_heading = "Routing"
    )]
    pub proxies: Vec<usize>,
    /// Arrival-time compression; a list sweeps
    #[arg(
        long,
        value_name = "X[,X2...]",
        value_delimiter = ',',
        default_value = "1",
        help_heading = "Routing"
    )]
    pub rate_scale: Vec<f64>,
    /// Replica load report period, ms (0 = off)
    #[arg(
        long,
        value_name = "X",
        default_value_t = 50.0,
        help_heading = "Routing"
    )]
    pub report_interval_ms: f64,
    /// Extra report delay, ms
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        help_heading = "Routing"
    )]
    pub report_delay_ms: f64,
    /// The filter's policies read every sampled report (as a `scrape` at
    /// --report-interval-ms would), instead of ORCA on their own responses
    /// only (each proxy its own, at each first token: the default config)
    #[arg(long, help_heading = "Routing")]
    pub sampled_reports: bool,
    /// The filter's `scrape` at this period (its `scrape.interval_ms`; 0 =
    /// off, the default config): with ORCA, each of the filter's proxies
    /// also reads one sample a period, the proxies staggered
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 0.0,
        help_heading = "Routing"
    )]
    pub scrape_ms: f64,

    /// JSON on stdout instead of the table
    #[arg(long, help_heading = "Output")]
    pub json: bool,
    /// Write SVG plots (hit rate / TTFT p90 vs load, per-replica load)
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub plots: Option<PathBuf>,
    /// Load-balance window (requests in replica), seconds
    #[arg(long, value_name = "S", default_value_t = SimConfig::default().window_s, help_heading = "Output")]
    pub window_s: f64,
    /// Busy-balance window, seconds
    #[arg(long, value_name = "S", default_value_t = SimConfig::default().busy_window_s, help_heading = "Output")]
    pub busy_window_s: f64,
    /// Seed of every random choice
    #[arg(long, value_name = "S", default_value_t = 1, help_heading = "Output")]
    pub seed: u64,
    /// Simulations run in parallel (results do not depend on it)
    #[arg(long, value_name = "N", default_value_t = 2, help_heading = "Output")]
    pub threads: usize,
    /// No progress display on stderr (shown only on a terminal)
    #[arg(long, help_heading = "Output")]
    pub no_progress: bool,
}

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
    /// Progress bar on stderr (when it is a terminal).
    pub progress: bool,
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
            progress: false,
            block_tokens: None,
            cfg: SimConfig::default(),
        }
    }
}

impl RunArgs {
    /// Check the values and build [`Args`].
    pub fn to_args(&self) -> Result<Args, String> {
        let mut a = Args {
            trace: self.trace.clone(),
            synthetic: self.synthetic.clone(),
            trace_opts: TraceOptions {
                format: self.format,
                limit: self.limit,
                session_rate: self.session_rate,
                think_s: self.think_s,
                max_turns: self.max_turns,
            },
            policies: self.policy.clone(),
            proxies: self.proxies.clone(),
            rate_scales: self.rate_scale.clone(),
            spread_ms: self.spread_ms,
            json: self.json,
            plots: self.plots.clone(),
            threads: self.threads.max(1),
            progress: !self.no_progress,
            block_tokens: self.block_tokens.map(|b| b.max(1)),
            cfg: SimConfig::default(),
        };
        a.cfg.replicas = self.replicas;
        a.cfg.cost.cache_capacity_tokens = self.cache_tokens;
        a.cfg.cost.prefill_tokens_per_s = self.prefill_tps;
        a.cfg.cost.decode_step_s = self.decode_step_ms / 1000.0;
        a.cfg.cost.max_running = self.max_running;
        if self.attention {
            a.cfg.cost.attention_coeff = CostModel::LLAMA_8B_ATTENTION_COEFF;
        }
        if self.batch_cost {
            a.cfg.cost = a.cfg.cost.with_batch_cost();
        }
        a.cfg.report_interval_s = self.report_interval_ms / 1000.0;
        a.cfg.report_delay_s = self.report_delay_ms / 1000.0;
        a.cfg.orca_reports = !self.sampled_reports;
        a.cfg.scrape_interval_s = self.scrape_ms / 1000.0;
        a.cfg.output_kv = !self.no_output_kv;
        a.cfg.window_s = self.window_s;
        a.cfg.busy_window_s = self.busy_window_s;
        a.cfg.seed = self.seed;
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
            || a.cfg.busy_window_s.is_nan()
            || a.cfg.busy_window_s <= 0.0
            || a.cfg.report_interval_s < 0.0
            || a.cfg.report_delay_s < 0.0
            || !(a.cfg.scrape_interval_s.is_finite() && a.cfg.scrape_interval_s >= 0.0)
        {
            return Err(
                "--window-s and --busy-window-s must be > 0, report interval and delay and --scrape-ms >= 0"
                    .into(),
            );
        }
        if a.cfg.replicas == 0 || a.cfg.replicas > 4096 {
            return Err("--replicas must be 1..=4096".into());
        }
        if a.cfg.cost.prefill_tokens_per_s <= 0.0 || a.cfg.cost.max_running == 0 {
            return Err("--prefill-tps must be > 0 and --max-running >= 1".into());
        }
        Ok(a)
    }
}

fn cli_parse(argv: &[String]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(
        std::iter::once("prefix-router-sim".to_string()).chain(argv.iter().cloned()),
    )
}

/// Parse the arguments of a plain run (without the program name): `None`
/// for `--help` / `--version`.
pub fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let cli = match cli_parse(argv) {
        Ok(c) => c,
        Err(e) => {
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    Ok(None)
                }
                _ => Err(e.to_string()),
            }
        }
    };
    if cli.command.is_some() {
        return Err("not a plain run (a subcommand was given)".into());
    }
    cli.run.to_args().map(Some)
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

/// A progress display on stderr, drawn only when stderr is a terminal
/// (and `show`): a bar over `total` simulations, or a spinner for `None`.
/// It ticks on its own, so a long simulation still shows the time passing.
pub fn progress_bar(show: bool, total: Option<u64>, prefix: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let template = if total.is_some() {
        "{prefix} [{elapsed_precise}] {bar:40} {pos}/{len} runs, eta {eta} {msg}"
    } else {
        "{prefix} [{elapsed_precise}] {spinner} {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        b.set_style(style);
    }
    b.set_prefix(prefix);
    b.enable_steady_tick(Duration::from_millis(250));
    b
}

/// Run every (rate scale, proxies, policy) combination; results in that
/// order regardless of thread scheduling. `progress` advances by one per
/// finished simulation.
pub fn run_matrix(
    wl: &Workload,
    specs: &[PolicySpec],
    base: &SimConfig,
    rate_scales: &[f64],
    proxies: &[usize],
    threads: usize,
    progress: &ProgressBar,
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
                progress.set_message(format!("{} x{s} k{k}", spec.label));
                progress.inc(1);
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
                )?,
            )?;
            put(
                format!("ttft_p90_vs_load_k{k}.svg"),
                line_chart(
                    &format!("TTFT p90 vs offered load ({title})"),
                    "offered load (rate scale x)",
                    "TTFT p90 (s, log scale)",
                    &series(&|r| r.ttft.p90),
                    Scale::Log,
                )?,
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
                )?,
            )?;
        }
    }
    Ok(written)
}

/// The whole program; returns the process exit code.
pub fn main_with_args(argv: &[String]) -> i32 {
    let cli = match cli_parse(argv) {
        Ok(c) => c,
        Err(e) => {
            // Help and version on stdout (status 0), errors on stderr (2).
            let _ = e.print();
            return e.exit_code();
        }
    };
    let r = match &cli.command {
        Some(Command::Suite(s)) => run_suite_cmd(s),
        None => match cli.run.to_args() {
            Ok(a) => run(&a).map(|()| 0),
            Err(e) => {
                eprintln!("error: {e}\n\nFor more information, try '--help'.");
                return 2;
            }
        },
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// The suite options a `suite` command line selects.
pub fn suite_options(s: &SuiteArgs) -> Result<suite::SuiteOptions, String> {
    let all = suite::workloads();
    for w in &s.workloads {
        if !all.iter().any(|d| d.name == w) {
            let names: Vec<&str> = all.iter().map(|d| d.name).collect();
            return Err(format!(
                "--workload: no workload {w:?}; one of {}",
                names.join(", ")
            ));
        }
    }
    let defs: Vec<suite::WorkloadDef> = all
        .into_iter()
        .filter(|d| match s.half {
            HalfArg::All => true,
            HalfArg::Tune => d.half == Half::Tune,
            HalfArg::Check => d.half == Half::Check,
        })
        .filter(|d| s.workloads.is_empty() || s.workloads.iter().any(|w| w == d.name))
        .collect();
    if defs.is_empty() {
        return Err("no workload selected".into());
    }
    let mut seeds = s.seeds.clone();
    if seeds.is_empty() {
        return Err("--seeds: give at least one".into());
    }
    if s.quick {
        seeds.truncate(1);
    }
    if !(s.scrape_ms.is_finite() && s.scrape_ms >= 0.0) {
        return Err("--scrape-ms: must be >= 0".into());
    }
    Ok(suite::SuiteOptions {
        defs,
        seeds,
        threads: s.threads.max(1),
        quick: s.quick,
        traces: s.traces.clone(),
        progress: !s.no_progress,
        scrape_s: s.scrape_ms / 1000.0,
        batch_cost: s.batch_cost,
    })
}

fn run_suite_cmd(s: &SuiteArgs) -> Result<i32, String> {
    let t0 = Instant::now();
    let o = suite_options(s)?;
    if s.calibrate {
        let (text, json, all) = suite::calibrate::calibrate(&o)?;
        if s.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?
            );
        } else {
            print!("{text}");
        }
        eprintln!(
            "calibrated {} workload(s) in {:.1} s ({} thread(s))",
            o.defs.len(),
            t0.elapsed().as_secs_f64(),
            o.threads
        );
        return Ok(if all { 0 } else { 1 });
    }
    let res = suite::run_suite(&o)?;
    let board = suite::score(&res);
    if s.json {
        let j = suite::score::to_json(&res, &board);
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", suite::score::to_table(&res, &board));
    }
    eprintln!(
        "suite: {} simulations in {:.1} s ({} thread(s))",
        res.runs,
        t0.elapsed().as_secs_f64(),
        o.threads
    );
    Ok(0)
}

fn run(a: &Args) -> Result<(), String> {
    let t0 = Instant::now();
    let mut specs = Vec::new();
    for p in &a.policies {
        specs.extend(PolicySpec::expand(p).map_err(|e| e.to_string())?);
    }
    let spin = progress_bar(a.progress, None, "sim");
    spin.set_message("loading the workload");
    let wl = load_workload(a);
    let wl = match wl {
        Ok(w) => w,
        Err(e) => {
            spin.finish_and_clear();
            return Err(e);
        }
    };
    let mut cfg = a.cfg.clone();
    cfg.cost.block_tokens = wl.block_tokens;
    let t_load = t0.elapsed();
    let total_cache = cfg
        .cost
        .cache_capacity_tokens
        .saturating_mul(cfg.replicas as u64);
    spin.set_message("computing the hit-rate bounds");
    let b = bounds::compute_with(&wl, total_cache, cfg.output_kv);
    spin.finish_and_clear();
    let bar = progress_bar(
        a.progress,
        Some((specs.len() * a.rate_scales.len() * a.proxies.len()) as u64),
        "sim",
    );
    let sets = run_matrix(
        &wl,
        &specs,
        &cfg,
        &a.rate_scales,
        &a.proxies,
        a.threads,
        &bar,
    );
    bar.finish_and_clear();
    let sets = sets?;
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
