//! `prefix-router-lab hostile-cpu`: the CPU a real Envoy spends per request on dense 1 MB
//! bodies (many tiny JSON elements, or escapes) with the filter, against the same Envoy
//! without it, beside a plain 1 MB prompt (issue 21: "CPU per MiB within 3x a plain
//! prompt's"). Envoy 1.40 with one worker, four instant backends; each body sent `requests`
//! times on one keep-alive connection (after 5 to warm up), Envoy's utime+stime read from
//! `/proc` around them; the minimum over `rounds` fresh Envoys per configuration.

use crate::backend::BackendOptions;
use crate::envoy::{EnvoyMode, EnvoyOptions};
use crate::lab::{Lab, LabOptions};
use crate::overhead_cpu::{clock_ticks_per_s, cpu_ticks};
use crate::{http, prom, workload};
use std::time::Duration;

/// Every body is just under the filter's default `max_body_bytes` (1 MiB).
const SIZE: usize = 1_000_000;

/// The plain prompt first (the yardstick), then the dense bodies.
pub fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let words = [
        "the", "cache", "prefix", "token", "replica", "model", "route", "load",
    ];
    let mut text = String::with_capacity(SIZE);
    for i in 0.. {
        if text.len() >= SIZE - 100 {
            break;
        }
        text.push_str(words[(i * 7 + i / 3) % words.len()]);
        text.push(' ');
    }
    let user = |content: &str| {
        format!(
            r#"{{"model":"sim-llm","max_tokens":4,"messages":[{{"role":"user","content":{content}}}]}}"#
        )
        .into_bytes()
    };
    let mut out = vec![("plain prompt", user(&format!("\"{text}\"")))];
    out.extend(workload::dense_bodies(SIZE));
    out.push((
        "short messages",
        workload::filled(
            SIZE,
            r#"{"model":"sim-llm","max_tokens":4,"messages":["#,
            r#"{"role":"user","content":"a"}"#,
            "]}",
        ),
    ));
    out.push((
        "escapes",
        user(&format!("\"{}\"", "\\n".repeat(SIZE / 2 - 60))),
    ));
    out.extend(workload::escaped_bodies(SIZE));
    out
}

/// Envoy's CPU milliseconds per request for each body, with `mode`'s config, and (with the
/// filter) the share of each body's requests it routed.
fn measure(
    mode: EnvoyMode,
    bodies: &[(&str, Vec<u8>)],
    requests: usize,
) -> Result<(Vec<f64>, Vec<f64>, String), String> {
    let mut lab = Lab::start(&LabOptions {
        label: "hostile-cpu".into(),
        backends: 4,
        backend: BackendOptions {
            instant: true,
            ..BackendOptions::default()
        },
        envoy: Some(EnvoyOptions {
            mode,
            concurrency: 1,
            log_level: "warn".into(),
            ..EnvoyOptions::default()
        }),
    })
    .map_err(|e| e.to_string())?;
    let envoy = lab.envoy().map_err(|e| e.to_string())?;
    let pid = envoy.pid().ok_or("Envoy is not running")?;
    let url = envoy.url("/v1/chat/completions");
    let agent = http::agent(Duration::from_secs(30));
    let tick = clock_ticks_per_s();
    let mut ms = Vec::with_capacity(bodies.len());
    let mut routed = Vec::with_capacity(bodies.len());
    let routed_now = || -> Result<f64, String> {
        let samples = envoy.prometheus().map_err(|e| e.to_string())?;
        Ok(prom::sum_matching(&samples, &["prefix_router_routed"]))
    };
    for (name, body) in bodies {
        let was = routed_now()?;
        let send = || http::post_json_bytes(&agent, &url, body).map_err(|e| format!("{name}: {e}"));
        for _ in 0..5 {
            send()?;
        }
        let before = cpu_ticks(pid)?;
        for _ in 0..requests {
            send()?;
        }
        let ticks = cpu_ticks(pid)? - before;
        ms.push(ticks as f64 / tick * 1e3 / requests.max(1) as f64);
        routed.push((routed_now()? - was) / (requests + 5) as f64);
    }
    let samples = envoy.prometheus().map_err(|e| e.to_string())?;
    let counts = format!(
        "routed {:.0}, too_complex {:.0}, other fallbacks {:.0}",
        prom::sum_matching(&samples, &["prefix_router_routed"]),
        prom::sum_matching(&samples, &["prefix_router_fallback_too_complex"]),
        prom::sum_matching(&samples, &["prefix_router_fallback"])
            - prom::sum_matching(&samples, &["prefix_router_fallback_too_complex"]),
    );
    lab.stop();
    Ok((ms, routed, counts))
}

/// Runs the measurement and returns the printed table.
pub fn run(rounds: usize, requests: usize) -> Result<String, String> {
    let bodies = bodies();
    let mut best = [
        vec![f64::INFINITY; bodies.len()],
        vec![f64::INFINITY; bodies.len()],
    ];
    let mut counts = String::new();
    let mut routed = vec![0.0; bodies.len()];
    for _ in 0..rounds.max(1) {
        for (k, mode) in [EnvoyMode::RoundRobin, EnvoyMode::PrefixRouter]
            .into_iter()
            .enumerate()
        {
            let (ms, r, c) = measure(mode, &bodies, requests)?;
            for (b, m) in best[k].iter_mut().zip(ms) {
                *b = b.min(m);
            }
            if k == 1 {
                (routed, counts) = (r, c);
            }
        }
    }
    let [rr, pr] = &best;
    let plain = pr[0] - rr[0];
    let mut out = format!(
        "Envoy CPU ms per request (Envoy 1.40, 1 worker, utime+stime over {requests} requests \
         a body, min of {} rounds); with the filter, last round: {counts}\n\n{:<24}{:>9}{:>8}{:>8}{:>10}{:>9}{:>8}\n",
        rounds.max(1),
        "body",
        "bytes",
        "rr ms",
        "pr ms",
        "added ms",
        "x plain",
        "routed"
    );
    for (i, (name, body)) in bodies.iter().enumerate() {
        let added = pr[i] - rr[i];
        out.push_str(&format!(
            "{name:<24}{:>9}{:>8.2}{:>8.2}{added:>10.2}{:>9.2}{:>7.0}%\n",
            body.len(),
            rr[i],
            pr[i],
            added / plain,
            100.0 * routed.get(i).copied().unwrap_or(0.0)
        ));
    }
    Ok(out)
}
