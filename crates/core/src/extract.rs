//! Prompt extraction: from a request body to the canonical byte stream the
//! model will see, written into a [`PromptSink`].
//!
//! ## Canonical stream
//! The stream depends on what the model sees, not on how the JSON was
//! written: key order and whitespace do not change it (non-text values are
//! re-serialized with sorted keys, see [`write_canonical_json`]), and the
//! same conversation sent as turn N and as turn N+1 shares a byte prefix up to
//! the end of turn N, because every record is self-contained and nothing is
//! appended after the last message.
//!
//! Records, in order (`RS` = 0x1E, `US` = 0x1F, `GS` = 0x1D):
//! - tools: `RS "tools" US <canonical JSON>` (chat, responses, messages)
//! - Anthropic `system` / Responses `instructions`: a `system` message
//! - every message: `RS <role> US <content>` then, if present, `US` + field
//!   name + `=` + value for `name`, `tool_call_id`, and canonical `tool_calls`.
//!   `content` is the string itself; an array of parts is its parts joined by
//!   `US`, text parts as their text (so `"hi"` and `[{"type":"text","text":"hi"}]`
//!   give the same bytes) and any other part as the stable marker
//!   `GS <type> GS <16 hex digits of xxh3(canonical JSON of the part)>`.
//! - completions: the prompt string; an array of prompts joined by `RS`;
//!   token-id arrays as little-endian u32s.
//!
//! The model name and an optional `cache_salt` are not in the stream: they
//! seed the hash chain ([`crate::hash::model_seed`]), so two models never share
//! a key.
//!
//! ## Anchor
//! The extractor calls [`PromptSink::anchor`] at the end of the first user
//! message (the opening of a conversation). The routing key uses it; see
//! [`crate::key`].
//!
//! ## Cost
//! One pass of `serde_json` over the body into borrowed structures
//! (`Cow<str>` borrows unless the string has escapes, `RawValue` for nested
//! values); text is written straight into the sink, so the only copy of the
//! prompt text is what the sink keeps (the hasher buffers at most one chunk).
//! O(body bytes).

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

use crate::hash;

const RS: &[u8] = &[0x1E];
const US: &[u8] = &[0x1F];
const GS: &[u8] = &[0x1D];

/// Which API a handled path speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`.
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

impl Api {
    /// The API of a path, by its last segments (so `/openai/v1/chat/completions`
    /// works too).
    pub fn from_path(path: &str) -> Option<Api> {
        let p = path.trim_end_matches('/');
        if p.ends_with("/chat/completions") {
            Some(Api::ChatCompletions)
        } else if p.ends_with("/completions") {
            Some(Api::Completions)
        } else if p.ends_with("/responses") {
            Some(Api::Responses)
        } else if p.ends_with("/messages") {
            Some(Api::Messages)
        } else {
            None
        }
    }

    /// Whether the body has message structure (and so an anchor).
    pub fn structured(self) -> bool {
        !matches!(self, Api::Completions)
    }
}

/// Where the canonical stream goes.
pub trait PromptSink {
    /// Next bytes of the canonical stream.
    fn write(&mut self, bytes: &[u8]);
    /// The end of the first user message (called at most once).
    fn anchor(&mut self);
}

impl PromptSink for Vec<u8> {
    fn write(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn anchor(&mut self) {}
}

/// What the body says besides the prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta<'a> {
    /// The `model` field ("" if absent).
    pub model: Cow<'a, str>,
    /// The OpenAI `user` field (or Anthropic `metadata.user_id`).
    pub user: Option<Cow<'a, str>>,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<Cow<'a, str>>,
}

/// Why a body could not be extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractError {
    /// Not JSON, or not the shape this API expects.
    Parse(String),
    /// Valid, but there is no prompt to route on.
    EmptyPrompt,
}

impl std::fmt::Display for ExtractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractError::Parse(m) => write!(f, "parse error: {m}"),
            ExtractError::EmptyPrompt => write!(f, "no prompt in the request"),
        }
    }
}

fn perr(e: serde_json::Error) -> ExtractError {
    ExtractError::Parse(e.to_string())
}

/// Every field any of the four APIs routes on; each API reads its own and
/// serde skips the rest of the body without materializing it.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    /// Chat and Anthropic messages.
    #[serde(borrow, default)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    /// Legacy OpenAI function definitions.
    #[serde(borrow, default)]
    functions: Option<&'a RawValue>,
    /// Completions.
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    /// Responses.
    #[serde(borrow, default)]
    instructions: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    /// Anthropic.
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    metadata: Option<AnthropicMeta<'a>>,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AnthropicMeta<'a> {
    #[serde(borrow, default)]
    user_id: Option<Cow<'a, str>>,
}

/// A chat message (OpenAI chat, Anthropic messages, Responses input items).
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PartHead<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// Extract `body` (for `api`) into `sink`; returns the request's metadata.
pub fn extract<'a, S: PromptSink>(
    api: Api,
    body: &'a [u8],
    sink: &mut S,
) -> Result<RequestMeta<'a>, ExtractError> {
    let mut w = Writer {
        sink,
        wrote: 0,
        anchored: false,
    };
    let meta = match api {
        Api::ChatCompletions => {
            let b: Body<'a> = serde_json::from_slice(body).map_err(perr)?;
            if let Some(t) = b.tools.or(b.functions) {
                w.tools(t)?;
            }
            let msgs = b
                .messages
                .ok_or_else(|| ExtractError::Parse("missing field `messages`".into()))?;
            for m in &msgs {
                w.message(m)?;
            }
            RequestMeta {
                model: b.model.unwrap_or_default(),
                user: b.user,
                cache_salt: b.cache_salt,
            }
        }
        Api::Completions => {
            let b: Body<'a> = serde_json::from_slice(body).map_err(perr)?;
            let p = b
                .prompt
                .ok_or_else(|| ExtractError::Parse("missing field `prompt`".into()))?;
            w.prompt(p)?;
            RequestMeta {
                model: b.model.unwrap_or_default(),
                user: b.user,
                cache_salt: b.cache_salt,
            }
        }
        Api::Responses => {
            let b: Body<'a> = serde_json::from_slice(body).map_err(perr)?;
            if let Some(t) = b.tools {
                w.tools(t)?;
            }
            if let Some(i) = &b.instructions {
                w.record("system", i.as_bytes());
            }
            match b.input {
                None => {}
                Some(raw) => match first_byte(raw) {
                    b'"' => {
                        let s: Cow<'a, str> = serde_json::from_str(raw.get()).map_err(perr)?;
                        w.record("user", s.as_bytes());
                        w.mark_user();
                    }
                    b'[' => {
                        let items: Vec<&'a RawValue> =
                            serde_json::from_str(raw.get()).map_err(perr)?;
                        for it in items {
                            let m: Message<'a> = if first_byte(it) == b'{' {
                                serde_json::from_str(it.get()).map_err(perr)?
                            } else {
                                return Err(ExtractError::Parse(
                                    "`input` items must be objects".into(),
                                ));
                            };
                            let is_msg = m.role.is_some()
                                && m.kind.as_deref().is_none_or(|k| k == "message");
                            if is_msg {
                                w.message(&m)?;
                            } else {
                                // function_call, function_call_output, reasoning...
                                w.sink.write(RS);
                                w.marker(it)?;
                                w.wrote += 1;
                            }
                        }
                    }
                    b'n' => {}
                    _ => {
                        return Err(ExtractError::Parse(
                            "`input` must be a string or an array".into(),
                        ))
                    }
                },
            }
            RequestMeta {
                model: b.model.unwrap_or_default(),
                user: b.user,
                cache_salt: b.cache_salt,
            }
        }
        Api::Messages => {
            let b: Body<'a> = serde_json::from_slice(body).map_err(perr)?;
            if let Some(s) = b.system {
                w.sink.write(RS);
                w.sink.write(b"system");
                w.sink.write(US);
                w.content(s)?;
                w.wrote += 1;
            }
            if let Some(t) = b.tools {
                w.tools(t)?;
            }
            let msgs = b
                .messages
                .ok_or_else(|| ExtractError::Parse("missing field `messages`".into()))?;
            for m in &msgs {
                w.message(m)?;
            }
            RequestMeta {
                model: b.model.unwrap_or_default(),
                user: b.metadata.and_then(|m| m.user_id),
                cache_salt: None,
            }
        }
    };
    if w.wrote == 0 {
        return Err(ExtractError::EmptyPrompt);
    }
    Ok(meta)
}

fn first_byte(raw: &RawValue) -> u8 {
    raw.get().bytes().next().unwrap_or(b'n')
}

struct Writer<'s, S: PromptSink> {
    sink: &'s mut S,
    /// Number of records with content written.
    wrote: usize,
    anchored: bool,
}

impl<S: PromptSink> Writer<'_, S> {
    fn record(&mut self, role: &str, content: &[u8]) {
        self.sink.write(RS);
        self.sink.write(role.as_bytes());
        self.sink.write(US);
        self.sink.write(content);
        self.wrote += 1;
    }

    fn mark_user(&mut self) {
        if !self.anchored {
            self.anchored = true;
            self.sink.anchor();
        }
    }

    fn tools(&mut self, raw: &RawValue) -> Result<(), ExtractError> {
        if first_byte(raw) == b'n' {
            return Ok(());
        }
        let v: serde_json::Value = serde_json::from_str(raw.get()).map_err(perr)?;
        self.sink.write(RS);
        self.sink.write(b"tools");
        self.sink.write(US);
        let mut buf = Vec::new();
        write_canonical_json(&v, &mut buf);
        self.sink.write(&buf);
        Ok(())
    }

    fn message(&mut self, m: &Message<'_>) -> Result<(), ExtractError> {
        let role = m.role.as_deref().unwrap_or("");
        self.sink.write(RS);
        self.sink.write(role.as_bytes());
        self.sink.write(US);
        if let Some(c) = m.content {
            self.content(c)?;
        }
        if let Some(n) = &m.name {
            self.field(b"name", n.as_bytes());
        }
        if let Some(id) = &m.tool_call_id {
            self.field(b"tool_call_id", id.as_bytes());
        }
        if let Some(tc) = m.tool_calls {
            if first_byte(tc) != b'n' {
                let v: serde_json::Value = serde_json::from_str(tc.get()).map_err(perr)?;
                let mut buf = Vec::new();
                write_canonical_json(&v, &mut buf);
                self.field(b"tool_calls", &buf);
            }
        }
        self.wrote += 1;
        if role == "user" {
            self.mark_user();
        }
        Ok(())
    }

    fn field(&mut self, name: &[u8], value: &[u8]) {
        self.sink.write(US);
        self.sink.write(name);
        self.sink.write(b"=");
        self.sink.write(value);
    }

    /// A content value: string, array of parts, or null.
    fn content(&mut self, raw: &RawValue) -> Result<(), ExtractError> {
        match first_byte(raw) {
            b'"' => {
                let s: Cow<'_, str> = serde_json::from_str(raw.get()).map_err(perr)?;
                self.sink.write(s.as_bytes());
            }
            b'[' => {
                let parts: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(perr)?;
                for (i, p) in parts.iter().enumerate() {
                    if i > 0 {
                        self.sink.write(US);
                    }
                    let head: PartHead<'_> = if first_byte(p) == b'{' {
                        serde_json::from_str(p.get()).map_err(perr)?
                    } else {
                        PartHead {
                            kind: None,
                            text: None,
                        }
                    };
                    let is_text = matches!(
                        head.kind.as_deref(),
                        Some("text") | Some("input_text") | Some("output_text") | None
                    );
                    match (&head.text, is_text) {
                        (Some(t), true) => self.sink.write(t.as_bytes()),
                        _ => self.marker(p)?,
                    }
                }
            }
            b'n' => {}
            _ => {
                return Err(ExtractError::Parse(
                    "content must be a string, an array of parts or null".into(),
                ))
            }
        }
        Ok(())
    }

    /// `GS type GS hex(xxh3(canonical json))` for a non-text value.
    fn marker(&mut self, raw: &RawValue) -> Result<(), ExtractError> {
        let v: serde_json::Value = serde_json::from_str(raw.get()).map_err(perr)?;
        let kind = v.get("type").and_then(|t| t.as_str()).unwrap_or("part");
        let mut buf = Vec::new();
        write_canonical_json(&v, &mut buf);
        let h = hash::hash(&buf, hash::PART_SEED);
        self.sink.write(GS);
        self.sink.write(kind.as_bytes());
        self.sink.write(GS);
        self.sink.write(hex16(h).as_slice());
        Ok(())
    }

    /// Completions `prompt`: string, array of strings, token ids, or arrays of
    /// token ids.
    fn prompt(&mut self, raw: &RawValue) -> Result<(), ExtractError> {
        let v: PromptValue<'_> = serde_json::from_str(raw.get()).map_err(perr)?;
        match v {
            PromptValue::One(s) => {
                if !s.is_empty() {
                    self.sink.write(s.as_bytes());
                    self.wrote += 1;
                }
            }
            PromptValue::Tokens(t) => self.tokens(&t),
            PromptValue::Many(items) => {
                for (i, it) in items.iter().enumerate() {
                    if i > 0 {
                        self.sink.write(RS);
                    }
                    match it {
                        PromptItem::Text(s) => {
                            self.sink.write(s.as_bytes());
                            self.wrote += usize::from(!s.is_empty());
                        }
                        PromptItem::Tokens(t) => self.tokens(t),
                    }
                }
            }
        }
        Ok(())
    }

    fn tokens(&mut self, t: &[u32]) {
        for id in t {
            self.sink.write(&id.to_le_bytes());
        }
        self.wrote += usize::from(!t.is_empty());
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptValue<'a> {
    #[serde(borrow)]
    One(Cow<'a, str>),
    Tokens(Vec<u32>),
    #[serde(borrow)]
    Many(Vec<PromptItem<'a>>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptItem<'a> {
    #[serde(borrow)]
    Text(Cow<'a, str>),
    Tokens(Vec<u32>),
}

fn hex16(h: u64) -> [u8; 16] {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'0'; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let nib = ((h >> (60 - 4 * i)) & 0xf) as usize;
        *o = D.get(nib).copied().unwrap_or(b'0');
    }
    out
}

/// Canonical JSON: object keys sorted bytewise, no whitespace, strings
/// escaped as serde_json does, `cache_control` keys dropped (Anthropic cache
/// hints do not change what the model sees).
pub fn write_canonical_json(v: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().filter(|k| *k != "cache_control").collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_str(k, out);
                out.push(b':');
                if let Some(val) = m.get(*k) {
                    write_canonical_json(val, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical_json(x, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_json_str(s, out),
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

fn write_json_str(s: &str, out: &mut Vec<u8>) {
    // serde_json's string serialization never fails for a Vec writer.
    if serde_json::to_writer(&mut *out, s).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    struct Rec {
        bytes: Vec<u8>,
        anchor: Option<usize>,
    }
    impl PromptSink for Rec {
        fn write(&mut self, b: &[u8]) {
            self.bytes.extend_from_slice(b);
        }
        fn anchor(&mut self) {
            assert!(self.anchor.is_none(), "anchor called twice");
            self.anchor = Some(self.bytes.len());
        }
    }
    fn run(api: Api, body: &str) -> (Vec<u8>, Option<usize>, String) {
        let mut r = Rec {
            bytes: vec![],
            anchor: None,
        };
        let m = extract(api, body.as_bytes(), &mut r).unwrap();
        (r.bytes, r.anchor, m.model.into_owned())
    }

    #[test]
    fn chat_key_order_and_whitespace_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]}"#;
        let b = r#"{ "tools" : [ {"function":{"parameters":{"a":2,"b":1},"name":"f"},"type":"function"} ],
                    "messages":[{"content":"S","role":"system"},{ "content":"hi","role":"user"}], "model":"m" }"#;
        assert_eq!(run(Api::ChatCompletions, a), run(Api::ChatCompletions, b));
    }

    #[test]
    fn chat_turns_share_prefix_and_anchor() {
        let t1 = r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"}]}"#;
        let t2 = r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#;
        let (b1, a1, _) = run(Api::ChatCompletions, t1);
        let (b2, a2, _) = run(Api::ChatCompletions, t2);
        assert!(b2.starts_with(&b1));
        assert!(b2.len() > b1.len());
        assert_eq!(a1, Some(b1.len()));
        assert_eq!(a1, a2);
    }

    #[test]
    fn string_and_text_parts_are_the_same_bytes() {
        let a = r#"{"messages":[{"role":"user","content":"hello"}]}"#;
        let b = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}"#;
        assert_eq!(run(Api::ChatCompletions, a), run(Api::ChatCompletions, b));
    }

    #[test]
    fn non_text_parts_get_stable_markers() {
        let a = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"http://x/1.png","detail":"low"}}]}]}"#;
        let b = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"image_url":{"detail":"low","url":"http://x/1.png"},"type":"image_url"}]}]}"#;
        let c = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"http://x/2.png"}}]}]}"#;
        let (ba, _, _) = run(Api::ChatCompletions, a);
        assert_eq!(ba, run(Api::ChatCompletions, b).0);
        assert_ne!(ba, run(Api::ChatCompletions, c).0);
        let s = String::from_utf8_lossy(&ba);
        assert!(s.contains("\u{1d}image_url\u{1d}"), "{s:?}");
    }

    #[test]
    fn escapes_are_decoded() {
        let a = r#"{"messages":[{"role":"user","content":"line1\nline2 \u00e9"}]}"#;
        let (b, _, _) = run(Api::ChatCompletions, a);
        assert!(String::from_utf8(b).unwrap().contains("line1\nline2 é"));
    }

    #[test]
    fn model_is_returned_not_streamed() {
        let (b, _, m) = run(
            Api::ChatCompletions,
            r#"{"model":"llama","messages":[{"role":"user","content":"x"}]}"#,
        );
        assert_eq!(m, "llama");
        assert!(!String::from_utf8_lossy(&b).contains("llama"));
    }

    #[test]
    fn tool_calls_and_names_are_included() {
        let a = r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}]}"#;
        let (b, _, _) = run(Api::ChatCompletions, a);
        let s = String::from_utf8_lossy(&b);
        assert!(s.contains("tool_calls=[{\"function\""));
        assert!(s.contains("tool_call_id=c1"));
    }

    #[test]
    fn completions_forms() {
        let (a, anchor, _) = run(Api::Completions, r#"{"model":"m","prompt":"abc"}"#);
        assert_eq!(a, b"abc");
        assert_eq!(anchor, None);
        let (b, _, _) = run(Api::Completions, r#"{"prompt":["abc","de"]}"#);
        assert_eq!(b, b"abc\x1ede");
        let (c, _, _) = run(Api::Completions, r#"{"prompt":[1,2]}"#);
        assert_eq!(c, [1, 0, 0, 0, 2, 0, 0, 0]);
        let (d, _, _) = run(Api::Completions, r#"{"prompt":[[1],[2]]}"#);
        assert_eq!(d, [1, 0, 0, 0, 0x1e, 2, 0, 0, 0]);
    }

    #[test]
    fn responses_forms() {
        let (a, an, _) = run(
            Api::Responses,
            r#"{"model":"m","instructions":"be brief","input":"hi"}"#,
        );
        assert_eq!(a, b"\x1esystem\x1fbe brief\x1euser\x1fhi");
        assert_eq!(an, Some(a.len()));
        let (b, _, _) = run(
            Api::Responses,
            r#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
        );
        assert_eq!(a, b);
        let (c, _, _) = run(
            Api::Responses,
            r#"{"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"1","name":"f","arguments":"{}"}]}"#,
        );
        assert!(String::from_utf8_lossy(&c).contains("\u{1d}function_call\u{1d}"));
    }

    #[test]
    fn anthropic_forms() {
        let a = r#"{"model":"claude","system":"S","messages":[{"role":"user","content":"q"}]}"#;
        let b = r#"{"model":"claude","system":[{"type":"text","text":"S","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}"#;
        let (ba, an, m) = run(Api::Messages, a);
        assert_eq!(m, "claude");
        assert_eq!(ba, run(Api::Messages, b).0);
        assert_eq!(an, Some(ba.len()));
    }

    #[test]
    fn bad_bodies() {
        let mut v = Vec::new();
        assert!(matches!(
            extract(Api::ChatCompletions, b"not json", &mut v),
            Err(ExtractError::Parse(_))
        ));
        assert!(matches!(
            extract(Api::ChatCompletions, br#"{"model":"m"}"#, &mut v),
            Err(ExtractError::Parse(_))
        ));
        assert!(matches!(
            extract(Api::ChatCompletions, br#"{"messages":[]}"#, &mut v),
            Err(ExtractError::EmptyPrompt)
        ));
        assert!(matches!(
            extract(Api::Completions, br#"{"prompt":""}"#, &mut v),
            Err(ExtractError::EmptyPrompt)
        ));
        assert!(matches!(
            extract(
                Api::ChatCompletions,
                br#"{"messages":[{"role":"user","content":5}]}"#,
                &mut v
            ),
            Err(ExtractError::Parse(_))
        ));
        assert!(matches!(
            extract(Api::ChatCompletions, br#"[1,2]"#, &mut v),
            Err(ExtractError::Parse(_))
        ));
    }

    #[test]
    fn api_from_path() {
        assert_eq!(
            Api::from_path("/v1/chat/completions"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(
            Api::from_path("/openai/v1/chat/completions/"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(Api::from_path("/v1/completions"), Some(Api::Completions));
        assert_eq!(Api::from_path("/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(Api::from_path("/v1/embeddings"), None);
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the extractor.
        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            for api in [Api::ChatCompletions, Api::Completions, Api::Responses, Api::Messages] {
                let mut v = Vec::new();
                let _ = extract(api, &data, &mut v);
            }
        }
    }
}
