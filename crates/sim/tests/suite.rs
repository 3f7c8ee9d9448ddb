//! Tests of the suite (`prefix-router-sim suite`), its load definitions,
//! the busy-balance metric and the new generators. Kept small: debug
//! builds.

use prefix_router_sim::bounds;
use prefix_router_sim::engine::{simulate, SimConfig};
use prefix_router_sim::policy::{PolicySpec, DEFAULT_POLICY};
use prefix_router_sim::report::{to_json, Report, RunSet};
use prefix_router_sim::suite::defs::{self, Half, Source, WorkloadDef, LOADS, PEERS, PROXIES};
use prefix_router_sim::suite::load::{self, offered, LoadFacts, Offered};
use prefix_router_sim::suite::{run_suite, score, SuiteOptions};
use prefix_router_sim::workload::{synthetic, Kind, Workload};

fn synth(spec: &str, seed: u64) -> Workload {
    synthetic::build(&synthetic::Spec::parse(spec).expect("spec"), seed, 16)
}

fn tiny_defs() -> Vec<WorkloadDef> {
    vec![
        WorkloadDef {
            name: "tiny-groups",
            half: Half::Tune,
            what: "test",
            source: Source::Synthetic(
                "shared-prefix:groups=4,prompts=6,system=300,question=40,output=8,rate=20",
            ),
            quick_limit: 10,
            scales: [1.0, 3.0, 9.0],
        },
        WorkloadDef {
            name: "tiny-agentic",
            half: Half::Check,
            what: "test",
            source: Source::Synthetic(
                "agentic:groups=2,users=3,turns=3,system=200,question=20,tool=100,output=8,session_rate=2,think=0.2",
            ),
            quick_limit: 3,
            scales: [1.0, 2.0, 6.0],
        },
    ]
}

fn tiny_options(threads: usize) -> SuiteOptions {
    SuiteOptions {
        defs: tiny_defs(),
        seeds: vec![3],
        threads,
        quick: false,
        traces: std::path::PathBuf::from("/nonexistent"),
        progress: false,
        scrape_s: 0.0,
        batch_cost: false,
    }
}

fn suite_json(threads: usize) -> String {
    let r = run_suite(&tiny_options(threads)).expect("suite runs");
    let b = score::score(&r);
    serde_json::to_string_pretty(&score::to_json(&r, &b)).expect("json")
}

#[test]
fn suite_json_is_byte_identical_for_a_seed() {
    let a = suite_json(2);
    let b = suite_json(2);
    assert_eq!(a, b, "two suite runs with the same seed differ");
    // Thread count changes nothing.
    assert_eq!(a, suite_json(1));
    let v: serde_json::Value = serde_json::from_str(&a).expect("parses");
    assert_eq!(v["default_policy"], DEFAULT_POLICY);
    // Every policy's own K-proxy / 1-proxy hit ratio, on the K-proxy cells.
    let cells = v["cells"].as_array().expect("cells");
    for c in cells {
        for p in c["policies"].as_array().expect("policies") {
            let r = &p["hit_kp_over_1p"];
            if c["proxies"] == 1 {
                assert!(r.is_null());
            } else {
                let one = cells
                    .iter()
                    .find(|o| {
                        o["workload"] == c["workload"]
                            && o["load"] == c["load"]
                            && o["proxies"] == 1
                    })
                    .and_then(|o| o["policies"].as_array())
                    .and_then(|v| v.iter().find(|x| x["policy"] == p["policy"]))
                    .expect("the 1-proxy figure");
                let (hk, h1) = (
                    p["hit_rate"].as_f64().unwrap_or(0.0),
                    one["hit_rate"].as_f64().unwrap_or(0.0),
                );
                if h1 >= 0.01 {
                    assert!(
                        (r.as_f64().expect("a ratio") - hk / h1).abs() < 1e-4,
                        "{r} {hk} {h1}"
                    );
                }
            }
        }
    }
    // A different seed changes the figures.
    let mut o = tiny_options(2);
    o.seeds = vec![4];
    let r = run_suite(&o).expect("suite runs");
    let other = serde_json::to_string_pretty(&score::to_json(&r, &score::score(&r))).expect("json");
    assert_ne!(a, other);
}

/// `--batch-cost` reaches every run of the suite. Its direction, a large
/// batch's context slowing its steps, is the replica crate's test
/// `a_large_batch_context_slows_decode_and_the_next_prefill`; on these tiny
/// prompts a 5 ms step over little context is faster than the flat 15 ms.
#[test]
fn the_batch_cost_reaches_every_run_of_the_suite() {
    let flat = run_suite(&tiny_options(2)).expect("suite runs");
    let mut o = tiny_options(2);
    o.batch_cost = true;
    let costly = run_suite(&o).expect("suite runs");
    let v = score::to_json(&costly, &score::score(&costly));
    assert_eq!(v["suite"]["batch_cost"], true);
    assert_eq!(
        score::to_json(&flat, &score::score(&flat))["suite"]["batch_cost"],
        false
    );
    // The same runs in the same order, each faster end to end: 5 ms steps
    // plus the read of a little context instead of a flat 15 ms.
    let runs = |r: &prefix_router_sim::suite::SuiteResult| -> Vec<(String, f64)> {
        r.workloads
            .iter()
            .flat_map(|w| &w.seeds)
            .flat_map(|s| s.results.iter().flatten().flatten())
            .map(|x| (x.policy.clone(), x.e2e.p50))
            .collect()
    };
    let (a, b) = (runs(&flat), runs(&costly));
    assert_eq!(a.len(), b.len());
    assert!(!a.is_empty());
    for ((pa, ea), (pb, eb)) in a.iter().zip(&b) {
        assert_eq!(pa, pb);
        assert!(eb < ea, "{pa}: e2e p50 {ea} flat, {eb} with the batch cost");
    }
}

#[test]
fn the_scoreboard_answers_from_the_runs() {
    let r = run_suite(&tiny_options(2)).expect("suite runs");
    assert_eq!(r.runs, 2 * LOADS.len() * PROXIES.len() * r.policies.len());
    let b = score::score(&r);
    assert_eq!(b.cells.len(), 2 * LOADS.len() * PROXIES.len());
    let d = r
        .policies
        .iter()
        .position(|p| p == DEFAULT_POLICY)
        .expect("the default runs");
    let peers: Vec<usize> = PEERS
        .iter()
        .map(|p| {
            r.policies
                .iter()
                .position(|x| x == p)
                .expect("every peer runs")
        })
        .collect();
    let (mut passed_tune, mut cells_tune) = (0, 0);
    for c in &b.cells {
        let v = c.verdict.as_ref().expect("a verdict per cell");
        let best = peers
            .iter()
            .map(|&i| c.aggs[i].p90)
            .fold(f64::INFINITY, f64::min);
        assert!((v.best_p90 - best).abs() < 1e-12);
        assert!((v.p90_ratio - c.aggs[d].p90 / best).abs() < 1e-9);
        assert_eq!(
            v.fails.contains(&"p90/peer"),
            v.p90_ratio > score::P90_VS_PEER_MAX
        );
        let best_hit = peers.iter().map(|&i| c.aggs[i].hit).fold(0.0, f64::max);
        match v.hit_ratio {
            Some(h) => assert!((h - c.aggs[d].hit / best_hit).abs() < 1e-9),
            None => assert!(best_hit < score::NO_SHARING_HIT),
        }
        // 4-proxy ratios exist exactly on the 4-proxy cells, against the
        // same workload and load with 1 proxy.
        assert_eq!(v.proxy_p90_ratio.is_some(), c.proxies > 1);
        if c.proxies > 1 {
            let one = b
                .cells
                .iter()
                .find(|o| o.workload == c.workload && o.load == c.load && o.proxies == 1)
                .expect("1-proxy cell");
            let want = c.aggs[d].p90 / one.aggs[d].p90;
            assert!((v.proxy_p90_ratio.unwrap_or(0.0) - want).abs() < 1e-9);
        }
        assert_eq!(v.overload_ratio.is_some(), c.load == LOADS.len() - 1);
        if r.workloads[c.workload].def.half == Half::Tune {
            cells_tune += 1;
            if v.pass() {
                passed_tune += 1;
            }
        }
    }
    let h = score::summarize(&r, &b, Half::Tune);
    assert_eq!((h.cells, h.passed), (cells_tune, passed_tune));
    let text = score::to_table(&r, &b);
    assert!(
        text.contains("tune half") && text.contains("check half"),
        "{text}"
    );
    assert!(text.contains(&format!("tune: {passed_tune}/{cells_tune} cells pass")));
}

#[test]
fn suite_policies_and_definition() {
    let p = defs::policies();
    assert_eq!(p.first(), Some(&DEFAULT_POLICY));
    for name in PEERS.iter().chain([&defs::RING, &defs::ROUND_ROBIN]) {
        assert!(p.contains(name), "{name}");
    }
    for name in &p {
        PolicySpec::parse(name).expect("a valid policy");
    }
    let ws = defs::workloads();
    assert!(ws.len() >= 8);
    assert!(ws.iter().any(|w| w.half == Half::Tune) && ws.iter().any(|w| w.half == Half::Check));
    for w in &ws {
        assert!(
            w.scales[0] < w.scales[1] && w.scales[1] < w.scales[2],
            "{}: loads must increase",
            w.name
        );
        if let Source::Synthetic(s) = w.source {
            synthetic::Spec::parse(s).expect("a valid synthetic spec");
        }
    }
    let mut names: Vec<&str> = ws.iter().map(|w| w.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ws.len(), "workload names are unique");
}

#[test]
fn plain_json_names_the_default_policy() {
    let wl = synth(
        "shared-prefix:groups=2,prompts=3,system=100,question=20,output=5,rate=10",
        1,
    );
    let c = SimConfig::default();
    let r = simulate(&wl, &PolicySpec::parse("round-robin").expect("spec"), &c).expect("run");
    let b = bounds::compute(&wl, c.cost.cache_capacity_tokens);
    let rep = Report::new(
        &wl,
        &c,
        b,
        vec![RunSet {
            rate_scale: 1.0,
            proxies: 1,
            results: vec![r],
        }],
    );
    let j = to_json(&rep);
    assert_eq!(j["default_policy"], DEFAULT_POLICY);
    assert!(j["runs"][0]["results"][0]["busy_balance"]["half_busy_windows"].is_u64());
}

#[test]
fn offered_load_of_an_open_loop_workload() {
    // 2,000 requests of 1,000 tokens at 20/s, no sharing in the question:
    // with hit rate 0 the prefill work is 2000 x (5 ms + 1000/16000 s).
    let wl = synth(
        "shared-prefix:groups=2000,prompts=1,system=0,question=1000,output=1,rate=20",
        5,
    );
    let c = SimConfig::default();
    let tokens = wl.requests[0].prompt.tokens() as f64;
    let per = c.cost.prefill_time(tokens as u64, 0);
    let o = offered(&wl, &c.cost, 4, 1.0, 0.0);
    let want = 20.0 * per / 4.0;
    assert!((o.prefill - want).abs() < 0.08 * want, "{o:?} vs {want}");
    // Twice the rate scale, twice the load; a hit rate removes work.
    let o2 = offered(&wl, &c.cost, 4, 2.0, 0.0);
    assert!((o2.prefill / o.prefill - 2.0).abs() < 1e-6);
    assert!(offered(&wl, &c.cost, 4, 1.0, 0.5).prefill < 0.6 * o.prefill);
    // One output token: a slot is held for the prefill only.
    assert!((o.slots - o.prefill / c.cost.max_running as f64).abs() < 1e-9);
}

#[test]
fn offered_load_of_a_closed_loop_saturates() {
    // Back-to-back turns: compressing session starts cannot push the
    // offered rate past what the sessions send with no queueing.
    let wl = synth(
        "multi-turn:groups=1,users=20,turns=6,system=200,question=50,output=100,session_rate=1,think=0",
        2,
    );
    let c = SimConfig::default();
    let a = offered(&wl, &c.cost, 2, 1e3, 0.5).max();
    let b = offered(&wl, &c.cost, 2, 1e6, 0.5).max();
    assert!(a.is_finite() && (b - a).abs() < 0.05 * a, "{a} {b}");
    let s = load::scale_for(0.5 * a, 1e-3, 1e6, |x| {
        offered(&wl, &c.cost, 2, x, 0.5).max()
    })
    .expect("reachable");
    let got = offered(&wl, &c.cost, 2, s, 0.5).max();
    assert!((got - 0.5 * a).abs() < 0.02 * a, "{got}");
    assert!(
        load::scale_for(2.0 * a, 1e-3, 1e6, |x| offered(&wl, &c.cost, 2, x, 0.5)
            .max())
        .is_none()
    );
}

#[test]
fn load_definitions() {
    let f = |pre: f64, slots: f64, p50: f64, p90: f64| LoadFacts {
        ring_hit: 0.3,
        offered: Offered {
            prefill: pre,
            slots,
        },
        rr_p50: p50,
        rr_p90: p90,
    };
    assert!(load::holds(0, &f(0.5, 0.6, 1.0, 5.0)));
    assert!(!load::holds(0, &f(0.5, 0.61, 1.0, 1.0)), "slots bind too");
    assert!(load::holds(1, &f(0.9, 0.5, 1.0, 3.0)));
    assert!(!load::holds(1, &f(0.9, 0.5, 1.0, 2.9)), "spread below 3");
    assert!(!load::holds(1, &f(1.2, 0.5, 1.0, 4.0)), "that is overload");
    assert!(!load::holds(1, &f(0.5, 0.5, 1.0, 4.0)), "that is moderate");
    assert!(load::holds(2, &f(1.2, 0.1, 1.0, 1.0)));
    assert!(
        !load::holds(2, &f(1.19, 3.0, 1.0, 1.0)),
        "prefill work decides"
    );
    // Seed means: the spread is mean p90 over mean p50.
    let p = LoadFacts::pooled(&[f(1.0, 0.0, 1.0, 2.0), f(1.0, 0.0, 3.0, 10.0)]).expect("two");
    assert!((p.rr_spread() - 3.0).abs() < 1e-12);
    assert_eq!(load::round3(1.2345, true), 1.24);
    assert_eq!(load::round3(1234.5, false), 1230.0);
    assert_eq!(load::round3(0.0123456, false), 0.0123);
}

#[test]
fn busy_balance_sees_an_idle_replica() {
    // Every request has the same prefix; plain hashing with no bound puts
    // all of them on one replica of two: that replica is busy all the time,
    // the other never, so the fleet is exactly half busy and max/mean = 2.
    let wl = synth(
        "shared-prefix:groups=1,prompts=400,system=1500,question=10,output=50,rate=40",
        1,
    );
    let c = SimConfig {
        replicas: 2,
        busy_window_s: 2.0,
        ..SimConfig::default()
    };
    let hot = simulate(&wl, &PolicySpec::parse("ch-first-chunk").expect("spec"), &c).expect("run");
    assert!(hot.busy_windows >= 3, "{}", hot.busy_windows);
    assert!(
        (hot.busy_ratio_mean - 2.0).abs() < 0.02,
        "{}",
        hot.busy_ratio_mean
    );
    let rr = simulate(&wl, &PolicySpec::parse("round-robin").expect("spec"), &c).expect("run");
    assert!(rr.busy_windows >= 3);
    assert!(rr.busy_ratio_mean < 1.1, "{}", rr.busy_ratio_mean);
    assert!(rr.busy_ratio_worst <= 2.0 + 1e-9);
    // A nearly idle fleet has no window that counts.
    let idle = synth(
        "shared-prefix:groups=5,prompts=2,system=100,question=10,output=2,rate=0.2",
        1,
    );
    let r = simulate(&idle, &PolicySpec::parse("round-robin").expect("spec"), &c).expect("run");
    assert_eq!(r.busy_windows, 0);
}

fn is_prefix(a: &[u64], b: &[u64]) -> bool {
    b.len() >= a.len() && &b[..a.len()] == a
}

#[test]
fn agentic_contexts_grow_step_by_step() {
    let spec = "agentic:groups=3,users=4,turns=6,system=500,question=50,tool=400,output=20,session_rate=1,think=0.5";
    let wl = synth(spec, 9);
    assert_eq!(wl.sessions.len(), 12);
    for s in &wl.sessions {
        assert!((3..=9).contains(&s.requests.len()), "{}", s.requests.len());
        for w in s.requests.windows(2) {
            let (a, b) = (&wl.requests[w[0] as usize], &wl.requests[w[1] as usize]);
            // The next step's prompt extends this step's prompt and answer.
            let m = a
                .remember
                .as_ref()
                .expect("a step with a successor remembers");
            assert!(is_prefix(m.blocks(), b.prompt.blocks()));
            assert!(b.prompt.tokens() > a.prompt.tokens() + 90);
            assert!((10..=30).contains(&a.output_tokens));
        }
    }
    // Deterministic for a seed, different for another.
    let again = synth(spec, 9);
    let other = synth(spec, 10);
    let blocks = |w: &Workload| -> Vec<u64> {
        w.requests
            .iter()
            .flat_map(|r| r.prompt.blocks().to_vec())
            .collect()
    };
    assert_eq!(blocks(&wl), blocks(&again));
    assert_ne!(blocks(&wl), blocks(&other));
}

#[test]
fn rag_users_share_their_first_document() {
    let wl = synth(
        "rag:docs=4,doc=600,k=2,zipf=1,system=100,question=30,output=10,users=60,turns=2,session_rate=2,think=1",
        4,
    );
    let firsts: Vec<&prefix_router_replica::Prompt> = wl
        .sessions
        .iter()
        .map(|s| &wl.requests[s.requests[0] as usize].prompt)
        .collect();
    // System (100 tokens) + a document of at least 300 tokens: 25 blocks
    // of 16 tokens. Sessions sharing them form a few big groups.
    let mut groups: Vec<(Vec<u64>, usize)> = Vec::new();
    for p in &firsts {
        let head = p.blocks()[..25].to_vec();
        match groups.iter_mut().find(|g| g.0 == head) {
            Some(g) => g.1 += 1,
            None => groups.push((head, 1)),
        }
    }
    assert!(groups.len() <= 4, "{} first-document groups", groups.len());
    let biggest = groups.iter().map(|g| g.1).max().unwrap_or(0);
    assert!(biggest >= 15, "Zipf: a hot document ({biggest})");
    // The question is the user's own: no two first prompts are equal.
    for (i, a) in firsts.iter().enumerate() {
        for b in firsts.iter().skip(i + 1) {
            assert_ne!(a.blocks(), b.blocks());
        }
    }
    assert!(wl
        .requests
        .iter()
        .all(|r| matches!(r.kind, Kind::Chat { .. })));
    // The body is valid JSON the core keys (no fallback).
    let r = simulate(
        &wl,
        &PolicySpec::parse("prefix-router").expect("spec"),
        &SimConfig {
            replicas: 2,
            ..SimConfig::default()
        },
    )
    .expect("run");
    assert_eq!(r.fallback, 0);
    assert_eq!(r.completed, wl.len());
}

#[test]
fn bursty_arrivals_crowd_into_the_bursts() {
    // 6x the mean rate for 10 % of every 30 s: 60 % of the arrivals.
    let wl = synth(
        "bursty:groups=40,prompts=50,system=10,question=10,output=1,rate=10",
        8,
    );
    let n = wl.sessions.len() as f64;
    let on = wl.sessions.iter().filter(|s| s.start % 30.0 < 3.0).count() as f64;
    assert!((on / n - 0.6).abs() < 0.05, "{}", on / n);
    let span = wl.span_s();
    assert!((n / span - 10.0).abs() < 1.5, "mean rate {}", n / span);
    // Plain shared-prefix stays Poisson: 10 % of arrivals in those slots.
    let plain = synth(
        "shared-prefix:groups=40,prompts=50,system=10,question=10,output=1,rate=10",
        8,
    );
    let on = plain
        .sessions
        .iter()
        .filter(|s| s.start % 30.0 < 3.0)
        .count() as f64;
    assert!((on / plain.sessions.len() as f64 - 0.1).abs() < 0.03);
    assert!(
        synthetic::Spec::parse("bursty:burst=20").is_err(),
        "burst x duty > 1"
    );
}

#[test]
fn gzipped_traces_read_as_plain() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("prs-suite-gz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let json = r#"[{"id":"a","conversations":[{"from":"human","value":"hi there"},{"from":"gpt","value":"hello"},{"from":"human","value":"how are you"},{"from":"gpt","value":"fine"}]}]"#;
    let plain = dir.join("t.json");
    std::fs::write(&plain, json).expect("write");
    let gz = dir.join("t.json.gz");
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(json.as_bytes()).expect("gzip");
    std::fs::write(&gz, e.finish().expect("gzip")).expect("write");
    let opts = prefix_router_sim::workload::TraceOptions::default();
    let a = prefix_router_sim::workload::load_trace(&plain, &opts, 1, 16).expect("plain");
    let b = prefix_router_sim::workload::load_trace(&gz, &opts, 1, 16).expect("gz");
    assert_eq!(a.len(), 2);
    assert_eq!(b.len(), a.len());
    assert_eq!(a.name, b.name);
    for (x, y) in a.requests.iter().zip(&b.requests) {
        assert_eq!(x.prompt.blocks(), y.prompt.blocks());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn suite_command_line() {
    use clap::Parser;
    use prefix_router_sim::cli::{suite_options, Cli, Command};
    let cli = Cli::try_parse_from([
        "prefix-router-sim",
        "suite",
        "--json",
        "--half",
        "check",
        "--seeds",
        "5,6",
        "--threads",
        "1",
    ])
    .expect("parses");
    let Some(Command::Suite(s)) = cli.command else {
        panic!("not the suite");
    };
    let o = suite_options(&s).expect("options");
    assert!(s.json);
    assert!(!o.batch_cost);
    let costly =
        Cli::try_parse_from(["prefix-router-sim", "suite", "--batch-cost"]).expect("parses");
    let Some(Command::Suite(c)) = costly.command else {
        panic!("not the suite");
    };
    assert!(suite_options(&c).expect("options").batch_cost);
    assert_eq!(o.seeds, vec![5, 6]);
    assert!(o.defs.iter().all(|d| d.half == Half::Check) && !o.defs.is_empty());
    let quick = Cli::try_parse_from(["prefix-router-sim", "suite", "--quick"]).expect("parses");
    let Some(Command::Suite(q)) = quick.command else {
        panic!("not the suite");
    };
    assert_eq!(suite_options(&q).expect("options").seeds.len(), 1);
    let bad =
        Cli::try_parse_from(["prefix-router-sim", "suite", "--workload", "nope"]).expect("parses");
    let Some(Command::Suite(b)) = bad.command else {
        panic!("not the suite");
    };
    assert!(suite_options(&b).is_err());
    // Plain-run flags do not mix with the subcommand.
    assert!(Cli::try_parse_from(["prefix-router-sim", "--synthetic", "zipf", "suite"]).is_err());
    let help = Cli::try_parse_from(["prefix-router-sim", "--help"]).expect_err("help");
    assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
    assert!(help.to_string().contains("suite"));
}

#[test]
fn mix_interleaves_its_applications_by_start_time() {
    let wl = synth("mix", 3);
    // Each part as the mix seeds it.
    let parts: Vec<Workload> = synthetic::MIX
        .iter()
        .enumerate()
        .map(|(i, s)| synth(s, prefix_router_sim::rng::seed2(3, i as u64 + 1)))
        .collect();
    // Every part's requests, each once.
    assert_eq!(
        wl.len(),
        parts.iter().map(Workload::len).sum::<usize>(),
        "requests"
    );
    assert_eq!(
        wl.sessions.len(),
        parts.iter().map(|p| p.sessions.len()).sum::<usize>()
    );
    // Sessions by start time; each request names the session holding it.
    assert!(wl.sessions.windows(2).all(|w| w[0].start <= w[1].start));
    let mut seen = vec![false; wl.len()];
    for (i, s) in wl.sessions.iter().enumerate() {
        for &r in &s.requests {
            assert_eq!(wl.requests[r as usize].session as usize, i);
            assert!(!std::mem::replace(&mut seen[r as usize], true));
        }
        // A session's turns extend each other (conversations were not
        // mixed up by the renumbering).
        for w in s.requests.windows(2) {
            let (a, b) = (&wl.requests[w[0] as usize], &wl.requests[w[1] as usize]);
            let m = a.remember.as_ref().expect("a turn with a successor");
            assert!(is_prefix(m.blocks(), b.prompt.blocks()));
        }
    }
    assert!(seen.iter().all(|&x| x));
    // Each request's body (what the router reads) is one of its part's,
    // with the same prompt (what the replica caches): conversations were
    // renumbered with their requests.
    let bodies = |w: &Workload| -> Vec<(Vec<u8>, Vec<u64>)> {
        let mut v: Vec<(Vec<u8>, Vec<u64>)> = w
            .requests
            .iter()
            .map(|r| {
                let mut b = Vec::new();
                w.write_body(r, &mut b);
                (b, r.prompt.blocks().to_vec())
            })
            .collect();
        v.sort();
        v
    };
    let mut want: Vec<(Vec<u8>, Vec<u64>)> = parts.iter().flat_map(bodies).collect();
    want.sort();
    assert!(
        bodies(&wl) == want,
        "bodies or prompts differ from the parts'"
    );
    // The applications overlap in time: each opens in the first 10 s and
    // still opens sessions after 150 s.
    for (p, spec) in parts.iter().zip(synthetic::MIX) {
        let first = p.sessions.iter().map(|s| s.start).fold(f64::MAX, f64::min);
        let last = p.sessions.iter().map(|s| s.start).fold(0.0, f64::max);
        assert!(first < 10.0 && last > 150.0, "{spec}: {first} .. {last}");
    }
    // Options are refused: the mix is fixed.
    assert!(synthetic::Spec::parse("mix:rate=2").is_err());
    // The body is valid JSON the core keys (no fallback).
    let mut short = wl.clone();
    short.truncate_sessions(120);
    let r = simulate(
        &short,
        &PolicySpec::parse("prefix-router").expect("spec"),
        &SimConfig::default(),
    )
    .expect("run");
    assert_eq!(r.fallback, 0);
    assert_eq!(r.completed, short.len());
}
