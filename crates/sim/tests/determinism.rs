//! The simulator's output is a function of its inputs and `--seed`:
//!
//! * the JSON of a plain run and the plots are byte-identical from run to
//!   run of the real binary (and whatever the thread count); the suite's
//!   JSON is checked the same way in-process, on two tiny workloads
//!   (`tests/suite.rs`, `suite_json_is_byte_identical_for_a_seed`: the real
//!   suite's workloads take minutes in a debug build, even `--quick`);
//! * golden hashes pin the random streams themselves (raw draws of
//!   `crate::rng` and the synthetic workloads built from them), so an update
//!   of `rand` / `rand_pcg` that changes a stream fails here rather than
//!   silently moving every figure. They do not cover routing or the replica
//!   model, which change on purpose; when a change to `rng.rs`, a generator
//!   or the text generator is meant, print the new values (`cargo test -p
//!   prefix-router-sim --test determinism -- --nocapture`) and update them.
//!
//! Kept small: debug builds, a few seconds.

use std::path::{Path, PathBuf};
use std::process::Command;

use rand::Rng as _;
use xxhash_rust::xxh3::Xxh3;

use prefix_router_sim::rng::{rng, seed2, seed_str, Draw, SliceRandom, Zipf};
use prefix_router_sim::workload::{sharegpt, synthetic, TraceOptions, Workload};

const BIN: &str = env!("CARGO_BIN_EXE_prefix-router-sim");

/// Run the binary; its stdout (status must be 0).
fn run(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("the simulator starts");
    assert!(
        out.status.success(),
        "prefix-router-sim {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

const MULTI_TURN: &str =
    "multi-turn:groups=2,users=8,turns=3,system=300,question=30,output=20,session_rate=4,think=1";

#[test]
fn plain_run_json_is_byte_identical_for_a_seed() {
    let args = [
        "--synthetic",
        MULTI_TURN,
        "--replicas",
        "3",
        "--proxies",
        "1,2",
        "--rate-scale",
        "1,3",
        "--seed",
        "5",
        "--json",
        "--no-progress",
    ];
    let a = run(&[&args[..], &["--threads", "2"]].concat());
    let b = run(&[&args[..], &["--threads", "2"]].concat());
    assert_eq!(a, b, "two runs with the same seed differ");
    assert_eq!(
        a,
        run(&[&args[..], &["--threads", "1"]].concat()),
        "the thread count changed the output"
    );
    let v: serde_json::Value = serde_json::from_str(&a).expect("JSON");
    assert!(v["runs"].as_array().is_some_and(|r| r.len() == 4), "{v}");
    // Another seed changes the figures (random policies, tie breaks, text).
    let mut other: Vec<&str> = args.to_vec();
    if let Some(s) = other.iter_mut().find(|s| **s == "5") {
        *s = "6";
    }
    assert_ne!(a, run(&other));
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("plots dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn plots_keep_their_names_and_bytes() {
    let base: PathBuf = std::env::temp_dir().join(format!("prs-plots-{}", std::process::id()));
    let dirs = [base.join("a"), base.join("b")];
    for d in &dirs {
        run(&[
            "--synthetic",
            "shared-prefix:groups=3,prompts=6,system=200,question=20,output=8,rate=10",
            "--replicas",
            "3",
            "--policy",
            "round-robin",
            "--policy",
            "prefix-router",
            "--rate-scale",
            "1,2",
            "--no-progress",
            "--plots",
            d.to_str().expect("utf-8 path"),
        ]);
    }
    let (a, b) = (files(&dirs[0]), files(&dirs[1]));
    let _ = std::fs::remove_dir_all(&base);
    let names: Vec<&str> = a.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "hit_rate_vs_load_k1.svg",
            "load_prefix-router_x1_k1.svg",
            "load_prefix-router_x2_k1.svg",
            "load_round-robin_x1_k1.svg",
            "load_round-robin_x2_k1.svg",
            "ttft_p90_vs_load_k1.svg",
        ]
    );
    assert_eq!(a, b, "plots differ between two runs");
    for (n, body) in &a {
        let s = String::from_utf8_lossy(body);
        assert!(s.starts_with("<svg") && s.contains("</svg>"), "{n}");
    }
}

/// xxh3 of every draw kind, 1000 of each, from a few seeds.
fn draws_hash() -> u64 {
    let mut h = Xxh3::new();
    for seed in [0u64, 1, 42, seed2(7, 9), seed_str(1, "label")] {
        let mut r = rng(seed);
        for _ in 0..1000 {
            h.update(&r.next_u64().to_le_bytes());
        }
        for n in [1u64, 2, 3, 10, 1000, u64::MAX / 3] {
            for _ in 0..1000 {
                h.update(&r.below(n).to_le_bytes());
            }
        }
        for _ in 0..1000 {
            h.update(&r.unit().to_bits().to_le_bytes());
            h.update(&r.exp(2.5).to_bits().to_le_bytes());
        }
        let z = Zipf::new(50, 1.1);
        for _ in 0..1000 {
            h.update(&(z.sample(&mut r) as u64).to_le_bytes());
        }
        let mut v: Vec<u32> = (0..1000).collect();
        v.shuffle(&mut r);
        for x in v {
            h.update(&x.to_le_bytes());
        }
    }
    h.digest()
}

/// xxh3 of everything a workload holds: session starts and think times,
/// every request's body, output length and replica-side block hashes.
fn workload_hash(wl: &Workload) -> u64 {
    let mut h = Xxh3::new();
    for s in &wl.sessions {
        h.update(&s.start.to_bits().to_le_bytes());
        for t in &s.think {
            h.update(&t.to_bits().to_le_bytes());
        }
        for r in &s.requests {
            h.update(&r.to_le_bytes());
        }
    }
    let mut body = Vec::new();
    for r in &wl.requests {
        body.clear();
        wl.write_body(r, &mut body);
        h.update(&body);
        h.update(&r.output_tokens.to_le_bytes());
        h.update(&r.prompt.tokens().to_le_bytes());
    }
    h.digest()
}

fn synth(spec: &str, seed: u64) -> u64 {
    workload_hash(&synthetic::build(
        &synthetic::Spec::parse(spec).expect("spec"),
        seed,
        16,
    ))
}

/// The golden values (see the module doc).
const GOLDEN_DRAWS: u64 = 0x6f38_0d6d_5cb4_14bb;
const GOLDEN_WORKLOADS: u64 = 0x5db5_aa62_638c_eb18;

#[test]
fn random_streams_match_the_golden_hashes() {
    let draws = draws_hash();
    let mut h = Xxh3::new();
    for (spec, seed) in [
        ("shared-prefix:groups=4,prompts=5,system=100,question=20", 1),
        ("zipf:groups=10,prompts=5,system=100,question=20", 2),
        ("multi-turn:groups=2,users=5,turns=3,system=100", 3),
        ("bursty:groups=4,prompts=10,system=100,question=20", 4),
        ("agentic:groups=2,users=3,turns=3,system=100,tool=50", 5),
        ("rag:users=4,turns=2,docs=10,doc=100,system=50", 6),
    ] {
        h.update(&synth(spec, seed).to_le_bytes());
    }
    let long = "word ".repeat(40);
    let json = format!(
        r#"[{{"id":"a","conversations":[{{"from":"human","value":"{long} one"}},{{"from":"gpt","value":"{long} two"}},{{"from":"human","value":"three"}},{{"from":"gpt","value":"four"}}]}},
            {{"id":"b","conversations":[{{"from":"human","value":"five"}},{{"from":"gpt","value":"six"}}]}}]"#
    );
    let sg =
        sharegpt::parse(json.as_bytes(), "t", &TraceOptions::default(), 9, 16).expect("parses");
    h.update(&workload_hash(&sg).to_le_bytes());
    let mut spread = synthetic::build(
        &synthetic::Spec::parse("shared-prefix:groups=2,prompts=5").expect("spec"),
        1,
        16,
    );
    spread.spread_starts(3.0, 11);
    h.update(&workload_hash(&spread).to_le_bytes());
    let workloads = h.digest();
    println!("GOLDEN_DRAWS: {draws:#018x}\nGOLDEN_WORKLOADS: {workloads:#018x}");
    assert_eq!(
        draws, GOLDEN_DRAWS,
        "rand's streams moved: a rand / rand_pcg update or a change to rng.rs (see the module doc)"
    );
    assert_eq!(
        workloads, GOLDEN_WORKLOADS,
        "the synthetic workloads moved: a generator, the text or rng.rs changed (see the module doc)"
    );
}
