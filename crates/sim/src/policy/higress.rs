//! Higress `ai-load-balancer`, policy `prefix_cache`, re-implemented from
//! `alibaba/higress`,
//! `plugins/wasm-go/extensions/ai-load-balancer/prefix_cache/lb_policy.go`
//! (read at commit `c43705f`; a Go proxy-wasm plugin that needs Redis and
//! Higress's Envoy fork for `GetUpstreamHosts` / `SetUpstreamOverrideHost`):
//!
//! * **Key.** Chat requests only. Walking `messages`, the plugin appends each
//!   message's `role:content` to a segment and closes the segment at every
//!   `user` message and at the last message; each segment is hashed (SHA-1
//!   there, xxh3 here) and XORed into the previous segment's key, so a
//!   conversation's turns form a chain of keys.
//! * **Lookup and placement** (one Redis script, shared by every gateway):
//!   walk the chain while a key exists and its host is healthy, refreshing
//!   each found key's TTL; the last found key's host is the target, however
//!   busy it is (no load term). With no match, "global least request": the
//!   fleet-wide count of requests in flight per host, kept in a Redis hash
//!   (incremented by the script, decremented when the stream ends), lowest
//!   count wins, equal counts broken at random, starting from a random
//!   healthy host. Then every chain key after the match is set to the
//!   target with the TTL (`redisKeyTTL`, default 1800 s).
//! * **Unkeyable requests** (no `messages`, a message without `role` or
//!   `content`, e.g. `/v1/completions`) continue to the cluster's own load
//!   balancing: round robin here, Envoy's default. So on a completions-only
//!   trace (Mooncake, Azure) the `higress` rows are round robin, with no
//!   cache affinity at all; [`crate::policy::PolicySpec::sees`] says so in
//!   the simulator's header.
//!
//! Modelling choices: one store for all proxies of a run (it is one Redis),
//! updated when the request is routed, as the script does, with no
//! latency (the plugin pauses every request for a Redis round trip; that
//! cost is not modelled). Every host is healthy. Option `blocks=B` (default
//! 0: off, as Higress behaves) also keys completions prompts, as segments
//! of `B` bytes: what the algorithm would do if it saw segment boundaries in
//! a token-block trace (Mooncake's text is 2048 bytes per 512-token block).
//! Option `ttl_s` (default 1800).
//!
//! Complexity per request: O(segments) store lookups plus O(hosts) for the
//! least-request scan; the store grows by one entry per new segment and
//! drops an entry when a lookup finds it expired.

use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::xxh3_64;

use super::{num, Choice, Outcome, Policy, SpecError, View};
use crate::hashers::{IdMap, IdSet};
use crate::input::RouteInput;
use crate::rng::{Draw, Rng};

/// `ttl_s`, `blocks`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Key TTL, seconds (Higress `redisKeyTTL`, default 1800).
    pub ttl_s: f64,
    /// Segment size for completions prompts, bytes (0: completions are not
    /// keyed, as in Higress).
    pub blocks: usize,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            ttl_s: 1800.0,
            blocks: 0,
        }
    }
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "ttl_s" => p.ttl_s = num(k, v)?,
                "blocks" => p.blocks = num(k, v)? as usize,
                _ => return Err(SpecError(format!("higress: unknown option {k:?}"))),
            }
        }
        Ok(p)
    }
}

/// The Redis state every gateway shares: chain key -> (host, expiry), and
/// the fleet-wide in-flight count per host.
#[derive(Debug, Default)]
pub struct Store {
    keys: IdMap<u64, (u32, f64)>,
    inflight: Vec<u64>,
}

/// A store shared by the proxies of one run.
pub type Shared = Arc<Mutex<Store>>;

impl Store {
    /// An empty store for `hosts` hosts.
    pub fn shared(hosts: usize) -> Shared {
        Arc::new(Mutex::new(Store {
            keys: IdMap::default(),
            inflight: vec![0; hosts],
        }))
    }
}

/// One Higress gateway.
pub struct Higress {
    p: Params,
    n: usize,
    store: Shared,
    rng: Rng,
    rr: usize,
    /// Requests this gateway counted in the store's in-flight hash.
    counted: IdSet<u64>,
}

impl Higress {
    /// Gateway `proxy` of a fleet sharing `store`.
    pub fn new(p: Params, hosts: usize, proxy: usize, seed: u64, store: Shared) -> Self {
        Higress {
            p,
            n: hosts.max(1),
            store,
            rng: crate::rng::rng(seed),
            rr: proxy,
            counted: IdSet::default(),
        }
    }

    /// The chain of segment keys, or `None` when the plugin would not key
    /// the request.
    fn chain(&self, input: &RouteInput<'_>) -> Option<Vec<u64>> {
        let v: serde_json::Value = serde_json::from_slice(input.body()).ok()?;
        let mut seg_hashes = Vec::new();
        if let Some(msgs) = v.get("messages").and_then(|m| m.as_array()) {
            let mut seg: Vec<u8> = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                let role = m.get("role")?.as_str()?;
                // Higress reads `content` as a string (gjson `.String()`):
                // an array of parts would be its raw JSON; strings here.
                let content = match m.get("content")? {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                seg.extend_from_slice(role.as_bytes());
                seg.push(b':');
                seg.extend_from_slice(content.as_bytes());
                if role == "user" || i + 1 == msgs.len() {
                    seg_hashes.push(xxh3_64(&seg));
                    seg.clear();
                }
            }
        } else if self.p.blocks > 0 {
            let prompt = v.get("prompt")?.as_str()?;
            seg_hashes.extend(prompt.as_bytes().chunks(self.p.blocks).map(xxh3_64));
        }
        if seg_hashes.is_empty() {
            return None;
        }
        let mut key = 0u64;
        Some(
            seg_hashes
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    key = if i == 0 { h } else { key ^ h };
                    key
                })
                .collect(),
        )
    }
}

impl Policy for Higress {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let Some(chain) = self.chain(input) else {
            let host = self.rr % self.n;
            self.rr = self.rr.wrapping_add(1);
            return Choice {
                host,
                outcome: Outcome::Fallback,
            };
        };
        let default = self.rng.below(self.n as u64) as usize;
        let now = view.now;
        let ttl = self.p.ttl_s;
        let Ok(mut st) = self.store.lock() else {
            return Choice {
                host: default,
                outcome: Outcome::Fallback,
            };
        };
        // Longest chain prefix whose key is alive.
        let mut found: Option<(usize, u32)> = None;
        for (i, k) in chain.iter().enumerate() {
            match st.keys.get(k).copied() {
                Some((h, exp)) if exp > now => {
                    st.keys.insert(*k, (h, now + ttl));
                    found = Some((i, h));
                }
                Some(_) => {
                    st.keys.remove(k);
                    break;
                }
                None => break,
            }
        }
        let (host, from, outcome) = match found {
            Some((i, h)) => (h as usize, i + 1, Outcome::Affinity),
            None => {
                // Least global in-flight count, random among equals.
                let mut best = default;
                let mut ties = 1u64;
                for h in 0..self.n {
                    if h == default {
                        continue;
                    }
                    let c = st.inflight.get(h).copied().unwrap_or(0);
                    let b = st.inflight.get(best).copied().unwrap_or(0);
                    if c < b {
                        best = h;
                        ties = 1;
                    } else if c == b {
                        ties += 1;
                        if self.rng.below(ties) == 0 {
                            best = h;
                        }
                    }
                }
                (best, 0, Outcome::Balance)
            }
        };
        for k in chain.iter().skip(from) {
            st.keys.insert(*k, (host as u32, now + ttl));
        }
        if let Some(c) = st.inflight.get_mut(host) {
            *c += 1;
        }
        drop(st);
        self.counted.insert(input.id);
        Choice { host, outcome }
    }

    fn on_done(&mut self, id: u64, host: usize) {
        if self.counted.remove(&id) {
            if let Ok(mut st) = self.store.lock() {
                if let Some(c) = st.inflight.get_mut(host) {
                    *c = c.saturating_sub(1);
                }
            }
        }
    }
}
