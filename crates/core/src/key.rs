//! The routing key: which prefix of the canonical stream goes on the ring.
//!
//! ## Decision
//! - `conversation` mode (default): the key is the chained hash of the
//!   canonical stream through the end of the **first user message** (tools,
//!   system prompt, first user turn). Every later turn of the conversation
//!   repeats exactly those bytes, so every turn gets the same key even though
//!   each turn is longer than the last; two conversations that share only a
//!   (long) system prompt differ in their first user message and get
//!   different keys, so a popular system prompt does not pile every
//!   conversation onto one replica. (In the Mooncake conversation trace every
//!   request shares its first 512-token block: keying on a fixed first chunk
//!   would send everything to one host.) Requests without message structure
//!   (`/v1/completions`) use the first `prefix_bytes` bytes.
//! - `prefix` mode: the key is the first `prefix_bytes` bytes (or the whole
//!   stream if shorter). Use it when clients put per-user text behind a long
//!   shared preamble and turns are not in message form. Short first turns
//!   then get a different key than their longer follow-ups: that is the
//!   trade-off.
//! - An explicit session (configured header, or the `user` field when
//!   `use_user_field` is on) overrides both: `key = xxh3(session, model_seed ^
//!   SESSION_SEED)`.
//!
//! The key of a prompt region is its chained prefix hash
//! ([`ChunkChain::prefix_hash`]): the same recurrence as the chunk chain, so
//! the key is `h_k` when the region ends on a chunk boundary. Only the key
//! region is hashed: bytes after it are not read by the hasher.

use crate::config::KeyMode;
use crate::extract::PromptSink;
use crate::hash::ChunkChain;

/// A [`PromptSink`] that computes the routing key.
#[derive(Debug, Clone)]
pub struct KeySink {
    chain: ChunkChain,
    limit: Option<u64>,
    use_anchor: bool,
    key: Option<u64>,
    /// Bytes hashed when the key was fixed.
    key_bytes: u64,
    /// Keep hashing the whole stream after the key (for the prefix index).
    whole: bool,
    /// Bytes of the group region: the key region capped at this.
    group_limit: u64,
    /// The group key, once fixed.
    group: Option<u64>,
    /// Every byte written, hashed or not.
    seen: u64,
    /// The key was fixed at the anchor (the end of the first user message).
    anchored: bool,
    /// Bytes before the first user message (the preamble), once it began.
    preamble: Option<u64>,
}

impl KeySink {
    /// A sink for `mode`; `structured` says whether the API has messages.
    pub fn new(
        seed: u64,
        chunk_bytes: usize,
        mode: KeyMode,
        prefix_bytes: u64,
        structured: bool,
    ) -> Self {
        let (limit, use_anchor) = match (mode, structured) {
            (KeyMode::Conversation, true) => (None, true),
            (KeyMode::Conversation, false) | (KeyMode::Prefix, _) => (Some(prefix_bytes), false),
        };
        KeySink {
            chain: ChunkChain::new(seed, chunk_bytes),
            limit,
            use_anchor,
            key: None,
            key_bytes: 0,
            whole: false,
            group_limit: prefix_bytes,
            group: None,
            seen: 0,
            anchored: false,
            preamble: None,
        }
    }

    /// Like [`KeySink::new`], and also hash the **whole** stream with one
    /// chain, recording `h_s, h_2s, ...` every `stride` chunks
    /// ([`ChunkChain::with_strided_history`]) for the prefix index
    /// ([`crate::index`]). The key and [`KeySink::bytes_hashed`] are exactly
    /// those of [`KeySink::new`]: the key region is a prefix of the stream,
    /// hashed by the same recurrence, so no byte is hashed twice.
    pub fn with_chain(
        seed: u64,
        chunk_bytes: usize,
        mode: KeyMode,
        prefix_bytes: u64,
        structured: bool,
        stride: u32,
    ) -> Self {
        let mut s = Self::new(seed, chunk_bytes, mode, prefix_bytes, structured);
        s.chain = ChunkChain::with_strided_history(seed, chunk_bytes, stride);
        s.whole = true;
        s
    }

    /// The key (the whole stream's prefix hash if no boundary was reached).
    pub fn key(&self) -> u64 {
        self.key.unwrap_or_else(|| self.chain.prefix_hash())
    }

    /// Bytes of the key region (the bytes fed to the hasher by
    /// [`KeySink::new`]).
    pub fn bytes_hashed(&self) -> u64 {
        if self.key.is_some() {
            self.key_bytes
        } else {
            self.chain.bytes()
        }
    }

    /// Bytes of the whole stream ([`KeySink::with_chain`]; otherwise the
    /// key region).
    pub fn stream_bytes(&self) -> u64 {
        self.chain.bytes()
    }

    /// The recorded strided chain of the whole stream
    /// ([`KeySink::with_chain`]; empty otherwise).
    pub fn chain_history(&self) -> &[u64] {
        self.chain.history()
    }

    /// Whether the key ends at the anchor (a conversation's opening: the
    /// end of the first user message), not at a byte limit or the end.
    pub fn anchored(&self) -> bool {
        self.anchored
    }

    /// Length of the whole canonical stream, bytes (hashed or not).
    pub fn seen_bytes(&self) -> u64 {
        self.seen
    }

    /// The group key: the chained hash of the key region capped at
    /// `prefix_bytes` (equal to [`KeySink::key`] when the key region is no
    /// longer).
    pub fn group(&self) -> u64 {
        self.group.unwrap_or_else(|| self.key())
    }

    /// The group region lies wholly in the preamble (tools, system prompt:
    /// an application's shared instructions, the same for all its
    /// conversations), and the key goes on past it to the first user
    /// message: the group is an application preamble, not the user's own
    /// content ([`crate::spill`] keys a later turn by its conversation).
    pub fn group_in_preamble(&self) -> bool {
        self.anchored
            && self.group.is_some()
            && self.group != self.key
            && self.preamble.is_some_and(|p| p >= self.group_limit)
    }

    fn fix_key(&mut self) {
        self.key = Some(self.chain.prefix_hash());
        self.key_bytes = self.chain.bytes();
        if self.group.is_none() {
            self.group = self.key;
        }
    }

    fn write_inner(&mut self, bytes: &[u8]) {
        if self.key.is_some() {
            if self.whole {
                self.chain.write(bytes);
            }
            return;
        }
        if let Some(limit) = self.limit {
            let room = limit.saturating_sub(self.chain.bytes());
            if bytes.len() as u64 >= room {
                let split = (room as usize).min(bytes.len());
                let (head, tail) = bytes.split_at(split);
                self.chain.write(head);
                self.fix_key();
                if self.whole {
                    self.chain.write(tail);
                }
                return;
            }
        }
        self.chain.write(bytes);
    }
}

impl PromptSink for KeySink {
    fn write(&mut self, bytes: &[u8]) {
        self.seen = self.seen.saturating_add(bytes.len() as u64);
        if self.group.is_none() && self.key.is_none() {
            let room = self.group_limit.saturating_sub(self.chain.bytes());
            if bytes.len() as u64 >= room {
                let split = (room as usize).min(bytes.len());
                let (head, tail) = bytes.split_at(split);
                self.write_inner(head);
                if self.group.is_none() {
                    self.group = Some(self.chain.prefix_hash());
                }
                self.write_inner(tail);
                return;
            }
        }
        self.write_inner(bytes);
    }

    fn user_start(&mut self) {
        if self.preamble.is_none() {
            self.preamble = Some(self.seen);
        }
    }

    fn anchor(&mut self) {
        if self.use_anchor && self.key.is_none() {
            self.fix_key();
            self.anchored = true;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::extract::{extract, Api};

    fn key(mode: KeyMode, api: Api, body: &str) -> (u64, u64) {
        let mut s = KeySink::new(1, 64, mode, 32, api.structured());
        extract(api, body.as_bytes(), &mut s).unwrap();
        (s.key(), s.bytes_hashed())
    }

    fn chat(system: &str, turns: &[&str]) -> String {
        let mut msgs = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
        for (i, t) in turns.iter().enumerate() {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            msgs.push(format!(r#"{{"role":"{role}","content":"{t}"}}"#));
        }
        format!(r#"{{"model":"m","messages":[{}]}}"#, msgs.join(","))
    }

    #[test]
    fn conversation_turns_share_a_key() {
        let sys = "You are a helpful assistant. ".repeat(40);
        let t1 = chat(&sys, &["first question"]);
        let t2 = chat(&sys, &["first question", "answer", "second"]);
        let t3 = chat(&sys, &["first question", "answer", "second", "a2", "third"]);
        let k1 = key(KeyMode::Conversation, Api::ChatCompletions, &t1);
        assert_eq!(k1, key(KeyMode::Conversation, Api::ChatCompletions, &t2));
        assert_eq!(k1, key(KeyMode::Conversation, Api::ChatCompletions, &t3));
        // Only the key region was hashed.
        let (_, full) = {
            let mut v = Vec::new();
            extract(Api::ChatCompletions, t3.as_bytes(), &mut v).unwrap();
            (0, v.len() as u64)
        };
        assert!(k1.1 < full);
    }

    #[test]
    fn shared_system_prompt_does_not_collapse_conversations() {
        let sys = "Long shared system prompt. ".repeat(200);
        let a = chat(&sys, &["question A"]);
        let b = chat(&sys, &["question B"]);
        assert_ne!(
            key(KeyMode::Conversation, Api::ChatCompletions, &a).0,
            key(KeyMode::Conversation, Api::ChatCompletions, &b).0
        );
        // ... which prefix mode with a short prefix does (documented trade-off).
        assert_eq!(
            key(KeyMode::Prefix, Api::ChatCompletions, &a).0,
            key(KeyMode::Prefix, Api::ChatCompletions, &b).0
        );
    }

    #[test]
    fn a_group_wholly_in_the_preamble_is_an_application_preamble() {
        let preamble = |system: &str, turns: &[&str], api: Api, body: Option<String>| {
            let body = body.unwrap_or_else(|| chat(system, turns));
            let mut s = KeySink::new(1, 64, KeyMode::Conversation, 32, api.structured());
            extract(api, body.as_bytes(), &mut s).unwrap();
            s.group_in_preamble()
        };
        let long = "Long shared system prompt. ".repeat(4);
        // The group (32 bytes here) ends inside the system prompt: yes, on
        // every turn.
        assert!(preamble(&long, &["question A"], Api::ChatCompletions, None));
        assert!(preamble(
            &long,
            &["question A", "answer", "again"],
            Api::ChatCompletions,
            None
        ));
        // A short system prompt: the group takes in the user's own text.
        assert!(!preamble(
            "short",
            &["a long document ".repeat(9).as_str()],
            Api::ChatCompletions,
            None
        ));
        // The key region no longer than the group: no separate group.
        assert!(!preamble("s", &["q"], Api::ChatCompletions, None));
        // No messages: no preamble.
        let c = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(100));
        assert!(!preamble("", &[], Api::Completions, Some(c)));
        // Responses with a string input and long instructions.
        let r = format!(r#"{{"instructions":"{long}","input":"hi there"}}"#);
        assert!(preamble("", &[], Api::Responses, Some(r)));
    }

    #[test]
    fn completions_use_prefix_bytes() {
        let (a, n) = key(
            KeyMode::Conversation,
            Api::Completions,
            &format!(r#"{{"prompt":"{}"}}"#, "x".repeat(100)),
        );
        assert_eq!(n, 32);
        let (b, _) = key(
            KeyMode::Conversation,
            Api::Completions,
            &format!(r#"{{"prompt":"{}yyy"}}"#, "x".repeat(100)),
        );
        assert_eq!(a, b);
        let (c, m) = key(
            KeyMode::Conversation,
            Api::Completions,
            r#"{"prompt":"short"}"#,
        );
        assert_eq!(m, 5);
        assert_ne!(a, c);
    }

    /// `with_chain` yields the same key and key bytes as `new`, in every
    /// mode, and its chain is the whole stream's strided chain.
    #[test]
    fn with_chain_keeps_the_key() {
        let sys = "System prompt text. ".repeat(60);
        let bodies = [
            (Api::ChatCompletions, chat(&sys, &["q1", "a1", "q2"])),
            (Api::ChatCompletions, chat("s", &["q"])),
            (
                Api::Completions,
                format!(r#"{{"prompt":"{}"}}"#, "p".repeat(3000)),
            ),
            (Api::Completions, r#"{"prompt":"tiny"}"#.to_string()),
        ];
        for mode in [KeyMode::Conversation, KeyMode::Prefix] {
            for (api, body) in &bodies {
                let mut a = KeySink::new(5, 64, mode, 100, api.structured());
                extract(*api, body.as_bytes(), &mut a).unwrap();
                let mut b = KeySink::with_chain(5, 64, mode, 100, api.structured(), 4);
                extract(*api, body.as_bytes(), &mut b).unwrap();
                assert_eq!(a.key(), b.key());
                assert_eq!(a.bytes_hashed(), b.bytes_hashed());
                let mut v = Vec::new();
                extract(*api, body.as_bytes(), &mut v).unwrap();
                assert_eq!(b.stream_bytes(), v.len() as u64);
                let all = crate::hash::chain_hashes(5, 64, &v);
                let want: Vec<u64> = all.iter().skip(3).step_by(4).copied().collect();
                assert_eq!(b.chain_history(), &want[..]);
            }
        }
    }

    #[test]
    fn key_equals_chain_recurrence() {
        // The key of a region is its chained prefix hash.
        let body = format!(r#"{{"prompt":"{}"}}"#, "z".repeat(200));
        let mut s = KeySink::new(9, 16, KeyMode::Prefix, 40, false);
        extract(Api::Completions, body.as_bytes(), &mut s).unwrap();
        let mut c = ChunkChain::new(9, 16);
        c.write(&[b'z'; 40]);
        assert_eq!(s.key(), c.prefix_hash());
    }
}
