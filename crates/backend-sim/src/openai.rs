//! OpenAI request parsing, the simulator's chat template, and response bodies.
//!
//! ## The prompt the simulator "sees"
//!
//! * `/v1/completions`: the `prompt` string as bytes. A token-id array
//!   (`[1, 2, 3]`) is encoded as 4 bytes per id, so its token count is
//!   exact. A one-element array (`["..."]` / `[[1, 2]]`) is unwrapped;
//!   batched prompts are rejected (400).
//! * `/v1/chat/completions`: its own chat template (no real tokenizer):
//!   ```text
//!   <|tools|>\n{tools as compact JSON}\n          (only if "tools" is given)
//!   <|{role}|>\n{content}{tool_calls JSON}\n      (per message)
//!   <|assistant|>\n                               (generation prompt)
//!   ```
//!   `content` may be a string, `null`, or an array of parts: text parts
//!   (`{"type":"text","text":..}` or bare strings) are concatenated; other
//!   parts (images, audio) contribute their compact JSON, so different
//!   images give different prompts. An assistant message's `tool_calls`
//!   are appended as compact JSON. The template is append-only across turns
//!   of a conversation, so turn N+1's prompt extends turn N's.
//!
//! ## Output
//!
//! `max_completion_tokens`, else `max_tokens`, else 16 tokens; the text is
//! deterministic filler words (one word per token). Every generation runs to
//! its length, so `finish_reason` is `"length"`.

use serde_json::{json, Map, Value};

/// Default output length when the request gives none.
pub const DEFAULT_MAX_TOKENS: u64 = 16;

/// Which API a generation request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// A parsed generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    pub api: Api,
    /// The prompt bytes the replica hashes and counts.
    pub prompt: Vec<u8>,
    pub max_tokens: u64,
    pub stream: bool,
    pub include_usage: bool,
}

/// An error to return to the client, OpenAI style.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            message: message.into(),
            kind: "BadRequestError",
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: 404,
            message: message.into(),
            kind: "NotFoundError",
        }
    }

    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
        }
    }

    /// `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> String {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.status,
            }
        })
        .to_string()
    }
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    }
}

fn max_tokens(m: &Map<String, Value>) -> Result<u64, ApiError> {
    for key in ["max_completion_tokens", "max_tokens"] {
        match m.get(key) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                return match v.as_u64() {
                    Some(n) if n >= 1 => Ok(n),
                    _ => Err(ApiError::bad_request(format!(
                        "{key} must be a positive integer, got {v}"
                    ))),
                }
            }
        }
    }
    Ok(DEFAULT_MAX_TOKENS)
}

fn stream_flags(m: &Map<String, Value>) -> Result<(bool, bool), ApiError> {
    let stream = match m.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "stream must be a boolean, got {v}"
            )))
        }
    };
    let include_usage = m
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((stream, include_usage))
}

/// Render one message's content.
fn render_content(content: Option<&Value>, out: &mut String) -> Result<(), ApiError> {
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.push_str(s),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part {
                    Value::String(s) => out.push_str(s),
                    Value::Object(p) if p.get("type").and_then(Value::as_str) == Some("text") => {
                        match p.get("text") {
                            Some(Value::String(s)) => out.push_str(s),
                            _ => {
                                return Err(ApiError::bad_request(
                                    "text content part needs a string \"text\"",
                                ))
                            }
                        }
                    }
                    Value::Object(_) => out.push_str(&part.to_string()),
                    _ => {
                        return Err(ApiError::bad_request(
                            "content parts must be objects or strings",
                        ))
                    }
                }
            }
        }
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "message content must be a string, an array or null, got {v}"
            )))
        }
    }
    Ok(())
}

/// The simulator's chat template (see module docs).
pub fn chat_template(messages: &[Value], tools: Option<&Value>) -> Result<String, ApiError> {
    let mut out = String::new();
    if let Some(tools) = tools.filter(|t| !t.is_null()) {
        out.push_str("<|tools|>\n");
        out.push_str(&tools.to_string());
        out.push('\n');
    }
    for (i, msg) in messages.iter().enumerate() {
        let Some(m) = msg.as_object() else {
            return Err(ApiError::bad_request(format!(
                "messages[{i}] must be an object"
            )));
        };
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ApiError::bad_request(format!(
                "messages[{i}] needs a string \"role\""
            )));
        };
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        render_content(m.get("content"), &mut out)?;
        if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
            out.push_str(&calls.to_string());
        }
        out.push('\n');
    }
    out.push_str("<|assistant|>\n");
    Ok(out)
}

/// Parse a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<GenRequest, ApiError> {
    let m = parse_object(body)?;
    let messages = match m.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::bad_request("messages must not be empty")),
        _ => {
            return Err(ApiError::bad_request(
                "\"messages\" must be an array of messages",
            ))
        }
    };
    let prompt = chat_template(messages, m.get("tools"))?.into_bytes();
    let (stream, include_usage) = stream_flags(&m)?;
    Ok(GenRequest {
        api: Api::Chat,
        prompt,
        max_tokens: max_tokens(&m)?,
        stream,
        include_usage,
    })
}

fn token_ids(ids: &[Value]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(ids.len() * 4);
    for id in ids {
        let n = u32::try_from(id.as_u64()?).ok()?;
        out.extend_from_slice(&n.to_le_bytes());
    }
    Some(out)
}

/// Parse a `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<GenRequest, ApiError> {
    let m = parse_object(body)?;
    let bad = || {
        ApiError::bad_request(
            "\"prompt\" must be a string, a token-id array, or a one-element array of those",
        )
    };
    let prompt = match m.get("prompt") {
        Some(Value::String(s)) => s.clone().into_bytes(),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => s.clone().into_bytes(),
            [Value::Array(ids)] => token_ids(ids).ok_or_else(bad)?,
            [] => return Err(ApiError::bad_request("prompt must not be empty")),
            [Value::String(_), ..] | [Value::Array(_), ..] => {
                return Err(ApiError::bad_request(
                    "batched prompts are not supported by the simulator",
                ))
            }
            ids => token_ids(ids).ok_or_else(bad)?,
        },
        _ => return Err(bad()),
    };
    let (stream, include_usage) = stream_flags(&m)?;
    Ok(GenRequest {
        api: Api::Completions,
        prompt,
        max_tokens: max_tokens(&m)?,
        stream,
        include_usage,
    })
}

const WORDS: [&str; 16] = [
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
];

/// Text of output token `i` (deterministic filler; a leading space after the
/// first).
pub fn token_text(i: u64) -> String {
    let w = WORDS
        .get((i % WORDS.len() as u64) as usize)
        .copied()
        .unwrap_or("x");
    if i == 0 {
        w.to_string()
    } else {
        format!(" {w}")
    }
}

/// Text of output tokens `from..to`.
pub fn text_range(from: u64, to: u64) -> String {
    (from..to).map(token_text).collect()
}

/// OpenAI `usage` object.
pub fn usage(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": { "cached_tokens": cached_tokens },
    })
}

/// Fields shared by every body of one response.
#[derive(Debug, Clone)]
pub struct Meta<'a> {
    pub api: Api,
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
}

/// Non-streaming response body.
pub fn full_response(meta: &Meta<'_>, text: &str, usage: Value) -> Value {
    match meta.api {
        Api::Chat => json!({
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text, "tool_calls": [] },
                "logprobs": null,
                "finish_reason": "length",
            }],
            "usage": usage,
        }),
        Api::Completions => json!({
            "id": meta.id,
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": "length",
            }],
            "usage": usage,
        }),
    }
}

/// One streaming chunk with `text` (and, for chat, the role on the first
/// chunk), `finish_reason` or null.
pub fn chunk(
    meta: &Meta<'_>,
    text: &str,
    first: bool,
    finish: Option<&str>,
    include_usage: bool,
) -> Value {
    let mut v = match meta.api {
        Api::Chat => {
            let delta = if finish.is_some() && text.is_empty() {
                json!({})
            } else if first {
                json!({ "role": "assistant", "content": text })
            } else {
                json!({ "content": text })
            };
            json!({
                "id": meta.id,
                "object": "chat.completion.chunk",
                "created": meta.created,
                "model": meta.model,
                "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
            })
        }
        Api::Completions => json!({
            "id": meta.id,
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
        }),
    };
    if include_usage {
        if let Some(o) = v.as_object_mut() {
            o.insert("usage".to_string(), Value::Null);
        }
    }
    v
}

/// The final usage-only chunk (`stream_options.include_usage`).
pub fn usage_chunk(meta: &Meta<'_>, usage: Value) -> Value {
    let object = match meta.api {
        Api::Chat => "chat.completion.chunk",
        Api::Completions => "text_completion",
    };
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage,
    })
}

/// One SSE event: `data: {json}\n\n`.
pub fn sse(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

/// The SSE terminator.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_template_strings_parts_tools() {
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"You are terse."},
            {"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"there"}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","content":"42","tool_call_id":"c1"}
        ],"tools":[{"type":"function","function":{"name":"f"}}],"max_tokens":5,"stream":true,
        "stream_options":{"include_usage":true}}"#;
        let r = parse_chat(body).unwrap();
        let p = String::from_utf8(r.prompt).unwrap();
        // Key order of re-serialized JSON depends on serde_json features,
        // so build the expectation with serde_json too.
        let tools = json!([{"type":"function","function":{"name":"f"}}]).to_string();
        let calls = json!([{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}])
            .to_string();
        let expected = format!(
            "<|tools|>\n{tools}\n<|system|>\nYou are terse.\n<|user|>\nHello there\n\
             <|assistant|>\n{calls}\n<|tool|>\n42\n<|assistant|>\n"
        );
        assert_eq!(p, expected);
        assert_eq!(r.max_tokens, 5);
        assert!(r.stream && r.include_usage);
        assert_eq!(r.api, Api::Chat);
    }

    #[test]
    fn chat_template_is_append_only_across_turns() {
        let t1 = chat_template(&[json!({"role":"user","content":"hi"})], None).unwrap();
        let t2 = chat_template(
            &[
                json!({"role":"user","content":"hi"}),
                json!({"role":"assistant","content":"yo"}),
                json!({"role":"user","content":"more"}),
            ],
            None,
        )
        .unwrap();
        assert!(t2.starts_with(&t1));
    }

    #[test]
    fn max_tokens_precedence_and_defaults() {
        let r = parse_chat(br#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert!(!r.stream && !r.include_usage);
        let r = parse_chat(br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":9,"max_completion_tokens":3}"#)
            .unwrap();
        assert_eq!(r.max_tokens, 3);
        let r = parse_completion(br#"{"prompt":"abc","max_tokens":null}"#).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn completion_prompts() {
        let r = parse_completion(br#"{"prompt":"hello world"}"#).unwrap();
        assert_eq!(r.prompt, b"hello world");
        assert_eq!(r.api, Api::Completions);
        let r = parse_completion(br#"{"prompt":["one"]}"#).unwrap();
        assert_eq!(r.prompt, b"one");
        let r = parse_completion(br#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(r.prompt.len(), 12);
        let r = parse_completion(br#"{"prompt":[[1,2]]}"#).unwrap();
        assert_eq!(r.prompt.len(), 8);
    }

    #[test]
    fn bad_requests_are_400() {
        for body in [
            &b"{not json"[..],
            b"[]",
            b"\"str\"",
            br#"{"messages":[]}"#,
            br#"{"messages":"hi"}"#,
            br#"{"messages":[{"content":"no role"}]}"#,
            br#"{"messages":[42]}"#,
            br#"{"messages":[{"role":"user","content":5}]}"#,
            br#"{"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":-3}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"max_tokens":"7"}"#,
            br#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
        ] {
            let e = parse_chat(body).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
            let v: Value = serde_json::from_str(&e.body()).unwrap();
            assert!(v["error"]["message"].is_string());
        }
        for body in [
            &br#"{}"#[..],
            br#"{"prompt":5}"#,
            br#"{"prompt":[]}"#,
            br#"{"prompt":["a","b"]}"#,
            br#"{"prompt":[1,-2]}"#,
            br#"{"prompt":[1,"a"]}"#,
        ] {
            assert_eq!(parse_completion(body).unwrap_err().status, 400);
        }
    }

    #[test]
    fn filler_and_bodies() {
        assert_eq!(text_range(0, 3), "lorem ipsum dolor");
        assert_eq!(text_range(1, 2), " ipsum");
        let meta = Meta {
            api: Api::Chat,
            id: "chatcmpl-1",
            created: 1,
            model: "m",
        };
        let v = full_response(&meta, "hi", usage(10, 2, 4));
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["usage"]["total_tokens"], 12);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        let c = chunk(&meta, "a", true, None, true);
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        assert!(c["usage"].is_null() && c.get("usage").is_some());
        let c = chunk(&meta, "", false, Some("length"), false);
        assert_eq!(c["choices"][0]["delta"], json!({}));
        assert!(c.get("usage").is_none());
        let u = usage_chunk(&meta, usage(1, 1, 0));
        assert_eq!(u["choices"], json!([]));
        assert_eq!(sse(&json!(1)), b"data: 1\n\n");
    }
}
