//! `rag`: many users sharing a few long documents (retrieval-augmented
//! chat over a small corpus).
//!
//! A corpus of `docs` documents, document `d` of `doc x (0.5 + u_d)` tokens
//! (`u_d` uniform in `[0, 1)`, fixed per seed). Each session is one user:
//! retrieval returns `k` distinct documents, each drawn by Zipf(`zipf`)
//! popularity (the most relevant first), and the first message is those
//! documents followed by the user's question (`question` tokens) after a
//! short shared system prompt (`system` tokens). Then `1..=turns` turns
//! (uniform), follow-up questions with think time, closed loop.
//!
//! Sharing is a tree, unlike the flat groups of `shared-prefix`: every
//! request shares the system prompt; those retrieving the same first
//! document share it too (a few long prefixes, very hot under Zipf); those
//! with the same first two share both; the question and later turns are
//! the user's own. The distinct two-document prefixes exceed one replica's
//! cache at the defaults, so where a document's users go matters.
//!
//! Sessions start as a Poisson process at `session_rate` per second;
//! `users` sessions in all. A shape, deterministic for a seed.

use std::sync::Arc;

use super::synthetic::{push_chat_session, Spec, ANS, QST, SYS};
use super::{Conversation, Text, Workload};
use crate::rng::{seed2, Draw, Rng, Zipf};

const DOC: u64 = 0x646f_6375_6d65_6e74; // "document"

/// Append the sessions of `spec` to `wl` (prompts are filled by the caller).
pub(super) fn build(spec: &Spec, seed: u64, block_tokens: u32, wl: &mut Workload, rng: &mut Rng) {
    let docs: Vec<Text> = (0..spec.docs)
        .map(|d| {
            let len = (f64::from(spec.doc) * (0.5 + rng.unit())).round().max(1.0) as u32;
            Text::Gen {
                key: seed2(seed ^ DOC, d as u64),
                len: len * 4,
            }
        })
        .collect();
    let system = Text::Gen {
        key: seed2(seed ^ SYS ^ DOC, 0),
        len: spec.system * 4,
    };
    let zipf = Zipf::new(spec.docs, spec.zipf);
    let mut t = 0.0;
    for s in 0..spec.users {
        let mut picked: Vec<usize> = Vec::with_capacity(spec.k);
        while picked.len() < spec.k {
            let d = zipf.sample(rng);
            if !picked.contains(&d) {
                picked.push(d);
            }
        }
        let turns_n = 1 + rng.below(spec.turns as u64) as usize;
        let sk = seed2(seed ^ QST ^ DOC, s as u64);
        let ak = seed2(seed ^ ANS ^ DOC, s as u64);
        let question = |k: usize| Text::Gen {
            key: seed2(sk, k as u64),
            len: spec.question * 4,
        };
        let mut turns = Vec::with_capacity(turns_n);
        for k in 0..turns_n {
            let user = if k == 0 {
                let mut parts: Vec<Text> = picked
                    .iter()
                    .filter_map(|&d| docs.get(d).cloned())
                    .collect();
                parts.push(question(0));
                Text::Cat(Arc::from(parts))
            } else {
                question(k)
            };
            turns.push((
                user,
                Text::Gen {
                    key: seed2(ak, k as u64),
                    len: (spec.output * 4) as u32,
                },
            ));
        }
        let conv = wl.convs.len() as u32;
        wl.convs.push(Conversation {
            system: (spec.system > 0).then(|| system.clone()),
            turns,
        });
        push_chat_session(
            wl,
            (conv, s),
            t,
            std::iter::repeat_n(spec.output, turns_n),
            (spec.think, block_tokens),
            rng,
        );
        t += rng.exp(1.0 / spec.session_rate);
    }
}
