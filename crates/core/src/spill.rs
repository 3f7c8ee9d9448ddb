//! The priced spill: stay on the key's ring owner unless leaving it saves
//! the fleet more time than the miss costs.
//!
//! ## Algorithm
//! Walk the key's ring order over eligible hosts: `o` (the owner), then its
//! successors. Every proxy presumes `o` holds the key's prefix (every proxy
//! sends the key there), so a request sent elsewhere is a miss that
//! re-prefills the prompt.
//!
//! With a fresh reported prefill queue `q_h` (requests whose prefill has not
//! started: vLLM's `num_requests_waiting`) for the owner and a candidate `j`,
//! the cost of each choice in units of this prompt's prefill time is
//!
//! ```text
//! cost_o = q_o                      (wait behind the owner's queue)
//! cost_j = q_j + r (1 + q_j)        (wait at j, plus the miss's prefill
//!                                    priced at 1/(1 - rho_j) = 1 + q_j)
//! ```
//!
//! where `r` is this prompt's prefill relative to a queued request's. The
//! miss's price is its prefill plus the delay it adds to the requests
//! queued behind it at `j`: in a queue with utilisation rho a unit of work
//! delays later arrivals by rho / (1 - rho) units, and rho / (1 - rho) is
//! the queue length in service times, so a miss at a replica with `q_j`
//! waiting costs the fleet `r (1 + q_j)`. The cheapest of the owner and the
//! next candidates wins; ties go to the earlier host on the walk.
//!
//! Without a fresh report for the owner the rule is plain bounded loads
//! ([`Ring::place`]) on the effective load.
//!
//! ## Consistency
//! Every input that can move a request off its owner is one every proxy
//! sees alike: the ring, the config and the replicas' reports. A proxy's
//! own in-flight counts move a request only when the owner has no fresh
//! report.
//!
//! ## Complexity
//! The walk stops after `candidates` eligible hosts: O(candidates) host
//! reads and arithmetic per request.

use crate::ring::{Bound, Ring};

/// Why the priced spill chose its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The owner: its queue is no worse than any candidate's priced cost.
    Owner,
    /// A successor whose priced cost beat the owner's queue.
    Priced,
    /// No fresh report for the owner: bounded loads decided.
    Bound,
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
    /// The group key: its owner is the first candidate, then the key's walk.
    pub group: Option<u64>,
}

/// Hosts priced per request: the group's owner, then the key's owner and
/// its ring successors. More changes little (the simulator's suite: 2, 4
/// and 6 within a few percent); fewer leaves a hot group's overflow one
/// place to go.
pub const CANDIDATES: usize = 4;

/// The candidate order: the group owner (if any), then the key's walk,
/// eligible hosts only, each once, at most `n`.
fn candidates(ring: &Ring, key: u64, x: &Inputs<'_>, n: usize) -> Vec<usize> {
    let eligible = |h: usize| x.eligible.get(h).copied().unwrap_or(true);
    let mut out: Vec<usize> = Vec::with_capacity(n);
    if let Some(g) = x.group.filter(|&g| g != key) {
        if let Some(h) = ring.walk(g).find(|&h| eligible(h)) {
            out.push(h);
        }
    }
    for h in ring.walk(key) {
        if out.len() >= n {
            break;
        }
        if eligible(h) && !out.contains(&h) {
            out.push(h);
        }
    }
    out
}

/// Group keys this proxy has seen recently: a direct-mapped table of
/// `SEEN_SLOTS` (group key, last seen ms) pairs. A first turn whose long
/// shared preamble (its group) was seen here recently is presumed held by
/// the group's owner; one never seen is presumed held nowhere. Popular
/// groups are seen by every proxy, so proxies agree on them; a collision
/// only forgets a group early. O(1) per request, 16 KiB.
#[derive(Debug, Clone)]
pub struct Seen {
    slots: Vec<(u64, u64)>,
}

/// Slots of [`Seen`].
pub const SEEN_SLOTS: usize = 1024;
/// How long a group stays "seen" without a new request, ms.
pub const SEEN_MS: u64 = 300_000;

impl Default for Seen {
    fn default() -> Self {
        Seen {
            slots: vec![(0, 0); SEEN_SLOTS],
        }
    }
}

impl Seen {
    /// Whether `group` was seen within [`SEEN_MS`] of `now_ms`; records it.
    pub fn check_and_mark(&mut self, group: u64, now_ms: u64) -> bool {
        let i = (group % SEEN_SLOTS as u64) as usize;
        let Some(slot) = self.slots.get_mut(i) else {
            return false;
        };
        let seen = slot.0 == group && slot.1 > 0 && now_ms.saturating_sub(slot.1) <= SEEN_MS;
        *slot = (group, now_ms.max(1));
        seen
    }
}

/// This key's spread of the spill price, `1 + u` with `u` in `[0, 1)`
/// from the key's top 53 bits.
pub fn spread(key: u64) -> f64 {
    1.0 + (key >> 11) as f64 / (1u64 << 53) as f64
}

/// Place `key` by the priced spill; `None` only if no host is eligible.
pub fn place(ring: &Ring, key: u64, bound: &Bound, x: &Inputs<'_>) -> Option<Placed> {
    let n = CANDIDATES.min(ring.hosts());
    let cands = candidates(ring, key, x, n);
    let &owner = cands.first()?;
    let total: u64 = x.loads.iter().sum();
    let under = |h: usize| x.loads.get(h).copied().unwrap_or(0) < ring.capacity(h, total, bound);
    let Some(q_o) = x.queues.get(owner).copied().flatten() else {
        // No fresh report: bounded loads along the candidates, then the walk.
        if let Some((rank, &h)) = cands.iter().enumerate().find(|(_, &h)| under(h)) {
            return Some(Placed {
                host: h,
                rank: rank as u32,
                why: Why::Bound,
            });
        }
        let el: Vec<bool> = (0..ring.hosts())
            .map(|h| x.eligible.get(h).copied().unwrap_or(true))
            .collect();
        return ring.place(key, x.loads, bound, &el).map(|p| Placed {
            host: p.host,
            rank: p.skipped,
            why: Why::Bound,
        });
    };
    let w_o = q_o.max(0.0) * x.service_s;
    if x.held_s <= 0.0 {
        // Nothing presumed held anywhere: bounded loads, and among the
        // candidates under the bound the shortest reported wait (ring
        // order on ties).
        let mut best: Option<(usize, u32, f64)> = None;
        for (i, &h) in cands.iter().enumerate() {
            if !under(h) {
                continue;
            }
            let w = x.queues.get(h).copied().flatten().unwrap_or(0.0).max(0.0) * x.service_s;
            if best.is_none_or(|b| w < b.2) {
                best = Some((h, i as u32, w));
            }
        }
        return match best {
            Some((h, rank, _)) => Some(Placed {
                host: h,
                rank,
                why: if rank == 0 { Why::Owner } else { Why::Priced },
            }),
            None => {
                let el: Vec<bool> = (0..ring.hosts())
                    .map(|h| x.eligible.get(h).copied().unwrap_or(true))
                    .collect();
                ring.place(key, x.loads, bound, &el).map(|p| Placed {
                    host: p.host,
                    rank: p.skipped,
                    why: Why::Bound,
                })
            }
        };
    }
    // Something presumed held at the owner: it keeps the request while
    // under this key's bound, the capacity factor raised to `u` (keys leave
    // a loaded owner one by one as its load grows, and the same keys each
    // time). Over it, the request goes to the later candidate under its
    // bound with the best net saving, the wait saved less the miss's price,
    // if that is not negative: with equal queues the bound decides; against
    // a queued candidate the hit is kept unless the wait saved outweighs it.
    let u = spread(key);
    let keyed = Bound {
        factor: bound.factor.powf(u),
        ..*bound
    };
    if x.loads.get(owner).copied().unwrap_or(0) < ring.capacity(owner, total, &keyed) {
        return Some(Placed {
            host: owner,
            rank: 0,
            why: Why::Owner,
        });
    }
    let mut best: Option<(usize, u32, f64)> = None;
    let mut any_under = false;
    for (i, &j) in cands.iter().enumerate().skip(1) {
        if !under(j) {
            continue;
        }
        any_under = true;
        let q = x.queues.get(j).copied().flatten().unwrap_or(0.0).max(0.0);
        let net = (w_o - q * x.service_s) - x.held_s * q * u;
        if net >= 0.0 && best.is_none_or(|b| net > b.2) {
            best = Some((j, i as u32, net));
        }
    }
    let best = match best {
        Some(b) => b,
        None if any_under => (owner, 0, 0.0),
        None => {
            let el: Vec<bool> = (0..ring.hosts())
                .map(|h| x.eligible.get(h).copied().unwrap_or(true))
                .collect();
            return ring.place(key, x.loads, bound, &el).map(|p| Placed {
                host: p.host,
                rank: p.skipped,
                why: Why::Bound,
            });
        }
    };
    Some(Placed {
        host: best.0,
        rank: best.1,
        why: if best.1 == 0 { Why::Owner } else { Why::Priced },
    })
}
