//! The load-spike scenario of the cost rule, end to end through Envoy.
//!
//! What it shows: when one replica's queue jumps, new conversations should go elsewhere
//! (they have nothing cached anywhere, so the queue is pure loss), while conversations whose
//! long prefix is cached on that replica should stay (their cached prefix saves more prefill
//! than the queue costs). The bounded-load ring alone cannot make that distinction below the
//! bound: it keeps both on the spiked replica.
//!
//! Setup (one run per mode, fresh backends each time, same conversations, same ring: replicas
//! are named `r1..r4`):
//! 1. 4 backend simulators with `max_running` 2 at `time_scale` 0.25 (prefill 8,000 tok/s x 4
//!    = 32,000 tok/s effective) and caches large enough for every document.
//! 2. Envoy + filter with the active scrape (200 ms) and either `cost.mode: "spill"` (prefill
//!    and service time set to what these backends really do: `prefill_tokens_per_s` 32000,
//!    `service_s` 0.05 = a 0.1 s burst request over 2 slots) or `"off"` (bounded ring only).
//! 3. Warm-up: `old` conversations, each opening with a unique document of `doc_bytes`,
//!    two turns each, one at a time: every one lands on its ring owner and is cached there.
//! 4. Spike: the replica holding the most of them gets a real queue: `loopers` clients send
//!    short requests straight to it (bypassing Envoy), back to back, so about
//!    `loopers - 2` requests wait there at any time and 2 run. The scrape reads both
//!    (`vllm:num_requests_waiting`, `vllm:num_requests_running`); with the default 7 loopers
//!    the replica's load, 7 requests that are not this proxy's, stays under the load bound
//!    (`min_capacity` 8): the bound does not decide here, the cost does. (With 8 loopers the
//!    replica is at its bound and everything leaves it, cached or not.)
//! 5. Measured during the spike, one request at a time: the next turn of every old
//!    conversation, then the first turn of `new` conversations (new documents of the same
//!    size). Time to first token is measured at the client.
//!
//! `prefix-router-lab spike` prints [`table`]; the e2e test asserts the placements.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::backend::BackendOptions;
use crate::envoy::{EnvoyMode, EnvoyOptions, FilterConfig};
use crate::lab::{Lab, LabOptions};
use crate::report::quantile;
use crate::workload::{self, chat_body, decision_field, RequestRecord};
use crate::{http, lab_err, Result};

/// Scenario parameters.
#[derive(Debug, Clone)]
pub struct SpikeOptions {
    /// `true`: `cost.mode: "spill"` (or what `cost_patch` sets); `false`: the bounded-load
    /// ring only.
    pub cost: bool,
    /// Conversations started before the spike.
    pub old: usize,
    /// Conversations started during the spike.
    pub new: usize,
    /// Size of each old conversation's opening document, bytes.
    pub doc_bytes: usize,
    /// Size of each new conversation's first message, bytes: a short chat, whose prefill
    /// costs less than the spiked queue's wait (a new conversation opening with a document as
    /// long as the old ones' stays with its owner: re-prefilling it at its next turn would cost
    /// more than the wait saved now).
    pub new_bytes: usize,
    /// Clients keeping the spiked replica busy.
    pub loopers: usize,
    /// Other `cost` fields of the cost run (e.g. `{"mode": "index"}`),
    /// merged over the scenario's; empty by default.
    pub cost_patch: serde_json::Map<String, Value>,
}

impl Default for SpikeOptions {
    fn default() -> Self {
        SpikeOptions {
            cost: true,
            old: 8,
            new: 24,
            doc_bytes: 64 * 1024,
            new_bytes: 2 * 1024,
            loopers: 7,
            cost_patch: serde_json::Map::new(),
        }
    }
}

/// One measured request.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Conversation index (within old or new).
    pub conversation: usize,
    /// Replica that served it.
    pub backend: String,
    /// Its ring owner would have been the spiked replica (old: it was cached there).
    pub decision: String,
    pub ttft: Option<Duration>,
    /// Cached tokens the replica reported.
    pub cached_tokens: Option<u64>,
    pub ok: bool,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct SpikeResult {
    pub cost: bool,
    /// [`SpikeOptions::cost_patch`] of the run.
    pub cost_patch: serde_json::Map<String, Value>,
    /// The replica that got the queue.
    pub spiked: String,
    /// Replica of each old conversation before the spike.
    pub old_homes: Vec<String>,
    /// Next turn of each old conversation during the spike.
    pub old: Vec<Measured>,
    /// First turn of each new conversation during the spike.
    pub new: Vec<Measured>,
    /// `vllm:num_requests_waiting` of the spiked replica, sampled during the measurement.
    pub spiked_waiting: Vec<f64>,
}

fn document(tag: &str, i: usize, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 128);
    let mut l = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "[{tag} {i}] paragraph {l}: the quarterly report lists revenue, costs and open issues. "
        ));
        l += 1;
    }
    s
}

/// A conversation's history before its first turn: the system prompt (the first turn's user
/// message carries the document and the first question, as a real first turn does).
fn opening() -> Vec<Value> {
    vec![json!({"role": "system", "content": "You answer questions about the user's document."})]
}

/// The first user message: the document, then the question.
fn first_message(tag: &str, i: usize, bytes: usize) -> String {
    format!("{}\n\nSummarize document {i}.", document(tag, i, bytes))
}

fn turn(agent: &ureq::Agent, url: &str, history: &mut Vec<Value>, user: &str) -> RequestRecord {
    history.push(json!({"role": "user", "content": user}));
    let body = chat_body("sim-llm", history, 8);
    let mut rec = RequestRecord::default();
    workload::send_streaming(agent, url, &body, &[], &mut rec);
    history.push(json!({"role": "assistant", "content": rec.reply.clone()}));
    rec
}

fn measured(conversation: usize, r: &RequestRecord) -> Measured {
    Measured {
        conversation,
        backend: r.backend.clone().unwrap_or_default(),
        decision: r.decision.clone().unwrap_or_default(),
        ttft: r.ttft,
        cached_tokens: r.cached_tokens,
        ok: r.ok(),
    }
}

/// The filter JSON patch of a run: `cost_patch` is merged into `cost`.
pub fn filter_patch(cost: bool, cost_patch: &serde_json::Map<String, Value>) -> Value {
    let mut c = json!({
        "mode": if cost { "spill" } else { "off" },
        "prefill_tokens_per_s": 32000.0,
        "service_s": 0.05
    });
    if let Some(m) = c.as_object_mut() {
        for (k, v) in cost_patch {
            m.insert(k.clone(), v.clone());
        }
    }
    json!({
        "scrape": {"cluster": "llm", "interval_ms": 200, "timeout_ms": 150},
        "cost": c
    })
}

/// Run the scenario once.
pub fn run(opts: &SpikeOptions) -> Result<SpikeResult> {
    let lab = Lab::start(&LabOptions {
        label: if opts.cost {
            "spike-cost"
        } else {
            "spike-ring"
        }
        .to_string(),
        backends: 4,
        backend: BackendOptions {
            max_running: 2,
            time_scale: 0.25,
            cache_tokens: 1 << 20,
            ..BackendOptions::default()
        },
        envoy: Some(EnvoyOptions {
            mode: EnvoyMode::PrefixRouter,
            filter: FilterConfig::Patched(filter_patch(opts.cost, &opts.cost_patch)),
            ..EnvoyOptions::default()
        }),
    })?;
    let url = lab.envoy()?.url("/v1/chat/completions");
    let agent = http::agent(Duration::from_secs(60));

    // Warm-up.
    let mut histories: Vec<Vec<Value>> = (0..opts.old).map(|_| opening()).collect();
    let mut old_homes = Vec::with_capacity(opts.old);
    for (i, h) in histories.iter_mut().enumerate() {
        let a = turn(&agent, &url, h, &first_message("old", i, opts.doc_bytes));
        let b = turn(&agent, &url, h, "What are the open issues?");
        if !(a.ok() && b.ok()) {
            return lab_err!("warm-up of conversation {i} failed: {a:?} {b:?}");
        }
        old_homes.push(b.backend.clone().unwrap_or_default());
    }
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for h in &old_homes {
        *per.entry(h.as_str()).or_default() += 1;
    }
    let spiked = per
        .iter()
        .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
        .map(|(name, _)| name.to_string())
        .unwrap_or_default();
    let backend_url = lab.backend(&spiked)?.url("/v1/completions");

    // The spike: back-to-back short requests straight to the replica.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let loopers: Vec<_> = (0..opts.loopers)
        .map(|t| {
            let stop = stop.clone();
            let sent = sent.clone();
            let url = backend_url.clone();
            std::thread::spawn(move || {
                let agent = http::agent(Duration::from_secs(60));
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({
                        "model": "sim-llm",
                        "prompt": format!("burst client {t} request {n}"),
                        "max_tokens": 40
                    })
                    .to_string();
                    let _ = http::post(&agent, &url, &[], &body);
                    sent.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    // Let the queue build and the scrape see it.
    std::thread::sleep(Duration::from_millis(800));

    let waiting = |lab: &Lab| -> f64 {
        lab.backend(&spiked)
            .and_then(|b| b.metrics())
            .map(|m| crate::prom::sum_matching(&m, &["vllm:num_requests_waiting"]))
            .unwrap_or(f64::NAN)
    };
    let mut spiked_waiting = vec![waiting(&lab)];
    let mut old = Vec::with_capacity(opts.old);
    for (i, h) in histories.iter_mut().enumerate() {
        let r = turn(&agent, &url, h, "And what changed since last quarter?");
        old.push(measured(i, &r));
    }
    spiked_waiting.push(waiting(&lab));
    let mut new = Vec::with_capacity(opts.new);
    for i in 0..opts.new {
        let mut h = opening();
        let r = turn(
            &agent,
            &url,
            &mut h,
            &first_message("new", i, opts.new_bytes),
        );
        new.push(measured(i, &r));
        if i % 4 == 3 {
            spiked_waiting.push(waiting(&lab));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for l in loopers {
        let _ = l.join();
    }
    Ok(SpikeResult {
        cost: opts.cost,
        cost_patch: opts.cost_patch.clone(),
        spiked,
        old_homes,
        old,
        new,
        spiked_waiting,
    })
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".to_string(), |d| {
        format!("{:.0}", d.as_secs_f64() * 1000.0)
    })
}

fn group_line(label: &str, rows: &[&Measured]) -> String {
    let ttfts: Vec<Duration> = rows.iter().filter_map(|m| m.ttft).collect();
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for m in rows {
        *per.entry(m.backend.as_str()).or_default() += 1;
    }
    let spread = per
        .iter()
        .map(|(b, n)| format!("{b}:{n}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "  {label:<44} {:>3}  TTFT p50 {:>5} ms  max {:>5} ms  replicas {spread}\n",
        rows.len(),
        ms(quantile(&ttfts, 0.5)),
        ms(ttfts.iter().max().copied()),
    )
}

/// Side-by-side table of a ring-only run and a cost-rule run. New conversations are grouped
/// by their ring owner, taken from the ring-only run (same names, same ring).
pub fn table(ring: &SpikeResult, cost: &SpikeResult) -> String {
    let mut out = String::new();
    let owner_spiked: Vec<bool> = ring.new.iter().map(|m| m.backend == ring.spiked).collect();
    for r in [ring, cost] {
        let mode = if r.cost && !r.cost_patch.is_empty() {
            format!("cost {}", Value::Object(r.cost_patch.clone()))
        } else if r.cost {
            "cost.mode spill (the default)".to_string()
        } else {
            "cost.mode off (bounded ring)".to_string()
        };
        let waiting: Vec<String> = r.spiked_waiting.iter().map(|w| format!("{w:.0}")).collect();
        out.push_str(&format!(
            "{mode}: spiked replica {} (waiting requests sampled: {})\n",
            r.spiked,
            waiting.join(", ")
        ));
        let old_there: Vec<&Measured> = r
            .old
            .iter()
            .filter(|m| r.old_homes.get(m.conversation) == Some(&r.spiked))
            .collect();
        let old_else: Vec<&Measured> = r
            .old
            .iter()
            .filter(|m| r.old_homes.get(m.conversation) != Some(&r.spiked))
            .collect();
        let new_owned: Vec<&Measured> = r
            .new
            .iter()
            .filter(|m| owner_spiked.get(m.conversation) == Some(&true))
            .collect();
        let new_else: Vec<&Measured> = r
            .new
            .iter()
            .filter(|m| owner_spiked.get(m.conversation) != Some(&true))
            .collect();
        out.push_str(&group_line(
            "old conversations cached on the spiked replica",
            &old_there,
        ));
        out.push_str(&group_line("old conversations cached elsewhere", &old_else));
        out.push_str(&group_line(
            "new conversations owned by the spiked replica",
            &new_owned,
        ));
        out.push_str(&group_line("new conversations owned elsewhere", &new_else));
    }
    out
}

/// Whether every measured request succeeded.
pub fn all_ok(r: &SpikeResult) -> bool {
    r.old.iter().chain(&r.new).all(|m| m.ok)
}

/// `cached=` of a decision header, if any.
pub fn cached(m: &Measured) -> Option<u64> {
    decision_field(&m.decision, "cached")?.parse().ok()
}
