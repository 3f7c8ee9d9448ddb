//! The former extractor (serde_json into borrowed structs), kept as the
//! reference the streaming extractor must match: same canonical bytes,
//! anchor, metadata, and error kind. Also the router's former `peek_meta`.
//! Canonical JSON is defined here on [`J`], a tree that keeps members as
//! written (it was serde_json's sorted `Value` until `3fbbb24`).
#![allow(dead_code, clippy::all)]

use prefix_router_core::extract::{Api, ExtractError, PromptSink, RequestMeta};
use prefix_router_core::hash;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

const RS: &[u8] = &[0x1E];
const US: &[u8] = &[0x1F];
const GS: &[u8] = &[0x1D];

/// The router's former pre-pass: `model` and `cache_salt` only.
pub fn peek_meta(body: &[u8]) -> Result<(String, Option<String>), ()> {
    serde_json::from_slice::<Peek<'_>>(body)
        .map(|p| (p.model.into_owned(), p.cache_salt.map(Cow::into_owned)))
        .map_err(|_| ())
}

#[derive(serde::Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    model: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    cache_salt: Option<std::borrow::Cow<'a, str>>,
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
        let v: J = serde_json::from_str(raw.get()).map_err(perr)?;
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
                let v: J = serde_json::from_str(tc.get()).map_err(perr)?;
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
        let v: J = serde_json::from_str(raw.get()).map_err(perr)?;
        let kind = v.kind().unwrap_or("part");
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

/// A JSON value as written: object members in body order, duplicates kept
/// (serde_json's `Value` sorts and deduplicates them).
pub enum J {
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    /// The value of the last `type` member, if an object's and a string.
    fn kind(&self) -> Option<&str> {
        match self {
            J::Obj(m) => match m.iter().rev().find(|(k, _)| k == "type") {
                Some((_, J::Str(s))) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<J, E> {
                Ok(J::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<J, E> {
                Ok(J::Num(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<J, E> {
                Ok(J::Num(v.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<J, E> {
                serde_json::Number::from_f64(v)
                    .map(J::Num)
                    .ok_or_else(|| E::custom("not a JSON number"))
            }
            fn visit_str<E>(self, v: &str) -> Result<J, E> {
                Ok(J::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<J, E> {
                Ok(J::Str(v))
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_none<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(J::Arr(v))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, J>()? {
                    v.push((k, x));
                }
                Ok(J::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Canonical JSON, the definition: members in body order (duplicates
/// kept), `cache_control` members dropped, no whitespace, strings and
/// numbers as serde_json prints them.
pub fn write_canonical_json(v: &J, out: &mut Vec<u8>) {
    match v {
        J::Obj(m) => {
            out.push(b'{');
            let mut first = true;
            for (k, x) in m.iter().filter(|(k, _)| k != "cache_control") {
                if !first {
                    out.push(b',');
                }
                first = false;
                write_json_str(k, out);
                out.push(b':');
                write_canonical_json(x, out);
            }
            out.push(b'}');
        }
        J::Arr(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical_json(x, out);
            }
            out.push(b']');
        }
        J::Str(s) => write_json_str(s, out),
        J::Num(n) => out.extend_from_slice(n.to_string().as_bytes()),
        J::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        J::Null => out.extend_from_slice(b"null"),
    }
}

fn write_json_str(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, s).unwrap();
}
