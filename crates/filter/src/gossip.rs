//! Index gossip ([`prefix_router_core::gossip`]): each VM sends what its
//! responses taught it to the peer Envoys, and applies what peers send.
//!
//! - Sending: every VM keeps an outbox ([`crate::root::State::outbox`]);
//!   on its tick, when `gossip.interval_ms` has passed, it sends the queued
//!   observations as one batch to every peer with `dispatch_http_call`
//!   through `gossip.cluster`, the destination header naming the peer (the
//!   cluster's `override_host` policy picks it). Failures (dispatch error,
//!   non-2xx, timeout) are counted in `prefix_router.gossip.send_errors`
//!   and never touch requests; a lost batch is not resent. A dispatch Envoy
//!   refuses because it has no `gossip.cluster` is also counted in
//!   `prefix_router.gossip.unknown_cluster` and logged once per VM as an
//!   error naming the field.
//! - Receiving (`gossip.accept`): a POST to `gossip.path` is answered by
//!   the filter itself ([`apply`]; 204, or 400 with the reason) and never
//!   forwarded.
//! - Load gossip (`gossip.name`): each batch also carries this Envoy's
//!   pending prefill per replica; with no observation a batch is still
//!   sent when those values changed, or every five intervals (peers count
//!   a snapshot for ten: `peer_loads_max_age_ms`). A receiver keeps the
//!   newest per sender in shared data; the request path reads its listed
//!   peers' fresh values (`prefix_router_core::gossip::read_peer_pending`)
//!   into `HostLoad::peer_pending_tokens`, which the cost rule weighs
//!   against the replicas' reports (`cost::pending_with_peers`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use prefix_router_core::config::GossipConfig;
use prefix_router_core::gossip::{self, GossipError};
use prefix_router_core::shared_index;
use proxy_wasm::hostcalls;
use proxy_wasm::types::LogLevel;

use crate::host::{self, SharedData};
use crate::root::State;

/// Per-VM sending state.
#[derive(Debug, Default)]
pub struct Gossiper {
    /// Outstanding calls.
    pending: BTreeSet<u32>,
    /// When the next batch is due (host clock, ms).
    next_ms: u64,
    /// Load gossip: the pending prefill last sent, and when.
    last_loads: Vec<(String, u64)>,
    last_loads_ms: u64,
    /// Whether this VM logged that Envoy has no `gossip.cluster`.
    unknown_logged: bool,
}

/// A batch with loads but no observation is sent only when the loads
/// changed or this many intervals passed (peers count a snapshot for ten).
const LOADS_KEEPALIVE_INTERVALS: u64 = 5;

impl Gossiper {
    /// One tick: send the outbox if a batch is due. `tick_ms` is the tick
    /// period (a batch is due half a tick early rather than a tick late).
    pub fn tick(&mut self, st: &State, g: &GossipConfig, now: u64, tick_ms: u64) {
        if now.saturating_add(tick_ms / 2) < self.next_ms {
            return;
        }
        self.next_ms = now.saturating_add(g.interval_ms);
        // Calls still outstanding from the last batch timed out or were lost.
        if !self.pending.is_empty() {
            st.metrics
                .inc(st.metrics.gossip_send_errors, self.pending.len() as u64);
            self.pending.clear();
        }
        let (obs, dropped) = match st.outbox.try_borrow_mut() {
            Ok(mut o) => {
                let d = std::mem::take(&mut o.dropped);
                (o.take(), d)
            }
            Err(_) => {
                st.metrics.inc(st.metrics.host_errors, 1);
                return;
            }
        };
        st.metrics.inc(st.metrics.gossip_dropped, dropped);
        if g.peers.is_empty() {
            return;
        }
        // Load gossip: this Envoy's pending prefill per replica (a quiet
        // Envoy's zeros matter as much as a busy one's).
        let loads = g.name.as_ref().map(|name| gossip::Loads {
            sender: name.clone(),
            pending: st
                .router
                .config()
                .hosts
                .iter()
                .filter(|h| h.weight > 0.0)
                .map(|h| {
                    let t = shared_index::read_pending_tokens(&SharedData, &h.address)
                        .unwrap_or_else(|e| {
                            st.metrics.inc(st.metrics.host_errors, 1);
                            host::log(
                                LogLevel::Warn,
                                &format!(
                                    "prefix-router: reading pending prefill for gossip: {e:?}"
                                ),
                            );
                            0
                        });
                    (h.address.clone(), t)
                })
                .collect(),
        });
        let loads = loads.filter(|l| {
            let due = now.saturating_sub(self.last_loads_ms)
                >= g.interval_ms.saturating_mul(LOADS_KEEPALIVE_INTERVALS);
            !obs.is_empty() || due || l.pending != self.last_loads
        });
        if let Some(l) = &loads {
            self.last_loads.clone_from(&l.pending);
            self.last_loads_ms = now;
        }
        if obs.is_empty() && loads.is_none() {
            return;
        }
        let body = gossip::encode_batch(g.fingerprint, &obs, loads.as_ref());
        let dest = st.router.config().destination_header.as_str();
        for peer in &g.peers {
            let headers = vec![
                (":method", "POST"),
                (":path", g.path.as_str()),
                (":authority", peer.as_str()),
                ("content-type", "application/octet-stream"),
                (dest, peer.as_str()),
            ];
            match hostcalls::dispatch_http_call(
                &g.cluster,
                headers,
                Some(&body),
                vec![],
                Duration::from_millis(g.timeout_ms),
            ) {
                Ok(token) => {
                    self.pending.insert(token);
                    st.metrics.inc(st.metrics.gossip_sent, obs.len() as u64);
                }
                Err(e) => {
                    st.metrics.inc(st.metrics.gossip_send_errors, 1);
                    if !host::unknown_cluster(
                        e,
                        "gossip.cluster",
                        &g.cluster,
                        &st.metrics,
                        st.metrics.gossip_unknown_cluster,
                        &mut self.unknown_logged,
                    ) {
                        host::log(
                            LogLevel::Warn,
                            &format!("prefix-router: gossip to {peer} not dispatched: {e:?}"),
                        );
                    }
                }
            }
        }
    }

    /// A call answered; `false` if the token is not a gossip call.
    pub fn response(&mut self, token: u32, st: &State) -> bool {
        if !self.pending.remove(&token) {
            return false;
        }
        let status = host::call_response_header(":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        if !status.starts_with('2') {
            st.metrics.inc(st.metrics.gossip_send_errors, 1);
            host::log(
                LogLevel::Debug,
                &format!("prefix-router: gossip batch answered {status:?}"),
            );
        }
        true
    }
}

/// What a received batch did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Observations recorded.
    pub applied: u64,
    /// Observations naming a host not in this filter's `hosts`.
    pub unknown_host: u64,
    /// Peer load snapshots recorded (0 or 1).
    pub loads: u64,
}

/// Record a received batch in this Envoy's shared index, as if its
/// responses had been seen here: the prefix entries, and the host's
/// capacity clock advanced by the tokens it took in.
pub fn apply(st: &State, g: &GossipConfig, body: &[u8], now: u64) -> Result<Applied, GossipError> {
    let gossip::Batch {
        fingerprint: fp,
        observations: obs,
        loads,
    } = gossip::decode_batch(body)?;
    if fp != g.fingerprint {
        return Err(GossipError(format!(
            "fingerprint {fp:#x} is not this filter's {:#x}: peers must use the same chunk_bytes and prefix-router version",
            g.fingerprint
        )));
    }
    let cfg = st.router.config();
    let mut out = Applied::default();
    // One write per touched bucket for the whole batch, one capacity-clock
    // update per host (its tokens summed): see `observe_many`.
    let mut known: Vec<(usize, &[u64])> = Vec::with_capacity(obs.len());
    let mut tokens: BTreeMap<usize, u64> = BTreeMap::new();
    for o in &obs {
        let Some(idx) = cfg.host_index(&o.host) else {
            out.unknown_host += 1;
            continue;
        };
        known.push((idx, o.hashes.as_slice()));
        let t = tokens.entry(idx).or_default();
        *t = t.saturating_add(o.tokens);
    }
    if !known.is_empty() {
        let (done, err) = cfg.cost.shared.observe_many(&SharedData, &known, now);
        st.metrics.inc(st.metrics.index_observed, done.entries);
        st.metrics.add(st.metrics.index_used, done.bytes_delta);
        if let Some(e) = err {
            st.metrics.inc(st.metrics.host_errors, 1);
            host::log(
                LogLevel::Warn,
                &format!("prefix-router: applying gossip to the shared index: {e:?}"),
            );
        }
    }
    for (idx, t) in tokens {
        advance_capacity(st, idx, t, now);
    }
    out.applied = known.len() as u64;
    if let Some(l) = loads {
        match gossip::store_peer_pending(
            &SharedData,
            &l,
            cfg.hosts.len(),
            |a| cfg.host_index(a),
            now,
        ) {
            Ok(unknown) => {
                out.loads = 1;
                out.unknown_host += unknown;
            }
            Err(e) => {
                st.metrics.inc(st.metrics.host_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: storing a peer's pending prefill: {e:?}"),
                );
            }
        }
    }
    Ok(out)
}

/// Advance host `idx`'s capacity clock by `tokens` newly cached tokens,
/// forgetting its entries older than the new horizon (shared by the
/// response path and gossip).
pub fn advance_capacity(st: &State, idx: usize, tokens: u64, now: u64) {
    let budget = st.router.config().cost.index.host_tokens;
    if budget == 0 {
        return;
    }
    let err = |what: &str, e: &dyn std::fmt::Debug| {
        st.metrics.inc(st.metrics.host_errors, 1);
        host::log(LogLevel::Warn, &format!("prefix-router: {what}: {e:?}"));
    };
    match shared_index::advance_capacity(&SharedData, idx, tokens, budget, now) {
        Ok(Some(horizon)) => match shared_index::forget_hosts(&SharedData, &[idx], horizon) {
            Ok(()) => st.metrics.inc(st.metrics.forget_capacity, 1),
            Err(e) => err("raising a host's capacity horizon", &e),
        },
        Ok(None) => {}
        Err(e) => err("advancing a host's capacity clock", &e),
    }
}
