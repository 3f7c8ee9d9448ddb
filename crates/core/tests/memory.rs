//! Per-request memory of the router's key path (`peek_meta`, then `extract`
//! into a `KeySink` with the strided chain, as the filter runs it), measured
//! with a counting global allocator: the peak of live heap bytes above the
//! level before the call, as a multiple `k` of the body's bytes. The
//! adversarial bodies of issue 21 and the worst cases of canonical JSON.
//! Run `cargo test -p prefix-router-core --test memory -- --nocapture` for
//! the table.
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
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counts are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            // Old and new blocks may both be live during the copy.
            grew(new);
            LIVE.fetch_sub(l.size(), Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak live heap bytes above the starting level while `f` runs.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    f();
    PEAK.load(Relaxed).saturating_sub(base)
}

/// The key path; the new extractor without its work budget (which stops
/// these bodies early: the walk's memory bound must hold without it).
fn key_path(api: Api, body: &[u8], new: bool) -> bool {
    let scan = extract::Scan::with_budget(body, u64::MAX);
    let model = if new {
        match scan.meta() {
            Ok(m) => m.model.into_owned(),
            Err(_) => return false,
        }
    } else {
        match reference::peek_meta(body) {
            Ok((m, _)) => m,
            Err(_) => return false,
        }
    };
    let seed = hash::model_seed(model.as_bytes(), None);
    let mut s = KeySink::with_chain(seed, 64, KeyMode::Conversation, 4096, api.structured(), 16);
    if new {
        scan.extract(api, &mut s).is_ok()
    } else {
        reference::extract(api, body, &mut s).is_ok()
    }
}

#[test]
fn memory_per_body_byte() {
    println!(
        "{:<28} {:>9} {:>12} {:>8} {:>12} {:>8}",
        "body", "bytes", "new peak", "new k", "serde peak", "serde k"
    );
    let mut worst: f64 = 0.0;
    for (name, body) in bodies::adversarial() {
        assert!(key_path(Api::ChatCompletions, &body, true), "{name}");
        let new = peak_of(|| assert!(key_path(Api::ChatCompletions, &body, true)));
        let old = peak_of(|| assert!(key_path(Api::ChatCompletions, &body, false)));
        let (kn, ko) = (
            new as f64 / body.len() as f64,
            old as f64 / body.len() as f64,
        );
        println!(
            "{name:<28} {:>9} {new:>12} {kn:>8.3} {old:>12} {ko:>8.2}",
            body.len()
        );
        worst = worst.max(kn);
    }
    println!("worst k (new): {worst:.3}");
    // 0.19 when this bar was set: the extraction never holds a copy of the body (one copy
    // alone would be 1.0). The VM's bar (issue 21: under 4x the body in all) counts the
    // buffered body itself too.
    assert!(
        worst <= 0.5,
        "extraction's peak heap above 0.5x the body: {worst}"
    );
}
