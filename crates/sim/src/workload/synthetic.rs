//! Synthetic workloads covering the published prefix-caching matrix.
//!
//! Spec: `NAME[:key=value,...]`. Lengths are in tokens (4 bytes each of
//! deterministic text, see [`crate::text`]); every request is a
//! `/v1/chat/completions` body with a system message and user message(s).
//!
//! | name | defaults | what it models |
//! |---|---|---|
//! | `shared-prefix` | `groups=150,prompts=5,system=6000,question=1200,output=1000,rate=10` | GIE / llm-d "shared prefix" benchmark: 150 groups x 5 prompts sharing a 6000-token system prompt, sent in random order, Poisson arrivals |
//! | `shared-prefix-long-q` | as above with `system=1000,question=6200` | the same matrix with long unique questions (little to share) |
//! | `zipf` | `shared-prefix` with `zipf=1.1` | group popularity Zipf(s): a few hot system prompts |
//! | `long-context` | `groups=250,prompts=5,system=16000,question=256,output=256,rate=4` | cache pressure: the groups' prefixes (4M tokens) exceed 8 replicas' caches |
//! | `multi-turn` | `groups=6,users=1000,turns=5,system=2000,question=200,output=200,session_rate=20,think=5` | few groups (system prompts), many users (per group), each a multi-turn conversation with growing history; closed loop with think time |
//! | `doc-qa` | `multi-turn` with `groups=250,users=4,turns=3,system=16000,question=256,output=256,session_rate=2` | questions about documents, each in its own system prompt: many long preambles, few conversations each, as `long-context` with follow-ups |
//! | `bursty` | `groups=60,prompts=25,system=3000,question=400,output=250,rate=10,burst=6,period=30,duty=0.1` | `shared-prefix` arrivals in bursts: every `period` s, `duty` of it at `burst` x the mean rate, the rest slower (same mean `rate`) |
//! | `agentic` | `groups=8,users=20,turns=10,system=6000,question=300,tool=2000,output=60,session_rate=0.5,think=1` | agentic tool loops ([`super::agentic`]): long, growing contexts |
//! | `rag` | `docs=8,doc=6000,k=2,zipf=1,system=400,question=150,output=200,users=700,turns=3,session_rate=4,think=8` | many users sharing a few long documents ([`super::rag`]) |
//! | `mix` | no options: the five specs of [`MIX`] | one fleet serving several applications at once (a chat app, single prompts, RAG, document Q&A, an agent), each seeded apart: what a rule's per-proxy judgements (which preambles converse, which are cold) meet in production |
//!
//! Keys: `groups`, `prompts` (per group), `system`, `question`, `output`,
//! `rate` (requests/s, Poisson), `zipf` (exponent; 0 = every group gets
//! exactly `prompts` requests), `users` (per group), `turns`,
//! `session_rate` (sessions/s), `think` (mean seconds, exponential),
//! `burst`, `period`, `duty` (open-loop arrivals: peak / mean rate, cycle
//! length in seconds, fraction of the cycle at the peak; `burst=1`, the
//! default outside `bursty`, is a plain Poisson process), `tool` (mean
//! tool-result tokens, `agentic`), `docs`, `doc`, `k` (`rag`: documents,
//! mean document tokens, documents retrieved per request).

use super::{
    fill_chat_prompts, Conversation, Kind, Request, Session, Text, Workload, WorkloadError,
};
use crate::rng::{seed2, seed_str, Draw, Rng, SliceRandom, Zipf};

/// Parameters of a synthetic workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub kind: SynthKind,
    pub groups: usize,
    pub prompts: usize,
    pub system: u32,
    pub question: u32,
    pub output: u64,
    pub rate: f64,
    pub zipf: f64,
    pub users: usize,
    pub turns: usize,
    pub session_rate: f64,
    pub think: f64,
    /// Open-loop arrivals: peak rate / mean rate (1 = Poisson).
    pub burst: f64,
    /// Burst cycle, seconds.
    pub period: f64,
    /// Fraction of each cycle at the peak rate.
    pub duty: f64,
    /// `agentic`: mean tool-result tokens.
    pub tool: u32,
    /// `rag`: documents, mean document tokens, documents per request.
    pub docs: usize,
    pub doc: u32,
    pub k: usize,
    /// The spec as given (for the report).
    pub text: String,
}

/// Open-loop single-turn groups or closed-loop multi-turn sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthKind {
    Groups,
    MultiTurn,
    Agentic,
    Rag,
    /// Several applications on one fleet ([`MIX`]).
    Mix,
}

/// `mix`: the applications of one fleet, side by side, each its own
/// workload (seeded apart) over about 220 s: a chat app (2 system prompts),
/// a single-prompt app (40 shared prompts), RAG over 8 documents,
/// questions about 100 documents, and an agent.
pub const MIX: [&str; 5] = [
    "multi-turn:groups=2,users=150,session_rate=1.5",
    "shared-prefix:groups=40,prompts=10,rate=2,output=300",
    "rag:users=400,session_rate=2",
    "doc-qa:groups=100,users=2,session_rate=1",
    "agentic:users=8,session_rate=0.32",
];

impl Spec {
    /// Parse `NAME[:k=v,...]`.
    pub fn parse(s: &str) -> Result<Spec, WorkloadError> {
        let (name, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut spec = Spec {
            kind: SynthKind::Groups,
            groups: 150,
            prompts: 5,
            system: 6000,
            question: 1200,
            output: 1000,
            rate: 10.0,
            zipf: 0.0,
            users: 1000,
            turns: 5,
            session_rate: 20.0,
            think: 5.0,
            burst: 1.0,
            period: 30.0,
            duty: 0.1,
            tool: 1000,
            docs: 8,
            doc: 6000,
            k: 2,
            text: s.to_string(),
        };
        match name {
            "shared-prefix" => {}
            "shared-prefix-long-q" => {
                spec.system = 1000;
                spec.question = 6200;
            }
            "zipf" => spec.zipf = 1.1,
            "long-context" => {
                spec.groups = 250;
                spec.system = 16000;
                spec.question = 256;
                spec.output = 256;
                spec.rate = 4.0;
            }
            "multi-turn" => {
                spec.kind = SynthKind::MultiTurn;
                spec.groups = 6;
                spec.system = 2000;
                spec.question = 200;
                spec.output = 200;
            }
            "doc-qa" => {
                spec.kind = SynthKind::MultiTurn;
                spec.groups = 250;
                spec.users = 4;
                spec.turns = 3;
                spec.system = 16000;
                spec.question = 256;
                spec.output = 256;
                spec.session_rate = 2.0;
            }
            "bursty" => {
                spec.groups = 60;
                spec.prompts = 25;
                spec.system = 3000;
                spec.question = 400;
                spec.output = 250;
                spec.burst = 6.0;
            }
            "agentic" => {
                spec.kind = SynthKind::Agentic;
                spec.groups = 8;
                spec.users = 20;
                spec.turns = 10;
                spec.system = 6000;
                spec.question = 300;
                spec.tool = 2000;
                spec.output = 60;
                spec.session_rate = 0.5;
                spec.think = 1.0;
            }
            "mix" => {
                if !rest.is_empty() {
                    return Err(WorkloadError::new(format!(
                        "synthetic workload mix takes no options (got {rest:?}): it is {}",
                        MIX.join(" + ")
                    )));
                }
                spec.kind = SynthKind::Mix;
            }
            "rag" => {
                spec.kind = SynthKind::Rag;
                spec.zipf = 1.0;
                spec.system = 400;
                spec.question = 150;
                spec.output = 200;
                spec.users = 700;
                spec.turns = 3;
                spec.session_rate = 4.0;
                spec.think = 8.0;
            }
            other => {
                return Err(WorkloadError::new(format!(
                    "unknown synthetic workload {other:?}; one of shared-prefix, shared-prefix-long-q, zipf, long-context, multi-turn, doc-qa, bursty, agentic, rag, mix"
                )))
            }
        }
        for kv in rest.split(',').filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                WorkloadError::new(format!("synthetic option {kv:?} is not key=value"))
            })?;
            let bad =
                || WorkloadError::new(format!("synthetic option {k}={v:?}: not a valid number"));
            let int = |v: &str| v.parse::<usize>().map_err(|_| bad());
            let flt = |v: &str| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(bad)
            };
            match k {
                "groups" => spec.groups = int(v)?,
                "prompts" => spec.prompts = int(v)?,
                "system" => spec.system = int(v)? as u32,
                "question" => spec.question = int(v)? as u32,
                "output" => spec.output = int(v)? as u64,
                "rate" => spec.rate = flt(v)?,
                "zipf" => spec.zipf = flt(v)?,
                "users" => spec.users = int(v)?,
                "turns" => spec.turns = int(v)?,
                "session_rate" => spec.session_rate = flt(v)?,
                "think" => spec.think = flt(v)?,
                "burst" => spec.burst = flt(v)?,
                "period" => spec.period = flt(v)?,
                "duty" => spec.duty = flt(v)?,
                "tool" => spec.tool = int(v)? as u32,
                "docs" => spec.docs = int(v)?,
                "doc" => spec.doc = int(v)? as u32,
                "k" => spec.k = int(v)?,
                _ => {
                    return Err(WorkloadError::new(format!(
                        "unknown synthetic option {k:?}"
                    )))
                }
            }
        }
        if spec.groups == 0 || spec.prompts == 0 || spec.users == 0 || spec.turns == 0 {
            return Err(WorkloadError::new(
                "groups, prompts, users and turns must be > 0",
            ));
        }
        if spec.rate <= 0.0 || spec.session_rate <= 0.0 {
            return Err(WorkloadError::new("rate and session_rate must be > 0"));
        }
        if spec.question == 0 {
            return Err(WorkloadError::new("question must be > 0 tokens"));
        }
        if spec.burst < 1.0
            || spec.period <= 0.0
            || !(spec.duty > 0.0 && spec.duty < 1.0)
            || spec.burst * spec.duty > 1.0
        {
            return Err(WorkloadError::new(
                "burst must be >= 1, period > 0, 0 < duty < 1 and burst x duty <= 1",
            ));
        }
        if spec.docs == 0 || spec.doc == 0 || spec.k == 0 || spec.k > spec.docs {
            return Err(WorkloadError::new(
                "docs, doc and k must be > 0, and k <= docs",
            ));
        }
        Ok(spec)
    }
}

pub(super) const SYS: u64 = 0x7379_7374_656d; // "system"
pub(super) const QST: u64 = 0x7175_6573_7469; // "questi"
pub(super) const ANS: u64 = 0x616e_7377_6572; // "answer"

/// The next open-loop arrival after `t`: Poisson at `spec.rate`, or with
/// `burst > 1` a Poisson process whose rate is `burst x rate` for the first
/// `duty` of every `period` seconds and `(1 - burst x duty) / (1 - duty) x
/// rate` for the rest (the same mean rate), drawn by time rescaling (one
/// unit exponential spent over the piecewise-constant rate).
fn next_arrival(spec: &Spec, t: f64, rng: &mut Rng) -> f64 {
    if spec.burst <= 1.0 {
        return t + rng.exp(1.0 / spec.rate);
    }
    let hi = spec.rate * spec.burst;
    let lo = spec.rate * (1.0 - spec.burst * spec.duty).max(0.0) / (1.0 - spec.duty);
    let on = spec.period * spec.duty;
    let mut need = rng.exp(1.0);
    let mut t = t;
    // At most a few thousand phases: the rate is > 0 in every peak phase.
    for _ in 0..1_000_000 {
        let cycle = (t / spec.period).floor();
        let into = t - cycle * spec.period;
        let (r, end) = if into < on {
            (hi, cycle * spec.period + on)
        } else {
            (lo, (cycle + 1.0) * spec.period)
        };
        let left = (end - t).max(0.0);
        if r > 0.0 && need <= r * left {
            return t + need / r;
        }
        need -= r * left;
        // Step past the boundary (guards against float rounding at `end`).
        t = if end > t { end } else { t + 1e-9 };
    }
    t
}

/// A closed-loop chat session on conversation `conv`: one request per turn,
/// with `outputs` its output lengths (at least 1 token), starting at `start`,
/// an exponential think time of mean `think` (s) before every turn after the
/// first (drawn after each turn's request, in turn order).
pub(super) fn push_chat_session(
    wl: &mut Workload,
    (conv, session): (u32, usize),
    start: f64,
    outputs: impl IntoIterator<Item = u64>,
    (think_mean, block_tokens): (f64, u32),
    rng: &mut Rng,
) {
    let mut reqs = Vec::new();
    let mut think = Vec::new();
    for (k, out) in outputs.into_iter().enumerate() {
        reqs.push(wl.requests.len() as u32);
        wl.requests.push(Request {
            kind: Kind::Chat {
                conv,
                turn: k as u32,
            },
            output_tokens: out.max(1),
            prompt: prefix_router_replica::Prompt::uncacheable(0, block_tokens),
            remember: None,
            session: session as u32,
            turn: k as u32,
        });
        think.push(if k == 0 { 0.0 } else { rng.exp(think_mean) });
    }
    wl.sessions.push(Session {
        start,
        requests: reqs,
        think,
    });
}

/// Build the workload.
pub fn build(spec: &Spec, seed: u64, block_tokens: u32) -> Workload {
    let mut wl = Workload::new(
        format!("synthetic:{}", spec.text),
        seed,
        block_tokens,
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    if spec.kind == SynthKind::Mix {
        for (i, part) in MIX.iter().enumerate() {
            // Fixed specs (the suite test `mix_interleaves_its_applications_by_start_time`
            // builds each).
            if let Ok(p) = Spec::parse(part) {
                wl.append(build(&p, seed2(seed, i as u64 + 1), block_tokens));
            }
        }
        wl.sort_sessions();
        return wl;
    }
    let mut rng = crate::rng::rng(seed_str(seed, &format!("synthetic:{}", spec.text)));
    let sys = |g: usize| Text::Gen {
        key: seed2(seed ^ SYS, g as u64),
        len: spec.system * 4,
    };
    match spec.kind {
        SynthKind::Groups => {
            let n = spec.groups * spec.prompts;
            let groups: Vec<usize> = if spec.zipf > 0.0 {
                let z = Zipf::new(spec.groups, spec.zipf);
                (0..n).map(|_| z.sample(&mut rng)).collect()
            } else {
                let mut v: Vec<usize> = (0..n).map(|i| i / spec.prompts).collect();
                v.shuffle(&mut rng);
                v
            };
            let mut t = 0.0;
            for (i, g) in groups.into_iter().enumerate() {
                let conv = wl.convs.len() as u32;
                wl.convs.push(Conversation {
                    system: (spec.system > 0).then(|| sys(g)),
                    turns: vec![(
                        Text::Gen {
                            key: seed2(seed ^ QST, i as u64),
                            len: spec.question * 4,
                        },
                        Text::Gen { key: 0, len: 0 },
                    )],
                });
                wl.requests.push(Request {
                    kind: Kind::Chat { conv, turn: 0 },
                    output_tokens: spec.output.max(1),
                    prompt: prefix_router_replica::Prompt::uncacheable(0, block_tokens),
                    remember: None,
                    session: i as u32,
                    turn: 0,
                });
                wl.sessions.push(Session {
                    start: t,
                    requests: vec![i as u32],
                    think: vec![0.0],
                });
                t = next_arrival(spec, t, &mut rng);
            }
        }
        SynthKind::Agentic => super::agentic::build(spec, seed, block_tokens, &mut wl, &mut rng),
        SynthKind::Rag => super::rag::build(spec, seed, block_tokens, &mut wl, &mut rng),
        SynthKind::Mix => {}
        SynthKind::MultiTurn => {
            let n = spec.groups * spec.users;
            let mut t = 0.0;
            for s in 0..n {
                let g = s % spec.groups;
                let sk = seed2(seed ^ QST, s as u64);
                let ak = seed2(seed ^ ANS, s as u64);
                let turns: Vec<(Text, Text)> = (0..spec.turns)
                    .map(|k| {
                        (
                            Text::Gen {
                                key: seed2(sk, k as u64),
                                len: spec.question * 4,
                            },
                            Text::Gen {
                                key: seed2(ak, k as u64),
                                len: (spec.output * 4) as u32,
                            },
                        )
                    })
                    .collect();
                let conv = wl.convs.len() as u32;
                wl.convs.push(Conversation {
                    system: (spec.system > 0).then(|| sys(g)),
                    turns,
                });
                let outputs = std::iter::repeat_n(spec.output, spec.turns);
                push_chat_session(
                    &mut wl,
                    (conv, s),
                    t,
                    outputs,
                    (spec.think, block_tokens),
                    &mut rng,
                );
                t += rng.exp(1.0 / spec.session_rate);
            }
        }
    }
    fill_chat_prompts(&mut wl);
    wl
}
