//! `prefix-router-lab`: run the lab from the command line.
//!
//! ```text
//! prefix-router-lab demo [--conversations N] [--turns N] [--concurrency N] [--time-scale X]
//!                        [--cache-tokens N] [--seed N] ...
//! prefix-router-lab overhead [--rounds N] [--per-round N] [--sizes B1,B2,..]
//! prefix-router-lab spike [--old N] [--new N] [--doc-bytes B] [--loopers N] [--queue Q]
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

use prefix_router_lab::envoy::{EnvoyMode, EnvoyOptions, FilterConfig};
use prefix_router_lab::report::side_by_side;
use prefix_router_lab::workload::DEMO_CACHE_TOKENS;
use prefix_router_lab::{BackendOptions, Lab, LabOptions, Report, Workload, WorkloadOptions};
use std::process::ExitCode;

const USAGE: &str = "\
usage: prefix-router-lab demo [options]

Starts 4 backend simulators + Envoy with the prefix-router filter (envoy/envoy.yaml), runs a
multi-turn chat workload through it, then does the same with fresh backends behind Envoy with
plain round robin (envoy/envoy-round-robin.yaml), and prints both side by side.

The defaults are a document chat under cache pressure: every conversation opens with a 6-10 KB
document (~2k tokens) and asks about it over 6 turns, users pause 0.2-4 s between turns, and each
backend's KV cache (36864 tokens) holds about a quarter of the 50 conversations, the four
together about all of them. Round robin copies every conversation onto every replica, so most
copies are evicted before they are reused; prefix-router keeps each conversation on one replica.

options:
  --conversations N   conversations (default 50)
  --turns N           turns per conversation (default 6)
  --concurrency N     conversations open at once (default 50: all)
  --time-scale X      backend --time-scale (default 0.5; smaller = faster)
  --cache-tokens N    backend KV-cache capacity in tokens (default 36864)
  --max-running N     backend max running batch (default 8)
  --max-tokens N      output tokens per request (default 48)
  --first-bytes LO,HI size of each conversation's first user message (default 6000,10000)
  --think-ms LO,HI    user think time before each follow-up turn, uniform (default 200,4000)
  --start-ms LO,HI    delay before each conversation's first turn, uniform (default 0,4000)
  --seed N            workload seed (default 42)
  --filter-patch JSON merged into the filter JSON of envoy/envoy.yaml, e.g.
                      '{\"capacity_factor\": 2.0}' (default: none)
  --also JSON         also run the filter with this patch (instead of --filter-patch) and add it
                      as a third column, e.g. '{\"cost\": {\"mode\": \"index\"}}': side by side in
                      one run
  --proxies N         run every column with N proxies (Envoys, sglang-routers) in front of the
                      same backends, a conversation's turns alternating between them (default 1)
  --gossip            with --proxies N > 1: the filter's Envoys gossip their indexes (`gossip`
                      with every other Envoy as a peer, interval 100 ms)
  --load-gossip       --gossip, and each Envoy also sends its pending prefill per replica
                      (`gossip.name` set to its own address)
  --sglang P[,P..]    also run SGLang's model gateway (sglang-router 0.3.2 from PyPI; install it
                      with `./build.sh peers`) with policy P in front of fresh backends, a column
                      each: cache_aware, round_robin, power_of_two or random

usage: prefix-router-lab overhead [--rounds N] [--per-round N] [--sizes B1,B2,..]

Measures the filter's added latency: Envoy without a filter, with the do-nothing testbed
filter, and with prefix-router, in one interleaved run (see BENCHMARKS.md).
Needs target/wasm32-wasip1/release/testbed_filter.wasm (or PREFIX_ROUTER_TESTBED_WASM).

usage: prefix-router-lab spike [--old N] [--new N] [--doc-bytes B] [--new-bytes B] [--loopers N] [--queue Q]
                               [--cost-patch JSON]

The default rule under a load spike (tests/src/spike.rs): 4 backends, `old` conversations with
a `doc-bytes` document cached on their replicas, then `loopers` direct clients keep the replica
holding most of them busy (a real queue, under the load bound) while the next turn of every
old conversation and the first turn of `new` conversations (`new-bytes` first messages) go
through Envoy. Runs the bounded ring alone (cost.mode off), then the default (spill), and prints
TTFT and placements side by side. Defaults: --old 8 --new 24 --doc-bytes 65536 --new-bytes 2048
--loopers 7. --cost-patch merges `cost` fields into the second run, e.g. '{\"mode\": \"index\"}'.

usage: prefix-router-lab gossip-cost [--batches N] [--observations N] [--hashes N]

What receiving index gossip costs an Envoy (tests/src/gossip_cost.rs): one Envoy with
gossip.accept, batches of random observations POSTed to its gossip path, alternating batches it
records (204) with same-size batches it refuses for their fingerprint (400); the difference is
the cost of recording. Defaults: --batches 200 --observations 50 --hashes 40.

environment: ENVOY_BIN (default .venv/bin/envoy), PREFIX_ROUTER_BACKEND (default
target/native/prefix-router-backend), PREFIX_ROUTER_WASM (default
target/wasm32-wasip1/release/prefix_router.wasm), PREFIX_ROUTER_LAB_KEEP=1 keeps the logs in .lab/.
";

struct DemoArgs {
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
}

/// `LO,HI` with `LO <= HI`.
fn range<T: std::str::FromStr + PartialOrd>(v: &str) -> Option<(T, T)> {
    let (a, b) = v.split_once(',')?;
    let lo: T = a.trim().parse().ok()?;
    let hi: T = b.trim().parse().ok()?;
    (lo <= hi).then_some((lo, hi))
}

fn parse_demo_args(args: &[String]) -> Result<DemoArgs, String> {
    let mut d = DemoArgs {
        workload: WorkloadOptions::default(),
        // The cache size the default workload is sized for (see prefix_router_lab::workload).
        backend: BackendOptions {
            cache_tokens: DEMO_CACHE_TOKENS,
            ..BackendOptions::default()
        },
        filter: FilterConfig::Default,
        also: None,
        sglang: Vec::new(),
        proxies: 1,
        gossip: false,
        load_gossip: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let bad = |v: &str| format!("bad value for {flag}: {v}");
        match flag.as_str() {
            "--conversations" => {
                let v = value()?;
                d.workload.conversations = v.parse().map_err(|_| bad(&v))?;
            }
            "--turns" => {
                let v = value()?;
                d.workload.turns = v.parse().map_err(|_| bad(&v))?;
            }
            "--concurrency" => {
                let v = value()?;
                d.workload.concurrency = v.parse().map_err(|_| bad(&v))?;
            }
            "--seed" => {
                let v = value()?;
                d.workload.seed = v.parse().map_err(|_| bad(&v))?;
            }
            "--time-scale" => {
                let v = value()?;
                d.backend.time_scale = v.parse().map_err(|_| bad(&v))?;
            }
            "--cache-tokens" => {
                let v = value()?;
                d.backend.cache_tokens = v.parse().map_err(|_| bad(&v))?;
            }
            "--think-ms" => {
                let v = value()?;
                d.workload.think_ms = range(&v).ok_or_else(|| bad(&v))?;
            }
            "--max-tokens" => {
                let v = value()?;
                d.workload.max_tokens = v.parse().map_err(|_| bad(&v))?;
            }
            "--start-ms" => {
                let v = value()?;
                d.workload.start_ms = range(&v).ok_or_else(|| bad(&v))?;
            }
            "--first-bytes" => {
                let v = value()?;
                d.workload.first_message_bytes = range(&v).ok_or_else(|| bad(&v))?;
            }
            "--max-running" => {
                let v = value()?;
                d.backend.max_running = v.parse().map_err(|_| bad(&v))?;
            }
            "--filter-patch" => {
                let v = value()?;
                let patch: serde_json::Value =
                    serde_json::from_str(&v).map_err(|e| format!("--filter-patch: {e}"))?;
                d.filter = FilterConfig::Patched(patch);
            }
            "--also" => {
                let v = value()?;
                let patch: serde_json::Value =
                    serde_json::from_str(&v).map_err(|e| format!("--also: {e}"))?;
                d.also = Some(FilterConfig::Patched(patch));
            }
            "--proxies" => {
                let v = value()?;
                d.proxies = v.parse().map_err(|_| bad(&v))?;
                if !(1..=8).contains(&d.proxies) {
                    return Err(format!("--proxies must be 1..=8, not {v}"));
                }
            }
            "--gossip" => d.gossip = true,
            "--load-gossip" => {
                d.gossip = true;
                d.load_gossip = true;
            }
            "--sglang" => {
                let v = value()?;
                for p in v.split(',').map(str::trim) {
                    if !prefix_router_lab::peer::SGLANG_POLICIES.contains(&p) {
                        return Err(format!(
                            "--sglang: unknown policy {p:?} (expected {})",
                            prefix_router_lab::peer::SGLANG_POLICIES.join(", ")
                        ));
                    }
                    d.sglang.push(p.to_string());
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if d.gossip && d.proxies < 2 {
        return Err("--gossip and --load-gossip need --proxies 2 or more".to_string());
    }
    Ok(d)
}

fn run_one(
    mode: EnvoyMode,
    label: &str,
    filter: &FilterConfig,
    args: &DemoArgs,
    workload: &Workload,
) -> Result<Report, String> {
    let n = args.proxies.max(1);
    println!(
        "== {label}: starting 4 backends (KV cache {} tokens each) + {n} Envoy{} ({})",
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
        backends: 4,
        backend: args.backend.clone(),
        envoy: (n == 1).then(|| EnvoyOptions {
            mode,
            filter: filter.clone(),
            ..EnvoyOptions::default()
        }),
    })
    .map_err(|e| e.to_string())?;
    let report = if n == 1 {
        if let Ok(e) = lab.envoy() {
            println!(
                "   Envoy listener {} admin {}; running {} conversations x {} turns, {} at once",
                e.url(""),
                e.admin_url(""),
                workload.opts.conversations,
                workload.opts.turns,
                workload.opts.concurrency
            );
        }
        lab.run_workload(workload, label)
            .map_err(|e| e.to_string())?
            .1
    } else {
        let envoys = lab
            .start_envoys(n, mode, filter, args.gossip, args.load_gossip)
            .map_err(|e| e.to_string())?;
        let urls: Vec<String> = envoys.iter().map(|e| e.url("")).collect();
        println!(
            "   Envoys {}; running {} conversations x {} turns, {} at once, turns alternating",
            urls.join(" "),
            workload.opts.conversations,
            workload.opts.turns,
            workload.opts.concurrency
        );
        let (_run, report) = lab
            .run_workload_at(workload, label, &urls)
            .map_err(|e| e.to_string())?;
        drop(envoys);
        report
    };
    print_done(&report);
    lab.stop();
    Ok(report)
}

fn demo(args: &[String]) -> Result<(), String> {
    let args = parse_demo_args(args)?;
    let workload = Workload::generate(args.workload.clone());
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

/// The workload through sglang-router with `policy`, in front of 4 fresh backends.
fn run_sglang(policy: &str, args: &DemoArgs, workload: &Workload) -> Result<Report, String> {
    let label = format!("sglang-router {policy}");
    println!(
        "== {label}: starting 4 backends (KV cache {} tokens each) + {} sglang-router{}",
        args.backend.cache_tokens,
        args.proxies.max(1),
        if args.proxies > 1 { "s" } else { "" }
    );
    let mut lab = Lab::start(&LabOptions {
        label: format!("demo-sglang-{}", policy.replace('_', "-")),
        backends: 4,
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
        "   sglang-router {}; running {} conversations x {} turns, {} at once",
        urls.join(" "),
        workload.opts.conversations,
        workload.opts.turns,
        workload.opts.concurrency
    );
    let (_run, report) = lab
        .run_workload_at(workload, &label, &urls)
        .map_err(|e| e.to_string())?;
    print_done(&report);
    for r in &mut routers {
        r.stop();
    }
    lab.stop();
    Ok(report)
}

/// `--flag value` pairs (every flag of `overhead` and `spike` takes a value).
fn flag_values(args: &[String]) -> Result<Vec<(&str, &str)>, String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        out.push((flag.as_str(), v.as_str()));
    }
    Ok(out)
}

fn overhead(args: &[String]) -> Result<(), String> {
    let mut opts = prefix_router_lab::overhead::OverheadOptions::default();
    for (flag, v) in flag_values(args)? {
        let bad = || format!("bad value for {flag}: {v}");
        match flag {
            "--rounds" => opts.rounds = v.parse().map_err(|_| bad())?,
            "--per-round" => opts.per_round = v.parse().map_err(|_| bad())?,
            "--sizes" => {
                opts.sizes = v
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad())?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    println!("{}", prefix_router_lab::overhead::run(&opts)?);
    Ok(())
}

fn spike(args: &[String]) -> Result<(), String> {
    use prefix_router_lab::spike::{self, SpikeOptions};
    let mut opts = SpikeOptions::default();
    for (flag, v) in flag_values(args)? {
        let bad = || format!("bad value for {flag}: {v}");
        match flag {
            "--old" => opts.old = v.parse().map_err(|_| bad())?,
            "--new" => opts.new = v.parse().map_err(|_| bad())?,
            "--doc-bytes" => opts.doc_bytes = v.parse().map_err(|_| bad())?,
            "--new-bytes" => opts.new_bytes = v.parse().map_err(|_| bad())?,
            "--loopers" => opts.loopers = v.parse().map_err(|_| bad())?,
            "--queue" => opts.queue = v.to_string(),
            "--cost-patch" => {
                opts.cost_patch = match serde_json::from_str(v) {
                    Ok(serde_json::Value::Object(m)) => m,
                    _ => return Err(format!("--cost-patch: not a JSON object: {v}")),
                }
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if opts.old == 0 || opts.loopers == 0 {
        return Err("--old and --loopers must be at least 1".to_string());
    }
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
        let r = spike::run(&SpikeOptions {
            cost,
            ..opts.clone()
        })
        .map_err(|e| e.to_string())?;
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

fn gossip_cost(args: &[String]) -> Result<(), String> {
    let mut opts = prefix_router_lab::gossip_cost::GossipCostOptions::default();
    for (flag, v) in flag_values(args)? {
        let bad = || format!("bad value for {flag}: {v}");
        match flag {
            "--batches" => opts.batches = v.parse().map_err(|_| bad())?,
            "--observations" => opts.observations = v.parse().map_err(|_| bad())?,
            "--hashes" => opts.hashes = v.parse().map_err(|_| bad())?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if opts.batches == 0 || opts.observations == 0 {
        return Err("--batches and --observations must be at least 1".to_string());
    }
    println!(
        "{}",
        prefix_router_lab::gossip_cost::run(&opts).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("overhead") => overhead(&args[1..]),
        Some("spike") => spike(&args[1..]),
        Some("gossip-cost") => gossip_cost(&args[1..]),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(String::new()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_empty() => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("prefix-router-lab: {e}");
            ExitCode::FAILURE
        }
    }
}
