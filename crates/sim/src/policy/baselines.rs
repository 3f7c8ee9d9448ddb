//! Load-only baselines and plain consistent hashing.
//!
//! * round robin, random: what a plain L7 proxy does (Envoy `ROUND_ROBIN`,
//!   `RANDOM`).
//! * least loaded (join the shortest queue): fewest in-flight requests from
//!   this proxy, ties broken at random (Envoy `LEAST_REQUEST` with all hosts
//!   compared).
//! * power of two choices (Mitzenmacher, "The Power of Two Choices in
//!   Randomized Load Balancing", 2001; Envoy `LEAST_REQUEST` default
//!   `choice_count: 2`): two distinct random hosts, the one with fewer
//!   in-flight requests.
//! * plain consistent hashing on the first chunk (Karger et al., 1997): the
//!   core's ring (same points as the project's router) keyed on the chained
//!   hash of the first 64-byte chunk of the canonical prompt, no load bound.

use prefix_router_core::Router;

use super::prefix_router::Params;
use super::{Choice, Outcome, Policy, SpecError, View};
use crate::input::RouteInput;
use crate::rng::{Draw, Rng};

/// Round robin (per proxy; proxies start at different offsets).
pub struct RoundRobin {
    n: usize,
    next: usize,
}

impl RoundRobin {
    pub fn new(n: usize, proxy: usize) -> Self {
        RoundRobin {
            n: n.max(1),
            next: proxy,
        }
    }
}

impl Policy for RoundRobin {
    fn route(&mut self, _: &RouteInput<'_>, _: &View<'_>) -> Choice {
        let host = self.next % self.n;
        self.next = self.next.wrapping_add(1);
        Choice {
            host,
            outcome: Outcome::Balance,
        }
    }
}

/// Uniformly random.
pub struct Random {
    n: usize,
    rng: Rng,
}

impl Random {
    pub fn new(n: usize, seed: u64) -> Self {
        Random {
            n: n.max(1),
            rng: crate::rng::rng(seed),
        }
    }
}

impl Policy for Random {
    fn route(&mut self, _: &RouteInput<'_>, _: &View<'_>) -> Choice {
        Choice {
            host: self.rng.below(self.n as u64) as usize,
            outcome: Outcome::Balance,
        }
    }
}

/// Fewest in-flight requests, random tie break.
pub struct LeastLoaded {
    n: usize,
    rng: Rng,
    ties: Vec<usize>,
}

impl LeastLoaded {
    pub fn new(n: usize, seed: u64) -> Self {
        LeastLoaded {
            n: n.max(1),
            rng: crate::rng::rng(seed),
            ties: Vec::new(),
        }
    }
}

impl Policy for LeastLoaded {
    fn route(&mut self, _: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let min = view.inflight.iter().copied().min().unwrap_or(0);
        self.ties.clear();
        for h in 0..self.n {
            if view.inflight.get(h).copied().unwrap_or(0) == min {
                self.ties.push(h);
            }
        }
        let i = self.rng.below(self.ties.len() as u64) as usize;
        Choice {
            host: self.ties.get(i).copied().unwrap_or(0),
            outcome: Outcome::Balance,
        }
    }
}

/// Power of two choices.
pub struct PowerOfTwo {
    n: usize,
    rng: Rng,
}

impl PowerOfTwo {
    pub fn new(n: usize, seed: u64) -> Self {
        PowerOfTwo {
            n: n.max(1),
            rng: crate::rng::rng(seed),
        }
    }
}

impl Policy for PowerOfTwo {
    fn route(&mut self, _: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let a = self.rng.below(self.n as u64) as usize;
        let host = if self.n < 2 {
            a
        } else {
            let mut b = self.rng.below(self.n as u64 - 1) as usize;
            if b >= a {
                b += 1;
            }
            let la = view.inflight.get(a).copied().unwrap_or(0);
            let lb = view.inflight.get(b).copied().unwrap_or(0);
            if lb < la {
                b
            } else {
                a
            }
        };
        Choice {
            host,
            outcome: Outcome::Balance,
        }
    }
}

/// Consistent hashing on the first 64-byte chunk, unbounded.
pub struct ChFirstChunk {
    router: Router,
    rr: usize,
    n: usize,
}

impl ChFirstChunk {
    pub fn new(n: usize) -> Result<Self, SpecError> {
        let p = Params {
            mode: "prefix".into(),
            prefix_bytes: 64,
            ..Params::default()
        };
        Ok(ChFirstChunk {
            router: Router::new(p.config(n)?),
            rr: 0,
            n: n.max(1),
        })
    }
}

impl Policy for ChFirstChunk {
    fn route(&mut self, input: &RouteInput<'_>, _: &View<'_>) -> Choice {
        match self.router.key(input.api(), input.body(), None) {
            Ok(k) => Choice {
                host: self.router.ring().owner(k.hash).unwrap_or(0),
                outcome: Outcome::Affinity,
            },
            Err(_) => {
                let host = self.rr % self.n;
                self.rr += 1;
                Choice {
                    host,
                    outcome: Outcome::Fallback,
                }
            }
        }
    }
}
