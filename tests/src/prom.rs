//! Minimal Prometheus text-format reader (enough for Envoy's `/stats/prometheus` and the
//! backends' `/metrics`).

/// One sample: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Raw label text between the braces (empty when none).
    pub labels: String,
    pub value: f64,
}

/// Parses the samples of a Prometheus text exposition; comments and malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) if line[..open].chars().all(|c| !c.is_whitespace()) => {
            let close = line[open..].rfind('}')? + open;
            (&line[..open], &line[open + 1..close], &line[close + 1..])
        }
        _ => {
            let sp = line.find(char::is_whitespace)?;
            (&line[..sp], "", &line[sp..])
        }
    };
    // value [timestamp]
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels: labels.to_string(),
        value,
    })
}

/// Sum over all labels of the samples named `name`; if there are none, of those named
/// `name` + `_total` (some exporters write counters one way, some the other, some both: never
/// add the two). `None` if neither exists.
pub fn sum(samples: &[Sample], name: &str) -> Option<f64> {
    let sum_named = |n: &str| -> Option<f64> {
        let mut found = false;
        let mut acc = 0.0;
        for s in samples.iter().filter(|s| s.name == n) {
            found = true;
            acc += s.value;
        }
        found.then_some(acc)
    };
    sum_named(name).or_else(|| sum_named(&format!("{name}_total")))
}

/// Every sample whose name contains all of `parts`.
pub fn matching<'a>(samples: &'a [Sample], parts: &[&str]) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| parts.iter().all(|p| s.name.contains(p)))
        .collect()
}

/// Sum of the samples whose name contains all of `parts` (0 when none).
pub fn sum_matching(samples: &[Sample], parts: &[&str]) -> f64 {
    matching(samples, parts).iter().map(|s| s.value).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_envoy_and_vllm_styles() {
        let text = "# TYPE prefix_router_routed_hit counter\n\
                    prefix_router_routed_hit{} 6\n\
                    envoy_cluster_upstream_rq_total{envoy_cluster_name=\"llm\"} 7\n\
                    vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 120.0\n\
                    vllm:prefix_cache_queries{model_name=\"m\"} 300\n\
                    vllm:num_requests_waiting 2 1700000000\n\
                    garbage\n";
        let s = parse(text);
        assert_eq!(s.len(), 5);
        assert_eq!(sum(&s, "vllm:prefix_cache_hits"), Some(120.0));
        assert_eq!(sum(&s, "vllm:prefix_cache_queries"), Some(300.0));
        assert_eq!(sum(&s, "vllm:num_requests_waiting"), Some(2.0));
        assert_eq!(sum(&s, "vllm:nope"), None);
        assert_eq!(sum_matching(&s, &["prefix_router", "routed"]), 6.0);
        assert_eq!(s[1].labels, "envoy_cluster_name=\"llm\"");
        // Both spellings present (as the backend simulator writes them): not added up.
        let both = parse("c_total{a=\"1\"} 5\nc{a=\"1\"} 5\n");
        assert_eq!(sum(&both, "c"), Some(5.0));
    }
}
