//! ShareGPT-style conversations: `[{"id", "conversations": [{"from",
//! "value"}]}]` (`from`: `human`/`user`, `gpt`/`assistant`/..., `system`).
//!
//! Each conversation is a session replayed turn by turn as
//! `/v1/chat/completions` requests with the growing history (every earlier
//! user message and the recorded answer), sessions arriving as a Poisson
//! process and an exponential think time between a turn's completion and
//! the next turn. A turn's output length is the recorded answer's length
//! (tokens = ceil(bytes / 4)).

use std::sync::Arc;

use serde::Deserialize;

use super::{
    fill_chat_prompts, Conversation, Kind, Request, Session, Text, TraceOptions, Workload,
    WorkloadError,
};
use crate::rng::{seed_str, Draw};

#[derive(Deserialize)]
struct Conv {
    #[serde(default)]
    conversations: Vec<Msg>,
}

#[derive(Deserialize)]
struct Msg {
    from: String,
    value: String,
}

#[derive(PartialEq)]
enum Role {
    System,
    User,
    Assistant,
}

fn role(from: &str) -> Option<Role> {
    match from.to_ascii_lowercase().as_str() {
        "system" => Some(Role::System),
        "human" | "user" => Some(Role::User),
        "gpt" | "assistant" | "chatgpt" | "bard" | "bing" | "model" => Some(Role::Assistant),
        _ => None,
    }
}

/// Parse a ShareGPT JSON file into sessions.
pub fn parse(
    bytes: &[u8],
    name: &str,
    opts: &TraceOptions,
    seed: u64,
    block_tokens: u32,
) -> Result<Workload, WorkloadError> {
    let convs: Vec<Conv> = serde_json::from_slice(bytes).map_err(|e| {
        WorkloadError::at(
            e.line(),
            format!("not ShareGPT JSON ({e}); expected [{{\"id\", \"conversations\": [{{\"from\", \"value\"}}]}}]"),
        )
    })?;
    let mut rng = crate::rng::rng(seed_str(seed, "sharegpt-arrivals"));
    let mut wl = Workload::new(
        format!("sharegpt:{name}"),
        seed,
        block_tokens,
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let mut t = 0.0;
    for c in convs {
        let mut system = None;
        let mut turns: Vec<(Text, Text)> = Vec::new();
        let mut pending_user: Option<String> = None;
        for m in c.conversations {
            match role(&m.from) {
                Some(Role::System) if turns.is_empty() && pending_user.is_none() => {
                    system = Some(Text::Lit(Arc::from(m.value.as_str())));
                }
                Some(Role::User) => pending_user = Some(m.value),
                Some(Role::Assistant) => {
                    if let Some(u) = pending_user.take() {
                        turns.push((
                            Text::Lit(Arc::from(u.as_str())),
                            Text::Lit(Arc::from(m.value.as_str())),
                        ));
                    }
                }
                _ => {}
            }
            if opts.max_turns > 0 && turns.len() >= opts.max_turns {
                break;
            }
        }
        if turns.is_empty() {
            continue;
        }
        let conv = wl.convs.len() as u32;
        let session = wl.sessions.len() as u32;
        let mut reqs = Vec::new();
        let mut think = Vec::new();
        for (k, (_, a)) in turns.iter().enumerate() {
            let idx = wl.requests.len() as u32;
            wl.requests.push(Request {
                kind: Kind::Chat {
                    conv,
                    turn: k as u32,
                },
                output_tokens: (a.len() as u64).div_ceil(4).max(1),
                prompt: prefix_router_replica::Prompt::uncacheable(0, block_tokens),
                remember: None,
                session,
                turn: k as u32,
            });
            reqs.push(idx);
            think.push(if k == 0 { 0.0 } else { rng.exp(opts.think_s) });
        }
        wl.convs.push(Conversation { system, turns });
        wl.sessions.push(Session {
            start: t,
            requests: reqs,
            think,
        });
        t += rng.exp(1.0 / opts.session_rate.max(1e-9));
        if opts.limit > 0 && wl.requests.len() >= opts.limit {
            break;
        }
    }
    if wl.requests.is_empty() {
        return Err(WorkloadError::new(
            "no conversation with a user turn followed by an answer",
        ));
    }
    fill_chat_prompts(&mut wl);
    Ok(wl)
}
