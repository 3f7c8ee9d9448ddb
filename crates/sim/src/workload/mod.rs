//! Workloads: what arrives when, and what each request's prompt is.
//!
//! A [`Workload`] is a list of [`Session`]s (one or more turns) over a flat
//! list of [`Request`]s. Open-loop traces (Mooncake, Azure, synthetic
//! shared-prefix) have one request per session, released at its timestamp.
//! Multi-turn workloads (ShareGPT, synthetic multi-turn) are closed-loop per
//! session: turn `k+1` is released `think[k+1]` seconds after turn `k`
//! completes, so a slow policy also delays later turns, as with real users.
//!
//! Each request knows how to render itself, lazily, in every form a policy
//! needs (see [`crate::input::RouteInput`]): the JSON body the prefix-router
//! core parses, the text SGLang's tree matches, the prompt GIE hashes, the
//! first user message KubeAI keys on, and (precomputed once, shared by every
//! policy) the replica's view: a [`Prompt`] of chained 16-token block hashes.

pub mod agentic;
pub mod azure;
pub mod mooncake;
pub mod rag;
pub mod sharegpt;
pub mod synthetic;

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use prefix_router_core::extract::{extract, Api};
use prefix_router_replica::Prompt;

use crate::rng::{seed2, Draw};
use crate::text::{gen_text, mooncake_text, MOONCAKE_BLOCK_TOKENS};

/// Model name put in every body (it seeds the core's hash chain).
pub const MODEL: &str = "llama-3.1-8b";

/// Text of a message: generated from a key, or literal (ShareGPT).
#[derive(Debug, Clone)]
pub enum Text {
    /// `len` bytes of [`gen_text`] for `key`.
    Gen { key: u64, len: u32 },
    /// Literal text.
    Lit(Arc<str>),
    /// Several texts one after another (e.g. retrieved documents and a
    /// question in one message).
    Cat(Arc<[Text]>),
}

impl Text {
    /// Append the raw text.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Text::Gen { key, len } => gen_text(*key, *len as usize, out),
            Text::Lit(s) => out.extend_from_slice(s.as_bytes()),
            Text::Cat(parts) => parts.iter().for_each(|p| p.write(out)),
        }
    }

    /// Append as a JSON string literal.
    fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'"');
        self.write_json_content(out);
        out.push(b'"');
    }

    /// Append the JSON-escaped content (no quotes).
    fn write_json_content(&self, out: &mut Vec<u8>) {
        match self {
            // Generated text needs no escaping (see `crate::text`).
            Text::Gen { .. } => self.write(out),
            Text::Lit(s) => {
                // Writing into a Vec cannot fail.
                let start = out.len();
                let _ = serde_json::to_writer(&mut *out, &**s);
                // Drop the quotes serde_json put around it.
                if out.len() >= start + 2 {
                    out.pop();
                    out.remove(start);
                }
            }
            Text::Cat(parts) => parts.iter().for_each(|p| p.write_json_content(out)),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Text::Gen { len, .. } => *len as usize,
            Text::Lit(s) => s.len(),
            Text::Cat(parts) => parts.iter().map(Text::len).sum(),
        }
    }

    /// Empty?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A conversation: optional system prompt, then (user, assistant) turns.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub system: Option<Text>,
    pub turns: Vec<(Text, Text)>,
}

/// What a request's prompt is made of.
#[derive(Debug, Clone)]
pub enum Kind {
    /// Mooncake: `tokens` tokens identified by 512-token block ids; sent as
    /// a `/v1/completions` body.
    Blocks { tokens: u64, ids: Box<[u64]> },
    /// No prefix information (Azure): unique text; `/v1/completions`.
    Unique { tokens: u64, key: u64 },
    /// Turn `turn` (0-based) of conversation `conv`: system prompt, all
    /// earlier turns with their answers, and this turn's user message;
    /// `/v1/chat/completions`.
    Chat { conv: u32, turn: u32 },
}

/// One request.
#[derive(Debug, Clone)]
pub struct Request {
    pub kind: Kind,
    /// Output tokens to generate (at least 1).
    pub output_tokens: u64,
    /// The replica's view of the prompt (chained 16-token block hashes).
    pub prompt: Prompt,
    /// Chat turns followed by another turn: prompt + this turn's answer as
    /// the replica would hold it after generating (what vLLM keeps cached
    /// of a finished request, generated tokens included; exactly the prefix
    /// of the next turn's prompt). Given to [`prefix_router_replica::Replica::remember`]
    /// when the request completes.
    pub remember: Option<Prompt>,
    /// Session and turn.
    pub session: u32,
    pub turn: u32,
}

/// A user session: requests released one after another.
#[derive(Debug, Clone)]
pub struct Session {
    /// Release time of the first request (seconds from trace start).
    pub start: f64,
    /// Request indices, in turn order.
    pub requests: Vec<u32>,
    /// `think[k]`: seconds between turn `k-1` completing and turn `k`
    /// being sent (`think[0]` unused, 0).
    pub think: Vec<f64>,
}

/// A complete workload.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Short description (source, parameters).
    pub name: String,
    /// Model name in bodies.
    pub model: String,
    /// Seed of generated text.
    pub text_seed: u64,
    /// Replica block size the prompts were hashed for.
    pub block_tokens: u32,
    pub requests: Vec<Request>,
    pub sessions: Vec<Session>,
    pub convs: Vec<Conversation>,
}

/// A workload error, with the line (1-based) when it comes from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadError {
    pub line: Option<usize>,
    pub msg: String,
}

impl WorkloadError {
    pub fn new(msg: impl Into<String>) -> Self {
        WorkloadError {
            line: None,
            msg: msg.into(),
        }
    }
    pub fn at(line: usize, msg: impl Into<String>) -> Self {
        WorkloadError {
            line: Some(line),
            msg: msg.into(),
        }
    }
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}", self.msg),
            None => write!(f, "{}", self.msg),
        }
    }
}

impl std::error::Error for WorkloadError {}

/// Trace file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Mooncake,
    ShareGpt,
    Azure,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "mooncake" | "jsonl" => Some(Format::Mooncake),
            "sharegpt" => Some(Format::ShareGpt),
            "azure" | "csv" => Some(Format::Azure),
            _ => None,
        }
    }

    /// Guess from the first bytes: `[` ShareGPT, `{` Mooncake JSONL, a CSV
    /// header with `ContextTokens` Azure.
    pub fn detect(head: &[u8]) -> Option<Format> {
        let first = head.iter().find(|b| !b.is_ascii_whitespace())?;
        match first {
            b'[' => Some(Format::ShareGpt),
            b'{' => Some(Format::Mooncake),
            _ => {
                let line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
                let line = String::from_utf8_lossy(line);
                line.contains("ContextTokens").then_some(Format::Azure)
            }
        }
    }
}

/// Options for turning a trace file into a workload.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    pub format: Option<Format>,
    /// Keep only the first N requests (0: all).
    pub limit: usize,
    /// ShareGPT: session arrivals per second (Poisson).
    pub session_rate: f64,
    /// ShareGPT: mean think time between turns, seconds (exponential).
    pub think_s: f64,
    /// ShareGPT: at most this many turns per conversation (0: all).
    pub max_turns: usize,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            format: None,
            limit: 0,
            session_rate: 2.0,
            think_s: 10.0,
            max_turns: 0,
        }
    }
}

/// Load a trace file.
pub fn load_trace(
    path: &Path,
    opts: &TraceOptions,
    seed: u64,
    block_tokens: u32,
) -> Result<Workload, WorkloadError> {
    let bytes = read_maybe_gzip(path)?;
    let head = bytes.get(..bytes.len().min(4096)).unwrap_or(&bytes);
    let format = match opts.format.or_else(|| Format::detect(head)) {
        Some(f) => f,
        None => {
            return Err(WorkloadError::new(format!(
                "cannot detect the format of {}; give --format mooncake|sharegpt|azure",
                path.display()
            )))
        }
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let name = name.strip_suffix(".gz").unwrap_or(&name).to_string();
    match format {
        Format::Mooncake => mooncake::parse(&bytes, &name, opts.limit, seed, block_tokens),
        Format::Azure => azure::parse(&bytes, &name, opts.limit, seed, block_tokens),
        Format::ShareGpt => sharegpt::parse(&bytes, &name, opts, seed, block_tokens),
    }
}

/// Read a file, gunzipping it when it starts with the gzip magic bytes
/// (`chitchat_sharegpt_format.json.gz` is used as shipped).
pub fn read_maybe_gzip(path: &Path) -> Result<Vec<u8>, WorkloadError> {
    let bytes = std::fs::read(path)
        .map_err(|e| WorkloadError::new(format!("cannot read {}: {e}", path.display())))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        use std::io::Read;
        let mut out = Vec::with_capacity(bytes.len() * 4);
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| WorkloadError::new(format!("cannot gunzip {}: {e}", path.display())))?;
        return Ok(out);
    }
    Ok(bytes)
}

impl Workload {
    /// Build from requests given in session order; sorts nothing.
    pub(crate) fn new(
        name: String,
        text_seed: u64,
        block_tokens: u32,
        requests: Vec<Request>,
        sessions: Vec<Session>,
        convs: Vec<Conversation>,
    ) -> Workload {
        Workload {
            name,
            model: MODEL.to_string(),
            text_seed,
            block_tokens,
            requests,
            sessions,
            convs,
        }
    }

    /// The API a request is sent to.
    pub fn api(&self, r: &Request) -> Api {
        match r.kind {
            Kind::Blocks { .. } | Kind::Unique { .. } => Api::Completions,
            Kind::Chat { .. } => Api::ChatCompletions,
        }
    }

    /// The raw prompt text of a completions request.
    fn write_prompt(&self, r: &Request, out: &mut Vec<u8>) {
        match &r.kind {
            Kind::Blocks { tokens, ids } => mooncake_text(self.text_seed, ids, *tokens, out),
            Kind::Unique { tokens, key } => gen_text(*key, (*tokens as usize) * 4, out),
            Kind::Chat { .. } => {}
        }
    }

    fn conv_of(&self, r: &Request) -> Option<(&Conversation, usize)> {
        match r.kind {
            Kind::Chat { conv, turn } => self.convs.get(conv as usize).map(|c| (c, turn as usize)),
            _ => None,
        }
    }

    /// Append the request body (JSON) to `out`; returns the byte range of
    /// the prompt: the prompt string's content (completions) or the
    /// `messages` array (chat).
    pub fn write_body(&self, r: &Request, out: &mut Vec<u8>) -> Range<usize> {
        out.extend_from_slice(b"{\"model\":");
        let _ = serde_json::to_writer(&mut *out, &self.model);
        match self.conv_of(r) {
            None => {
                out.extend_from_slice(b",\"prompt\":\"");
                let s = out.len();
                self.write_prompt(r, out);
                let e = out.len();
                out.extend_from_slice(b"\"}");
                s..e
            }
            Some((c, turn)) => {
                out.extend_from_slice(b",\"messages\":");
                let s = out.len();
                out.push(b'[');
                let mut first = true;
                let mut msg = |role: &str, t: &Text, out: &mut Vec<u8>| {
                    if !first {
                        out.push(b',');
                    }
                    first = false;
                    out.extend_from_slice(b"{\"role\":\"");
                    out.extend_from_slice(role.as_bytes());
                    out.extend_from_slice(b"\",\"content\":");
                    t.write_json(out);
                    out.push(b'}');
                };
                if let Some(sys) = &c.system {
                    msg("system", sys, out);
                }
                for (i, (u, a)) in c.turns.iter().enumerate().take(turn + 1) {
                    msg("user", u, out);
                    if i < turn {
                        msg("assistant", a, out);
                    }
                }
                out.push(b']');
                let e = out.len();
                out.push(b'}');
                s..e
            }
        }
    }

    /// Append the text SGLang's router extracts for routing: the prompt
    /// (completions) or the message contents joined by a space (chat).
    pub fn write_routing_text(&self, r: &Request, out: &mut Vec<u8>) {
        match self.conv_of(r) {
            None => self.write_prompt(r, out),
            Some((c, turn)) => {
                let mut first = true;
                let mut put = |t: &Text, out: &mut Vec<u8>| {
                    if !first {
                        out.push(b' ');
                    }
                    first = false;
                    t.write(out);
                };
                if let Some(sys) = &c.system {
                    put(sys, out);
                }
                for (i, (u, a)) in c.turns.iter().enumerate().take(turn + 1) {
                    put(u, out);
                    if i < turn {
                        put(a, out);
                    }
                }
            }
        }
    }

    /// Append the first `n` characters of the first user message (chat) or
    /// of the prompt (completions), as KubeAI's `Prefix(n)` does.
    pub fn write_first_user(&self, r: &Request, n: usize, out: &mut Vec<u8>) {
        let mut buf = Vec::new();
        match self.conv_of(r) {
            None => match &r.kind {
                Kind::Blocks { ids, .. } => {
                    // Only the first block can matter for n <= 2048.
                    let first = ids
                        .get(..ids.len().min(n.div_ceil(2048).max(1)))
                        .unwrap_or(&[]);
                    mooncake_text(self.text_seed, first, (n as u64).div_ceil(4), &mut buf);
                }
                _ => self.write_prompt(r, &mut buf),
            },
            Some((c, _)) => {
                if let Some((u, _)) = c.turns.first() {
                    u.write(&mut buf);
                }
            }
        }
        let s = String::from_utf8_lossy(&buf);
        let end = s.char_indices().nth(n).map(|(i, _)| i).unwrap_or(s.len());
        out.extend_from_slice(s.get(..end).unwrap_or("").as_bytes());
    }

    /// The canonical prompt stream (what the model sees, per the core's
    /// extractor) of a request.
    pub fn canonical(&self, r: &Request) -> Vec<u8> {
        let mut body = Vec::new();
        self.write_body(r, &mut body);
        let mut canon = Vec::new();
        // Our own bodies always parse; an error leaves an empty stream.
        let _ = extract(self.api(r), &body, &mut canon);
        canon
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// No requests?
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Span of session start times (seconds).
    pub fn span_s(&self) -> f64 {
        let lo = self
            .sessions
            .iter()
            .map(|s| s.start)
            .fold(f64::INFINITY, f64::min);
        let hi = self.sessions.iter().map(|s| s.start).fold(0.0, f64::max);
        if lo.is_finite() {
            hi - lo
        } else {
            0.0
        }
    }

    /// Total prompt tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.requests.iter().map(|r| r.prompt.tokens()).sum()
    }

    /// Requests in nominal order: by session start plus the think times
    /// before the turn (service time ignored), ties by index. Used by the
    /// bounds, which have no queueing.
    pub fn nominal_order(&self) -> Vec<u32> {
        let mut v: Vec<(f64, u32)> = Vec::with_capacity(self.requests.len());
        for s in &self.sessions {
            let mut t = s.start;
            for (k, &r) in s.requests.iter().enumerate() {
                t += s.think.get(k).copied().unwrap_or(0.0);
                v.push((t, r));
            }
        }
        v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        v.into_iter().map(|(_, r)| r).collect()
    }

    /// Keep only the first `n` sessions (by start time order as stored).
    /// Spread every session's start uniformly over `[start, start +
    /// width_s)`, seeded: for traces whose timestamps are coarse (the
    /// Mooncake conversation trace's are on a 3 s grid, so about ten
    /// requests arrive at the same instant). No-op for `width_s <= 0`.
    pub fn spread_starts(&mut self, width_s: f64, seed: u64) {
        if !(width_s.is_finite() && width_s > 0.0) {
            return;
        }
        let mut rng = crate::rng::rng(crate::rng::seed_str(seed, "spread-starts"));
        for s in &mut self.sessions {
            s.start += width_s * rng.unit();
        }
        self.name = format!("{}, starts spread over {} ms", self.name, width_s * 1000.0);
    }

    pub fn truncate_sessions(&mut self, n: usize) {
        if n == 0 || n >= self.sessions.len() {
            return;
        }
        self.sessions.truncate(n);
        let keep: std::collections::BTreeSet<u32> = self
            .sessions
            .iter()
            .flat_map(|s| s.requests.iter().copied())
            .collect();
        let mut remap = vec![u32::MAX; self.requests.len()];
        let mut reqs = Vec::with_capacity(keep.len());
        for (i, r) in std::mem::take(&mut self.requests).into_iter().enumerate() {
            if keep.contains(&(i as u32)) {
                if let Some(m) = remap.get_mut(i) {
                    *m = reqs.len() as u32;
                }
                reqs.push(r);
            }
        }
        self.requests = reqs;
        for s in &mut self.sessions {
            for r in &mut s.requests {
                *r = remap.get(*r as usize).copied().unwrap_or(u32::MAX);
            }
        }
    }

    /// Append `other`'s sessions, requests and conversations (their indices
    /// shifted past this workload's), keeping its prompts as built.
    pub(crate) fn append(&mut self, other: Workload) {
        let (r0, s0, c0) = (
            self.requests.len() as u32,
            self.sessions.len() as u32,
            self.convs.len() as u32,
        );
        for mut r in other.requests {
            r.session += s0;
            if let Kind::Chat { conv, .. } = &mut r.kind {
                *conv += c0;
            }
            self.requests.push(r);
        }
        for mut s in other.sessions {
            for r in &mut s.requests {
                *r += r0;
            }
            self.sessions.push(s);
        }
        self.convs.extend(other.convs);
    }

    /// Order sessions by start time (stable), renumbering each request's
    /// session: appended workloads interleave, and `--limit` keeps the
    /// first sessions to start.
    pub(crate) fn sort_sessions(&mut self) {
        let mut v: Vec<(usize, Session)> = std::mem::take(&mut self.sessions)
            .into_iter()
            .enumerate()
            .collect();
        v.sort_by(|a, b| a.1.start.total_cmp(&b.1.start));
        let mut new_of = vec![0u32; v.len()];
        for (new, (old, _)) in v.iter().enumerate() {
            if let Some(n) = new_of.get_mut(*old) {
                *n = new as u32;
            }
        }
        self.sessions = v.into_iter().map(|(_, s)| s).collect();
        for r in &mut self.requests {
            if let Some(&n) = new_of.get(r.session as usize) {
                r.session = n;
            }
        }
    }
}

/// Helper for builders: the replica prompt of a Mooncake request.
pub(crate) fn block_prompt(tokens: u64, ids: &[u64], block_tokens: u32) -> Prompt {
    Prompt::from_block_ids(tokens, ids, MOONCAKE_BLOCK_TOKENS, block_tokens)
}

/// Helper for builders: a unique prompt (no sharing with anything).
pub(crate) fn unique_prompt(tokens: u64, key: u64, block_tokens: u32) -> Prompt {
    let n = tokens.div_ceil(u64::from(MOONCAKE_BLOCK_TOKENS)).max(1);
    let ids: Vec<u64> = (0..n).map(|j| seed2(key, j)).collect();
    Prompt::from_block_ids(tokens, &ids, MOONCAKE_BLOCK_TOKENS, block_tokens)
}

/// Fill the replica prompts of chat requests (after `convs` is complete),
/// and for turns followed by another turn the prompt extended with the
/// answer (`RS "assistant" US answer`, the record the next turn repeats).
pub(crate) fn fill_chat_prompts(wl: &mut Workload) {
    let mut out = Vec::with_capacity(wl.requests.len());
    for r in &wl.requests {
        let Kind::Chat { conv, turn } = r.kind else {
            out.push(None);
            continue;
        };
        let mut canon = wl.canonical(r);
        let prompt = Prompt::from_bytes(&canon, wl.block_tokens);
        let answer = wl
            .convs
            .get(conv as usize)
            .filter(|c| (turn as usize) + 1 < c.turns.len())
            .and_then(|c| c.turns.get(turn as usize))
            .map(|(_, a)| a);
        let remember = answer.map(|a| {
            canon.push(0x1E);
            canon.extend_from_slice(b"assistant");
            canon.push(0x1F);
            a.write(&mut canon);
            Prompt::from_bytes(&canon, wl.block_tokens)
        });
        out.push(Some((prompt, remember)));
    }
    for (r, p) in wl.requests.iter_mut().zip(out) {
        if let Some((p, m)) = p {
            r.prompt = p;
            r.remember = m;
        }
    }
}
