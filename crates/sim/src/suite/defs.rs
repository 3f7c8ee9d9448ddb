//! The suite's fixed definition: workloads, halves, loads, fleet, policies.

use std::path::Path;

use crate::policy::DEFAULT_POLICY;
use crate::workload::{self, synthetic, Format, TraceOptions, Workload};

/// Which half of the suite a workload belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Half {
    /// Changes to the default may be tuned on these.
    Tune,
    /// Held out: a change must not make these worse.
    Check,
}

impl Half {
    pub fn name(self) -> &'static str {
        match self {
            Half::Tune => "tune",
            Half::Check => "check",
        }
    }
}

/// Where a workload's requests come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A file in the traces directory.
    Trace {
        file: &'static str,
        format: Format,
        /// First N requests.
        limit: usize,
        /// Session starts spread over this many ms after their timestamp.
        spread_ms: f64,
        /// ShareGPT: sessions per second, mean think time, turns kept.
        session_rate: f64,
        think_s: f64,
        max_turns: usize,
    },
    /// A synthetic spec (`crate::workload::synthetic`).
    Synthetic(&'static str),
}

/// The three loads of every workload.
pub const LOADS: [&str; 3] = ["moderate", "heavy", "overload"];

/// One workload of the suite.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadDef {
    pub name: &'static str,
    pub half: Half,
    pub what: &'static str,
    pub source: Source,
    /// Requests (traces) or sessions (synthetic) kept with `--quick`.
    pub quick_limit: usize,
    /// Rate scale of each load, in [`LOADS`] order, from `suite
    /// --calibrate` (see [`super::load`] for what each load means).
    pub scales: [f64; 3],
}

/// Replicas in every cell.
pub const REPLICAS: usize = 8;
/// Proxy counts of every cell (independent instances, no gossip).
pub const PROXIES: [usize; 2] = [1, 4];
/// Seeds of a full run.
pub const SEEDS: [u64; 2] = [1, 2];
/// Busy-balance window of the suite, seconds.
pub const BUSY_WINDOW_S: f64 = 5.0;
/// The project's plain bounded-load ring (`cost.mode: off`): its hit rate
/// defines the offered load.
pub const RING: &str = "prefix-router:cost=off";
/// The previous default (`cost.mode: index`), side by side with the new one.
pub const PREVIOUS: &str = "prefix-router-cost";
/// Round robin: its TTFT spread defines the heavy load.
pub const ROUND_ROBIN: &str = "round-robin";
/// The peers the default is judged against (issue 19's list).
pub const PEERS: [&str; 6] = [
    "gie",
    "sglang-cache-aware",
    "dynamo",
    "kubeai",
    "higress",
    "least-loaded",
];

/// Every policy of a cell, in table order: the default, the plain ring,
/// the previous default, the peers, round robin (each once).
pub fn policies() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = vec![DEFAULT_POLICY];
    for p in [RING, PREVIOUS]
        .into_iter()
        .chain(PEERS)
        .chain(std::iter::once(ROUND_ROBIN))
    {
        if !v.contains(&p) {
            v.push(p);
        }
    }
    v
}

const MOONCAKE: &str = "mooncake_conversation_trace.jsonl";
const AZURE: &str = "AzureLLMInferenceTrace_conv_2023.csv";
const CHITCHAT: &str = "chitchat_sharegpt_format.json.gz";

/// The suite. Scales come from `prefix-router-sim suite --calibrate`, which
/// recomputes them and checks that these still meet the load definitions.
pub fn workloads() -> Vec<WorkloadDef> {
    vec![
        WorkloadDef {
            name: "mooncake",
            half: Half::Tune,
            what: "Mooncake conversation trace (Kimi), first 4,000 requests, 512-token block ids, starts spread over the trace's 3 s tick",
            source: Source::Trace {
                file: MOONCAKE,
                format: Format::Mooncake,
                limit: 4000,
                spread_ms: 3000.0,
                session_rate: 0.0,
                think_s: 0.0,
                max_turns: 0,
            },
            quick_limit: 1200,
            scales: [1.6, 2.81, 5.39],
        },
        WorkloadDef {
            name: "shared-prefix",
            half: Half::Tune,
            what: "GIE / llm-d shared-prefix benchmark: 150 groups x 5 prompts, 6,000-token system prompts, 1,000-token outputs",
            source: Source::Synthetic("shared-prefix"),
            quick_limit: 250,
            scales: [0.92, 1.89, 3.35],
        },
        WorkloadDef {
            name: "long-context",
            half: Half::Tune,
            what: "250 groups x 5 prompts with 16,000-token prefixes: 4M tokens of prefixes, more than the fleet's cache",
            source: Source::Synthetic("long-context"),
            quick_limit: 400,
            scales: [0.943, 2.26, 3.18],
        },
        WorkloadDef {
            name: "multi-turn",
            half: Half::Tune,
            what: "synthetic multi-turn chat with think times: 6 system prompts, 1,800 users x 5 turns",
            source: Source::Synthetic("multi-turn:users=300"),
            quick_limit: 200,
            scales: [0.854, 1.62, 27.9],
        },
        WorkloadDef {
            name: "doc-qa",
            half: Half::Tune,
            what: "questions about documents, each in its own 16,000-token system prompt (new, stop 34): 250 documents x 4 users x 3 turns",
            source: Source::Synthetic("doc-qa"),
            quick_limit: 250,
            scales: [1.2, 2.11, 4.9],
        },
        WorkloadDef {
            name: "mix",
            half: Half::Tune,
            what: "one fleet, five applications side by side over 220 s (new, stop 40): a chat app under 2 system prompts, single prompts under 40, RAG over 8 documents, questions about 100 documents, an agent",
            source: Source::Synthetic("mix"),
            quick_limit: 300,
            scales: [0.967, 1.68, 3.61],
        },
        WorkloadDef {
            name: "azure",
            half: Half::Tune,
            what: "Azure LLM inference trace 2023 (conversation), first 4,000 requests: no prefix information, a control with no sharing",
            source: Source::Trace {
                file: AZURE,
                format: Format::Azure,
                limit: 4000,
                spread_ms: 0.0,
                session_rate: 0.0,
                think_s: 0.0,
                max_turns: 0,
            },
            quick_limit: 1200,
            scales: [8.98, 20.2, 30.0],
        },
        WorkloadDef {
            name: "zipf",
            half: Half::Check,
            what: "shared-prefix with Zipf(1.1) group popularity: a few hot system prompts",
            source: Source::Synthetic("zipf"),
            quick_limit: 250,
            scales: [1.39, 2.76, 5.35],
        },
        WorkloadDef {
            name: "bursty",
            half: Half::Check,
            what: "shared-prefix-like groups (60 x 25) arriving in bursts: 3 s of every 30 s at 6x the mean rate",
            source: Source::Synthetic("bursty"),
            quick_limit: 500,
            scales: [4.05, 5.87, 13.6],
        },
        WorkloadDef {
            name: "chat",
            half: Half::Check,
            what: "real human chats (BYU Chit-Chat, ShareGPT shape), first 8,000 requests (1,451 conversations of up to 8 turns), exponential think time (mean 10 s)",
            source: Source::Trace {
                file: CHITCHAT,
                format: Format::ShareGpt,
                limit: 8000,
                spread_ms: 0.0,
                session_rate: 2.0,
                think_s: 10.0,
                max_turns: 8,
            },
            quick_limit: 1500,
            scales: [45.0, 69.2, 221.0],
        },
        WorkloadDef {
            name: "chat-b2b",
            half: Half::Check,
            what: "the same real chats back to back: each turn sent when the previous answer ends (no think time)",
            source: Source::Trace {
                file: CHITCHAT,
                format: Format::ShareGpt,
                limit: 8000,
                spread_ms: 0.0,
                session_rate: 4.0,
                think_s: 0.0,
                max_turns: 8,
            },
            quick_limit: 1500,
            scales: [22.6, 36.4, 104.0],
        },
        WorkloadDef {
            name: "agentic",
            half: Half::Check,
            what: "agent tool loops (new): 8 agent types with 6,000-token tool prompts, 160 tasks of 5-15 steps, each step a short tool call and a tool result (500-5,000 tokens) appended; contexts grow to 30k tokens",
            source: Source::Synthetic("agentic"),
            quick_limit: 50,
            scales: [5.06, 11.2, 32.5],
        },
        WorkloadDef {
            name: "rag",
            half: Half::Check,
            what: "RAG over a few long documents (new): 700 users, each retrieving 2 of 8 documents (3k-9k tokens, Zipf popularity) plus follow-up turns",
            source: Source::Synthetic("rag"),
            quick_limit: 230,
            scales: [4.37, 7.64, 24.9],
        },
    ]
}

/// KV block size of a workload's replicas: the trace's own 512-token
/// granularity for Mooncake, vLLM's 16 otherwise (as plain runs choose).
pub fn block_tokens(def: &WorkloadDef) -> u32 {
    match def.source {
        Source::Trace {
            format: Format::Mooncake,
            ..
        } => 512,
        _ => 16,
    }
}

/// Build a workload for `seed` (`quick`: only its first
/// [`WorkloadDef::quick_limit`] requests or sessions).
pub fn build(def: &WorkloadDef, traces: &Path, seed: u64, quick: bool) -> Result<Workload, String> {
    let bt = block_tokens(def);
    let mut wl = match &def.source {
        Source::Trace {
            file,
            format,
            limit,
            spread_ms,
            session_rate,
            think_s,
            max_turns,
        } => {
            let path = traces.join(file);
            let opts = TraceOptions {
                format: Some(*format),
                limit: if quick { def.quick_limit } else { *limit },
                session_rate: *session_rate,
                think_s: *think_s,
                max_turns: *max_turns,
            };
            let mut wl = workload::load_trace(&path, &opts, seed, bt)
                .map_err(|e| format!("{}: {}: {e}", def.name, path.display()))?;
            wl.spread_starts(spread_ms / 1000.0, seed);
            wl
        }
        Source::Synthetic(spec) => {
            let spec = synthetic::Spec::parse(spec).map_err(|e| format!("{}: {e}", def.name))?;
            let mut wl = synthetic::build(&spec, seed, bt);
            if quick {
                wl.truncate_sessions(def.quick_limit);
            }
            wl
        }
    };
    wl.name = def.name.to_string();
    Ok(wl)
}
