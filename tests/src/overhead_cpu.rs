//! `prefix-router-lab overhead`, CPU part: the proxy's CPU per request under load, with the
//! filter and without it (Envoy round robin), in one run.
//!
//! Each configuration is an Envoy 1.40 with 2 workers (`--concurrency 2`) in front of its own
//! 3 backend simulators (`--instant`: the reply is written at once, no scheduler):
//! - `round-robin`: envoy-round-robin.yaml (no wasm filter),
//! - `noop-wasm`: envoy.yaml with the testbed's do-nothing filter,
//! - `skeleton-wasm`: the testbed filter that does only what Envoy sees of a body router (body
//!   buffered, destination and ORCA headers set, a decision header added; all to one backend),
//! - `prefix-router`: envoy.yaml as committed (the default rule),
//! - `prefix-router-ring`: envoy.yaml with `cost.mode: off`,
//! - optionally `prefix-router (other .wasm)`: the default config with another build of the
//!   filter (`--cpu-compare-wasm`, e.g. to weigh an opt-level or a post-link pass).
//!
//! The load generator is `wrk` (Debian's 4.1.0; `./build.sh setup` installs it): closed loop,
//! keep-alive, `--connections` connections on one thread, each request a POST of one of
//! [`BODIES`] chat bodies of 1-8 KiB (varied prompts: [`CONVERSATIONS`] conversations whose
//! requests share their opening document, each request with its own last message). The rounds
//! are interleaved (A, B, C, A, B, C …) so that machine noise hits all alike. The proxy CPU of
//! a run is Envoy's utime + stime from `/proc/<pid>/stat` after it minus before it (all
//! threads: workers, main thread, wasm VMs), divided by the responses wrk counted.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use serde_json::json;

use crate::backend::BackendOptions;
use crate::envoy::{EnvoyMode, EnvoyOptions, FilterConfig};
use crate::lab::{Lab, LabOptions};
use crate::paths;
use crate::workload::{text, Rng};

/// Distinct request bodies wrk cycles through.
pub const BODIES: usize = 240;
/// Conversations the bodies belong to (requests of one share its opening document).
pub const CONVERSATIONS: usize = 40;

/// Options of the CPU run.
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// Interleaved rounds.
    pub rounds: usize,
    /// Seconds of load per configuration per round.
    pub seconds: u32,
    /// wrk's connections (kept alive, closed loop).
    pub connections: u32,
    /// Another build of the filter to measure with the default config too.
    pub compare_wasm: Option<PathBuf>,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            rounds: 3,
            seconds: 5,
            connections: 16,
            compare_wasm: None,
        }
    }
}

/// Chat body `i` of [`BODIES`]: 1-8 KiB, conversation `i % CONVERSATIONS`.
pub fn body(i: usize) -> String {
    let conv = i % CONVERSATIONS;
    let mut doc_rng = Rng::new(0x5eed_c0de ^ conv as u64);
    let mut rng = Rng::new(0x00b0_d1e5 ^ i as u64);
    let target = rng.range(1100, 8000);
    // The conversation's opening document: about half of the smallest body.
    let doc_bytes = 400 + doc_rng.below(200);
    let doc = text(&mut doc_rng, doc_bytes);
    let mut msgs = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": format!("Conversation {conv}. {doc}")}),
    ];
    let encode = |m: &Vec<serde_json::Value>| {
        json!({"model": "sim-llm", "max_tokens": 1, "stream": false, "messages": m}).to_string()
    };
    let mut turn = 0usize;
    loop {
        let len = encode(&msgs).len();
        // Room for this message's own JSON and the closing question.
        if len + 120 >= target {
            break;
        }
        let role = if turn.is_multiple_of(2) {
            "assistant"
        } else {
            "user"
        };
        msgs.push(json!({"role": role, "content": text(&mut rng, (target - len - 120).min(1500))}));
        turn += 1;
    }
    if turn % 2 == 1 {
        msgs.push(json!({"role": "user", "content": format!("Question {i}?")}));
    }
    encode(&msgs)
}

/// wrk's Lua script: the bodies as long strings, cycled per thread; `done` prints one line
/// the harness parses.
pub fn wrk_script(bodies: &[String]) -> String {
    let mut level = 1;
    while bodies
        .iter()
        .any(|b| b.contains(&format!("]{}]", "=".repeat(level))))
    {
        level += 1;
    }
    let eq = "=".repeat(level);
    let mut s = String::from("local bodies = {\n");
    for b in bodies {
        s.push_str(&format!("[{eq}[{b}]{eq}],\n"));
    }
    s.push_str(
        r#"}
local i = 0
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", "/v1/chat/completions", nil, bodies[i])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("PRLAB requests=%d status=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, e.status, e.connect, e.read, e.write, e.timeout))
end
"#,
    );
    s
}

/// What wrk's `done` printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WrkCounts {
    pub requests: u64,
    /// Responses other than 2xx/3xx.
    pub status: u64,
    /// Socket errors (connect, read, write, timeout).
    pub socket: u64,
}

/// Parses the `PRLAB ...` line of [`wrk_script`]'s `done`.
pub fn parse_wrk(out: &str) -> Option<WrkCounts> {
    let line = out.lines().find(|l| l.starts_with("PRLAB "))?;
    let mut c = WrkCounts::default();
    for kv in line.split_whitespace().skip(1) {
        let (k, v) = kv.split_once('=')?;
        let v: u64 = v.parse().ok()?;
        match k {
            "requests" => c.requests = v,
            "status" => c.status = v,
            "connect" | "read" | "write" | "timeout" => c.socket += v,
            _ => return None,
        }
    }
    Some(c)
}

/// utime + stime of `pid` (all its threads), in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    parse_stat_ticks(&stat).ok_or_else(|| format!("cannot parse /proc/{pid}/stat: {stat:?}"))
}

/// Fields 14 (utime) and 15 (stime) of a `/proc/<pid>/stat` line; the command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, index 11 here.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

pub(crate) fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// One wrk run against `addr`; returns its counts.
fn wrk(
    bin: &PathBuf,
    script: &std::path::Path,
    addr: &str,
    secs: u32,
    conns: u32,
) -> Result<WrkCounts, String> {
    let out = Command::new(bin)
        .arg("-t1")
        .arg(format!("-c{conns}"))
        .arg(format!("-d{secs}s"))
        .arg("--timeout")
        .arg("10s")
        .arg("-s")
        .arg(script)
        .arg(format!("http://{addr}/"))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "wrk failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let c = parse_wrk(&stdout).ok_or_else(|| format!("no PRLAB line in wrk's output: {stdout}"))?;
    if c.status > 0 || c.socket > 0 || c.requests == 0 {
        return Err(format!("wrk against {addr}: {c:?}\n{stdout}"));
    }
    Ok(c)
}

/// The rows the summary line compares with round robin.
const DEFAULT_ROW: &str = "prefix-router (default)";
const SKELETON_ROW: &str = "skeleton-wasm (steers, no routing)";

/// Runs the measurement and returns the printed table.
pub fn run(opts: &CpuOptions) -> Result<String, String> {
    let wrk_bin = paths::wrk_bin().map_err(|e| e.to_string())?;
    let backend = BackendOptions {
        instant: true,
        ..BackendOptions::default()
    };
    let testbed = paths::testbed_wasm().map_err(|e| e.to_string())?;
    let base = EnvoyOptions {
        mode: EnvoyMode::PrefixRouter,
        concurrency: 2,
        log_level: "warn".into(),
        ..EnvoyOptions::default()
    };
    let mut configs: Vec<(String, EnvoyOptions)> = vec![
        (
            "round-robin (no filter)".into(),
            EnvoyOptions {
                mode: EnvoyMode::RoundRobin,
                ..base.clone()
            },
        ),
        (
            "noop-wasm".into(),
            EnvoyOptions {
                filter: FilterConfig::Raw("noop".into()),
                wasm: Some(testbed.clone()),
                ..base.clone()
            },
        ),
        (
            SKELETON_ROW.into(),
            EnvoyOptions {
                filter: FilterConfig::RawFirstHost("skeleton".into()),
                wasm: Some(testbed),
                ..base.clone()
            },
        ),
        (DEFAULT_ROW.into(), base.clone()),
        (
            "prefix-router-ring (cost off)".into(),
            EnvoyOptions {
                filter: FilterConfig::Patched(json!({"cost": {"mode": "off"}})),
                ..base.clone()
            },
        ),
    ];
    if let Some(w) = &opts.compare_wasm {
        configs.push((
            format!("prefix-router (default, {})", w.display()),
            EnvoyOptions {
                wasm: Some(w.clone()),
                ..base.clone()
            },
        ));
    }
    let mut labs = Vec::new();
    for (name, e) in &configs {
        let lab = Lab::start(&LabOptions {
            label: "overhead-cpu".into(),
            backends: 3,
            backend: backend.clone(),
            envoy: Some(e.clone()),
        })
        .map_err(|e| format!("{name}: {e}"))?;
        labs.push(lab);
    }
    let mut targets = Vec::new();
    for lab in &labs {
        let envoy = lab.envoy().map_err(|e| e.to_string())?;
        let pid = envoy.pid().ok_or("Envoy is not running")?;
        let addr = envoy
            .url("")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        targets.push((pid, addr));
    }
    let bodies: Vec<String> = (0..BODIES).map(body).collect();
    let script = labs
        .first()
        .ok_or("no configuration")?
        .dir()
        .join("cpu-bodies.lua");
    std::fs::write(&script, wrk_script(&bodies)).map_err(|e| e.to_string())?;
    // Warm-up: connections, VMs, the filter's shared state.
    for (_, addr) in &targets {
        wrk(&wrk_bin, &script, addr, 1, opts.connections)?;
    }
    let tick = clock_ticks_per_s();
    let mut ticks = vec![0u64; targets.len()];
    let mut requests = vec![0u64; targets.len()];
    let mut secs = vec![0f64; targets.len()];
    for _ in 0..opts.rounds {
        for (k, (pid, addr)) in targets.iter().enumerate() {
            let before = cpu_ticks(*pid)?;
            let t = Instant::now();
            let c = wrk(&wrk_bin, &script, addr, opts.seconds, opts.connections)?;
            secs[k] += t.elapsed().as_secs_f64();
            ticks[k] += cpu_ticks(*pid)? - before;
            requests[k] += c.requests;
        }
    }
    let us_per_req: Vec<f64> = (0..targets.len())
        .map(|k| ticks[k] as f64 / tick * 1e6 / requests[k].max(1) as f64)
        .collect();
    let sizes: Vec<usize> = bodies.iter().map(String::len).collect();
    let mut out = format!(
        "Proxy CPU per request: Envoy 1.40 (v8), --concurrency 2, 3 instant backends each; \
         wrk 1 thread, {} connections, keep-alive, {} chat bodies of {}-{} B ({} conversations); \
         {} interleaved rounds x {} s per config; CPU = Envoy's utime+stime (/proc/<pid>/stat) \
         / responses\n\n",
        opts.connections,
        BODIES,
        sizes.iter().min().copied().unwrap_or(0),
        sizes.iter().max().copied().unwrap_or(0),
        CONVERSATIONS,
        opts.rounds,
        opts.seconds
    );
    out.push_str("| config | responses | req/s | proxy CPU per request | vs round robin |\n");
    out.push_str("|---|---|---|---|---|\n");
    let rr = us_per_req.first().copied().unwrap_or(f64::NAN);
    for (k, (name, _)) in configs.iter().enumerate() {
        out.push_str(&format!(
            "| {name} | {} | {:.0} | {:.0} us | {:.2}x |\n",
            requests[k],
            requests[k] as f64 / secs[k].max(1e-9),
            us_per_req[k],
            us_per_req[k] / rr
        ));
    }
    let of = |name: &str| {
        configs
            .iter()
            .position(|(n, _)| n == name)
            .and_then(|k| us_per_req.get(k).copied())
            .unwrap_or(f64::NAN)
    };
    out.push_str(&format!(
        "\ndefault / round robin: {:.2}x (target <= 1.2x); skeleton / round robin: {:.2}x\n",
        of(DEFAULT_ROW) / rr,
        of(SKELETON_ROW) / rr
    ));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_varied_chat_of_1_to_8_kib() {
        let bodies: Vec<String> = (0..BODIES).map(body).collect();
        for b in &bodies {
            assert!((1024..=8192).contains(&b.len()), "{}", b.len());
            let v: serde_json::Value = serde_json::from_str(b).unwrap();
            let msgs = v["messages"].as_array().unwrap();
            assert_eq!(msgs.last().unwrap()["role"], "user");
        }
        let distinct: std::collections::HashSet<&String> = bodies.iter().collect();
        assert_eq!(distinct.len(), BODIES);
        let small = bodies.iter().filter(|b| b.len() < 3000).count();
        let large = bodies.iter().filter(|b| b.len() > 6000).count();
        assert!(small > 10 && large > 10, "{small} {large}");
        // Requests of one conversation share its opening document.
        let first = |b: &str| {
            let v: serde_json::Value = serde_json::from_str(b).unwrap();
            v["messages"][1]["content"].as_str().unwrap().to_string()
        };
        assert_eq!(first(&bodies[0]), first(&bodies[CONVERSATIONS]));
        assert_ne!(first(&bodies[0]), first(&bodies[1]));
    }

    #[test]
    fn script_holds_every_body_and_wrk_line_parses() {
        let bodies = vec!["{\"a\":\"]=]\"}".to_string(), "{}".to_string()];
        let s = wrk_script(&bodies);
        assert!(s.contains("[==[{\"a\":\"]=]\"}]==],"), "{s}");
        assert!(s.contains("[==[{}]==],"));
        let c = parse_wrk(
            "Running 1s test\nPRLAB requests=120 status=2 connect=0 read=1 write=0 timeout=3\n",
        );
        assert_eq!(
            c,
            Some(WrkCounts {
                requests: 120,
                status: 2,
                socket: 4
            })
        );
        assert_eq!(parse_wrk("no line"), None);
        assert_eq!(parse_wrk("PRLAB requests=x"), None);
    }

    #[test]
    fn stat_ticks_skip_a_command_with_spaces() {
        let stat = "1234 (envoy (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }
}
