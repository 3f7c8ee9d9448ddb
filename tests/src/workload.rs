//! Deterministic multi-turn chat workload.
//!
//! `C` conversations of `T` turns. Every conversation has a system prompt drawn from a few
//! product-like prompts (skewed: the first is shared by about half of the conversations), a
//! unique first user message, and at every next turn the messages grow by two: the assistant's
//! reply (the text the backend actually returned) and a new user message. Conversations run
//! concurrently (`concurrency` at once); the turns of one conversation run sequentially. Every
//! request streams (`"stream": true, "stream_options": {"include_usage": true}`).
//!
//! ## The default: document chat under cache pressure
//!
//! [`WorkloadOptions::default`] on backends with [`DEMO_CACHE_TOKENS`] of KV cache each is the
//! workload of `prefix-router-lab demo` and of the end-to-end stickiness test. Each of the 50
//! conversations opens with a 6-10 KB document (1.5-2.5k tokens at the simulators' 4 bytes per
//! token; about 2.2k tokens with the system prompt), the way a RAG or code-assistant chat
//! starts, and grows by about 220 tokens a turn (a 350-650-byte question and the 48-token
//! reply), to about 3.3k tokens after turn 6. All 50 are open at once (users arrive over the
//! first 4 s) and users pause 0.2-4 s (uniform) before each follow-up, several times the
//! 0.25-1 s a turn takes, so most of the time a conversation is idle and its KV must survive in
//! the cache until the user comes back. Measured figures: BENCHMARKS.md.
//!
//! The cache size puts the fleet in the regime where affinity matters: one replica's cache
//! (36864 tokens: 11-17 conversations, depending on how far they are) holds about its quarter of
//! the conversations (12.5 on average), while the four caches together (147k tokens) hold about
//! all 50 (110k tokens at turn 1, 165k after turn 6).
//! * With prefix-router all turns of a conversation go to one replica, which serves only its own
//!   share of the conversations and keeps their prefixes: a follow-up turn hits all but its new
//!   user message (about 94% of its prompt). The exception is a replica whose share (set by the
//!   key hash; it varies with the seed, e.g. 17 of the 50 on one replica with seed 42) does not
//!   fit in its cache: it thrashes.
//! * Round robin sends each turn to the next replica, so every replica serves all 50
//!   conversations and each conversation's prefix is copied onto all four. A follow-up hits only
//!   when it lands on a replica that served an earlier turn of the same conversation (the
//!   previous turn's replica: about 1 in 4) and that replica has not evicted it since. While a
//!   user pauses, the replica serves about 5 other conversations a second, mostly prefixes it
//!   does not hold, and its cache holds about 12 of them: after a pause of a few seconds even
//!   the previous turn's prefix is gone (about a third of the follow-ups that land on the
//!   previous turn's replica miss).
//!
//! With larger caches round robin keeps more of its copies and the multiple falls (about 2.5x
//! with this workload and 57344-token caches); with much smaller ones prefix-router's replicas
//! thrash too.

use crate::http;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    pub conversations: usize,
    pub turns: usize,
    /// Conversations open at once (each runs its turns one after the other; when one ends the
    /// next starts). The default, 50, opens all of them at once.
    pub concurrency: usize,
    pub seed: u64,
    /// Distinct system prompts (at least 1).
    pub system_prompts: usize,
    /// Each system prompt padded with generated text to at least this many bytes (an
    /// application's long instructions or tool definitions); 0 keeps them short (~400 bytes).
    pub system_bytes: usize,
    /// `max_tokens` of every request (length of the assistant replies).
    pub max_tokens: u32,
    pub model: String,
    pub path: String,
    pub request_timeout: Duration,
    /// Think time before each follow-up turn, drawn uniformly from this range (ms). Real users
    /// pause between turns; the jitter also keeps closed-loop clients from falling into a
    /// period that aliases with Envoy's round robin (which would make round robin accidentally
    /// sticky).
    pub think_ms: (u64, u64),
    /// Delay before each conversation's first turn, drawn uniformly from this range (ms): users
    /// open their conversations over a while rather than all in the same millisecond.
    pub start_ms: (u64, u64),
    /// Size of each conversation's first user message, uniform in this range (bytes). A large
    /// first message is a document or code the user asks about over several turns (RAG, code
    /// assistants): unique per conversation, reused by every later turn.
    pub first_message_bytes: (usize, usize),
}

/// The user turns of ShareGPT-shaped chats (`[{"conversations": [{"from",
/// "value"}]}]`, gzipped or not, as in `/work/shared/traces`): each chat's
/// `human` / `user` messages in order; chats without one are left out.
pub fn sharegpt_user_turns(bytes: &[u8]) -> Result<Vec<Vec<String>>, String> {
    let mut text = Vec::new();
    let json: &[u8] = if bytes.starts_with(&[0x1f, 0x8b]) {
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut text)
            .map_err(|e| format!("gzip: {e}"))?;
        &text
    } else {
        bytes
    };
    let v: Value = serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let chats = v
        .as_array()
        .ok_or("not ShareGPT: expected [{\"conversations\": [{\"from\", \"value\"}]}]")?;
    Ok(chats
        .iter()
        .filter_map(|c| c.get("conversations").and_then(Value::as_array))
        .map(|turns| {
            turns
                .iter()
                .filter(|m| {
                    m.get("from").and_then(Value::as_str).is_some_and(|f| {
                        f.eq_ignore_ascii_case("human") || f.eq_ignore_ascii_case("user")
                    })
                })
                .filter_map(|m| m.get("value").and_then(Value::as_str).map(str::to_string))
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect())
}

/// Backend KV-cache capacity (tokens per replica) that the default workload is sized for: a
/// replica holds about its quarter of the 50 conversations, the four replicas about all of them.
/// See the module docs; `prefix-router-lab demo` and the e2e stickiness test use it.
pub const DEMO_CACHE_TOKENS: u64 = 36_864;

/// Document chat under cache pressure (see the module docs): 50 conversations x 6 turns, all open
/// at once (first turns spread over 4 s), 6-10 KB first messages, 0.2-4 s pauses between turns.
/// Meant for backends with [`DEMO_CACHE_TOKENS`].
impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            conversations: 50,
            turns: 6,
            concurrency: 50,
            seed: 42,
            system_prompts: 4,
            system_bytes: 0,
            max_tokens: 48,
            model: "sim-llm".to_string(),
            path: "/v1/chat/completions".to_string(),
            request_timeout: Duration::from_secs(120),
            think_ms: (200, 4000),
            start_ms: (0, 4000),
            first_message_bytes: (6000, 10000),
        }
    }
}

/// The fixed part of one conversation: system prompt and all user messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: usize,
    /// Index of the system prompt it uses.
    pub system_index: usize,
    pub system: String,
    /// One per turn.
    pub user_messages: Vec<String>,
    /// Pause before each turn (before the first: the start delay, see `start_ms`).
    pub think: Vec<Duration>,
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub opts: WorkloadOptions,
    pub system_prompts: Vec<String>,
    pub conversations: Vec<Conversation>,
}

/// splitmix64: small, deterministic, good enough for text generation.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }
}

const WORDS: &[&str] = &[
    "account",
    "address",
    "agent",
    "answer",
    "archive",
    "backup",
    "balance",
    "batch",
    "billing",
    "bucket",
    "buffer",
    "cache",
    "calendar",
    "cluster",
    "commit",
    "config",
    "contract",
    "credit",
    "customer",
    "dashboard",
    "database",
    "deadline",
    "delivery",
    "deploy",
    "device",
    "discount",
    "document",
    "domain",
    "draft",
    "error",
    "estimate",
    "event",
    "export",
    "feature",
    "file",
    "filter",
    "forecast",
    "format",
    "gateway",
    "graph",
    "handler",
    "header",
    "history",
    "import",
    "incident",
    "index",
    "invoice",
    "issue",
    "job",
    "journal",
    "kernel",
    "label",
    "latency",
    "ledger",
    "license",
    "limit",
    "log",
    "market",
    "memory",
    "message",
    "metric",
    "migration",
    "model",
    "module",
    "network",
    "node",
    "notice",
    "order",
    "package",
    "partner",
    "payment",
    "pipeline",
    "plan",
    "policy",
    "portal",
    "price",
    "profile",
    "project",
    "query",
    "queue",
    "quota",
    "record",
    "refund",
    "region",
    "release",
    "report",
    "request",
    "schedule",
    "schema",
    "search",
    "server",
    "service",
    "session",
    "shipment",
    "snapshot",
    "storage",
    "stream",
    "subscription",
    "summary",
    "ticket",
    "token",
    "trace",
    "update",
    "upload",
    "user",
    "vendor",
    "version",
    "volume",
    "warehouse",
    "window",
    "workflow",
];

const VERBS: &[&str] = &[
    "check",
    "explain",
    "compare",
    "update",
    "review",
    "summarize",
    "list",
    "fix",
    "move",
    "cancel",
    "restore",
    "estimate",
    "verify",
    "rename",
    "merge",
    "split",
    "schedule",
    "archive",
];

const PRODUCTS: &[(&str, &str)] = &[
    (
        "Acme Cloud",
        "a customer-support assistant for a cloud hosting company",
    ),
    ("Ledgerly", "a bookkeeping assistant for small businesses"),
    (
        "ShipFast",
        "a logistics assistant that tracks parcels and deliveries",
    ),
    (
        "DocuMind",
        "a writing assistant that drafts and edits documents",
    ),
    ("TravelNest", "a travel-planning assistant"),
    ("CodePilot", "a programming assistant"),
];

fn sentence(rng: &mut Rng) -> String {
    let n = rng.range(6, 14);
    let mut words: Vec<&str> = Vec::with_capacity(n + 1);
    words.push(VERBS[rng.below(VERBS.len())]);
    for _ in 0..n {
        words.push(WORDS[rng.below(WORDS.len())]);
    }
    let mut s = words.join(" ");
    if let Some(first) = s.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    s.push('.');
    s
}

/// About `bytes` of text made of sentences.
pub fn text(rng: &mut Rng, bytes: usize) -> String {
    let mut out = String::new();
    while out.len() < bytes {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&sentence(rng));
    }
    out
}

impl Workload {
    /// Generates the workload; same options, same workload.
    pub fn generate(opts: WorkloadOptions) -> Workload {
        let mut rng = Rng::new(opts.seed);
        let n_sys = opts.system_prompts.max(1);
        let system_prompts: Vec<String> = (0..n_sys)
            .map(|i| {
                let (name, role) = PRODUCTS[i % PRODUCTS.len()];
                let mut s = format!(
                    "You are {name}, {role}. Answer briefly and politely. {}",
                    text(&mut rng, 60)
                );
                while s.len() < opts.system_bytes {
                    s.push(' ');
                    s.push_str(&text(&mut rng, 60));
                }
                s
            })
            .collect();
        // Skewed popularity: weight of prompt i is 2^(n-1-i) (e.g. 8:4:2:1 for four prompts),
        // so the first is shared by about half of the conversations.
        let weights: Vec<u64> = (0..n_sys)
            .map(|i| 1u64 << (n_sys - 1 - i).min(20))
            .collect();
        let total: u64 = weights.iter().sum();
        let conversations = (0..opts.conversations)
            .map(|id| {
                let mut pick = rng.next_u64() % total.max(1);
                let mut system_index = 0;
                for (i, w) in weights.iter().enumerate() {
                    if pick < *w {
                        system_index = i;
                        break;
                    }
                    pick -= w;
                }
                let mut user_messages = Vec::with_capacity(opts.turns);
                let mut think = Vec::with_capacity(opts.turns);
                let (flo, fhi) = opts.first_message_bytes;
                let first_len = rng.range(flo, fhi.max(flo));
                user_messages.push(format!(
                    "Hello, this is customer #{id:04}. {}",
                    text(&mut rng, first_len)
                ));
                // No draw for a fixed start delay, so (0, 0) leaves the workload as it was.
                let (slo, shi) = opts.start_ms;
                let start = if shi > slo {
                    rng.range(slo as usize, shi as usize) as u64
                } else {
                    slo
                };
                think.push(Duration::from_millis(start));
                for _ in 1..opts.turns {
                    let len = rng.range(350, 650);
                    user_messages.push(text(&mut rng, len));
                    let (lo, hi) = opts.think_ms;
                    let ms = rng.range(lo as usize, hi.max(lo) as usize) as u64;
                    think.push(Duration::from_millis(ms));
                }
                Conversation {
                    id,
                    system_index,
                    system: system_prompts[system_index].clone(),
                    user_messages,
                    think,
                }
            })
            .collect();
        Workload {
            opts,
            system_prompts,
            conversations,
        }
    }

    /// The same workload with real users' messages: conversation `i` takes
    /// `chats[i]` as its user turns (at most as many turns as it had, fewer
    /// if the chat is shorter); think times, start delays and system
    /// prompts stay as generated. The assistant's replies come from the
    /// backends, as always. Errors if there are fewer chats than
    /// conversations or a chat has no message.
    pub fn with_user_messages(mut self, chats: &[Vec<String>]) -> Result<Workload, String> {
        if chats.len() < self.conversations.len() {
            return Err(format!(
                "{} chats for {} conversations",
                chats.len(),
                self.conversations.len()
            ));
        }
        for (c, msgs) in self.conversations.iter_mut().zip(chats) {
            if msgs.is_empty() {
                return Err(format!("chat {} has no user message", c.id));
            }
            let n = c.user_messages.len().min(msgs.len());
            c.user_messages = msgs.iter().take(n).cloned().collect();
            c.think.truncate(n);
        }
        Ok(self)
    }

    pub fn total_requests(&self) -> usize {
        self.conversations
            .iter()
            .map(|c| c.user_messages.len())
            .sum()
    }
}

/// The request body of a chat turn.
pub fn chat_body(model: &str, messages: &[Value], max_tokens: u32) -> String {
    json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// What happened to one request.
#[derive(Debug, Clone, Default)]
pub struct RequestRecord {
    pub conversation: usize,
    pub turn: usize,
    /// HTTP status; 0 when no response arrived.
    pub status: u16,
    /// `x-backend-name` of the response.
    pub backend: Option<String>,
    /// `x-prefix-router-decision` of the response.
    pub decision: Option<String>,
    /// `x-cached-tokens` header, else `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Time to the first SSE `data:` chunk.
    pub ttft: Option<Duration>,
    pub latency: Duration,
    /// When the request was sent (`send_streaming`).
    pub started: Option<Instant>,
    /// The assistant text returned.
    pub reply: String,
    pub error: Option<String>,
}

impl RequestRecord {
    pub fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }

    /// The `outcome=` field of the decision header, if any.
    pub fn outcome(&self) -> Option<&str> {
        decision_field(self.decision.as_deref()?, "outcome")
    }
}

/// Field `name` of a `k=v;k=v` decision header.
pub fn decision_field<'a>(decision: &'a str, name: &str) -> Option<&'a str> {
    decision.split(';').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then_some(v.trim())
    })
}

#[derive(Debug, Clone)]
pub struct RunResult {
    pub records: Vec<RequestRecord>,
    pub wall: Duration,
}

fn u64_at(v: &Value, path: &[&str]) -> Option<u64> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_u64()
}

/// Applies one JSON chunk (SSE event or whole non-streamed body) to the record.
fn absorb_chunk(rec: &mut RequestRecord, v: &Value) {
    if let Some(err) = v.get("error") {
        rec.error = Some(format!("error event: {err}"));
    }
    if let Some(choice) = v.get("choices").and_then(|c| c.get(0)) {
        for text in [
            choice.get("delta").and_then(|d| d.get("content")),
            choice.get("message").and_then(|d| d.get("content")),
            choice.get("text"),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(s) = text.as_str() {
                rec.reply.push_str(s);
            }
        }
    }
    if let Some(usage) = v.get("usage").filter(|u| !u.is_null()) {
        rec.prompt_tokens = u64_at(usage, &["prompt_tokens"]).or(rec.prompt_tokens);
        rec.completion_tokens = u64_at(usage, &["completion_tokens"]).or(rec.completion_tokens);
        if rec.cached_tokens.is_none() {
            rec.cached_tokens = u64_at(usage, &["prompt_tokens_details", "cached_tokens"]);
        }
    }
}

/// Sends one streaming request and reads the whole stream.
pub fn send_streaming(
    agent: &ureq::Agent,
    url: &str,
    body: &str,
    extra_headers: &[(&str, &str)],
    rec: &mut RequestRecord,
) {
    let start = Instant::now();
    rec.started = Some(start);
    let mut req = agent
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
    for (k, v) in extra_headers {
        req = req.header(*k, *v);
    }
    let mut resp = match req.send(body) {
        Ok(r) => r,
        Err(e) => {
            rec.error = Some(format!("request failed: {e}"));
            rec.latency = start.elapsed();
            return;
        }
    };
    rec.status = resp.status().as_u16();
    for (k, v) in http::response_headers(&resp) {
        match k.as_str() {
            "x-backend-name" => rec.backend = Some(v),
            "x-prefix-router-decision" => rec.decision = Some(v),
            "x-cached-tokens" => rec.cached_tokens = v.trim().parse().ok(),
            _ => {}
        }
    }
    let is_sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("event-stream"));
    let reader = resp.body_mut().as_reader();
    if !is_sse {
        let mut text = String::new();
        let mut r = BufReader::new(reader);
        let res = std::io::Read::read_to_string(&mut r, &mut text);
        rec.latency = start.elapsed();
        if let Err(e) = res {
            rec.error = Some(format!("reading body: {e}"));
            return;
        }
        match serde_json::from_str::<Value>(&text) {
            Ok(v) if rec.status == 200 => absorb_chunk(rec, &v),
            _ if rec.status == 200 => rec.error = Some(format!("not JSON: {text:.200}")),
            _ => rec.error = Some(format!("status {}: {text:.200}", rec.status)),
        }
        return;
    }
    let mut done = false;
    for line in BufReader::new(reader).lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                rec.error = Some(format!("reading stream: {e}"));
                break;
            }
        };
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data.is_empty() {
            continue;
        }
        if rec.ttft.is_none() {
            rec.ttft = Some(start.elapsed());
        }
        if data == "[DONE]" {
            done = true;
            break;
        }
        match serde_json::from_str::<Value>(data) {
            Ok(v) => absorb_chunk(rec, &v),
            Err(e) => {
                rec.error = Some(format!("bad SSE chunk ({e}): {data:.200}"));
            }
        }
    }
    rec.latency = start.elapsed();
    if rec.error.is_none() && rec.status == 200 && !done {
        rec.error = Some("stream ended without [DONE]".to_string());
    }
    if rec.error.is_none() && rec.status != 200 {
        rec.error = Some(format!("status {}", rec.status));
    }
}

/// Runs one conversation to the end; returns its records.
/// Runs one conversation; turn `t` goes to `urls[(conversation id + t) % urls.len()]`, so
/// with several proxies a conversation's consecutive turns alternate between them.
fn run_conversation(
    agent: &ureq::Agent,
    urls: &[String],
    opts: &WorkloadOptions,
    conv: &Conversation,
    observe: Observer<'_>,
) -> Vec<RequestRecord> {
    let mut messages = vec![json!({"role": "system", "content": conv.system})];
    let mut out = Vec::with_capacity(conv.user_messages.len());
    for (turn, user) in conv.user_messages.iter().enumerate() {
        if let Some(pause) = conv.think.get(turn).filter(|d| !d.is_zero()) {
            std::thread::sleep(*pause);
        }
        messages.push(json!({"role": "user", "content": user}));
        let body = chat_body(&opts.model, &messages, opts.max_tokens);
        let mut rec = RequestRecord {
            conversation: conv.id,
            turn,
            ..RequestRecord::default()
        };
        let Some(url) = urls.get((conv.id + turn) % urls.len().max(1)) else {
            rec.error = Some("no proxy to send to".to_string());
            out.push(rec);
            continue;
        };
        send_streaming(agent, url, &body, &[], &mut rec);
        // Even a failed turn appends an assistant message so the conversation keeps its shape.
        let reply = if rec.reply.is_empty() {
            "(no answer)".to_string()
        } else {
            rec.reply.clone()
        };
        messages.push(json!({"role": "assistant", "content": reply}));
        observe(&rec);
        out.push(rec);
    }
    out
}

/// Runs the workload against `base_url` (e.g. `http://127.0.0.1:10000`).
pub fn run(workload: &Workload, base_url: &str) -> RunResult {
    run_spread(workload, &[base_url.to_string()])
}

/// Runs the workload against several proxies in front of the same backends (base URLs): a
/// conversation's consecutive turns alternate between them (turn `t` of conversation `c` goes
/// to `base_urls[(c + t) % n]`), as when clients are spread over proxies without stickiness.
pub fn run_spread(workload: &Workload, base_urls: &[String]) -> RunResult {
    run_spread_observed(workload, base_urls, &|_| {})
}

/// Called with each request's record as soon as it has finished (from the
/// client threads): a progress display.
pub type Observer<'a> = &'a (dyn Fn(&RequestRecord) + Sync);

/// [`run_spread`], calling `observe` after every request.
pub fn run_spread_observed(
    workload: &Workload,
    base_urls: &[String],
    observe: Observer<'_>,
) -> RunResult {
    let urls: Vec<String> = base_urls
        .iter()
        .map(|b| format!("{b}{}", workload.opts.path))
        .collect();
    let next = AtomicUsize::new(0);
    let records = Mutex::new(Vec::with_capacity(workload.total_requests()));
    let start = Instant::now();
    let workers = workload
        .opts
        .concurrency
        .clamp(1, workload.conversations.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let agent = http::agent(workload.opts.request_timeout);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(conv) = workload.conversations.get(i) else {
                        break;
                    };
                    let recs = run_conversation(&agent, &urls, &workload.opts, conv, observe);
                    records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(recs);
                }
            });
        }
    });
    let mut records = records.into_inner().unwrap_or_else(|e| e.into_inner());
    records.sort_by_key(|r| (r.conversation, r.turn));
    RunResult {
        records,
        wall: start.elapsed(),
    }
}

/// `head`, then as many `item`s (comma-separated) as fit in `size` bytes, then `tail`.
pub fn filled(size: usize, head: &str, item: &str, tail: &str) -> Vec<u8> {
    let n = size.saturating_sub(head.len() + tail.len()) / (item.len() + 1);
    let mut b = String::with_capacity(size);
    b.push_str(head);
    b.push_str(&vec![item; n].join(","));
    b.push_str(tail);
    b.into_bytes()
}

/// Chat bodies of at most `size` bytes built from one repeated element: the amplification
/// bodies of issue 21 (many tiny JSON elements per byte).
pub fn dense_bodies(size: usize) -> Vec<(&'static str, Vec<u8>)> {
    let fill = |head: &str, item: &str, tail: &str| filled(size, head, item, tail);
    let user = r#"{"model":"sim-llm","max_tokens":4,"messages":[{"role":"user","content":["#;
    vec![
        (
            "empty messages",
            fill(
                r#"{"model":"sim-llm","max_tokens":4,"messages":["#,
                "{}",
                "]}",
            ),
        ),
        ("empty object parts", fill(user, "{}", "]}]}")),
        ("number parts", fill(user, "0", "]}]}")),
        (
            "text parts",
            fill(user, r#"{"type":"text","text":"a"}"#, "]}]}"),
        ),
        (
            "unsorted part objects",
            fill(user, r#"{"b":0,"a":0}"#, "]}]}"),
        ),
    ]
}

/// Chat bodies of about `size` bytes whose strings are dense with escapes, as clients
/// write them: a coding agent's source files (this repository's own), German prose as
/// Python's `json.dumps` writes it (`\u00fc`), tool results as JSON (`\"` every 5-6
/// bytes); and an adversary's `\n` after random gaps of 1-31 bytes. The files and results
/// go in user turns (the backend simulator needs no tool-call ids), after a short first
/// user turn; the files also in `tool_result` parts (Anthropic's shape: canonical JSON).
/// Last, a tool whose description is `\n` throughout (canonical JSON's densest string).
pub fn escaped_bodies(size: usize) -> Vec<(&'static str, Vec<u8>)> {
    let json = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let chat = |messages: Vec<String>| {
        let mut b = String::from(r#"{"model":"sim-llm","max_tokens":4,"messages":["#);
        for m in messages {
            if b.len() + m.len() + 2 > size {
                break;
            }
            if !b.ends_with('[') {
                b.push(',');
            }
            b.push_str(&m);
        }
        b.push_str("]}");
        b.into_bytes()
    };
    let msg = |role: &str, text: &str| format!(r#"{{"role":"{role}","content":{}}}"#, json(text));
    let sources = [
        include_str!("../../crates/core/src/extract.rs"),
        include_str!("../../crates/core/src/json_stream.rs"),
        include_str!("../../crates/core/src/spill.rs"),
        include_str!("../../crates/core/src/config.rs"),
    ];
    let mut code = vec![msg("user", "Why does the router fall back on this body?")];
    let mut parts = code.clone();
    let mut tools = vec![msg("user", "Find me flights to Paris.")];
    for t in 0..size / 16_384 {
        let file = sources.get(t % sources.len()).copied().unwrap_or("");
        code.push(msg("assistant", "Reading the next file."));
        code.push(msg("user", file));
        // As Anthropic-shaped agents send it: a non-text part, hashed as canonical JSON.
        parts.push(msg("assistant", "Reading the next file."));
        parts.push(format!(
            r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{t}","content":{}}}]}}"#,
            json(file)
        ));
    }
    for t in 0..size / 256 {
        let rows: Vec<String> = (0..10)
            .map(|i| {
                format!(
                    r#"{{"airline": "AF", "flight": "AF{t}{i}", "price": {}, "stops": 0}}"#,
                    100 + i
                )
            })
            .collect();
        tools.push(msg("assistant", &format!(r#"{{"query": "paris {t}"}}"#)));
        tools.push(msg("user", &format!("[{}]", rows.join(", "))));
    }
    // As `json.dumps` writes them (`ensure_ascii`).
    let words = [
        "f\\u00fcr",
        "Stra\\u00dfe",
        "sch\\u00f6n",
        "M\\u00fcnchen",
        "k\\u00f6nnen",
        "gro\\u00df",
        "\\u00fcber",
        "die",
        "und",
    ];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut german, mut gaps) = (String::new(), String::new());
    while german.len() + 200 < size {
        german.push_str(
            words
                .get(next() as usize % words.len())
                .copied()
                .unwrap_or(""),
        );
        german.push(' ');
    }
    while gaps.len() + 200 < size {
        gaps.push_str(&"a".repeat(1 + next() as usize % 31));
        gaps.push_str("\\n");
    }
    let raw = |text: &str| format!(r#"{{"role":"user","content":"{text}"}}"#);
    let description = "\\n".repeat(size.saturating_sub(200) / 2);
    let described = format!(
        r#"{{"model":"sim-llm","max_tokens":4,"tools":[{{"type":"function","function":{{"name":"f","description":"{description}"}}}}],"messages":[{}]}}"#,
        raw("q")
    );
    vec![
        ("code agent", chat(code)),
        ("code in tool_result parts", chat(parts)),
        ("\\n in a tool description", described.into_bytes()),
        ("German, \\u escapes", chat(vec![raw(&german)])),
        ("JSON tool messages", chat(tools)),
        ("\\n at gaps of 1-31", chat(vec![raw(&gaps)])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_bodies_are_valid_chats_of_about_their_size() {
        for (name, body) in escaped_bodies(200_000) {
            assert!(
                (150_000..=200_000).contains(&body.len()),
                "{name}: {}",
                body.len()
            );
            let v: serde_json::Value = serde_json::from_slice(&body).expect(name);
            let text: String = v["messages"]
                .as_array()
                .expect(name)
                .iter()
                .filter_map(|m| m["content"].as_str())
                .collect();
            // Escape-dense: the decoded text is well short of the body.
            assert!(text.len() < body.len() * 97 / 100, "{name}");
        }
    }

    fn small() -> WorkloadOptions {
        WorkloadOptions {
            conversations: 40,
            turns: 3,
            ..WorkloadOptions::default()
        }
    }

    #[test]
    fn real_chats_replace_the_user_turns() {
        let json = br#"[
            {"id": "a", "conversations": [{"from": "human", "value": "Hello?"},
                {"from": "gpt", "value": "Hi!"}, {"from": "human", "value": "How are you?"},
                {"from": "gpt", "value": "Fine."}, {"from": "human", "value": "Bye"},
                {"from": "human", "value": "Really"}]},
            {"id": "b", "conversations": [{"from": "gpt", "value": "only an answer"}]},
            {"id": "c", "conversations": [{"from": "User", "value": "One"}]},
            {"id": "d"}
        ]"#;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, json).unwrap();
        let gz = gz.finish().unwrap();
        let plain = sharegpt_user_turns(json).unwrap();
        assert_eq!(sharegpt_user_turns(&gz).unwrap(), plain);
        assert_eq!(
            plain,
            vec![vec!["Hello?", "How are you?", "Bye", "Really"], vec!["One"]]
        );
        let two = WorkloadOptions {
            conversations: 2,
            ..small()
        };
        let w = Workload::generate(two.clone())
            .with_user_messages(&plain)
            .unwrap();
        // At most the generated turns (3); fewer when the chat is shorter.
        assert_eq!(
            w.conversations[0].user_messages,
            vec!["Hello?", "How are you?", "Bye"]
        );
        assert_eq!(w.conversations[0].think.len(), 3);
        assert_eq!(w.conversations[1].user_messages, vec!["One"]);
        assert_eq!(w.conversations[1].think.len(), 1);
        assert_eq!(w.total_requests(), 4);
        let three = WorkloadOptions {
            conversations: 3,
            ..small()
        };
        assert!(Workload::generate(three)
            .with_user_messages(&plain)
            .is_err());
        assert!(sharegpt_user_turns(b"{}").is_err());
        assert!(sharegpt_user_turns(b"[oops").is_err());
    }

    #[test]
    fn generation_is_deterministic_and_shaped() {
        let a = Workload::generate(small());
        let b = Workload::generate(small());
        assert_eq!(a.conversations, b.conversations);
        assert_eq!(a.total_requests(), 120);
        assert_eq!(a.system_prompts.len(), 4);
        // First user messages are unique.
        let mut firsts: Vec<&String> = a
            .conversations
            .iter()
            .map(|c| &c.user_messages[0])
            .collect();
        firsts.sort();
        firsts.dedup();
        assert_eq!(firsts.len(), 40);
        // The most popular system prompt is shared by many conversations; every conversation has
        // the system prompt its index says.
        let popular = a
            .conversations
            .iter()
            .filter(|c| c.system_index == 0)
            .count();
        assert!(popular >= 10, "popular={popular}");
        assert!(a
            .conversations
            .iter()
            .all(|c| c.system == a.system_prompts[c.system_index]));
        let other = Workload::generate(WorkloadOptions { seed: 7, ..small() });
        assert_ne!(a.conversations, other.conversations);
    }

    #[test]
    fn absorbs_stream_chunks() {
        let mut rec = RequestRecord::default();
        absorb_chunk(
            &mut rec,
            &json!({"choices": [{"delta": {"content": "Hel"}}]}),
        );
        absorb_chunk(
            &mut rec,
            &json!({"choices": [{"delta": {"content": "lo"}}], "usage": null}),
        );
        absorb_chunk(
            &mut rec,
            &json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                    "prompt_tokens_details": {"cached_tokens": 8}}}),
        );
        assert_eq!(rec.reply, "Hello");
        assert_eq!(rec.prompt_tokens, Some(10));
        assert_eq!(rec.cached_tokens, Some(8));
    }

    #[test]
    fn decision_fields() {
        let d = "outcome=spill;host=127.0.0.1:1;source=prompt;skipped=2;key=9f";
        assert_eq!(decision_field(d, "outcome"), Some("spill"));
        assert_eq!(decision_field(d, "skipped"), Some("2"));
        assert_eq!(decision_field(d, "nope"), None);
    }
}
