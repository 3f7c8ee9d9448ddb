//! `agentic`: agent tool loops with long, growing contexts.
//!
//! Each session is one agent task, closed loop: the model answers with a
//! short tool call, the tool runs (`think`, exponential, the tool's
//! latency), its result comes back as the next user message, and so on for
//! the task's steps. The context grows by a whole tool result each step
//! (file contents, search results, logs), so late steps carry tens of
//! thousands of tokens of which all but the newest tool result and call are
//! the previous step's prompt: almost everything is a hit on the replica
//! that served the previous step, and a miss there costs a long prefill.
//!
//! * `groups` agent types, each with its own system prompt of `system`
//!   tokens (instructions and tool definitions), shared by every task of
//!   that type;
//! * `groups x users` tasks, each of a type drawn uniformly, starting as a
//!   Poisson process at `session_rate` per second;
//! * the task's first message: `question` tokens;
//! * steps per task: uniform in `[turns/2, 3 turns/2]` (at least 1);
//! * each tool call: uniform in `[output/2, 3 output/2]` tokens (generated,
//!   so output length); each tool result: log-uniform in
//!   `[tool/4, 5 tool/2]` tokens (mean about `tool`).
//!
//! Not modeled on a recording: a shape, deterministic for a seed.

use super::synthetic::{push_chat_session, Spec, ANS, QST, SYS};
use super::{Conversation, Text, Workload};
use crate::rng::{seed2, Draw, Rng};

/// Append the sessions of `spec` to `wl` (prompts are filled by the caller).
pub(super) fn build(spec: &Spec, seed: u64, block_tokens: u32, wl: &mut Workload, rng: &mut Rng) {
    let n = spec.groups * spec.users;
    let lo_steps = (spec.turns / 2).max(1);
    let hi_steps = (spec.turns * 3 / 2).max(lo_steps);
    let tool = f64::from(spec.tool.max(1));
    let (tool_lo, tool_hi) = ((tool / 4.0).ln(), (tool * 2.5).ln());
    let out_lo = (spec.output / 2).max(1);
    let out_hi = (spec.output * 3 / 2).max(out_lo);
    let mut t = 0.0;
    for s in 0..n {
        let g = rng.below(spec.groups as u64);
        let steps = lo_steps + rng.below((hi_steps - lo_steps + 1) as u64) as usize;
        let sk = seed2(seed ^ QST, s as u64);
        let ak = seed2(seed ^ ANS, s as u64);
        let mut turns = Vec::with_capacity(steps);
        let mut outputs = Vec::with_capacity(steps);
        for k in 0..steps {
            let user_tokens = if k == 0 {
                spec.question
            } else {
                (tool_lo + (tool_hi - tool_lo) * rng.unit()).exp().round() as u32
            };
            let out = out_lo + rng.below(out_hi - out_lo + 1);
            outputs.push(out);
            turns.push((
                Text::Gen {
                    key: seed2(sk, k as u64),
                    len: user_tokens.max(1) * 4,
                },
                Text::Gen {
                    key: seed2(ak, k as u64),
                    len: (out * 4) as u32,
                },
            ));
        }
        let conv = wl.convs.len() as u32;
        wl.convs.push(Conversation {
            system: (spec.system > 0).then(|| Text::Gen {
                key: seed2(seed ^ SYS ^ 0x0061_6765_6e74, g),
                len: spec.system * 4,
            }),
            turns,
        });
        push_chat_session(wl, (conv, s), t, outputs, (spec.think, block_tokens), rng);
        t += rng.exp(1.0 / spec.session_rate);
    }
}
