//! What replicas send back: the ORCA header (`load::parse_orca`), the plain
//! queue-depth header (`load::parse_queue_header`) and a Prometheus
//! `/metrics` page (`scrape::queue_depth`, `scrape::first_counter`). The
//! first byte picks which metric names are asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::{host_state, load, scrape};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let orca: &[&[&str]] = &[
        &["num_requests_waiting"],
        &["num_requests_waiting", "num_requests_running"],
        &["kv_cache_usage_perc"],
    ];
    let prom: &[&[&str]] = &[
        &["vllm:num_requests_waiting"],
        &["sglang:num_queue_reqs", "sglang:num_running_reqs"],
        &["vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"],
    ];
    let names = |set: &[&str]| set.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let o = names(orca[usize::from(pick) % orca.len()]);
    let p = names(prom[usize::from(pick / 4) % prom.len()]);
    // A parsed report goes where the filter puts it, and is read back as the
    // router reads it (NaN, infinities and negatives included).
    let store = prefix_router_core::store::MemStore::default();
    let now = 1_000_000;
    if let Ok(Some(v)) = load::parse_orca(&text, &o) {
        let _ = host_state::record_report(&store, "h", v, v, now);
    }
    if let Ok(v) = load::parse_queue_header(&text) {
        let _ = host_state::record_report(&store, "q", v, 0.0, now);
    }
    for h in ["h", "q"] {
        if let Ok(l) = host_state::read_load(&store, h) {
            let _ = l.reported(
                now + 500,
                load::Freshness {
                    ttl_ms: 10_000,
                    fade_ms: 2_000,
                },
            );
        }
    }
    let _ = scrape::queue_depth(&text, &p);
    let _ = scrape::first_counter(&text, &p);
});
