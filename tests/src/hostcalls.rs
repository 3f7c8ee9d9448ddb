//! Host calls per request at several fleet sizes (`prefix-router-lab
//! overhead` prints them; an e2e test asserts they are equal).
//!
//! Four backend simulators; for each fleet size N the filter is configured
//! with them plus N - 4 hosts that exist only in its config (the ring and
//! the shared data see N hosts). The probe sends the same chat body several
//! times, a body whose key's ring owner is one of the four real backends at
//! every size (found with the core's own key and ring, from the same filter
//! JSON), so every request takes the same path: routed to the owner, served
//! there, its report recorded. Envoy runs one worker, so no compare-and-swap
//! retries (two calls each) come from requests overlapping. It reads the
//! filter's gauge
//! `prefix_router.hostcalls.last` (the last finished request's host calls)
//! and its counter `prefix_router.hostcalls` over the requests.

use std::time::Duration;

use prefix_router_core::extract::Api;
use prefix_router_core::{Config, Router};
use serde_json::{json, Value};

use crate::backend::BackendOptions;
use crate::envoy::{self, EnvoyMode, EnvoyOptions, FilterConfig};
use crate::lab::{Lab, LabOptions};
use crate::{http, prom};

/// What one fleet size gave.
#[derive(Debug, Clone, PartialEq)]
pub struct HostCalls {
    /// Configured hosts.
    pub hosts: usize,
    /// `prefix_router.hostcalls.last` after the probe's last request.
    pub last: u64,
    /// `prefix_router.hostcalls` over the requests the filter saw.
    pub per_request: f64,
    /// Requests the filter saw (routed + fallbacks).
    pub requests: f64,
    /// Median client-side latency of the probe's requests, microseconds
    /// (one small body, sequential: indicative only).
    pub p50_us: u64,
}

fn body(i: usize) -> String {
    json!({
        "model": "sim-llm",
        "max_tokens": 1,
        "stream": false,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": format!("host call probe {i}")},
        ],
    })
    .to_string()
}

/// The filter config with the lab's backends and `extra` more hosts.
fn patch(lab: &Lab, extra: usize, base: &Value) -> Value {
    let mut hosts = match envoy::hosts_json(&lab.backends) {
        Value::Array(a) => a,
        _ => Vec::new(),
    };
    for i in 0..extra {
        // Addresses nothing listens on, outside Envoy's cluster.
        let (a, b) = (i / 250, i % 250);
        hosts.push(json!({
            "address": format!("127.1.{a}.{}:9", b + 1),
            "name": format!("absent-{i}"),
            "weight": 1,
        }));
    }
    let mut p = base.clone();
    if let Value::Object(m) = &mut p {
        m.insert("hosts".into(), Value::Array(hosts));
    }
    p
}

fn router_for(lab: &Lab, cfg: &FilterConfig) -> Result<Router, String> {
    let template = std::fs::read_to_string(EnvoyMode::PrefixRouter.template_path())
        .map_err(|e| format!("reading the envoy template: {e}"))?;
    let text = envoy::filter_json_text(&template, cfg, &lab.backends).map_err(|e| e.to_string())?;
    let c = Config::from_json(text.as_bytes()).map_err(|e| e.to_string())?;
    Ok(Router::new(c))
}

fn metric(samples: &[prom::Sample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// Host calls per request at each of `sizes` (each at least 4) configured
/// hosts, `requests` requests each, with the filter config `base` merged
/// over the committed one (`{}`: the default). `gap_ms` between requests:
/// 25 reads every request's load report, 0 (back to back) only the first's.
pub fn measure(
    sizes: &[usize],
    requests: usize,
    base: &Value,
    gap_ms: u64,
) -> Result<Vec<HostCalls>, String> {
    let mut lab = Lab::start(&LabOptions {
        label: "hostcalls".to_string(),
        backends: 4,
        backend: BackendOptions {
            instant: true,
            ..BackendOptions::default()
        },
        envoy: None,
    })
    .map_err(|e| e.to_string())?;
    let real: Vec<String> = lab.backends.iter().map(|b| b.address()).collect();
    // One body whose owner is a real backend at every size.
    let configs: Vec<FilterConfig> = sizes
        .iter()
        .map(|&n| FilterConfig::Patched(patch(&lab, n.saturating_sub(4), base)))
        .collect();
    let routers = configs
        .iter()
        .map(|c| router_for(&lab, c))
        .collect::<Result<Vec<_>, _>>()?;
    let probe = (0..100_000)
        .map(body)
        .find(|b| {
            routers.iter().all(|r| {
                let Ok(k) = r.key(Api::ChatCompletions, b.as_bytes(), None) else {
                    return false;
                };
                let owner = r.ring().owner(k.hash).and_then(|h| r.config().hosts.get(h));
                owner.is_some_and(|h| real.contains(&h.address))
            })
        })
        .ok_or("no probe body owned by a real backend at every size")?;
    let agent = http::agent(Duration::from_secs(30));
    let mut out = Vec::new();
    for (&n, cfg) in sizes.iter().zip(configs) {
        let e = lab
            .start_envoy(&EnvoyOptions {
                mode: EnvoyMode::PrefixRouter,
                filter: cfg,
                // One worker: no other request's compare-and-swap can
                // interleave and retry (a retry is two more calls).
                concurrency: 1,
                ..EnvoyOptions::default()
            })
            .map_err(|e| e.to_string())?;
        let url = e.url("/v1/chat/completions");
        let mut took = Vec::with_capacity(requests);
        for i in 0..requests {
            let t0 = std::time::Instant::now();
            let r = http::post(
                &agent,
                &url,
                &[("content-type", "application/json")],
                &probe,
            )
            .map_err(|e| e.to_string())?;
            took.push(t0.elapsed());
            if r.status != 200 {
                return Err(format!("{n} hosts, request {i}: {} {}", r.status, r.body));
            }
            // At 25 ms each request asks for and reads its report: a worker
            // does both at most every 20 ms per host (`REPORT_EVERY_MS`; 5
            // calls fewer when it does not), and a report stored in the same
            // millisecond as the last, with the same values, is not
            // written again.
            std::thread::sleep(Duration::from_millis(gap_ms));
        }
        // The gauge is set when a request's stream ends, just after its
        // response.
        std::thread::sleep(Duration::from_millis(300));
        let s = e.prometheus().map_err(|e| e.to_string())?;
        let seen: f64 = prom::matching(&s, &["prefix_router_routed"])
            .iter()
            .chain(prom::matching(&s, &["prefix_router_fallback"]).iter())
            .map(|x| x.value)
            .sum();
        let calls = metric(&s, "prefix_router_hostcalls");
        out.push(HostCalls {
            hosts: n,
            // `as` saturates; a gauge of whole calls.
            last: metric(&s, "prefix_router_hostcalls_last") as u64,
            per_request: if seen > 0.0 { calls / seen } else { f64::NAN },
            requests: seen,
            p50_us: {
                took.sort();
                took.get(took.len() / 2)
                    .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            },
        });
    }
    lab.stop();
    Ok(out)
}

/// The table `prefix-router-lab overhead` prints.
pub fn table(rows: &[HostCalls]) -> String {
    let mut s = String::from(
        "host calls per request (prefix_router.hostcalls.last; hostcalls / requests; \
         p50 latency of the probe's sequential small requests)\n\
         | configured hosts | last request | mean | requests | p50 |\n|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {} | {} us |\n",
            r.hosts, r.last, r.per_request, r.requests, r.p50_us
        ));
    }
    s
}
