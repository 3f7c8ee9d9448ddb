//! `prefix-router-lab`: run the lab from the command line (clap; `prefix-router-lab help CMD`
//! or `CMD --help` for the flags).
//!
//! ```text
//! prefix-router-lab demo [--conversations N] [--turns N] [--concurrency N] [--time-scale X]
//!                        [--cache-tokens N] [--seed N] ...
//! prefix-router-lab overhead [--rounds N] [--per-round N] [--sizes B1,B2,..] [--skip-latency]
//!                           [--latency-compare-wasm WASM] [--cpu-rounds N] [--cpu-seconds S] [--cpu-connections N]
//!                           [--cpu-compare-wasm WASM]
//!                           [--hostcalls-hosts N1,N2,..] [--hostcalls-patch JSON]
//! prefix-router-lab spike [--old N] [--new N] [--doc-bytes B] [--loopers N]
//!                         [--cost-patch JSON]
//! prefix-router-lab gossip-cost [--batches N] [--observations N] [--hashes N]
//! ```
//!
//! The demo's defaults are a document chat under cache pressure: `WorkloadOptions::default()`
//! (50 conversations x 6 turns, all open at once, 6-10 KB first messages, 0.2-4 s pauses) on
//! backends with `workload::DEMO_CACHE_TOKENS` (36864) tokens of KV cache each, so that one
//! replica's cache holds about its quarter of the conversations and the four caches together
//! about all of them. The module docs of `prefix_router_lab::workload` explain why that is the
//! regime where routing by prefix pays off, and what each policy's hit rate is made of.

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use prefix_router_lab::envoy::{EnvoyMode, EnvoyOptions, FilterConfig};
use prefix_router_lab::gossip_cost::GossipCostOptions;
use prefix_router_lab::overhead::OverheadOptions;
use prefix_router_lab::overhead_cpu::CpuOptions;
use prefix_router_lab::report::side_by_side;
use prefix_router_lab::spike::SpikeOptions;
use prefix_router_lab::workload::{RequestRecord, DEMO_CACHE_TOKENS};
use prefix_router_lab::{BackendOptions, Lab, LabOptions, Report, Workload, WorkloadOptions};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

const ABOUT: &str =
    "prefix-router-lab: the prefix router in Envoy, on loopback, against backend simulators";

const ENVIRONMENT: &str = "\
Environment: ENVOY_BIN (default .venv/bin/envoy), PREFIX_ROUTER_BACKEND (default
target/native/prefix-router-backend), PREFIX_ROUTER_WASM (default: the newer of
target/prefix_router.wasm, written by ./build.sh wasm, and cargo's
target/wasm32-wasip1/release/prefix_router.wasm), PREFIX_ROUTER_LAB_KEEP=1 keeps the logs in .lab/.";

const DEMO_ABOUT: &str = "\
Starts 4 backend simulators (--backends) + Envoy with the prefix-router filter
(envoy/envoy.yaml), runs a multi-turn chat workload through it, then does the same with fresh
backends behind Envoy with plain round robin (envoy/envoy-round-robin.yaml), and prints both side
by side.

The defaults are a document chat under cache pressure: every conversation opens with a 6-10 KB
document (~2k tokens) and asks about it over 6 turns, users pause 0.2-4 s between turns, and each
backend's KV cache (36864 tokens) holds about a quarter of the 50 conversations, the four
together about all of them. Round robin copies every conversation onto every replica, so most
copies are evicted before they are reused; prefix-router keeps each conversation on one replica.

A progress bar shows each column's requests while it runs (on stderr, when it is a terminal).";

const OVERHEAD_ABOUT: &str = "\
Measures the filter's added latency: Envoy without a filter, with the do-nothing testbed
filter, and with prefix-router, in one interleaved run (see BENCHMARKS.md).
Needs target/wasm32-wasip1/release/testbed_filter.wasm (or PREFIX_ROUTER_TESTBED_WASM).

Then the CPU part (tests/src/overhead_cpu.rs): Envoy's CPU per request under wrk load (2
workers, 3 instant backends, 1-8 KiB chat bodies), round robin without a filter vs the
do-nothing filter, prefix-router's default config and cost.mode off, in interleaved rounds.
Needs wrk on the PATH (or WRK_BIN; ./build.sh setup installs Debian's wrk).";

const SPIKE_ABOUT: &str = "\
The default rule under a load spike (tests/src/spike.rs): 4 backends, `old` conversations with
a `doc-bytes` document cached on their replicas, then `loopers` direct clients keep the replica
holding most of them busy (a real queue, under the load bound) while the next turn of every
old conversation and the first turn of `new` conversations (`new-bytes` first messages) go
through Envoy. Runs the bounded ring alone (cost.mode off), then the default (spill), and prints
TTFT and placements side by side.";

const GOSSIP_COST_ABOUT: &str = "\
What receiving index gossip costs an Envoy (tests/src/gossip_cost.rs): one Envoy with
gossip.accept, batches of random observations POSTed to its gossip path, alternating batches it
records (204) with same-size batches it refuses for their fingerprint (400); the difference is
the cost of recording.";

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "prefix-router-lab",
    version,
    about = ABOUT,
    after_help = ENVIRONMENT,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// prefix-router vs round robin (and peers) on a multi-turn chat workload, side by side
    #[command(long_about = DEMO_ABOUT, after_help = ENVIRONMENT)]
    Demo(DemoArgs),
    /// The filter's added latency and proxy CPU per request inside Envoy
    #[command(long_about = OVERHEAD_ABOUT, after_help = ENVIRONMENT)]
    Overhead(OverheadArgs),
    /// The default rule under a load spike: TTFT and placements, ring alone vs default
    #[command(long_about = SPIKE_ABOUT, after_help = ENVIRONMENT)]
    Spike(SpikeArgs),
    /// What receiving index gossip costs an Envoy
    #[command(long_about = GOSSIP_COST_ABOUT, after_help = ENVIRONMENT)]
    GossipCost(GossipCostArgs),
    /// Envoy's CPU per request on dense 1 MB bodies, with the filter and without, beside a
    /// plain 1 MB prompt (tests/src/hostile_cpu.rs)
    #[command(after_help = ENVIRONMENT)]
    HostileCpu(HostileCpuArgs),
}

/// `LO,HI` with `LO <= HI`.
fn range<T: std::str::FromStr + PartialOrd>(v: &str) -> Result<(T, T), String> {
    let bad = || "expected LO,HI with LO <= HI".to_string();
    let (a, b) = v.split_once(',').ok_or_else(bad)?;
    let lo: T = a.trim().parse().map_err(|_| bad())?;
    let hi: T = b.trim().parse().map_err(|_| bad())?;
    if lo <= hi {
        Ok((lo, hi))
    } else {
        Err(bad())
    }
}

fn json(v: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(v).map_err(|e| e.to_string())
}

fn json_object(v: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(v) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        _ => Err("not a JSON object".to_string()),
    }
}

fn at_least_one(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be at least 1".to_string()),
    }
}

fn proxies(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=8).contains(&n) => Ok(n),
        _ => Err("must be 1..=8".to_string()),
    }
}

fn sglang_policy(v: &str) -> Result<String, String> {
    let p = v.trim();
    if prefix_router_lab::peer::SGLANG_POLICIES.contains(&p) {
        Ok(p.to_string())
    } else {
        Err(format!(
            "unknown policy {p:?} (expected {})",
            prefix_router_lab::peer::SGLANG_POLICIES.join(", ")
        ))
    }
}

/// `prefix-router-lab demo` options.
#[derive(Debug, Clone, clap::Args)]
struct DemoArgs {
    /// Conversations
    #[arg(long, value_name = "N", default_value_t = WorkloadOptions::default().conversations)]
    conversations: usize,
    /// Turns per conversation
    #[arg(long, value_name = "N", default_value_t = WorkloadOptions::default().turns)]
    turns: usize,
    /// Conversations open at once (the default: all)
    #[arg(long, value_name = "N", default_value_t = WorkloadOptions::default().concurrency)]
    concurrency: usize,
    /// Backend simulators (replicas)
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = at_least_one)]
    backends: usize,
    /// Backend --time-scale (smaller = faster)
    #[arg(long, value_name = "X", default_value_t = BackendOptions::default().time_scale)]
    time_scale: f64,
    /// Backend KV-cache capacity in tokens
    #[arg(long, value_name = "N", default_value_t = DEMO_CACHE_TOKENS)]
    cache_tokens: u64,
    /// Backend max running batch
    #[arg(long, value_name = "N", default_value_t = BackendOptions::default().max_running)]
    max_running: u32,
    /// Output tokens per request
    #[arg(long, value_name = "N", default_value_t = WorkloadOptions::default().max_tokens)]
    max_tokens: u32,
    /// Size of each conversation's first user message, bytes [default: 6000,10000]
    #[arg(long, value_name = "LO,HI", value_parser = range::<usize>)]
    first_bytes: Option<(usize, usize)>,
    /// Distinct system prompts (skewed popularity: the first is about half the conversations')
    #[arg(long, value_name = "N", default_value_t = WorkloadOptions::default().system_prompts,
          value_parser = at_least_one)]
    system_prompts: usize,
    /// Pad each system prompt to at least this many bytes (an application's long instructions)
    #[arg(long, value_name = "B", default_value_t = WorkloadOptions::default().system_bytes)]
    system_bytes: usize,
    /// User think time before each follow-up turn, uniform, ms [default: 200,4000]
    #[arg(long, value_name = "LO,HI", value_parser = range::<u64>)]
    think_ms: Option<(u64, u64)>,
    /// Delay before each conversation's first turn, uniform, ms [default: 0,4000]
    #[arg(long, value_name = "LO,HI", value_parser = range::<u64>)]
    start_ms: Option<(u64, u64)>,
    /// Workload seed
    #[arg(long, value_name = "N", default_value_t = WorkloadOptions::default().seed)]
    seed: u64,
    /// Merged into the filter JSON of envoy/envoy.yaml, e.g. '{"capacity_factor": 2.0}'
    #[arg(long, value_name = "JSON", value_parser = json)]
    filter_patch: Option<serde_json::Value>,
    /// Also run the filter with this patch (instead of --filter-patch) and add it as a third
    /// column, e.g. '{"cost": {"mode": "index"}}': side by side in one run
    #[arg(long, value_name = "JSON", value_parser = json)]
    also: Option<serde_json::Value>,
    /// Run every column with N proxies (Envoys, sglang-routers) in front of the same backends,
    /// a conversation's turns alternating between them
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = proxies)]
    proxies: usize,
    /// With --proxies N > 1: the filter's Envoys gossip their indexes (`gossip` with every
    /// other Envoy as a peer, interval 100 ms)
    #[arg(long)]
    gossip: bool,
    /// --gossip, and each Envoy also sends its pending prefill per replica (`gossip.name` set
    /// to its own address)
    #[arg(long)]
    load_gossip: bool,
    /// Also run SGLang's model gateway (sglang-router 0.3.2 from PyPI; install it with
    /// `./build.sh peers`) with policy P in front of fresh backends, a column each:
    /// cache_aware, round_robin, power_of_two or random
    #[arg(long, value_name = "P[,P..]", value_delimiter = ',', value_parser = sglang_policy)]
    sglang: Vec<String>,
    /// Real users' turns instead of generated ones: a ShareGPT JSON file (gzipped or not, e.g.
    /// /work/shared/traces/chitchat_sharegpt_format.json.gz); conversation i takes the i-th
    /// chat's user messages, at most --turns of them; system prompts, pauses and the assistant's
    /// replies (the backends') as without it
    #[arg(long, value_name = "FILE")]
    sharegpt: Option<std::path::PathBuf>,
    /// Backends send a streamed response's head before its first token and with no load
    /// headers, as vLLM and SGLang do (`prefix-router-backend --early-stream-head`): with the
    /// default config the filter then gets no load reports on streams
    #[arg(long)]
    early_stream_head: bool,
}

/// The demo, as its flags ask.
struct Demo {
    workload: WorkloadOptions,
    backend: BackendOptions,
    filter: FilterConfig,
    /// `--also`: a second filter configuration, run as a third column.
    also: Option<FilterConfig>,
    /// `--sglang`: sglang-router policies, a column each.
    sglang: Vec<String>,
    /// `--proxies`: proxies per column.
    proxies: usize,
    /// `--gossip`: the filter's Envoys gossip.
    gossip: bool,
    /// `--load-gossip`: and their pending prefill.
    load_gossip: bool,
    /// `--sharegpt`: real users' turns.
    sharegpt: Option<std::path::PathBuf>,
    /// `--backends`: replicas per column.
    backends: usize,
}

impl DemoArgs {
    fn demo(&self) -> Result<Demo, String> {
        let d = WorkloadOptions::default();
        let gossip = self.gossip || self.load_gossip;
        if gossip && self.proxies < 2 {
            return Err("--gossip and --load-gossip need --proxies 2 or more".to_string());
        }
        Ok(Demo {
            workload: WorkloadOptions {
                conversations: self.conversations,
                turns: self.turns,
                concurrency: self.concurrency,
                seed: self.seed,
                max_tokens: self.max_tokens,
                think_ms: self.think_ms.unwrap_or(d.think_ms),
                start_ms: self.start_ms.unwrap_or(d.start_ms),
                first_message_bytes: self.first_bytes.unwrap_or(d.first_message_bytes),
                system_prompts: self.system_prompts,
                system_bytes: self.system_bytes,
                ..d
            },
            // The cache size the default workload is sized for (see prefix_router_lab::workload).
            backend: BackendOptions {
                cache_tokens: self.cache_tokens,
                time_scale: self.time_scale,
                max_running: self.max_running,
                early_stream_head: self.early_stream_head,
                ..BackendOptions::default()
            },
            filter: self
                .filter_patch
                .clone()
                .map_or(FilterConfig::Default, FilterConfig::Patched),
            also: self.also.clone().map(FilterConfig::Patched),
            sglang: self.sglang.clone(),
            proxies: self.proxies,
            backends: self.backends,
            gossip,
            load_gossip: self.load_gossip,
            sharegpt: self.sharegpt.clone(),
        })
    }
}

/// `prefix-router-lab overhead` options.
#[derive(Debug, Clone, clap::Args)]
struct OverheadArgs {
    /// Interleaved rounds
    #[arg(long, value_name = "N", default_value_t = OverheadOptions::default().rounds)]
    rounds: usize,
    /// Requests per configuration per round
    #[arg(long, value_name = "N", default_value_t = OverheadOptions::default().per_round)]
    per_round: usize,
    /// Approximate body sizes, bytes [default: 1000,16000,128000]
    #[arg(long, value_name = "B1,B2,..", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Fleet sizes (configured hosts, each at least 4) to count host calls per request at;
    /// 0 alone: skip that part
    #[arg(long, value_name = "N1,N2,..", value_delimiter = ',', default_values_t = [4, 64, 1024])]
    hostcalls_hosts: Vec<usize>,
    /// Filter JSON merged over the committed config for the host-call count, e.g.
    /// '{"cost":{"mode":"index"}}'
    #[arg(long, value_name = "JSON", default_value = "{}")]
    hostcalls_patch: String,
    /// CPU part: interleaved rounds of wrk load per configuration (0: skip the CPU part)
    #[arg(long, value_name = "N", default_value_t = CpuOptions::default().rounds)]
    cpu_rounds: usize,
    /// CPU part: seconds of load per configuration per round
    #[arg(long, value_name = "S", default_value_t = CpuOptions::default().seconds,
          value_parser = clap::value_parser!(u32).range(1..))]
    cpu_seconds: u32,
    /// CPU part: wrk's keep-alive connections
    #[arg(long, value_name = "N", default_value_t = CpuOptions::default().connections,
          value_parser = clap::value_parser!(u32).range(1..))]
    cpu_connections: u32,
    /// CPU part: also measure the default config with this build of the filter
    #[arg(long, value_name = "WASM")]
    cpu_compare_wasm: Option<std::path::PathBuf>,
    /// Skip the latency part (the table of added latency per body size)
    #[arg(long)]
    skip_latency: bool,
    /// Latency part: also measure the default config with this build of the filter (its own
    /// table, same run)
    #[arg(long, value_name = "WASM")]
    latency_compare_wasm: Option<std::path::PathBuf>,
}

/// `prefix-router-lab spike` options.
#[derive(Debug, Clone, clap::Args)]
struct SpikeArgs {
    /// Conversations started before the spike
    #[arg(long, value_name = "N", default_value_t = SpikeOptions::default().old,
          value_parser = at_least_one)]
    old: usize,
    /// Conversations started during the spike
    #[arg(long, value_name = "N", default_value_t = SpikeOptions::default().new)]
    new: usize,
    /// Size of each old conversation's opening document, bytes
    #[arg(long, value_name = "B", default_value_t = SpikeOptions::default().doc_bytes)]
    doc_bytes: usize,
    /// Size of each new conversation's first message, bytes
    #[arg(long, value_name = "B", default_value_t = SpikeOptions::default().new_bytes)]
    new_bytes: usize,
    /// Clients keeping the spiked replica busy
    #[arg(long, value_name = "N", default_value_t = SpikeOptions::default().loopers,
          value_parser = at_least_one)]
    loopers: usize,
    /// `cost` fields merged into the second run, e.g. '{"mode": "index"}'
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    cost_patch: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `prefix-router-lab hostile-cpu` options.
#[derive(Debug, Clone, clap::Args)]
struct HostileCpuArgs {
    /// Rounds (fresh Envoys) per configuration; the minimum is reported
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = at_least_one)]
    rounds: usize,
    /// Requests per body per round
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = at_least_one)]
    requests: usize,
}

/// `prefix-router-lab gossip-cost` options.
#[derive(Debug, Clone, clap::Args)]
struct GossipCostArgs {
    /// Batches of each kind
    #[arg(long, value_name = "N", default_value_t = GossipCostOptions::default().batches,
          value_parser = at_least_one)]
    batches: usize,
    /// Observations per batch
    #[arg(long, value_name = "N", default_value_t = GossipCostOptions::default().observations,
          value_parser = at_least_one)]
    observations: usize,
    /// Hashes per observation
    #[arg(long, value_name = "N", default_value_t = GossipCostOptions::default().hashes)]
    hashes: usize,
}

/// A progress bar over one column's requests: on stderr, drawn only when it is a terminal.
fn progress_bar(total: usize, label: &str) -> ProgressBar {
    let pb = ProgressBar::new(total as u64);
    let style = ProgressStyle::with_template(
        "   {prefix} [{elapsed_precise}] {bar:40} {pos}/{len} requests {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(label.to_string());
    pb
}

/// A spinner with the elapsed time, for runs whose requests are not counted ahead: on
/// stderr, drawn only when it is a terminal.
fn spinner(what: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("   {spinner} {msg} [{elapsed_precise}]") {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

/// Advances `pb` for each finished request and names the failures so far.
fn observer(pb: &ProgressBar) -> impl Fn(&RequestRecord) + Sync + '_ {
    let failed = AtomicUsize::new(0);
    move |rec: &RequestRecord| {
        if rec.error.is_some() {
            let n = failed.fetch_add(1, Ordering::Relaxed) + 1;
            pb.set_message(format!("({n} failed)"));
        }
        pb.inc(1);
    }
}

fn run_one(
    mode: EnvoyMode,
    label: &str,
    filter: &FilterConfig,
    args: &Demo,
    workload: &Workload,
) -> Result<Report, String> {
    let n = args.proxies.max(1);
    println!(
        "== {label}: starting {} backends (KV cache {} tokens each) + {n} Envoy{} ({})",
        args.backends,
        args.backend.cache_tokens,
        if n == 1 { "" } else { "s" },
        mode.template_path().display()
    );
    let mut lab = Lab::start(&LabOptions {
        label: format!(
            "demo-{}",
            label
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect::<String>()
        ),
        backends: args.backends,
        backend: args.backend.clone(),
        envoy: (n == 1).then(|| EnvoyOptions {
            mode,
            filter: filter.clone(),
            ..EnvoyOptions::default()
        }),
    })
    .map_err(|e| e.to_string())?;
    // Made once the lines above are printed (a bar draws as soon as it exists).
    let pb;
    let report = if n == 1 {
        if let Ok(e) = lab.envoy() {
            println!(
                "   Envoy listener {} admin {}; running {} conversations ({} requests, at most {} turns each), {} at once",
                e.url(""),
                e.admin_url(""),
                workload.opts.conversations,
                workload.total_requests(),
                workload.opts.turns,
                workload.opts.concurrency
            );
        }
        pb = progress_bar(workload.total_requests(), label);
        lab.run_workload_observed(workload, label, &observer(&pb))
            .map_err(|e| e.to_string())?
            .1
    } else {
        let envoys = lab
            .start_envoys(n, mode, filter, args.gossip, args.load_gossip)
            .map_err(|e| e.to_string())?;
        let urls: Vec<String> = envoys.iter().map(|e| e.url("")).collect();
        println!(
            "   Envoys {}; running {} conversations ({} requests, at most {} turns each), {} at once, turns alternating",
            urls.join(" "),
            workload.opts.conversations,
            workload.total_requests(),
            workload.opts.turns,
            workload.opts.concurrency
        );
        pb = progress_bar(workload.total_requests(), label);
        let (_run, report) = lab
            .run_workload_at_observed(workload, label, &urls, &observer(&pb))
            .map_err(|e| e.to_string())?;
        drop(envoys);
        report
    };
    pb.finish_and_clear();
    print_done(&report);
    lab.stop();
    Ok(report)
}

fn demo(args: &DemoArgs) -> Result<(), String> {
    let args = args.demo()?;
    let mut workload = Workload::generate(args.workload.clone());
    if let Some(p) = &args.sharegpt {
        let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let chats = prefix_router_lab::workload::sharegpt_user_turns(&bytes)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        workload = workload
            .with_user_messages(&chats)
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let with_filter = run_one(
        EnvoyMode::PrefixRouter,
        EnvoyMode::PrefixRouter.label(),
        &args.filter,
        &args,
        &workload,
    )?;
    let also = match &args.also {
        Some(f) => Some(run_one(
            EnvoyMode::PrefixRouter,
            "prefix-router (--also)",
            f,
            &args,
            &workload,
        )?),
        None => None,
    };
    let round_robin = run_one(
        EnvoyMode::RoundRobin,
        EnvoyMode::RoundRobin.label(),
        &args.filter,
        &args,
        &workload,
    )?;
    let mut peers = Vec::new();
    for policy in &args.sglang {
        peers.push(run_sglang(policy, &args, &workload)?);
    }
    println!();
    let mut reports = vec![&with_filter];
    reports.extend(also.as_ref());
    reports.push(&round_robin);
    reports.extend(peers.iter());
    println!("{}", side_by_side(&reports));
    Ok(())
}

fn print_done(report: &Report) {
    println!(
        "   done: {}/{} ok in {:.1} s",
        report.ok,
        report.requests,
        report.wall.as_secs_f64()
    );
}

/// The workload through sglang-router with `policy`, in front of `--backends` fresh backends.
fn run_sglang(policy: &str, args: &Demo, workload: &Workload) -> Result<Report, String> {
    let label = format!("sglang-router {policy}");
    println!(
        "== {label}: starting {} backends (KV cache {} tokens each) + {} sglang-router{}",
        args.backends,
        args.backend.cache_tokens,
        args.proxies.max(1),
        if args.proxies > 1 { "s" } else { "" }
    );
    let mut lab = Lab::start(&LabOptions {
        label: format!("demo-sglang-{}", policy.replace('_', "-")),
        backends: args.backends,
        backend: args.backend.clone(),
        envoy: None,
    })
    .map_err(|e| e.to_string())?;
    let workers: Vec<String> = lab.backends.iter().map(|b| b.address()).collect();
    let mut routers = Vec::with_capacity(args.proxies.max(1));
    for _ in 0..args.proxies.max(1) {
        routers.push(
            prefix_router_lab::peer::SglangRouter::start(policy, &workers, lab.dir())
                .map_err(|e| e.to_string())?,
        );
    }
    let urls: Vec<String> = routers.iter().map(|r| r.url("")).collect();
    println!(
        "   sglang-router {}; running {} conversations ({} requests, at most {} turns each), {} at once",
        urls.join(" "),
        workload.opts.conversations,
        workload.total_requests(),
        workload.opts.turns,
        workload.opts.concurrency
    );
    let pb = progress_bar(workload.total_requests(), &label);
    let observe = observer(&pb);
    let (_run, report) = lab
        .run_workload_at_observed(workload, &label, &urls, &observe)
        .map_err(|e| e.to_string())?;
    pb.finish_and_clear();
    print_done(&report);
    for r in &mut routers {
        r.stop();
    }
    lab.stop();
    Ok(report)
}

fn overhead(args: &OverheadArgs) -> Result<(), String> {
    let mut opts = OverheadOptions {
        rounds: args.rounds,
        per_round: args.per_round,
        compare_wasm: args.latency_compare_wasm.clone(),
        ..OverheadOptions::default()
    };
    if !args.sizes.is_empty() {
        opts.sizes = args.sizes.clone();
    }
    if !args.skip_latency {
        println!("{}", prefix_router_lab::overhead::run(&opts)?);
    }
    // The CPU part: proxy CPU per request under wrk, against Envoy round robin.
    if args.cpu_rounds > 0 {
        let cpu = CpuOptions {
            rounds: args.cpu_rounds,
            seconds: args.cpu_seconds,
            connections: args.cpu_connections,
            compare_wasm: args.cpu_compare_wasm.clone(),
        };
        println!("{}", prefix_router_lab::overhead_cpu::run(&cpu)?);
    }
    if args.hostcalls_hosts != [0] {
        let patch: serde_json::Value = serde_json::from_str(&args.hostcalls_patch)
            .map_err(|e| format!("--hostcalls-patch: {e}"))?;
        let rows = prefix_router_lab::hostcalls::measure(&args.hostcalls_hosts, 20, &patch, 25)?;
        println!("{}", prefix_router_lab::hostcalls::table(&rows));
    }
    Ok(())
}

fn spike(args: &SpikeArgs) -> Result<(), String> {
    use prefix_router_lab::spike;
    let opts = SpikeOptions {
        old: args.old,
        new: args.new,
        doc_bytes: args.doc_bytes,
        new_bytes: args.new_bytes,
        loopers: args.loopers,
        cost_patch: args.cost_patch.clone().unwrap_or_default(),
        ..SpikeOptions::default()
    };
    let mut results = Vec::new();
    for cost in [false, true] {
        println!(
            "== cost.mode {}: starting 4 backends + Envoy",
            if cost {
                if opts.cost_patch.is_empty() {
                    "spill (the default)".to_string()
                } else {
                    format!(
                        "as patched: {}",
                        serde_json::Value::Object(opts.cost_patch.clone())
                    )
                }
            } else {
                "off (bounded ring only)".to_string()
            }
        );
        let pb = spinner("running the scenario");
        let r = spike::run(&SpikeOptions {
            cost,
            ..opts.clone()
        });
        pb.finish_and_clear();
        let r = r.map_err(|e| e.to_string())?;
        if !spike::all_ok(&r) {
            return Err(format!(
                "cost.mode {}: some requests failed",
                if cost { "on" } else { "off" }
            ));
        }
        results.push(r);
    }
    println!();
    println!("{}", spike::table(&results[0], &results[1]));
    Ok(())
}

fn gossip_cost(args: &GossipCostArgs) -> Result<(), String> {
    let opts = GossipCostOptions {
        batches: args.batches,
        observations: args.observations,
        hashes: args.hashes,
    };
    let pb = spinner("posting gossip batches to one Envoy");
    let table = prefix_router_lab::gossip_cost::run(&opts);
    pb.finish_and_clear();
    println!("{}", table.map_err(|e| e.to_string())?);
    Ok(())
}

fn main() -> ExitCode {
    // Usage errors exit with status 2 (clap), run errors with 1.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Demo(a) => demo(a),
        Command::Overhead(a) => overhead(a),
        Command::Spike(a) => spike(a),
        Command::GossipCost(a) => gossip_cost(a),
        Command::HostileCpu(a) => {
            prefix_router_lab::hostile_cpu::run(a.rounds, a.requests).map(|t| println!("{t}"))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("prefix-router-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("prefix-router-lab").chain(args.iter().copied()))
    }

    fn demo_of(args: &[&str]) -> Result<Demo, String> {
        let mut all = vec!["demo"];
        all.extend_from_slice(args);
        match parse(&all).map_err(|e| e.to_string())?.command {
            Command::Demo(d) => d.demo(),
            other => panic!("not the demo: {other:?}"),
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn demo_defaults_are_the_documented_workload() {
        let d = demo_of(&[]).unwrap();
        let w = WorkloadOptions::default();
        assert_eq!(d.workload.conversations, w.conversations);
        assert_eq!(d.workload.turns, w.turns);
        assert_eq!(d.workload.concurrency, w.concurrency);
        assert_eq!(d.workload.think_ms, w.think_ms);
        assert_eq!(d.workload.start_ms, w.start_ms);
        assert_eq!(d.workload.first_message_bytes, w.first_message_bytes);
        assert_eq!(d.workload.max_tokens, w.max_tokens);
        assert_eq!(d.workload.seed, w.seed);
        assert_eq!(d.backend.cache_tokens, DEMO_CACHE_TOKENS);
        assert_eq!(d.backend.time_scale, BackendOptions::default().time_scale);
        assert_eq!(d.backend.max_running, BackendOptions::default().max_running);
        assert!(matches!(d.filter, FilterConfig::Default));
        assert!(d.also.is_none() && d.sglang.is_empty());
        assert_eq!(d.proxies, 1);
        assert!(!d.gossip && !d.load_gossip);
    }

    #[test]
    fn demo_flags() {
        let d = demo_of(&[
            "--conversations",
            "8",
            "--turns",
            "2",
            "--concurrency",
            "4",
            "--time-scale",
            "0.25",
            "--cache-tokens",
            "1000",
            "--max-running",
            "3",
            "--max-tokens",
            "5",
            "--first-bytes",
            "10,20",
            "--think-ms",
            "0,1",
            "--start-ms",
            "5,5",
            "--seed",
            "7",
            "--filter-patch",
            r#"{"capacity_factor": 2.0}"#,
            "--also",
            r#"{"cost": {"mode": "index"}}"#,
            "--proxies",
            "2",
            "--load-gossip",
            "--sglang",
            "cache_aware,round_robin",
        ])
        .unwrap();
        assert_eq!(d.workload.conversations, 8);
        assert_eq!(d.workload.turns, 2);
        assert_eq!(d.workload.concurrency, 4);
        assert_eq!(d.backend.time_scale, 0.25);
        assert_eq!(d.backend.cache_tokens, 1000);
        assert_eq!(d.backend.max_running, 3);
        assert_eq!(d.workload.max_tokens, 5);
        assert_eq!(d.workload.first_message_bytes, (10, 20));
        assert_eq!(d.workload.think_ms, (0, 1));
        assert_eq!(d.workload.start_ms, (5, 5));
        assert_eq!(d.workload.seed, 7);
        assert!(
            matches!(&d.filter, FilterConfig::Patched(v) if v["capacity_factor"] == 2.0),
            "{:?}",
            d.filter
        );
        assert!(matches!(&d.also, Some(FilterConfig::Patched(v)) if v["cost"]["mode"] == "index"));
        assert_eq!(d.proxies, 2);
        assert!(d.gossip && d.load_gossip);
        assert_eq!(d.sglang, ["cache_aware", "round_robin"]);
    }

    #[test]
    fn bad_demo_flags_are_refused() {
        for bad in [
            &["--proxies", "0"][..],
            &["--proxies", "9"],
            &["--think-ms", "5,1"],
            &["--first-bytes", "10"],
            &["--filter-patch", "{nope"],
            &["--sglang", "fastest"],
            &["--gossip"],
            &["--proxies", "1", "--load-gossip"],
            &["--conversations", "x"],
            &["--bogus"],
        ] {
            assert!(demo_of(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn other_commands() {
        let Command::Overhead(o) = parse(&["overhead", "--sizes", "100,2000", "--rounds", "2"])
            .unwrap()
            .command
        else {
            panic!("not overhead");
        };
        assert_eq!((o.sizes.as_slice(), o.rounds), (&[100, 2000][..], 2));
        assert_eq!(o.per_round, OverheadOptions::default().per_round);
        assert_eq!(
            (o.cpu_rounds, o.cpu_seconds, o.skip_latency),
            (
                CpuOptions::default().rounds,
                CpuOptions::default().seconds,
                false
            )
        );
        let Command::Overhead(o) = parse(&["overhead", "--skip-latency", "--cpu-rounds", "0"])
            .unwrap()
            .command
        else {
            panic!("not overhead");
        };
        assert_eq!((o.cpu_rounds, o.skip_latency), (0, true));
        assert!(parse(&["overhead", "--cpu-seconds", "0"]).is_err());
        let Command::Spike(s) = parse(&["spike", "--cost-patch", r#"{"mode": "index"}"#])
            .unwrap()
            .command
        else {
            panic!("not spike");
        };
        assert_eq!(s.cost_patch.unwrap()["mode"], "index");
        assert_eq!(s.old, SpikeOptions::default().old);
        assert!(parse(&["spike", "--cost-patch", "[1]"]).is_err());
        assert!(parse(&["spike", "--loopers", "0"]).is_err());
        let Command::GossipCost(g) = parse(&["gossip-cost", "--hashes", "3"]).unwrap().command
        else {
            panic!("not gossip-cost");
        };
        assert_eq!(
            (g.hashes, g.batches),
            (3, GossipCostOptions::default().batches)
        );
        assert!(parse(&["gossip-cost", "--batches", "0"]).is_err());
        assert!(parse(&[]).is_err());
        assert!(parse(&["nope"]).is_err());
    }
}
