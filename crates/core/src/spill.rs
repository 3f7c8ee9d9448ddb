//! The priced spill (`cost.mode = "spill"`, the default): a request stays
//! where every proxy presumes its prefix is cached unless leaving saves more
//! time than the miss costs the fleet.
//!
//! ## Algorithm
//! 1. **Candidates** (at most [`CANDIDATES`], eligible hosts only): the
//!    ring walk of the request's *group* key (the key region capped at
//!    `key.prefix_bytes`: a long shared preamble, such as a system prompt or
//!    a document, is one group), the owner first. The first candidate `o`
//!    is where every proxy sends the request, so every proxy presumes it
//!    holds the prompt, or will after this request: a conversation's next
//!    turn comes back to it. The rest are the group's ring successors, as
//!    in consistent hashing with bounded loads: a hot group's overflow goes
//!    where its earlier overflow went, so a hot document or system prompt
//!    is copied onto the fewest replicas, the same ones from every proxy.
//!    A later turn whose group lies wholly in the preamble
//!    ([`crate::Key::preamble_group`]: a system prompt or tools longer than
//!    `key.prefix_bytes`) takes its key's walk instead: an application's preamble
//!    is shared by all its conversations and soon held by every replica, so
//!    its owner would otherwise take every conversation's later turns. A
//!    first turn goes to the group's owner, where single prompts sharing
//!    the preamble meet, unless this proxy has seen a later turn under that
//!    preamble, or at least half the first turns under preambles it had not seen so
//!    opened conversations ([`Preambles`]): then it takes its key's walk
//!    too, and opens where its later turns go. A *cold* preamble, one
//!    that carries less of this proxy's recent requests than the bound's
//!    slack on one host (`(capacity_factor - 1) / hosts`: a document in a
//!    system prompt, read by a few), keeps every turn on the group's walk
//!    like any other group: all of its traffic fits on its owner within
//!    the bound, and spreading its conversations would re-prefill it on
//!    each replica they land on ([`Preambles::cold`]).
//!    Leaving costs re-prefilling the prompt: `held_s = prompt bytes /
//!    bytes_per_token / prefill_tokens_per_s`.
//! 2. **Waits**: `W_h = q_h x service_s`, `q_h` the prefill queue: the
//!    waiting requests in `h`'s fresh report (vLLM's
//!    `num_requests_waiting`, ORCA or scrape), faded by the report's age
//!    ([`crate::load::HostLoad::reported_queue`]); for a first turn, this
//!    proxy's own part of it counted live instead, its requests at `h`
//!    with no response byte yet
//!    ([`crate::load::HostLoad::fresh_queue`]). `None` without a fresh
//!    report; a first turn then counts this proxy's own part alone
//!    ([`Hosts::own`]).
//! 3. **A later turn** (a session or user key, or a conversation key whose
//!    prompt goes on past the first user message) stays at
//!    `o` under `o`'s bound (below), and over it leaves only as step 3's
//!    price allows, never by the bound alone (unless every candidate is
//!    over its bound, step 4): the bound's load is partly
//!    this proxy's own in-flight count, which the fleet's other proxies do
//!    not see, so moving a conversation by it would split the conversation
//!    between proxies. Without a fresh report for `o` a later turn stays.
//!    **A first turn under its bound** (`c^u` times the fleet's mean load,
//!    floor `min_capacity`; `u` in `[1, 2)` from the key's hash, so keys
//!    leave a loaded owner one by one as its load grows, the same keys each
//!    time) stays at `o` unless a candidate `j` under its own bound has
//!
//!    ```text
//!    (W_o - W_j) - held_s x (1 + q_j) x u  >  0
//!    ```
//!
//!    The wait saved must pay the re-prefill (`held_s`) and the delay that
//!    work adds to the `q_j` requests queued at `j`: under load a queue of
//!    `q` requests means a utilisation `rho` with `rho / (1 - rho)` about
//!    `q`, the delay a unit of work adds to those behind it, so a miss is
//!    worth more the busier the fleet is and hits are kept near
//!    saturation.
//! 4. **A first turn over its bound**: `o` gives way to the candidate under its bound
//!    with the largest `(W_o - W_j) - held_s x q_j x u` if it is not
//!    negative: against an idle candidate the bound decides, as in plain
//!    bounded loads. If none qualifies and the group has outgrown its
//!    candidates (every candidate after `o` over its bound in the fleet
//!    without `o`: `o`'s own pile must not raise that bar), the first
//!    host past them on the walk, under its bound, with
//!    `(W_o - W_j) - held_s x (1 + q_j) x u > 0` (it does not hold the
//!    group, so the move pays its own re-prefill too); else `o` keeps it.
//!    Without this, one key for all traffic (prompts sharing more than
//!    `key.prefix_bytes`) piled onto its four candidates while the rest of
//!    the fleet idled. If every candidate is over its bound and no host
//!    past them qualifies (a later turn: if every candidate is over its
//!    bound): plain bounded loads along the key's walk ([`Ring::place`]).
//! 5. **No fresh report for `o`**: a later turn stays at `o`. A first
//!    turn over `o`'s plain bound (`c`, not the per-key `c^u`) goes to the
//!    first candidate under its bound, else the key's walk ([`Ring::place`]):
//!    nothing then moves the conversation's later turns off `o`, so the
//!    bound decides; under it, `q_o` is this proxy's own requests waiting
//!    at `o` and step 3 prices it (behind vLLM, whose streams carry no
//!    ORCA, this proxy's own waiting requests are the only queue a first
//!    turn can weigh).
//!
//! Ties go to the earlier candidate.
//!
//! ## Consistency
//! What moves a later turn (a conversation that has a replica) is the same
//! in every proxy: the ring, the config, the request's own bytes and the
//! replicas' queues. A proxy's own in-flight requests enter only through
//! the bound's load ([`crate::load::HostLoad::effective`]: its in-flight
//! requests plus the report's requests beyond its own when the report was
//! taken), and only a first turn is ever moved by the bound alone: where a
//! conversation opens may differ between proxies, where it goes on does
//! not. A later turn's queue is the replica's report alone, which every
//! proxy that heard it weighs alike; a first turn's adds this proxy's own
//! part live, closer to the replica's queue than an old report (with
//! ORCA, older the more proxies there are), and so does the set of
//! preambles this proxy saw converse ([`Preambles`]). One per-proxy input
//! reaches a later turn: whether its application preamble is cold
//! ([`Preambles::cold`], its share of this proxy's recent requests), which
//! proxies of one fleet judge alike unless the share sits near the limit.
//! No prefix index, no gossip, no state per key. The measurements behind
//! each step: docs/design.md.
//!
//! ## Trade-offs
//! - Placement is by hash, not by load: with few conversations some
//!   replicas own more than their share (a multinomial draw), and only a
//!   queue, which every proxy sees alike, moves their later turns.
//! - No memory of a spill: a first turn moved off `o` leaves its
//!   conversation's next turn to come back to `o`, which must prefill it.
//! - The price reads `service_s` and `prefill_tokens_per_s` only as their
//!   product: both sides are prefill tokens, a queued request priced at
//!   `service_s x prefill_tokens_per_s` of them (8,000 by default) against
//!   the prompt's `prompt bytes / bytes_per_token`.
//! - Where single prompts are most of the first turns under preambles
//!   not seen to converse, a conversation under a new preamble opens at
//!   the preamble's owner and moves once, at its second turn.
//! - A preamble whose share crosses the cold limit moves its
//!   conversations once; bursty ones (an agent type idle for a while, then
//!   busy) split some tasks (the suite's agentic with 4 proxies, TTFT p90
//!   1.05-1.14x).
//!
//! ## Complexity
//! Two ring walks of at most [`CANDIDATES`] hosts and O(1) arithmetic per
//! candidate ([`place_by`] asks about those hosts only, and about the rest
//! of the walk only when every candidate is over its bound or the group
//! has outgrown them: O(hosts) then, as plain bounded loads); the bound's
//! total load comes in as one number ([`Hosts::total`]).

use crate::ring::{Bound, Ring};

/// Why the priced spill chose its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The first candidate (the group's or the key's owner).
    Owner,
    /// A later candidate, the first under its bound: its shorter wait
    /// pays the miss (step 3).
    Priced,
    /// A later candidate: the first was over its bound (step 4), or plain
    /// bounded loads decided (no fresh report, or every candidate over its
    /// bound).
    Bound,
}

impl Why {
    /// `owner`, `priced` or `bound` (the decision header's `why=`).
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Owner => "owner",
            Why::Priced => "priced",
            Why::Bound => "bound",
        }
    }
}

/// Where the rule placed a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Chosen host.
    pub host: usize,
    /// Its position on the key's walk over eligible hosts (0: the owner).
    pub rank: u32,
    /// Why.
    pub why: Why,
    /// The first candidate, `o`.
    pub owner: usize,
    /// The reported waits weighed, milliseconds: `W_o` and `W` of the
    /// chosen host (`None`: no fresh report for `o`, or bounded loads
    /// along the whole walk decided).
    pub wait_ms: Option<(u32, u32)>,
}

/// Slots of [`Preambles`].
pub const PREAMBLE_SLOTS: usize = 4096;

/// How many of the latest first turns under preambles not seen to
/// converse [`Preambles`] weighs (an exponential decay over about this many).
pub const PREAMBLE_HORIZON: f64 = 256.0;

/// The application preambles this proxy has seen carry a conversation's
/// later turns ([`crate::Key::preamble_group`]). Such a later turn takes
/// its key's walk; a first turn under a preamble in this set does too, so
/// it opens where its later turns go instead of at the preamble's owner.
/// A first turn cannot be told from a single prompt by its bytes, but the
/// preamble's history tells whether its application converses.
///
/// A preamble not in the set yet is judged by the others like it: of the
/// recent first turns under preambles not seen to converse, the share
/// that turned out to open a conversation (a later turn then put their
/// preamble in the set). If at least half did, a first turn under an
/// unseen preamble opens at its key's owner too: with many preambles and
/// few conversations each (a document in each system prompt), waiting
/// for each preamble's own later turn would split most conversations.
/// Single prompts under preambles never seen to converse (the GIE
/// shared-prefix benchmark) keep that share at 0 and meet at their
/// preamble's owner.
///
/// Each proxy learns it from its own traffic, and it moves first turns
/// only, where a conversation opens, which may differ between proxies;
/// later turns do not read it. A direct-mapped table of group hashes: O(1)
/// per request, 32 KiB; a collision forgets the older preamble.
///
/// It also keeps each preamble's share of the proxy's recent routed
/// requests (decayed over [`SHARE_HORIZON`]; a second direct-mapped table,
/// 96 KiB, where a collision costs the resident one count): a preamble
/// under the share limit is cold ([`Preambles::cold`]), and all of its
/// turns keep the group's walk. Later turns read this, so proxies agree
/// on a conversation as far as their shares agree: proxies of one fleet
/// see the same mix, and a preamble far from the limit (an application's
/// system prompt, a document read by a few) is on the same side in each.
/// One whose share crosses the limit moves its conversations once, as
/// when the traffic's mix changes.
#[derive(Debug, Clone)]
pub struct Preambles {
    slots: Vec<u64>,
    /// Decayed counts of first turns under preambles not in the set, and
    /// of those preambles' first later turns.
    opened: f64,
    conversed: f64,
    /// Each preamble's decayed count of requests ([`Preambles::cold`]).
    shares: Vec<Share>,
    /// The decayed count of every routed request, and how many were seen.
    total: f64,
    tick: u64,
}

/// A slot of [`Preambles`]' share table: a group, its decayed request
/// count, and the tick it was last brought up to date.
#[derive(Debug, Clone, Copy, Default)]
struct Share {
    group: u64,
    count: f64,
    tick: u64,
}

/// How many of the latest routed requests a preamble's share of the
/// traffic is measured over (an exponential decay over about this many).
pub const SHARE_HORIZON: f64 = 1024.0;

/// What a count keeps of itself per request counted ([`SHARE_HORIZON`]).
const SHARE_KEEP: f64 = 1.0 - 1.0 / SHARE_HORIZON;

/// What the opened and conversed counts keep per first turn counted
/// ([`PREAMBLE_HORIZON`]).
const PREAMBLE_KEEP: f64 = 1.0 - 1.0 / PREAMBLE_HORIZON;

impl Share {
    /// Its count at `tick`, decayed since it was brought up to date.
    fn at(&self, tick: u64) -> f64 {
        self.count * decay(SHARE_KEEP, tick - self.tick)
    }
}

impl Default for Preambles {
    fn default() -> Self {
        Preambles {
            slots: vec![0; PREAMBLE_SLOTS],
            opened: 0.0,
            conversed: 0.0,
            shares: vec![Share::default(); PREAMBLE_SLOTS],
            total: 0.0,
            tick: 0,
        }
    }
}

impl Preambles {
    /// The slot and stored value of a group (0 marks an empty slot).
    fn slot(group: u64) -> (usize, u64) {
        ((group % PREAMBLE_SLOTS as u64) as usize, group.max(1))
    }

    /// Whether a later turn under this group was seen.
    fn seen(&self, group: u64) -> bool {
        let (i, v) = Self::slot(group);
        self.slots.get(i) == Some(&v)
    }

    /// Count a routed request: `turn`, when it is under an application
    /// preamble ([`crate::Decision::preamble_turn`]), its group and
    /// whether it is a later turn (a later turn puts its group in the
    /// set).
    pub fn observe(&mut self, turn: Option<(u64, bool)>) {
        self.tick += 1;
        self.total = self.total * SHARE_KEEP + 1.0;
        let Some((group, later)) = turn else {
            return;
        };
        let tick = self.tick;
        let (i, v) = Self::slot(group);
        if let Some(s) = self.shares.get_mut(i) {
            let now = s.at(tick);
            *s = if s.group == v {
                Share {
                    group: v,
                    count: now + 1.0,
                    tick,
                }
            } else if now <= 1.0 {
                // A collision costs the resident one count: a preamble
                // busier than it takes the slot over.
                Share {
                    group: v,
                    count: 1.0,
                    tick,
                }
            } else {
                Share {
                    count: now - 1.0,
                    tick,
                    ..*s
                }
            };
        }
        if self.slots.get(i) == Some(&v) {
            return;
        }
        self.opened *= PREAMBLE_KEEP;
        self.conversed *= PREAMBLE_KEEP;
        if later {
            self.conversed += 1.0;
            if let Some(s) = self.slots.get_mut(i) {
                *s = v;
            }
        } else {
            self.opened += 1.0;
        }
    }

    /// Whether this preamble carries so little of the traffic that its
    /// conversations may all live where it is held: its share of the
    /// recent routed requests ([`SHARE_HORIZON`]) is under `limit`, the
    /// bound's slack on one host (`(capacity_factor - 1) / hosts`), so
    /// all of it fits on its owner within the bound. A proxy that has
    /// counted fewer than `1.5 / limit` requests judges as if it had: a
    /// preamble is hot there from its second request.
    pub fn cold(&self, group: u64, limit: f64) -> bool {
        if limit.is_nan() || limit <= 0.0 {
            return false;
        }
        let (i, v) = Self::slot(group);
        let count = match self.shares.get(i) {
            Some(s) if s.group == v => s.at(self.tick),
            _ => 0.0,
        };
        // Until 1.5 / limit requests were counted, as if they had been: a
        // preamble is hot there from its second request.
        count < limit * self.total.max(1.5 / limit)
    }

    /// Whether a first turn under this group opens at its key's owner:
    /// the group was seen to converse, or at least half the recent first
    /// turns under groups not seen yet opened a conversation.
    pub fn converses(&self, group: u64) -> bool {
        self.seen(group) || (self.conversed > 0.0 && 2.0 * self.conversed >= self.opened)
    }
}

/// `keep` to the power `n` (0 past any count that matters).
fn decay(keep: f64, n: u64) -> f64 {
    if n > 1 << 20 {
        0.0
    } else {
        // `as` is exact: n <= 2^20.
        keep.powi(n as i32)
    }
}

/// Seconds as whole milliseconds for the decision header (saturating).
pub fn ms(s: f64) -> u32 {
    // `as` saturates and maps NaN to 0.
    (s * 1000.0).round().max(0.0) as u32
}

/// The inputs of one placement.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Effective load per host (bounded-load fallback).
    pub loads: &'a [u64],
    /// Fresh reported prefill queue per host (`None`: no fresh report).
    pub queues: &'a [Option<f64>],
    /// Hosts that may be chosen.
    pub eligible: &'a [bool],
    /// Seconds of prefill the first candidate is presumed to save this
    /// request (its presumed cached prefix / prefill rate).
    pub held_s: f64,
    /// Seconds of wait per queued request.
    pub service_s: f64,
    /// The group key: its ring walk gives the candidates (`None`: the
    /// key's walk).
    pub group: Option<u64>,
    /// The request is not a later turn of a conversation (see step 3): the
    /// bound may move it, and a queue may move it under the owner's bound.
    /// A later turn moves only over the bound, and only as priced.
    pub first_turn: bool,
}

/// Hosts priced per request: the group's owner and its ring successors
/// (the key's when there is no group). More changes little (the simulator's suite: 2, 4
/// and 6 within a few percent); fewer leaves a hot group's overflow one
/// place to go.
pub const CANDIDATES: usize = 4;

/// What the rule reads of the hosts, asked host by host as the walks
/// reach them (a caller may read each host's state only then).
pub struct Hosts<'a> {
    /// The fleet's total effective load (the bound's `L`).
    pub total: u64,
    /// Effective load of a host.
    pub load: &'a dyn Fn(usize) -> u64,
    /// Fresh reported prefill queue of a host (`None`: no fresh report).
    pub queue: &'a dyn Fn(usize) -> Option<f64>,
    /// This proxy's own requests at a host with no response byte yet: a
    /// first turn's queue where the host has no fresh report (0 when the
    /// caller does not track them).
    pub own: &'a dyn Fn(usize) -> f64,
    /// Whether a host may be chosen.
    pub eligible: &'a dyn Fn(usize) -> bool,
}

/// The request's side of [`Inputs`]: everything but the hosts.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// [`Inputs::held_s`].
    pub held_s: f64,
    /// [`Inputs::service_s`].
    pub service_s: f64,
    /// [`Inputs::group`].
    pub group: Option<u64>,
    /// [`Inputs::first_turn`].
    pub first_turn: bool,
}

/// The candidate order: the ring walk of the group key (the key's when the
/// request has no group of its own), eligible hosts only, each once, at
/// most `n`.
fn candidates(
    ring: &Ring,
    key: u64,
    x: &Hosts<'_>,
    group: Option<u64>,
    n: usize,
) -> Vec<(usize, u32)> {
    let eligible = x.eligible;
    // (host, its position in the order counting the ineligible hosts
    // passed over: 0 for the first candidate when nothing was ejected).
    let mut out: Vec<(usize, u32)> = Vec::with_capacity(n);
    let mut passed = 0u32;
    for h in ring.walk(group.unwrap_or(key)) {
        if out.len() >= n {
            break;
        }
        if eligible(h) {
            out.push((h, passed + out.len() as u32));
        } else {
            passed += 1;
        }
    }
    out
}

/// This key's spread of the spill price, `1 + u` with `u` in `[0, 1)`
/// from the key's top 53 bits.
pub fn spread(key: u64) -> f64 {
    1.0 + (key >> 11) as f64 / (1u64 << 53) as f64
}

/// Plain bounded loads along the key's whole walk ([`Ring::place`]).
fn bounded(ring: &Ring, key: u64, bound: &Bound, x: &Hosts<'_>, owner: usize) -> Option<Placed> {
    ring.place_by(key, x.total, bound, x.load, x.eligible)
        .map(|p| Placed {
            host: p.host,
            rank: p.skipped,
            why: Why::Bound,
            owner,
            wait_ms: None,
        })
}

/// Whether a group has outgrown its candidates (step 4): every candidate
/// after the owner is over its bound in the fleet without the owner (the
/// owner's own pile must not raise the bar that says its overflow hosts
/// are full).
fn outgrown(
    ring: &Ring,
    total: u64,
    bound: &Bound,
    hosts: &Hosts<'_>,
    cands: &[(usize, u32)],
) -> bool {
    let Some(&(owner, _)) = cands.first() else {
        return false;
    };
    let rest = total.saturating_sub((hosts.load)(owner));
    cands.len() > 1
        && cands
            .iter()
            .skip(1)
            .all(|&(j, _)| (hosts.load)(j) >= ring.capacity(j, rest, bound))
}

/// The first host on `walk_key`'s walk that is `open` and whose `net` (of
/// its queue) is positive: (host, rank, net, its queue).
fn beyond(
    ring: &Ring,
    walk_key: u64,
    open: &dyn Fn(usize) -> bool,
    queue: &dyn Fn(usize) -> Option<f64>,
    net: impl Fn(f64) -> f64,
) -> Option<(usize, u32, f64, f64)> {
    for (rank, h) in ring.walk(walk_key).enumerate() {
        if !open(h) {
            continue;
        }
        let q = queue(h).unwrap_or(0.0).max(0.0);
        let v = net(q);
        if v > 0.0 {
            // `as` is exact: a walk is at most the hosts long.
            return Some((h, rank as u32, v, q));
        }
    }
    None
}

/// Place `key` by the priced spill; `None` only if no host is eligible.
pub fn place(ring: &Ring, key: u64, bound: &Bound, x: &Inputs<'_>) -> Option<Placed> {
    let hosts = Hosts {
        total: x.loads.iter().sum(),
        load: &|h| x.loads.get(h).copied().unwrap_or(0),
        queue: &|h| x.queues.get(h).copied().flatten(),
        own: &|_| 0.0,
        eligible: &|h| x.eligible.get(h).copied().unwrap_or(true),
    };
    let rule = Rule {
        held_s: x.held_s,
        service_s: x.service_s,
        group: x.group,
        first_turn: x.first_turn,
    };
    place_by(ring, key, bound, &hosts, &rule)
}

/// [`place`] reading the hosts through `x` as the walks reach them: the
/// candidates (and, only when every candidate is over its bound, the rest
/// of the key's walk up to the first host under its bound).
pub fn place_by(
    ring: &Ring,
    key: u64,
    bound: &Bound,
    hosts: &Hosts<'_>,
    x: &Rule,
) -> Option<Placed> {
    let n = CANDIDATES.min(ring.hosts());
    let cands = candidates(ring, key, hosts, x.group, n);
    let &(owner, owner_rank) = cands.first()?;
    let total = hosts.total;
    let under = |h: usize| (hosts.load)(h) < ring.capacity(h, total, bound);
    // A first turn's queue at a host with no fresh report: this proxy's
    // own part, known live.
    let queue = |h: usize| (hosts.queue)(h).or_else(|| x.first_turn.then(|| (hosts.own)(h)));
    let q_o = match (hosts.queue)(owner) {
        Some(q) => q,
        // No fresh report: a later turn stays (nothing every proxy sees
        // says to move it).
        None if !x.first_turn => {
            return Some(Placed {
                host: owner,
                rank: owner_rank,
                why: Why::Owner,
                owner,
                wait_ms: None,
            })
        }
        // A first turn: nothing can move the conversation's later turns
        // off `o` then, so its bound decides (bounded loads along the
        // candidates, then the walk); under it, this proxy's own
        // requests waiting there are the queue it knows, priced below.
        None => match cands.iter().find(|&&(h, _)| under(h)) {
            Some(&(h, _)) if h == owner => (hosts.own)(owner),
            Some(&(h, rank)) => {
                return Some(Placed {
                    host: h,
                    rank,
                    why: Why::Bound,
                    owner,
                    wait_ms: None,
                })
            }
            None => return bounded(ring, key, bound, hosts, owner),
        },
    };
    let w_o = q_o.max(0.0) * x.service_s;
    let u = spread(key);
    let keyed = Bound {
        factor: bound.factor.powf(u),
        ..*bound
    };
    let owner_over = (hosts.load)(owner) >= ring.capacity(owner, total, &keyed);
    if !owner_over && !x.first_turn {
        return Some(Placed {
            host: owner,
            rank: owner_rank,
            why: Why::Owner,
            owner,
            wait_ms: Some((ms(w_o), ms(w_o))),
        });
    }
    // Only a first turn is priced as over its bound: a later turn over it
    // still leaves only where the reports price it as under it (the bound's
    // load is partly this proxy's own in-flight count, which another proxy
    // does not see).
    let over = owner_over && x.first_turn;
    // (host, rank, net saving, its wait)
    let mut best: Option<(usize, u32, f64, f64)> = None;
    let mut any_under = false;
    for &(j, rank) in cands.iter().skip(1) {
        if !under(j) {
            continue;
        }
        any_under = true;
        let q = queue(j).unwrap_or(0.0).max(0.0);
        let saved = w_o - q * x.service_s;
        // Over its bound the owner gives way unless the miss's delay to
        // those queued at `j` outweighs the wait saved; under it, the wait
        // saved must also pay this request's own re-prefill.
        let (net, ok) = if over {
            let net = saved - x.held_s * q * u;
            (net, net >= 0.0)
        } else {
            let net = saved - x.held_s * (1.0 + q) * u;
            (net, net > 0.0)
        };
        if ok && best.is_none_or(|b| net > b.2) {
            best = Some((j, rank, net, q * x.service_s));
        }
    }
    // Step 4, past the candidates: a first turn over its owner's bound
    // that no candidate pays for, when the group has outgrown them.
    let best = match best {
        None if over && outgrown(ring, total, bound, hosts, &cands) => {
            let open =
                |h: usize| (hosts.eligible)(h) && under(h) && !cands.iter().any(|&(c, _)| c == h);
            beyond(ring, x.group.unwrap_or(key), &open, &queue, |q| {
                w_o - q * x.service_s - x.held_s * (1.0 + q) * u
            })
            .map(|(h, r, v, q)| (h, r, v, q * x.service_s))
        }
        b => b,
    };
    let best = match best {
        Some(b) => b,
        None if !owner_over || any_under => (owner, owner_rank, 0.0, w_o),
        None => {
            // The owner and every candidate over their bounds: bounded
            // loads along the whole walk.
            return bounded(ring, key, bound, hosts, owner);
        }
    };
    Some(Placed {
        host: best.0,
        rank: best.1,
        owner,
        wait_ms: Some((ms(w_o), ms(best.3))),
        why: match (best.0 == owner, over) {
            (true, _) => Why::Owner,
            (false, false) => Why::Priced,
            (false, true) => Why::Bound,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring(n: usize) -> Ring {
        let names: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:8000")).collect();
        Ring::new(names.iter().map(|s| (s.as_str(), 1.0)), 100)
    }

    fn bound() -> Bound {
        Bound {
            factor: 1.25,
            min_capacity: 8.0,
        }
    }

    fn order(r: &Ring, key: u64) -> Vec<usize> {
        r.walk(key).collect()
    }

    fn inputs<'a>(
        loads: &'a [u64],
        queues: &'a [Option<f64>],
        eligible: &'a [bool],
        held_s: f64,
    ) -> Inputs<'a> {
        Inputs {
            loads,
            queues,
            eligible,
            held_s,
            service_s: 0.5,
            group: None,
            first_turn: true,
        }
    }

    /// One key for all traffic (e.g. `/v1/completions` prompts sharing
    /// more than `key.prefix_bytes`): its owner and the three candidates
    /// after it are full and queued, four replicas idle.
    fn outgrown_fleet(
        r: &Ring,
        key: u64,
        rest_load: u64,
        rest_queue: f64,
    ) -> (Vec<u64>, Vec<Option<f64>>) {
        let w = order(r, key);
        let mut loads = vec![rest_load; 8];
        let mut queues = vec![Some(rest_queue); 8];
        loads[w[0]] = 300;
        queues[w[0]] = Some(290.0);
        for &j in &w[1..4] {
            loads[j] = 60;
            queues[j] = Some(50.0);
        }
        (loads, queues)
    }

    #[test]
    fn a_group_that_outgrew_its_candidates_overflows_to_an_idle_host_past_them() {
        let r = ring(8);
        let key = 42;
        let w = order(&r, key);
        let eligible = [true; 8];
        // The candidates are under their bound (the owner's pile raises
        // the fleet's mean) but over it in the fleet without the owner.
        // Idle hosts past them: the first on the walk takes it (the wait
        // saved, 145 s, pays re-prefilling 3 s there).
        let (loads, queues) = outgrown_fleet(&r, key, 0, 0.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &queues, &eligible, 3.0)).unwrap();
        assert_eq!(p.host, w[4]);
        assert_eq!(p.rank, 4);
        assert_eq!(p.why, Why::Bound);
        // No candidate pays for it: each is queued 50 deep (a miss there
        // delays them 3 s x 50 x u, more than the 120 s saved). Hosts
        // past them as loaded and queued: the owner keeps it (the fleet
        // is saturated; hits are capacity).
        let (loads, queues) = outgrown_fleet(&r, key, 60, 50.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &queues, &eligible, 3.0)).unwrap();
        assert_eq!((p.host, p.why), (w[0], Why::Owner));
        // A later turn never goes past the candidates.
        let (loads, queues) = outgrown_fleet(&r, key, 0, 0.0);
        let later = Inputs {
            first_turn: false,
            ..inputs(&loads, &queues, &eligible, 3.0)
        };
        let p = place(&r, key, &bound(), &later).unwrap();
        assert_eq!(p.host, w[0]);
    }

    #[test]
    fn a_new_prompt_takes_the_shortest_wait_under_the_bound() {
        let r = ring(4);
        let key = 42;
        let w = order(&r, key);
        let mut q = vec![Some(0.0); 4];
        q[w[0]] = Some(3.0);
        q[w[1]] = Some(1.0);
        let loads = vec![0; 4];
        let el = vec![true; 4];
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 0.0)).unwrap();
        assert_eq!((p.host, p.rank, p.why), (w[2], 2, Why::Priced));
        // Equal waits: ring order.
        let q = vec![Some(0.0); 4];
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 0.0)).unwrap();
        assert_eq!((p.host, p.why), (w[0], Why::Owner));
    }

    #[test]
    fn under_its_bound_a_prompt_leaves_only_if_the_wait_saved_pays_its_reprefill() {
        let r = ring(4);
        let key = 7;
        let w = order(&r, key);
        let loads = vec![1; 4];
        let el = vec![true; 4];
        // 3 queued at the owner (1.5 s) against re-prefilling 2 s elsewhere: stay.
        let mut q = vec![Some(0.0); 4];
        q[w[0]] = Some(3.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 2.0)).unwrap();
        assert_eq!((p.host, p.why), (w[0], Why::Owner));
        // 20 queued (10 s): the wait saved outweighs even the most spread price (2 x 2 s).
        q[w[0]] = Some(20.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 2.0)).unwrap();
        assert_eq!((p.host, p.why), (w[1], Why::Priced));
        // A short prompt (0.1 s) leaves a 3-deep queue.
        q[w[0]] = Some(3.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 0.1)).unwrap();
        assert_eq!((p.host, p.why), (w[1], Why::Priced));
    }

    #[test]
    fn over_its_bound_a_held_prompt_moves_to_an_idle_candidate_and_stays_against_a_queue() {
        let r = ring(4);
        let key = 9;
        let w = order(&r, key);
        // The owner is far over any bound (c^2 x mean of 33 / 4 < 20).
        let mut loads = vec![4; 4];
        loads[w[0]] = 21;
        let el = vec![true; 4];
        let mut q = vec![Some(0.0); 4];
        q[w[0]] = Some(2.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 2.0)).unwrap();
        assert_eq!(
            (p.host, p.why),
            (w[1], Why::Bound),
            "idle candidate: the bound decides"
        );
        // Every other candidate has a queue of 1: the wait saved (1 x 0.5 s)
        // is less than re-prefilling 2 s of prefix there (2 x 1 x u).
        let mut q = vec![Some(1.0); 4];
        q[w[0]] = Some(2.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 2.0)).unwrap();
        assert_eq!((p.host, p.why), (w[0], Why::Owner), "the hit is kept");
        // A long enough queue at the owner outweighs it.
        let mut q = vec![Some(1.0); 4];
        q[w[0]] = Some(30.0);
        let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 2.0)).unwrap();
        assert_ne!(p.host, w[0]);
    }

    #[test]
    fn over_its_bound_a_later_turn_leaves_only_where_the_reports_price_it() {
        let r = ring(4);
        let key = 9;
        let w = order(&r, key);
        // The owner is far over any bound, the others idle.
        let mut loads = vec![4; 4];
        loads[w[0]] = 21;
        let el = vec![true; 4];
        let mut q = vec![Some(0.0); 4];
        q[w[0]] = Some(2.0);
        let first = inputs(&loads, &q, &el, 2.0);
        let later = Inputs {
            first_turn: false,
            ..first
        };
        // A first turn gives way over the bound; a later turn keeps its hit:
        // 2 queued (1 s) do not pay re-prefilling 2 s of prefix elsewhere.
        assert_eq!(place(&r, key, &bound(), &first).unwrap().why, Why::Bound);
        let p = place(&r, key, &bound(), &later).unwrap();
        assert_eq!((p.host, p.why), (w[0], Why::Owner));
        // 30 queued (15 s) outweigh it: the reports move it.
        let mut q30 = q.clone();
        q30[w[0]] = Some(30.0);
        let p = place(
            &r,
            key,
            &bound(),
            &Inputs {
                queues: &q30,
                ..later
            },
        )
        .unwrap();
        assert_eq!((p.host, p.why), (w[1], Why::Priced));
        // Under its bound a later turn stays whatever the queue.
        let idle = vec![0; 4];
        let under = Inputs {
            loads: &idle,
            queues: &q30,
            ..later
        };
        let p = place(&r, key, &bound(), &under).unwrap();
        assert_eq!((p.host, p.why), (w[0], Why::Owner));
    }

    #[test]
    fn without_a_report_it_is_plain_bounded_loads() {
        let r = ring(5);
        let el = vec![true; 5];
        let q = vec![None; 5];
        for key in 0..200u64 {
            let key = crate::hash::hash(&key.to_le_bytes(), 3);
            let loads: Vec<u64> = (0..5).map(|i| (key >> (i * 3)) & 15).collect();
            let p = place(&r, key, &bound(), &inputs(&loads, &q, &el, 1.0)).unwrap();
            let want = r.place(key, &loads, &bound(), &el).unwrap();
            assert_eq!(p.host, want.host);
        }
    }

    #[test]
    fn the_group_owner_comes_first() {
        let r = ring(6);
        let (key, group) = (11u64, 0xdead_beef_u64);
        let g0 = r.owner(group).unwrap();
        let q = vec![Some(0.0); 6];
        let loads = vec![0; 6];
        let el = vec![true; 6];
        let mut x = inputs(&loads, &q, &el, 1.0);
        x.group = Some(group);
        let p = place(&r, key, &bound(), &x).unwrap();
        assert_eq!((p.host, p.rank), (g0, 0));
        // An ejected group owner: the group's ring successor.
        let g1 = r.walk(group).nth(1).unwrap();
        let mut el = vec![true; 6];
        el[g0] = false;
        x.eligible = &el;
        let p = place(&r, key, &bound(), &x).unwrap();
        assert_eq!((p.host, p.rank), (g1, 1));
    }

    #[test]
    fn a_hot_group_overflows_to_its_ring_successor_whatever_the_key() {
        let r = ring(6);
        let group = 0xdead_beef_u64;
        let w = order(&r, group);
        // The group's owner has a long queue, every other host none.
        let mut q = vec![Some(0.0); 6];
        q[w[0]] = Some(20.0);
        let loads = vec![0; 6];
        let el = vec![true; 6];
        let mut x = inputs(&loads, &q, &el, 0.5);
        x.group = Some(group);
        let mut owners = std::collections::BTreeSet::new();
        for i in 0..64u64 {
            let key = crate::hash::hash(&i.to_le_bytes(), 9);
            owners.insert(r.owner(key).unwrap());
            let p = place(&r, key, &bound(), &x).unwrap();
            // Equal prices: ties go to the earlier candidate, the
            // group's successor, the same host for every prompt of the
            // group (the keys' own owners are spread over the ring).
            assert_eq!((p.host, p.why), (w[1], Why::Priced), "key {key:x}");
        }
        assert!(owners.len() > 2, "the keys have several owners");
    }

    #[test]
    fn a_preamble_is_cold_while_its_share_fits_the_bound_slack_of_one_host() {
        // 8 hosts, capacity factor 1.25: the limit is 1/32 of the traffic.
        let limit = 0.25 / 8.0;
        let mut p = Preambles::default();
        // A fresh proxy judges as if it had counted 1.5 / limit requests:
        // a preamble is hot there from its second request.
        assert!(p.cold(7, limit), "nothing counted yet");
        p.observe(Some((7, false)));
        assert!(p.cold(7, limit), "one request");
        p.observe(Some((7, true)));
        assert!(!p.cold(7, limit), "two requests");
        // An application with a fifth of the traffic, 250 documents with
        // the rest, a few requests each.
        for i in 0..4000u64 {
            let turn = if i % 5 == 0 {
                Some((7, i > 0))
            } else {
                Some((1000 + i % 250, false))
            };
            p.observe(turn);
        }
        assert!(!p.cold(7, limit), "a fifth of the traffic is hot");
        assert!((1000..1250).all(|g| p.cold(g, limit)), "documents");
        assert!(p.cold(99, limit), "a preamble not seen yet");
        // The application falls to 1/100 of the traffic: cold; and back
        // to 1/20: hot again.
        let mix = |p: &mut Preambles, every: u64| {
            for i in 0..8000u64 {
                let turn = (i % every == 0).then_some((7, true));
                p.observe(turn.or(Some((5000 + i % 300, false))));
            }
        };
        mix(&mut p, 100);
        assert!(p.cold(7, limit), "1/100 of the traffic");
        mix(&mut p, 20);
        assert!(!p.cold(7, limit), "1/20 of it");
    }

    #[test]
    fn a_busier_preamble_takes_a_colliding_slot_over() {
        let limit = 0.25 / 8.0;
        let mut p = Preambles::default();
        let a = 3u64;
        let b = a + PREAMBLE_SLOTS as u64;
        for _ in 0..50 {
            p.observe(Some((a, true)));
        }
        assert!(!p.cold(a, limit));
        // b, in a's slot, with all the traffic from now on.
        for _ in 0..200 {
            p.observe(Some((b, true)));
        }
        assert!(!p.cold(b, limit), "b took the slot");
        assert!(p.cold(a, limit), "a lost it");
    }

    proptest! {
        #[test]
        fn the_choice_is_eligible(
            key in any::<u64>(),
            loads in proptest::collection::vec(0u64..40, 6),
            queues in proptest::collection::vec(proptest::option::of(0.0f64..30.0), 6),
            eligible in proptest::collection::vec(any::<bool>(), 6),
            held in 0.0f64..5.0,
        ) {
            let r = ring(6);
            let x = inputs(&loads, &queues, &eligible, held);
            match place(&r, key, &bound(), &x) {
                Some(p) => prop_assert!(eligible[p.host]),
                None => prop_assert!(eligible.iter().all(|e| !e)),
            }
        }
    }
}
