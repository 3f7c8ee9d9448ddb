//! Reading a replica's Prometheus `/metrics` for its queue depth (the active
//! scrape, as opposed to the load reports on responses).
//!
//! The adapter fetches the text; this module sums the samples of the
//! configured metric names (every label set, or only those whose
//! `model_name` label matches when a model is given) into one queue depth.
//! The same sum over `scrape.running_metrics` gives the running count
//! (`Report::running`, counted by the bound, not priced by the cost rule).
//! Presets: vLLM `vllm:num_requests_waiting` and
//! `vllm:num_requests_running`, SGLang `sglang:num_queue_reqs` and
//! `sglang:num_running_reqs`. O(size of the text).
//!
//! ## Restart detection
//! The scrape also reads a counter that only a restart (or a cache reset)
//! makes go down (`scrape.restart_metrics`; vLLM preset
//! `vllm:prefix_cache_queries_total`, SGLang preset
//! `sglang:prompt_tokens_total`). [`counter_reset`] keeps the last value per
//! host in shared data and reports a decrease, which makes the filter
//! forget the host's prefix-index entries: its KV cache is gone. A cache
//! flush that leaves the counters alone (vLLM's `/reset_prefix_cache`) is
//! not visible this way; the next section catches it.
//!
//! ## Flush detection
//! A replica whose cache was flushed stops hitting the prefixes the index
//! credits it with. The filter adds, per host, the tokens the index
//! credited each request with when that request's response arrives from
//! the credited host ([`add_served_credit`]; by then the replica has
//! admitted it and counted its prefix-cache hits), and the scrape reads the
//! host's prefix-cache hit counter (`scrape.hit_metrics`, in tokens; vLLM
//! preset `vllm:prefix_cache_hits_total`, SGLang `sglang:cached_tokens_total`). Credit accumulates over
//! consecutive scrape intervals until it reaches [`FLUSH_MIN_TOKENS`]
//! (several requests' worth); if the hit counter grew by less than
//! [`FLUSH_HIT_SHARE`] of it over those intervals and the ones just before
//! and after them ([`flush_check`]: a request's hit and its credit can
//! fall on either side of a scrape), the cache the index believes in is
//! gone: the filter forgets the host's entries (counter
//! `prefix_router.index.forget.flushed`), one scrape interval after the
//! credited misses add up to the minimum. In the Envoy
//! demo the replicas hit 88-92 % of what the index credits (BENCHMARKS
//! "Sizing the index"), so 10 % leaves a wide margin, and the minimum keeps
//! a prefix the replica merely evicted from passing for a flush; other proxies' and
//! clients' hits only add to the counter, so they can hide a flush but
//! never fake one. Cost: one compare-and-swap per credited response, one
//! read-and-clear per host per scrape.

use crate::store::{SharedStore, StoreError};

/// Sum of the samples of `names` in a Prometheus text exposition; `None` if
/// none of them is present. Comment lines, other metrics and malformed lines
/// are skipped; a non-finite value makes the whole scrape invalid.
pub fn queue_depth(text: &str, names: &[String]) -> Result<Option<f64>, String> {
    let mut sum = 0.0;
    let mut any = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let name = line.get(..name_end).unwrap_or("");
        if !names.iter().any(|n| n == name) {
            continue;
        }
        let rest = line.get(name_end..).unwrap_or("");
        let after_labels = match rest.find('}') {
            Some(i) if rest.starts_with('{') => rest.get(i + 1..).unwrap_or(""),
            _ => rest,
        };
        let mut fields = after_labels.split_whitespace();
        let Some(v) = fields.next() else { continue };
        let x: f64 = v
            .parse()
            .map_err(|_| format!("{name}: value {v:?} is not a number"))?;
        if !x.is_finite() {
            return Err(format!("{name}: value {v:?} is not finite"));
        }
        sum += x;
        any = true;
    }
    Ok(any.then_some(sum))
}

/// The value of the first of `names` present in the text (its samples
/// summed over label sets), `None` if none is.
pub fn first_counter(text: &str, names: &[String]) -> Result<Option<f64>, String> {
    for n in names {
        if let Some(v) = queue_depth(text, std::slice::from_ref(n))? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Credited tokens a window of scrape intervals must reach before
/// [`flush_check`] judges it (16 KiB of prompt at 4 bytes per token:
/// several requests' worth, so one prefix the replica merely evicted does
/// not look like a flush).
pub const FLUSH_MIN_TOKENS: u64 = 4096;
/// A flush is suspected when the hits between two scrapes are below this
/// share of what the index credited.
pub const FLUSH_HIT_SHARE: f64 = 0.1;

/// Whether a replica's cache looks flushed: the index credited it with
/// `credited` tokens of prefix between two scrapes (responses that came
/// back from it) and its hit counter grew by `hits` tokens.
pub fn flush_suspected(credited: u64, hits: f64) -> bool {
    credited >= FLUSH_MIN_TOKENS && hits < FLUSH_HIT_SHARE * credited as f64
}

fn credit_key(address: &str) -> String {
    format!("prefix_router/scrape/credit/{address}")
}

fn hits_key(address: &str) -> String {
    format!("prefix_router/scrape/hits/{address}")
}

/// A response came back from `address` for a request the index credited
/// with `tokens` of cached prefix there: add them to the host's credit
/// since the last scrape. Any VM (compare-and-swap).
pub fn add_served_credit<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    tokens: u64,
) -> Result<u64, StoreError> {
    let delta = i64::try_from(tokens).unwrap_or(i64::MAX);
    crate::store::add_counter(store, &credit_key(address), delta)
}

/// The credit added since the last call, cleared (compare-and-swap).
pub fn take_served_credit<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<u64, StoreError> {
    crate::store::cas_update(store, &credit_key(address), |v| {
        let cur = v
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_le_bytes);
        if cur == 0 {
            (None, 0)
        } else {
            (Some(0u64.to_le_bytes()), cur)
        }
    })
}

/// What the scraping VM keeps per host for flush detection: the hit
/// counter and the hits of the last interval, and the window of intervals
/// being judged (credit and hits since it opened, hits of the interval
/// before it, whether its credit reached [`FLUSH_MIN_TOKENS`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct FlushWatch {
    counter: f64,
    hits_last: f64,
    hits_before: f64,
    window_hits: f64,
    window_credit: u64,
}

impl FlushWatch {
    fn decode(v: Option<&[u8]>) -> Option<FlushWatch> {
        let b = v?;
        let word = |i: usize| -> Option<[u8; 8]> { b.get(i * 8..i * 8 + 8)?.try_into().ok() };
        let w = FlushWatch {
            counter: f64::from_le_bytes(word(0)?),
            hits_last: f64::from_le_bytes(word(1)?),
            hits_before: f64::from_le_bytes(word(2)?),
            window_hits: f64::from_le_bytes(word(3)?),
            window_credit: u64::from_le_bytes(word(4)?),
        };
        [w.counter, w.hits_last, w.hits_before, w.window_hits]
            .iter()
            .all(|x| x.is_finite())
            .then_some(w)
    }

    fn encode(&self) -> [u8; 40] {
        let mut out = [0u8; 40];
        for (slot, bytes) in out.chunks_exact_mut(8).zip([
            self.counter.to_le_bytes(),
            self.hits_last.to_le_bytes(),
            self.hits_before.to_le_bytes(),
            self.window_hits.to_le_bytes(),
            self.window_credit.to_le_bytes(),
        ]) {
            slot.copy_from_slice(&bytes);
        }
        out
    }
}

/// One scrape of a host for flush detection: `counter` is its hit counter
/// now, `credit` what [`take_served_credit`] returned (the credit of the
/// interval that just ended). Credit accumulates over consecutive
/// intervals until it reaches [`FLUSH_MIN_TOKENS`]; one scrape later that
/// window is judged against the hits of its intervals and of the ones just
/// before and after it (a request's hit is counted when the replica admits
/// it and its credit when its response arrives, so the two can fall on
/// either side of a scrape). Returns `Some((credit, hits))` when
/// [`flush_suspected`] says the window's credit found no cache. The first
/// scrape of a host and a counter that went down (a restart,
/// [`counter_reset`]) judge nothing and start over. Written only by the
/// scraping VM, so a plain write suffices.
pub fn flush_check<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    counter: f64,
    credit: u64,
) -> Result<Option<(u64, f64)>, StoreError> {
    let key = hits_key(address);
    let (v, _) = store.get(&key)?;
    let prev = FlushWatch::decode(v.as_deref()).filter(|w| counter >= w.counter);
    let (next, verdict) = match prev {
        // First sight or a restart: the credit taken now has no hits to be
        // compared with.
        None => (
            FlushWatch {
                counter,
                ..FlushWatch::default()
            },
            None,
        ),
        Some(w) => {
            let hits = counter - w.counter;
            let closed = w.window_credit >= FLUSH_MIN_TOKENS;
            let verdict = if closed {
                let total = w.hits_before + w.window_hits + hits;
                flush_suspected(w.window_credit, total).then_some((w.window_credit, total))
            } else {
                None
            };
            // A judged or empty window restarts with this interval.
            let fresh = closed || w.window_credit == 0;
            let next = FlushWatch {
                counter,
                hits_last: hits,
                hits_before: if fresh { w.hits_last } else { w.hits_before },
                window_hits: if fresh { hits } else { w.window_hits + hits },
                window_credit: if fresh {
                    credit
                } else {
                    w.window_credit.saturating_add(credit)
                },
            };
            (next, verdict)
        }
    };
    store.set(&key, &next.encode(), None)?;
    Ok(verdict)
}

fn counter_key(address: &str) -> String {
    format!("prefix_router/scrape/counter/{address}")
}

/// Record a host's restart counter; `Ok(true)` if it went down since the
/// last scrape (the replica restarted or reset its cache). The first value
/// seen is only recorded. Written only by the scraping VM (the lease
/// holder), so a plain write suffices.
pub fn counter_reset<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    value: f64,
) -> Result<bool, StoreError> {
    let key = counter_key(address);
    let (v, _) = store.get(&key)?;
    let prev = v
        .as_deref()
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(f64::from_le_bytes)
        .filter(|x| x.is_finite());
    store.set(&key, &value.to_le_bytes(), None)?;
    Ok(prev.is_some_and(|p| value < p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn restart_counter_going_down_is_a_reset() {
        let s = MemStore::default();
        let names = n(&[
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_queries",
        ]);
        let t1 = "vllm:prefix_cache_queries{model_name=\"m\"} 900\nvllm:prefix_cache_queries_total{model_name=\"m\"} 1000\n";
        assert_eq!(first_counter(t1, &names), Ok(Some(1000.0)));
        assert_eq!(
            first_counter("vllm:prefix_cache_queries 7\n", &names),
            Ok(Some(7.0))
        );
        assert_eq!(first_counter("other 1\n", &names), Ok(None));
        assert_eq!(counter_reset(&s, "a", 1000.0), Ok(false)); // first sight
        assert_eq!(counter_reset(&s, "a", 1500.0), Ok(false));
        assert_eq!(counter_reset(&s, "a", 1500.0), Ok(false));
        assert_eq!(counter_reset(&s, "b", 10.0), Ok(false)); // per host
        assert_eq!(counter_reset(&s, "a", 20.0), Ok(true)); // restarted
        assert_eq!(counter_reset(&s, "a", 40.0), Ok(false));
    }

    #[test]
    fn a_flush_is_hits_far_below_the_credit() {
        assert!(!flush_suspected(0, 0.0));
        assert!(!flush_suspected(FLUSH_MIN_TOKENS - 1, 0.0)); // too little to judge
        assert!(flush_suspected(FLUSH_MIN_TOKENS, 0.0));
        assert!(flush_suspected(10_000, 999.0));
        assert!(!flush_suspected(10_000, 1_000.0));
        assert!(!flush_suspected(10_000, 50_000.0)); // others' hits count too

        let s = MemStore::default();
        assert_eq!(take_served_credit(&s, "a"), Ok(0));
        assert_eq!(add_served_credit(&s, "a", 300), Ok(300));
        assert_eq!(add_served_credit(&s, "a", 212), Ok(512));
        assert_eq!(add_served_credit(&s, "b", 7), Ok(7));
        assert_eq!(take_served_credit(&s, "a"), Ok(512));
        assert_eq!(take_served_credit(&s, "a"), Ok(0)); // cleared
        assert_eq!(take_served_credit(&s, "b"), Ok(7)); // per host

        // First sight: the credit taken now is dropped, nothing judged.
        assert_eq!(flush_check(&s, "a", 100.0, 5_000), Ok(None));
        // Interval 1 credits 1,000: the window stays open, and interval 2
        // adds 4,000 (5,000 >= FLUSH_MIN_TOKENS): it closes.
        assert_eq!(flush_check(&s, "a", 100.0, 1_000), Ok(None));
        assert_eq!(flush_check(&s, "a", 100.0, 4_000), Ok(None));
        // Judged one scrape later: the hits of interval 3 still count (a
        // hit counted after the scrape that took its credit).
        assert_eq!(flush_check(&s, "a", 2_600.0, 0), Ok(None));
        // Intervals 4-5 credit 6,000 and hit 100 (and interval 6 nothing);
        // interval 3's 2,500 hits came before the window: 2,600 hits, no flush.
        assert_eq!(flush_check(&s, "a", 2_600.0, 6_000), Ok(None));
        assert_eq!(flush_check(&s, "a", 2_700.0, 0), Ok(None));
        // Intervals 6-7 credit 8,000, and 6-8 hit 50: flushed.
        assert_eq!(flush_check(&s, "a", 2_700.0, 0), Ok(None));
        assert_eq!(flush_check(&s, "a", 2_700.0, 8_000), Ok(None));
        assert_eq!(flush_check(&s, "a", 2_750.0, 0), Ok(Some((8_000, 50.0))));
        // Below FLUSH_MIN_TOKENS nothing is judged, whatever the hits.
        for _ in 0..5 {
            assert_eq!(flush_check(&s, "a", 2_750.0, 500), Ok(None));
        }
        // A counter that goes down (a restart) judges nothing and starts over.
        assert_eq!(flush_check(&s, "a", 10.0, 9_000), Ok(None));
        assert_eq!(flush_check(&s, "a", 10.0, 0), Ok(None));
        // Per host, and a garbage value is a first sight.
        s.set("prefix_router/scrape/hits/b", b"junk", None).unwrap();
        assert_eq!(flush_check(&s, "b", 0.0, 9_000), Ok(None));
        assert_eq!(flush_check(&s, "b", 0.0, 0), Ok(None));
    }

    fn n(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn vllm_and_sglang_texts() {
        let vllm = "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
                    # TYPE vllm:num_requests_waiting gauge\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 3.0\n\
                    vllm:num_requests_running{model_name=\"m\"} 5.0\n\
                    vllm:num_requests_waiting_total 99\n";
        assert_eq!(
            queue_depth(vllm, &n(&["vllm:num_requests_waiting"])),
            Ok(Some(3.0))
        );
        assert_eq!(
            queue_depth(
                vllm,
                &n(&["vllm:num_requests_waiting", "vllm:num_requests_running"])
            ),
            Ok(Some(8.0))
        );
        let sglang = "sglang:num_queue_reqs{model_name=\"a\",engine_type=\"unified\"} 2\nsglang:num_queue_reqs{model_name=\"b\"} 1 1700000000000\n";
        assert_eq!(
            queue_depth(sglang, &n(&["sglang:num_queue_reqs"])),
            Ok(Some(3.0))
        );
        assert_eq!(
            queue_depth(sglang, &n(&["vllm:num_requests_waiting"])),
            Ok(None)
        );
    }

    #[test]
    fn bad_values() {
        assert!(queue_depth("q 1e999\n", &n(&["q"])).is_err());
        assert!(queue_depth("q abc\n", &n(&["q"])).is_err());
        assert_eq!(queue_depth("q\n", &n(&["q"])), Ok(None));
        assert_eq!(queue_depth("", &n(&["q"])), Ok(None));
    }
}
