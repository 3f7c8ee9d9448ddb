//! NVIDIA Dynamo's KV-aware router, re-implemented from Dynamo **1.6.1**
//! (crate `dynamo-kv-router` 1.6.1, `ai-dynamo/dynamo` commit `0d9c24a8`,
//! path `lib/kv-router`):
//!
//! * `src/scheduling/selector/reference.rs` (`DefaultWorkerSelector`'s
//!   cost) and `src/scheduling/config.rs` (`KvRouterConfig::default()`):
//!
//!   ```text
//!   overlap_w         = leading request blocks cached on worker w (indexer, fed by KV events)
//!   raw_prefill_w     = (active prefill tokens on w + isl) / block
//!   prefill_cost_w    = prefill_load_scale * max(0, raw_prefill_w - overlap_score_credit * overlap_w)
//!   decode_cost_w     = potential decode blocks of w (below)
//!   logit_w           = prefill_cost_w + decode_cost_w
//!   ```
//!
//!   lowest logit wins, ties at random (`router_temperature` 0). Defaults:
//!   `overlap_score_credit` 1, `prefill_load_scale` 1,
//!   `overlap_score_credit_decay` 0, `decode_active_request_weight` 0, no
//!   host/disk tiers. Option `overlap_weight` is the deprecated
//!   `overlap_score_weight`, which 1.6.1 maps onto `prefill_load_scale`.
//! * `src/sequences/prompt_registry.rs` (`WorkerLoadProjection::
//!   potential_decode_blocks`, `project_loads_from_membership`): the decode
//!   term is "the blocks the worker would have if the request were
//!   scheduled there": the worker's distinct active blocks plus the
//!   request's blocks beyond the longest prefix it shares with the active
//!   sequences on that worker. Blocks are full blocks
//!   (`complete_block_count`); output blocks are not tracked
//!   (`router_track_output_blocks` false).
//! * `src/sequences/single.rs`: a request's prefill load is `isl - cached`
//!   tokens, cached as the indexer saw it at routing, removed when its
//!   prefill completes (the router sees the first token) or it finishes.
//!
//! **What the router knows of the caches.** Dynamo's indexer is a radix tree
//! fed by the workers' KV events (BlockStored / BlockRemoved). vLLM emits
//! BlockStored for a prompt's blocks after the engine step that computed
//! them and for generated blocks as they fill; the event then crosses the
//! event plane (ZMQ, NATS) to every router. Modelled here: a request's
//! prompt blocks are announced at its first token (the end of its prefill)
//! and reach the routers `kv_delay_ms` later (default 20 ms; 10-50 ms is the
//! plausible range of one engine step plus transport); its generated blocks
//! (the replica's `remember` of prompt + answer) are announced while it
//! decodes, so they are known when it finishes, or at first token + delay
//! if that is later. Every router instance of a fleet sees the same events
//! (one shared [`KvEvents`]). A block counts for overlap only while it is
//! also still in the replica's cache: removals are seen at once, a small
//! optimism in Dynamo's favour (a real router keeps a just-evicted block for
//! the event delay), as is a block evicted and re-inserted between two
//! lookups of it.
//!
//! **Not modelled.** The router-side queue (`router_queue_threshold`): 1.6.1
//! ships it off (`None`; Dynamo turned router queueing off by default in
//! v1.4.0), so the default router dispatches every request at once, as
//! here. With it on, requests are held while every worker's active prefill
//! tokens exceed `threshold x max_num_batched_tokens`; holding a request
//! needs an engine hook the simulator does not have.
//!
//! In-flight prefill tokens and active blocks are tracked by each router
//! instance for the requests it routed (`router_replica_sync` is off by
//! default).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prefix_router_replica::Replica;

use super::{num, Choice, Outcome, Policy, SpecError, View};
use crate::hashers::{IdMap, IdSet};
use crate::input::RouteInput;
use crate::rng::{Draw, Rng};

/// `overlap_weight` (= `prefill_load_scale`), `kv_delay_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub overlap_weight: f64,
    /// KV event delay: first token to the routers' index, seconds.
    pub kv_delay_s: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            overlap_weight: 1.0,
            kv_delay_s: 0.020,
        }
    }
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "overlap_weight" => p.overlap_weight = num(k, v)?,
                "kv_delay_ms" => p.kv_delay_s = num(k, v)? / 1000.0,
                _ => return Err(SpecError(format!("dynamo: unknown option {k:?}"))),
            }
        }
        Ok(p)
    }
}

/// The KV events every router of a fleet receives: stored blocks in flight
/// to the routers, and per replica the blocks announced stored.
#[derive(Debug, Default)]
pub struct KvEvents {
    /// (delivery time, replica, blocks), not yet delivered.
    pending: Vec<(f64, usize, Vec<u64>)>,
    /// Per replica: blocks announced stored and not seen removed.
    stored: Vec<IdSet<u64>>,
}

/// The event stream shared by the routers of one run.
pub type SharedEvents = Arc<Mutex<KvEvents>>;

impl KvEvents {
    /// An empty stream for `hosts` replicas.
    pub fn shared(hosts: usize) -> SharedEvents {
        Arc::new(Mutex::new(KvEvents {
            pending: Vec::new(),
            stored: (0..hosts).map(|_| IdSet::default()).collect(),
        }))
    }

    fn announce(&mut self, at: f64, host: usize, blocks: Vec<u64>) {
        if !blocks.is_empty() {
            self.pending.push((at, host, blocks));
        }
    }

    /// Deliver every event due by `now`; drop blocks the replicas no longer
    /// hold once a replica's set outgrows twice its cache.
    fn deliver(&mut self, now: f64, replicas: &[Replica]) {
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending.get(i).is_some_and(|e| e.0 <= now) {
                let (_, host, blocks) = self.pending.swap_remove(i);
                if let Some(set) = self.stored.get_mut(host) {
                    set.extend(blocks);
                }
            } else {
                i += 1;
            }
        }
        for (set, r) in self.stored.iter_mut().zip(replicas) {
            let cache = r.cache();
            let cap = cache.capacity_tokens() / u64::from(cache.block_tokens().max(1));
            if set.len() as u64 > 2 * cap + 1024 {
                set.retain(|b| cache.contains(*b));
            }
        }
    }

    /// Leading blocks of `blocks` the router believes `host` holds: announced
    /// and still cached. A block found evicted is forgotten (BlockRemoved).
    fn overlap(&mut self, host: usize, blocks: &[u64], replica: Option<&Replica>) -> u64 {
        let (Some(set), Some(r)) = (self.stored.get_mut(host), replica) else {
            return 0;
        };
        let mut n = 0;
        for b in blocks {
            if !set.contains(b) {
                break;
            }
            if !r.cache().contains(*b) {
                set.remove(b);
                break;
            }
            n += 1;
        }
        n
    }
}

struct Active {
    host: usize,
    new_tokens: u64,
    prefilling: bool,
    blocks: Vec<u64>,
    /// Blocks of prompt + answer (the replica's `remember`), if any.
    remember: Option<Vec<u64>>,
    /// When its first token came.
    first_token: Option<f64>,
}

#[derive(Default)]
struct Worker {
    prefill_tokens: u64,
    /// Distinct active full blocks, refcounted.
    blocks: IdMap<u64, u32>,
}

/// Dynamo KV router (one router instance).
pub struct Dynamo {
    p: Params,
    workers: Vec<Worker>,
    active: IdMap<u64, Active>,
    events: SharedEvents,
    rng: Rng,
    best: Vec<usize>,
    overlaps: Vec<u64>,
}

impl Dynamo {
    /// A router reading the KV events of `events`.
    pub fn new(p: Params, hosts: usize, seed: u64, events: SharedEvents) -> Self {
        Dynamo {
            p,
            workers: (0..hosts).map(|_| Worker::default()).collect(),
            active: HashMap::default(),
            events,
            rng: crate::rng::rng(seed),
            best: Vec::new(),
            overlaps: vec![0; hosts],
        }
    }

    /// Release a finished request's load; the blocks it leaves cached (if
    /// `at` is known) are announced.
    fn finish(&mut self, id: u64, at: Option<f64>) {
        let Some(a) = self.active.remove(&id) else {
            return;
        };
        if let (Some(t), Some(rem)) = (at, a.remember) {
            let due = t.max(a.first_token.unwrap_or(t) + self.p.kv_delay_s);
            if let Ok(mut ev) = self.events.lock() {
                ev.announce(due, a.host, rem);
            }
        }
        let Some(w) = self.workers.get_mut(a.host) else {
            return;
        };
        if a.prefilling {
            w.prefill_tokens = w.prefill_tokens.saturating_sub(a.new_tokens);
        }
        for b in &a.blocks {
            if let Some(c) = w.blocks.get_mut(b) {
                *c -= 1;
                if *c == 0 {
                    w.blocks.remove(b);
                }
            }
        }
    }
}

impl Policy for Dynamo {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let prompt = input.prompt();
        let bs = u64::from(prompt.block_tokens().max(1));
        let isl = prompt.tokens();
        let blocks = prompt.blocks();
        let n_blocks = blocks.len() as u64;
        if let Ok(mut ev) = self.events.lock() {
            ev.deliver(view.now, view.replicas);
            for (h, o) in self.overlaps.iter_mut().enumerate() {
                *o = ev.overlap(h, blocks, view.replicas.get(h));
            }
        }
        let mut best = f64::INFINITY;
        self.best.clear();
        let mut max_overlap = 0;
        for (h, w) in self.workers.iter().enumerate() {
            let overlap = self.overlaps.get(h).copied().unwrap_or(0);
            max_overlap = max_overlap.max(overlap);
            let raw_prefill = (w.prefill_tokens + isl) as f64 / bs as f64;
            let prefill_cost = self.p.overlap_weight * (raw_prefill - overlap as f64).max(0.0);
            let shared = blocks
                .iter()
                .take_while(|b| w.blocks.contains_key(b))
                .count() as u64;
            let decode_cost = (w.blocks.len() as u64 + n_blocks - shared) as f64;
            let logit = prefill_cost + decode_cost;
            if logit < best {
                best = logit;
                self.best.clear();
            }
            if logit == best {
                self.best.push(h);
            }
        }
        let i = self.rng.below(self.best.len() as u64) as usize;
        let host = self.best.get(i).copied().unwrap_or(0);
        let overlap = self.overlaps.get(host).copied().unwrap_or(0);
        let new_tokens = isl.saturating_sub(overlap * bs);
        if let Some(w) = self.workers.get_mut(host) {
            w.prefill_tokens += new_tokens;
            for &b in blocks {
                *w.blocks.entry(b).or_insert(0) += 1;
            }
        }
        self.active.insert(
            input.id,
            Active {
                host,
                new_tokens,
                prefilling: true,
                blocks: blocks.to_vec(),
                remember: input.req.remember.as_ref().map(|p| p.blocks().to_vec()),
                first_token: None,
            },
        );
        let outcome = if max_overlap == 0 {
            Outcome::Balance
        } else if overlap == max_overlap {
            Outcome::Affinity
        } else {
            Outcome::Spill
        };
        Choice { host, outcome }
    }

    fn on_first_token_at(&mut self, id: u64, _host: usize, t: f64) {
        let delay = self.p.kv_delay_s;
        let Some(a) = self.active.get_mut(&id) else {
            return;
        };
        a.first_token = Some(t);
        if a.prefilling {
            a.prefilling = false;
            if let Some(w) = self.workers.get_mut(a.host) {
                w.prefill_tokens = w.prefill_tokens.saturating_sub(a.new_tokens);
            }
            if let Ok(mut ev) = self.events.lock() {
                ev.announce(t + delay, a.host, a.blocks.clone());
            }
        }
    }

    fn on_done(&mut self, id: u64, _host: usize) {
        self.finish(id, None);
    }

    fn on_done_at(&mut self, id: u64, _host: usize, t: f64) {
        self.finish(id, Some(t));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::policy::PolicySpec;
    use crate::workload::synthetic;
    use prefix_router_replica::CostModel;

    fn cost() -> CostModel {
        CostModel {
            cache_capacity_tokens: 1 << 20,
            ..CostModel::default()
        }
    }

    /// A two-turn chat: request 0, then request 1 extending it.
    fn workload() -> crate::workload::Workload {
        let spec = synthetic::Spec::parse(
            "multi-turn:groups=1,users=1,turns=2,system=2000,question=200,output=50,think=0",
        )
        .unwrap();
        let wl = synthetic::build(&spec, 1, cost().block_tokens);
        assert_eq!((wl.requests[1].session, wl.requests[1].turn), (0, 1));
        wl
    }

    #[test]
    fn sees_a_prompt_only_after_its_kv_events_arrive() {
        let wl = workload();
        let mut replicas: Vec<Replica> = (0..2).map(|_| Replica::new(cost())).collect();
        let req = &wl.requests[0];
        // The prompt is on replica 1: admitted there, its prefill done at t0.
        replicas[1]
            .submit(0, req.prompt.clone(), req.output_tokens, 0.0)
            .unwrap();
        let t0 = replicas[1].next_event_time().unwrap();
        let _ = replicas[1].advance(t0);
        assert!(replicas[1].cache().lookup(req.prompt.blocks()) > 0);
        let events = KvEvents::shared(2);
        let mut d = Dynamo::new(Params::default(), 2, 1, events.clone());
        // Pretend this router routed it to replica 1 (its first token at t0).
        d.active.insert(
            0,
            Active {
                host: 1,
                new_tokens: req.prompt.tokens(),
                prefilling: true,
                blocks: req.prompt.blocks().to_vec(),
                remember: None,
                first_token: None,
            },
        );
        d.on_first_token_at(0, 1, t0);
        let probe = &wl.requests[0];
        let input = RouteInput::new(&wl, probe, 7);
        let inflight = [0u64; 2];
        let overlap_at = |d: &mut Dynamo, now: f64| {
            let view = View {
                now,
                inflight: &inflight,
                pending: &[],
                reports: &[None, None],
                replicas: &replicas,
            };
            let _ = d.route(&input, &view);
            d.active.remove(&7);
            d.overlaps[1]
        };
        // 5 ms after the prefill: the events are still on their way.
        assert_eq!(overlap_at(&mut d, t0 + 0.005), 0);
        // 60 ms after: delivered.
        assert!(overlap_at(&mut d, t0 + 0.060) > 0);
        // And a prompt admitted but not prefilled is never seen early.
        assert_eq!(events.lock().unwrap().stored[0].len(), 0);
    }

    #[test]
    fn a_prompt_just_admitted_is_not_seen() {
        let wl = workload();
        let spec = PolicySpec::parse("dynamo").unwrap();
        let mut fleet = spec.build_fleet(2, 1, 1, Some(1 << 20)).unwrap();
        let mut replicas: Vec<Replica> = (0..2).map(|_| Replica::new(cost())).collect();
        let req = &wl.requests[0];
        replicas[0]
            .submit(0, req.prompt.clone(), req.output_tokens, 0.0)
            .unwrap();
        // The cache already holds the blocks (admission), the router must not.
        assert!(replicas[0].cache().lookup(req.prompt.blocks()) > 0);
        let input = RouteInput::new(&wl, req, 1);
        let view = View {
            now: 0.001,
            inflight: &[0, 0],
            pending: &[],
            reports: &[None, None],
            replicas: &replicas,
        };
        let c = fleet[0].route(&input, &view);
        assert_eq!(c.outcome, Outcome::Balance);
    }

    #[test]
    fn decode_term_counts_the_requests_own_new_blocks() {
        // Two idle workers; worker 0 runs a request sharing the new one's
        // prefix, worker 1 an unrelated request with more distinct blocks.
        // Without the new request's own blocks the decode term prefers
        // worker 0 only by its smaller active set; with them, worker 0 adds
        // nothing for the shared prefix and wins by a margin.
        let wl = workload();
        let events = KvEvents::shared(2);
        let mut d = Dynamo::new(Params::default(), 2, 1, events);
        let req = &wl.requests[0];
        let blocks = req.prompt.blocks();
        assert!(blocks.len() >= 4);
        for &b in blocks {
            *d.workers[0].blocks.entry(b).or_insert(0) += 1;
        }
        for i in 0..(blocks.len() as u64 - 1) {
            *d.workers[1].blocks.entry(0xdead_0000 + i).or_insert(0) += 1;
        }
        let replicas: Vec<Replica> = (0..2).map(|_| Replica::new(cost())).collect();
        let input = RouteInput::new(&wl, req, 3);
        let view = View {
            now: 0.0,
            inflight: &[0, 0],
            pending: &[],
            reports: &[None, None],
            replicas: &replicas,
        };
        let c = d.route(&input, &view);
        // Worker 0: active n, new 0 -> n. Worker 1: active n-1, new n -> 2n-1.
        // (Without the new blocks worker 1 would win, n-1 < n.)
        assert_eq!(c.host, 0);
    }

    #[test]
    fn fleet_shares_one_event_stream() {
        let spec = PolicySpec::parse("dynamo:kv_delay_ms=0").unwrap();
        let wl = workload();
        let mut fleet = spec.build_fleet(2, 1, 2, Some(1 << 20)).unwrap();
        let mut replicas: Vec<Replica> = (0..2).map(|_| Replica::new(cost())).collect();
        let req = &wl.requests[0];
        // Proxy 0 routes it and sees its first token.
        let input = RouteInput::new(&wl, req, 0);
        let view = View {
            now: 0.0,
            inflight: &[0, 0],
            pending: &[],
            reports: &[None, None],
            replicas: &replicas,
        };
        let h = fleet[0].route(&input, &view).host;
        replicas[h]
            .submit(0, req.prompt.clone(), req.output_tokens, 0.0)
            .unwrap();
        let t0 = replicas[h].next_event_time().unwrap();
        let _ = replicas[h].advance(t0);
        fleet[0].on_first_token_at(0, h, t0);
        // Proxy 1 now sees the prefix on that replica.
        let next = &wl.requests[1];
        let input = RouteInput::new(&wl, next, 1);
        let view = View {
            now: t0 + 0.001,
            inflight: &[0, 0],
            pending: &[],
            reports: &[None, None],
            replicas: &replicas,
        };
        let c = fleet[1].route(&input, &view);
        assert_eq!((c.host, c.outcome), (h, Outcome::Affinity));
    }
}
