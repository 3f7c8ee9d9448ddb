//! Reading a replica's Prometheus `/metrics` for its queue depth (the active
//! scrape, as opposed to the load reports on responses).
//!
//! The adapter fetches the text; this module sums the samples of the
//! configured metric names (every label set, or only those whose
//! `model_name` label matches when a model is given) into one queue depth.
//! Presets: vLLM `vllm:num_requests_waiting` (+ optionally
//! `vllm:num_requests_running`), SGLang `sglang:num_queue_reqs`
//! (+ `sglang:num_running_reqs`). O(size of the text).

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

#[cfg(test)]
mod tests {
    use super::*;

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
