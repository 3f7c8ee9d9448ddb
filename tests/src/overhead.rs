//! `prefix-router-lab overhead`: what the filter adds per request inside Envoy.
//!
//! Seven Envoys in one run, each in front of its own 2 backend simulators
//! (`--instant`: a fixed reply written at once, no scheduler):
//! - `no-filter`: envoy-round-robin.yaml (no wasm filter),
//! - `noop-wasm`: envoy.yaml with the testbed's do-nothing filter (same
//!   runtime, same plugin config knobs),
//! - `buffer-wasm`: the testbed filter that only pauses and buffers the body
//!   (what any body-based router pays before its own work),
//! - `skeleton-wasm`: the testbed filter that does what Envoy sees of a body
//!   router and nothing else (ORCA format header, body buffered, destination
//!   header set to one backend, a decision header added): the floor any
//!   filter that steers by the body pays in Envoy's runtime,
//! - `prefix-router-ring`: envoy.yaml with `cost.mode: off`,
//! - `prefix-router`: envoy.yaml as committed (the default rule),
//! - `prefix-router-index-all`: `cost.mode: index`, every boundary indexed;
//! - with `--latency-compare-wasm`, an eighth: `prefix-router` with another
//!   build of the filter (e.g. main's), in its own table below the first.
//!
//! One client thread, keep-alive, sends the same sequence of chat bodies to
//! each, in interleaved rounds (A, B, C, A, B, C …) so that machine noise hits
//! all alike. The figure that matters is `prefix-router - noop-wasm`:
//! the filter's own work (buffering, parsing, hashing, shared data, headers),
//! with the cost of having any wasm filter at all separated out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::backend::BackendOptions;
use crate::envoy::{EnvoyMode, EnvoyOptions, FilterConfig};
use crate::lab::{Lab, LabOptions};
use crate::paths;

/// Options of the overhead run.
#[derive(Debug, Clone)]
pub struct OverheadOptions {
    /// Requests per configuration per round.
    pub per_round: usize,
    pub rounds: usize,
    /// Approximate body sizes to measure (bytes).
    pub sizes: Vec<usize>,
    /// Also measure the default config with this build of the filter.
    pub compare_wasm: Option<std::path::PathBuf>,
}

impl Default for OverheadOptions {
    fn default() -> Self {
        OverheadOptions {
            per_round: 200,
            rounds: 5,
            sizes: vec![1_000, 16_000, 128_000],
            compare_wasm: None,
        }
    }
}

/// A chat body of about `bytes`, unique per `i` (distinct conversations).
fn body(bytes: usize, i: usize) -> String {
    let filler = "the replica holds the prefix of this conversation in its cache ";
    let mut msgs = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": format!("conversation {i}: hello")}),
    ];
    let mut size = 200;
    let mut turn = 0;
    while size < bytes {
        let n = (bytes - size).min(2000);
        let text: String = filler.chars().cycle().take(n).collect();
        let role = if turn % 2 == 0 { "assistant" } else { "user" };
        msgs.push(json!({"role": role, "content": text}));
        size += n + 40;
        turn += 1;
    }
    if turn % 2 == 1 {
        msgs.push(json!({"role": "user", "content": "and?"}));
    }
    json!({"model": "sim-llm", "max_tokens": 1, "stream": false, "messages": msgs}).to_string()
}

/// A minimal HTTP/1.1 keep-alive client: one `write` per request (headers and
/// body together) with `TCP_NODELAY`, so Nagle's algorithm and delayed ACKs
/// cannot add milliseconds that have nothing to do with the proxy.
struct RawClient {
    w: TcpStream,
    r: BufReader<TcpStream>,
    host: String,
}

impl RawClient {
    fn connect(addr: &str) -> Result<RawClient, String> {
        let w = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        w.set_nodelay(true).map_err(|e| e.to_string())?;
        w.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        let r = BufReader::new(w.try_clone().map_err(|e| e.to_string())?);
        Ok(RawClient {
            w,
            r,
            host: addr.to_string(),
        })
    }

    /// POST and read the whole response; returns the status.
    fn post(&mut self, path: &str, body: &str) -> Result<u16, String> {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.host,
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body.as_bytes());
        self.w.write_all(&req).map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.r.read_line(&mut line).map_err(|e| e.to_string())?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line).map_err(|e| e.to_string())?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().map_err(|_| format!("bad length {v:?}"))?;
                } else if k.eq_ignore_ascii_case("transfer-encoding") {
                    return Err("chunked responses are not expected here".into());
                }
            }
        }
        let mut buf = vec![0u8; len];
        self.r.read_exact(&mut buf).map_err(|e| e.to_string())?;
        Ok(status)
    }
}

fn pct(values: &[f64], p: f64) -> f64 {
    crate::report::quantile_us(values, p).unwrap_or(f64::NAN)
}

/// Runs the measurement and returns the printed table.
pub fn run(opts: &OverheadOptions) -> Result<String, String> {
    let backend = BackendOptions {
        instant: true,
        ..BackendOptions::default()
    };
    let testbed = paths::testbed_wasm().map_err(|e| e.to_string())?;
    // One worker each; the filter configs differ only in what is named.
    let base = EnvoyOptions {
        mode: EnvoyMode::PrefixRouter,
        concurrency: 1,
        log_level: "warn".into(),
        ..EnvoyOptions::default()
    };
    let filter = |f: FilterConfig| EnvoyOptions {
        filter: f,
        ..base.clone()
    };
    let testbed_filter = |f: FilterConfig| EnvoyOptions {
        filter: f,
        wasm: Some(testbed.clone()),
        ..base.clone()
    };
    let mut configs: Vec<(&str, EnvoyOptions)> = vec![
        (
            "no-filter",
            EnvoyOptions {
                mode: EnvoyMode::RoundRobin,
                ..base.clone()
            },
        ),
        (
            "noop-wasm",
            testbed_filter(FilterConfig::Raw("noop".into())),
        ),
        (
            "buffer-wasm",
            testbed_filter(FilterConfig::Raw("buffer-body".into())),
        ),
        // What Envoy does for any body router: ORCA format header, body
        // buffered, destination header set, decision header added.
        (
            "skeleton-wasm",
            testbed_filter(FilterConfig::RawFirstHost("skeleton".into())),
        ),
        // The bounded ring alone (`cost.mode: off`): key hash, ring walk,
        // in-flight counters.
        (
            "prefix-router-ring",
            filter(FilterConfig::Patched(json!({"cost": {"mode": "off"}}))),
        ),
        // The default, the priced spill: the ring's work plus the
        // candidates' reports.
        ("prefix-router", base.clone()),
        // The index rule (`cost.mode: index`): shared-data index lookup
        // and writes.
        (
            "prefix-router-index",
            filter(FilterConfig::Patched(json!({"cost": {"mode": "index"}}))),
        ),
    ];
    if let Some(w) = &opts.compare_wasm {
        configs.push((
            "prefix-router-compare",
            EnvoyOptions {
                wasm: Some(w.clone()),
                ..base.clone()
            },
        ));
    }
    let mut labs = Vec::new();
    for (name, e) in &configs {
        let lab = Lab::start(&LabOptions {
            label: format!("overhead-{name}"),
            backends: 2,
            backend: backend.clone(),
            envoy: Some(e.clone()),
        })
        .map_err(|e| format!("{name}: {e}"))?;
        labs.push(lab);
    }
    let mut clients = Vec::new();
    for lab in &labs {
        let url = lab.envoy().map_err(|e| e.to_string())?.url("");
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        clients.push(RawClient::connect(&addr)?);
    }
    // Progress on stderr (drawn only when it is a terminal): every request, warm-up included.
    let total =
        opts.sizes.len() * clients.len() * (20.min(opts.per_round) + opts.rounds * opts.per_round);
    let pb = indicatif::ProgressBar::new(total as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "   overhead [{elapsed_precise}] {bar:40} {pos}/{len} requests",
    ) {
        pb.set_style(style);
    }
    let mut out = String::new();
    out.push_str(&format!(
        "Envoy 1.40 (v8), 1 worker; {} rounds x {} requests per config and size, interleaved; \
         latency = client write to full response read, loopback, keep-alive, TCP_NODELAY\n\n",
        opts.rounds, opts.per_round
    ));
    out.push_str("| body | no-filter p50 / p90 | noop-wasm p50 / p90 | buffer-wasm p50 / p90 | skeleton-wasm p50 / p90 | prefix-router-ring p50 / p90 | prefix-router (default) p50 / p90 | prefix-router-index-all p50 / p90 | default - noop (p50) | skeleton - noop (p50) | default - skeleton (p50) | ring - noop (p50) | index-all - ring (p50) | noop - no-filter (p50) |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let at = |name: &str| configs.iter().position(|(n, _)| *n == name).unwrap_or(0);
    let has_compare = opts.compare_wasm.is_some();
    let (none, noop, buffer, skeleton, ring, default, index, compare) = (
        at("no-filter"),
        at("noop-wasm"),
        at("buffer-wasm"),
        at("skeleton-wasm"),
        at("prefix-router-ring"),
        at("prefix-router"),
        at("prefix-router-index"),
        at("prefix-router-compare"),
    );
    let mut compared = String::new();
    for &size in &opts.sizes {
        let bodies: Vec<String> = (0..opts.per_round).map(|i| body(size, i)).collect();
        let actual = bodies.first().map(|b| b.len()).unwrap_or(0);
        let mut lat: Vec<Vec<f64>> = vec![Vec::new(); labs.len()];
        // Warm-up: connections, VM, caches.
        for c in clients.iter_mut() {
            for b in bodies.iter().take(20) {
                c.post("/v1/chat/completions", b)?;
                pb.inc(1);
            }
        }
        for _ in 0..opts.rounds {
            for (k, c) in clients.iter_mut().enumerate() {
                for b in &bodies {
                    let t = Instant::now();
                    let status = c.post("/v1/chat/completions", b)?;
                    let us = t.elapsed().as_secs_f64() * 1e6;
                    pb.inc(1);
                    if status != 200 {
                        return Err(format!("{}: status {status}", configs[k].0));
                    }
                    lat[k].push(us);
                }
            }
        }
        for l in &mut lat {
            l.sort_by(|a, b| a.total_cmp(b));
        }
        let p50: Vec<f64> = lat.iter().map(|l| pct(l, 0.5)).collect();
        let p90: Vec<f64> = lat.iter().map(|l| pct(l, 0.9)).collect();
        let cell = |k: usize| format!("{:.0} / {:.0} us", p50[k], p90[k]);
        let diff = |a: usize, b: usize| format!("{:+.0} us", p50[a] - p50[b]);
        out.push_str(&format!(
            "| {:.1} KB | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            actual as f64 / 1000.0,
            cell(none),
            cell(noop),
            cell(buffer),
            cell(skeleton),
            cell(ring),
            cell(default),
            cell(index),
            diff(default, noop),
            diff(skeleton, noop),
            diff(default, skeleton),
            diff(ring, noop),
            diff(index, ring),
            diff(noop, none),
        ));
        if let (true, Some(c50), Some(c90)) = (has_compare, p50.get(compare), p90.get(compare)) {
            compared.push_str(&format!(
                "| {:.1} KB | {:.0} / {:.0} us | {:.0} / {:.0} us | {:+.0} us | {:+.0} us | {:+.0} us |\n",
                actual as f64 / 1000.0,
                p50[default],
                p90[default],
                c50,
                c90,
                p50[default] - p50[noop],
                c50 - p50[noop],
                p50[default] - c50
            ));
        }
    }
    pb.finish_and_clear();
    if let Some(w) = &opts.compare_wasm {
        out.push_str(&format!(
            "\nThe default config with this build and with {} (`compare`), same run:\n\n",
            w.display()
        ));
        out.push_str("| body | default p50 / p90 | compare p50 / p90 | default - noop (p50) | compare - noop (p50) | default - compare (p50) |\n");
        out.push_str("|---|---|---|---|---|---|\n");
        out.push_str(&compared);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_requested_size_and_are_valid_chat() {
        for size in [1_000, 16_000, 128_000] {
            let b = body(size, 3);
            let ratio = b.len() as f64 / size as f64;
            assert!((0.95..1.1).contains(&ratio), "{size}: {}", b.len());
            let v: serde_json::Value = serde_json::from_str(&b).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            assert_eq!(msgs.last().unwrap()["role"], "user");
        }
        assert_ne!(body(1000, 1), body(1000, 2));
    }
}
