//! A quick throughput probe that tolerates a busy machine: the best of many
//! short batches (criterion's mean and median include time the process
//! spent descheduled). `cargo test --release -p prefix-router-core --test
//! throughput -- --ignored --nocapture`. The numbers of record come from
//! `cargo bench -p prefix-router-core --bench core -- extract`.
//! `PROBE_FILES=a.json,b.json ... probe_files` times request bodies from
//! files: the checking scan, the index rule's path and the default's.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod bodies;
mod reference;

use prefix_router_core::config::KeyMode;
use prefix_router_core::extract::{self, Api};
use prefix_router_core::hash;
use prefix_router_core::key::KeySink;
use std::hint::black_box;
use std::time::Instant;

/// The filter's key path: `peek_meta`, then `extract` into a `KeySink` with
/// the strided chain.
fn key_path(body: &[u8], new: bool) -> u64 {
    let scan = extract::Scan::with_budget(body, u64::MAX);
    let model = if new {
        scan.meta().unwrap().model.into_owned()
    } else {
        reference::peek_meta(body).unwrap().0
    };
    let seed = hash::model_seed(model.as_bytes(), None);
    let mut s = KeySink::with_chain(seed, 64, KeyMode::Conversation, 4096, true, 16);
    if new {
        scan.extract(Api::ChatCompletions, &mut s).unwrap();
    } else {
        reference::extract(Api::ChatCompletions, body, &mut s).unwrap();
    }
    s.key()
}

/// The same through one [`extract::Scan`] (the router with `Scan` instead
/// of `peek_meta` + `extract`).
fn scan_path(body: &[u8]) -> u64 {
    let scan = extract::Scan::with_budget(body, u64::MAX);
    let model = scan.meta().unwrap().model;
    let seed = hash::model_seed(model.as_bytes(), None);
    let mut s = KeySink::with_chain(seed, 64, KeyMode::Conversation, 4096, true, 16);
    scan.extract(Api::ChatCompletions, &mut s).unwrap();
    s.key()
}

/// The default config's path: one [`extract::Scan`] into a `KeySink`
/// without the whole-prompt chain (only `cost.mode: index` keeps it).
fn default_path(body: &[u8]) -> u64 {
    default_path_within(body, u64::MAX).unwrap()
}

/// [`default_path`] within a work budget of `work` ns (None: over it).
fn default_path_within(body: &[u8], work: u64) -> Option<u64> {
    let scan = extract::Scan::with_budget(body, work);
    let model = scan.meta().ok()?.model;
    let seed = hash::model_seed(model.as_bytes(), None);
    let mut s = KeySink::new(seed, 64, KeyMode::Conversation, 4096, true);
    scan.extract(Api::ChatCompletions, &mut s).ok()?;
    Some(s.key() ^ s.seen_bytes())
}

/// The checking scan alone (what every path pays first).
fn check_only(body: &[u8]) -> u64 {
    u64::from(extract::Scan::with_budget(body, u64::MAX).meta().is_ok())
}

/// The work the default path is charged for `body`: the least budget it
/// completes within (ns of `json_stream::cost`).
fn charged(body: &[u8]) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 40);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if default_path_within(body, mid).is_some() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Each body's cost without a budget, what the budget model charges for
/// it, and its cost as the router runs it (within `extract::budget`: the
/// element-dense bodies stop early, a counted fallback). Times in µs;
/// `x` is per byte against the plain 1 MiB prompt. `PROBE=name` measures
/// only the bodies whose name contains it.
#[test]
#[ignore]
fn probe_budget() {
    let cases = bodies::cases();
    let plain = cases
        .iter()
        .find(|(n, _)| n == "plain_prompt_1MiB")
        .map(|(_, b)| best(|| default_path(black_box(b)), 20) / b.len() as f64)
        .unwrap();
    println!(
        "{:<28} {:>9} {:>9} {:>6} {:>10} {:>9} {:>9} {:>6} {:>9}",
        "body", "bytes", "free µs", "x", "charged µs", "budget µs", "capped µs", "x", "outcome"
    );
    let only = std::env::var("PROBE").unwrap_or_default();
    for (name, body) in &cases {
        if !name.contains(&only) {
            continue;
        }
        let free = best(|| default_path(black_box(body)), 20);
        let budget = extract::budget(body.len());
        let capped = best(
            || default_path_within(black_box(body), budget).unwrap_or(1),
            20,
        );
        let ok = default_path_within(body, budget).is_some();
        let x = |t: f64| t / body.len() as f64 / plain;
        println!(
            "{name:<28} {:>9} {:>9.1} {:>6.2} {:>10.1} {:>9.1} {:>9.1} {:>6.2} {:>9}",
            body.len(),
            free * 1e6,
            x(free),
            charged(body) as f64 / 1e3,
            budget as f64 / 1e3,
            capped * 1e6,
            x(capped),
            if ok { "routed" } else { "fallback" }
        );
    }
}

/// Best time per call in seconds over `batches` batches of ~5 ms.
fn best(mut f: impl FnMut() -> u64, batches: usize) -> f64 {
    let t = Instant::now();
    black_box(f());
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((0.005 / once) as usize).max(1);
    let mut best = f64::MAX;
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..reps {
            black_box(f());
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

#[test]
#[ignore]
fn probe() {
    let only = std::env::var("PROBE").unwrap_or_default();
    let serde = std::env::var("PROBE_SERDE").is_ok();
    let cases = bodies::cases();
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "body",
        "bytes",
        "new µs",
        "MB/s",
        "scan µs",
        "MB/s",
        "serde µs",
        "MB/s",
        "dflt µs",
        "check µs"
    );
    let batches = std::env::var("PROBE_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    for (name, body) in &cases {
        if !name.contains(&only) {
            continue;
        }
        assert_eq!(key_path(body, true), key_path(body, false), "{name}");
        assert_eq!(key_path(body, true), scan_path(body), "{name}");
        let n = best(|| key_path(black_box(body), true), batches);
        let sc = best(|| scan_path(black_box(body)), batches);
        let df = best(|| default_path(black_box(body)), batches);
        let so = best(|| check_only(black_box(body)), batches);
        let o = if serde {
            best(|| key_path(black_box(body), false), 10)
        } else {
            f64::NAN
        };
        let mb = |t: f64| body.len() as f64 / t / 1e6;
        println!(
            "{name:<28} {:>9} {:>9.1} {:>9.0} {:>9.1} {:>9.0} {:>9.1} {:>9.0} {:>9.1} {:>9.1}",
            body.len(),
            n * 1e6,
            mb(n),
            sc * 1e6,
            mb(sc),
            o * 1e6,
            mb(o),
            df * 1e6,
            so * 1e6
        );
    }
}

#[test]
#[ignore]
fn probe_scan_only() {
    println!("{:<28} {:>9} {:>9}", "body", "scan µs", "all µs");
    for (name, body) in bodies::adversarial() {
        let s = best(|| check_only(black_box(&body)), 20);
        let a = best(|| scan_path(black_box(&body)), 20);
        println!("{name:<28} {:>9.1} {:>9.1}", s * 1e6, a * 1e6);
    }
}

#[test]
#[ignore]
fn probe_files() {
    let files = std::env::var("PROBE_FILES").unwrap_or_default();
    for f in files.split(',').filter(|f| !f.is_empty()) {
        let body = std::fs::read(f).unwrap();
        let s = best(|| check_only(black_box(&body)), 20);
        let a = best(|| scan_path(black_box(&body)), 20);
        let d = best(|| default_path(black_box(&body)), 20);
        println!(
            "{f:<28} {:>9} scan {:>9.1} chain {:>9.1} default {:>9.1} ns/B {:.3}",
            body.len(),
            s * 1e6,
            a * 1e6,
            d * 1e6,
            d * 1e9 / body.len() as f64
        );
    }
}
