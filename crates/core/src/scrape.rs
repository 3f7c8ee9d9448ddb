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
//! not visible this way.

use crate::load::{SharedStore, StoreError};

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
    use crate::load::MemStore;

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
