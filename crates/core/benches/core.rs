//! Criterion benches of the routing core (fixed inputs, no randomness):
//! key extraction + hashing per request size, ring placement per fleet size,
//! and the full decision. Run: `cargo bench -p prefix-router-core`.
//! Results and the command that produced them: BENCHMARKS.md.

#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)]

#[path = "../tests/bodies/mod.rs"]
mod bodies;
#[path = "../tests/reference/mod.rs"]
mod reference;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prefix_router_core::config::KeyMode;
use prefix_router_core::extract::{self, Api, PromptSink};
use prefix_router_core::hash;
use prefix_router_core::key::KeySink;
use prefix_router_core::load::HostLoad;
use prefix_router_core::{Config, Request, Router};
use std::hint::black_box;

use bodies::text;

/// A chat body: system prompt, first user turn, then history up to `total` bytes.
fn chat_body(total: usize) -> Vec<u8> {
    let sys = text(2000.min(total / 2), 1);
    let mut msgs = vec![
        serde_json::json!({"role": "system", "content": sys}),
        serde_json::json!({"role": "user", "content": text(200, 2)}),
    ];
    let mut i = 3;
    while serde_json::to_vec(&msgs).map(|v| v.len()).unwrap_or(0) < total {
        let role = if i % 2 == 1 { "assistant" } else { "user" };
        msgs.push(serde_json::json!({"role": role, "content": text(1000, i)}));
        i += 1;
    }
    serde_json::to_vec(
        &serde_json::json!({"model": "llama-3.1-8b", "stream": true, "messages": msgs}),
    )
    .unwrap_or_default()
}

/// The router's key path: read `model`/`cache_salt`, seed, extract into a
/// key sink (with the strided chain when `stride` is set, as
/// `Router::decide` does for the index rule). `new`: this crate; else the
/// former serde extractor and pre-pass.
fn key_path(body: &[u8], new: bool, stride: Option<u32>) -> Option<u64> {
    let seed = if new {
        let m = extract::peek_meta(body).ok()?;
        hash::model_seed(m.model.as_bytes(), None)
    } else {
        let (model, _) = reference::peek_meta(body).ok()?;
        hash::model_seed(model.as_bytes(), None)
    };
    let mut sink = match stride {
        Some(s) => KeySink::with_chain(seed, 64, KeyMode::Conversation, 4096, true, s),
        None => KeySink::new(seed, 64, KeyMode::Conversation, 4096, true),
    };
    let ok = if new {
        extract::extract(Api::ChatCompletions, body, &mut sink).is_ok()
    } else {
        reference::extract(Api::ChatCompletions, body, &mut sink).is_ok()
    };
    ok.then(|| sink.key() ^ sink.chain_history().len() as u64)
}

/// The key path through one [`extract::Scan`] (the router with `Scan`
/// instead of `peek_meta` + `extract`), with the strided chain.
fn scan_path(body: &[u8]) -> Option<u64> {
    let scan = extract::Scan::new(body);
    let m = scan.meta().ok()?;
    let seed = hash::model_seed(m.model.as_bytes(), None);
    let mut sink = KeySink::with_chain(seed, 64, KeyMode::Conversation, 4096, true, 16);
    scan.extract(Api::ChatCompletions, &mut sink).ok()?;
    Some(sink.key() ^ sink.chain_history().len() as u64)
}

/// Counts bytes only (the extractor alone, without hashing).
struct Null(u64);
impl PromptSink for Null {
    fn write(&mut self, b: &[u8]) {
        self.0 += b.len() as u64;
    }
    fn anchor(&mut self) {}
}

fn bench_extract(c: &mut Criterion) {
    let mut g = c.benchmark_group("extract");
    g.sample_size(20)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3));
    let cases = bodies::cases();
    for (name, body) in &cases {
        // A body over the work budget falls back (tests/budget.rs says which): its cost is
        // the time to find that out, and the former extractor, which has no budget, still keys it.
        let over = matches!(
            extract::extract(Api::ChatCompletions, body, &mut Null(0)),
            Err(extract::ExtractError::TooComplex(_))
        );
        let key = key_path(body, true, Some(16));
        if over {
            assert!(key.is_none(), "{name}");
        } else {
            assert!(key.is_some(), "{name}");
            assert_eq!(key, key_path(body, false, Some(16)), "{name}");
        }
        g.throughput(Throughput::Bytes(body.len() as u64));
        for (label, new) in [("new", true), ("serde", false)] {
            g.bench_with_input(
                BenchmarkId::new(format!("{name}/chain/{label}"), body.len()),
                body,
                |b, body| b.iter(|| key_path(black_box(body), new, Some(16))),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("{name}/key/{label}"), body.len()),
                body,
                |b, body| b.iter(|| key_path(black_box(body), new, None)),
            );
        }
        g.bench_with_input(
            BenchmarkId::new(format!("{name}/chain/scan"), body.len()),
            body,
            |b, body| b.iter(|| scan_path(black_box(body))),
        );
        g.bench_with_input(
            BenchmarkId::new(format!("{name}/extract_only/new"), body.len()),
            body,
            |b, body| {
                b.iter(|| {
                    let mut s = Null(0);
                    let _ = extract::extract(Api::ChatCompletions, black_box(body), &mut s);
                    s.0
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new(format!("{name}/peek_meta/new"), body.len()),
            body,
            |b, body| b.iter(|| extract::peek_meta(black_box(body)).is_ok()),
        );
    }
    g.finish();
}

fn router(n: usize) -> Router {
    router_mode(n, "spill")
}

/// `n` hosts with `cost.mode = mode`.
fn router_mode(n: usize, mode: &str) -> Router {
    let hosts: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"address":"10.0.{}.{}:8000"}}"#, i / 250, i % 250))
        .collect();
    let json = format!(
        r#"{{"hosts":[{}],"cost":{{"mode":"{mode}"}}}}"#,
        hosts.join(",")
    );
    match Config::from_json(json.as_bytes()) {
        Ok(c) => Router::new(c),
        Err(e) => panic!("{e}"),
    }
}

fn bench_key(c: &mut Criterion) {
    let r = router(8);
    let mut g = c.benchmark_group("key");
    for size in [1_000usize, 16_000, 256_000] {
        let body = chat_body(size);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("chat_conversation", size),
            &body,
            |b, body| b.iter(|| r.key(Api::ChatCompletions, black_box(body), None)),
        );
    }
    g.finish();
}

/// Placement of a given key ([`Request::with_key`]: the body is not read)
/// by plain bounded loads (`cost.mode = "off"`) and by the priced spill
/// (`"spill"`, the default).
fn bench_place(c: &mut Criterion) {
    let mut g = c.benchmark_group("place");
    let body = chat_body(1000);
    for mode in ["off", "spill"] {
        for n in [4usize, 16, 64, 256] {
            let r = router_mode(n, mode);
            let idle = vec![HostLoad::default(); n];
            // A loaded fleet: every host but the last few at its bound, so the
            // walk is long (worst case).
            let busy: Vec<HostLoad> = (0..n)
                .map(|i| HostLoad {
                    inflight: if i + 2 < n { 100 } else { 0 },
                    pending_requests: 0,
                    report: None,
                    ejected: false,
                    pending_prefill_tokens: 0,
                    peer_pending_tokens: 0,
                    recent: 0.0,
                })
                .collect();
            let key = match r.key(Api::ChatCompletions, &body, None) {
                Ok(k) => k,
                Err(e) => panic!("{e:?}"),
            };
            let place = |l: &[HostLoad]| {
                r.decide(&Request::new(Api::ChatCompletions, &body, l, 0).with_key(black_box(key)))
            };
            g.bench_with_input(
                BenchmarkId::new(format!("{mode}_idle"), n),
                &idle,
                |b, l| b.iter(|| place(l)),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("{mode}_saturated"), n),
                &busy,
                |b, l| b.iter(|| place(l)),
            );
        }
    }
    g.finish();
}

fn bench_ring_build(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_build");
    for n in [16usize, 256] {
        g.bench_function(BenchmarkId::new("hosts_x100_vnodes", n), |b| {
            b.iter(|| router(black_box(n)))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_extract,
    bench_key,
    bench_place,
    bench_ring_build
);
criterion_main!(benches);
