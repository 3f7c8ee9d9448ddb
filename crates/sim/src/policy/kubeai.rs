//! KubeAI `PrefixHash` load balancing, re-implemented from
//! `substratusai/kubeai`:
//!
//! * `internal/loadbalancer/balance_chwbl.go`: consistent hashing with
//!   bounded loads (CHWBL). Each endpoint has `replication` points
//!   (`xxhash(name + i)`); the key's walk goes point by point clockwise and
//!   takes the first endpoint whose load passes
//!   `inflight + 1 <= (total + 1) / n * load_factor`; if none does, the
//!   key's first endpoint.
//! * `internal/loadbalancer/group.go`: load = the proxy's own in-flight
//!   count. Points per endpoint: the Model's
//!   `spec.loadBalancing.prefixHash.replication`, whose CRD default is 256
//!   (`api/k8s/v1/model_types.go` at `0c67b3ba`, `+kubebuilder:default=256`;
//!   `internal/loadbalancer/load_balancer.go` at `8fbbb358` builds each
//!   group from it, `newEndpointGroup(lb)`). Older KubeAI hard-coded 100
//!   (`group.go` at `56aac4bc`).
//! * `internal/apiutils/request.go` and the OpenAI request types: the key is
//!   the adapter name plus the first `PrefixCharLength` characters of the
//!   first user message (chat) or of the prompt (completions).
//!
//! Defaults: `meanLoadPercentage` 125 (load factor 1.25),
//! `prefixCharLength` 100, `replication` 256. Hashes are xxh3 here (KubeAI: xxhash64).

use xxhash_rust::xxh3::xxh3_64;

use super::{host_address, num, Choice, Outcome, Policy, SpecError, View};
use crate::input::RouteInput;

/// `chars` (prefix characters), `load_factor`, `replication`.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub prefix_chars: usize,
    pub load_factor: f64,
    pub replication: usize,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            prefix_chars: 100,
            load_factor: 1.25,
            replication: 256,
        }
    }
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "chars" => p.prefix_chars = num(k, v)? as usize,
                "load_factor" => p.load_factor = num(k, v)?,
                "replication" => p.replication = (num(k, v)? as usize).max(1),
                _ => return Err(SpecError(format!("kubeai: unknown option {k:?}"))),
            }
        }
        Ok(p)
    }
}

/// KubeAI CHWBL on a character prefix.
pub struct KubeAi {
    p: Params,
    ring: Vec<(u64, u32)>,
    n: usize,
}

impl KubeAi {
    pub fn new(p: Params, hosts: usize) -> Self {
        let mut ring = Vec::with_capacity(hosts * p.replication);
        for h in 0..hosts {
            let name = host_address(h);
            for i in 0..p.replication {
                ring.push((xxh3_64(format!("{name}{i}").as_bytes()), h as u32));
            }
        }
        ring.sort_unstable();
        KubeAi { p, ring, n: hosts }
    }

    fn load_ok(&self, load: u64, total: u64) -> bool {
        if total == 0 {
            return true;
        }
        let avg = (total + 1) as f64 / self.n.max(1) as f64;
        (load + 1) as f64 <= avg * self.p.load_factor
    }
}

impl Policy for KubeAi {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let key = input.first_user(self.p.prefix_chars);
        let h = xxh3_64(&key);
        let len = self.ring.len();
        if len == 0 {
            return Choice {
                host: 0,
                outcome: Outcome::Fallback,
            };
        }
        let start = self.ring.partition_point(|&(p, _)| p < h) % len;
        let total: u64 = view.inflight.iter().sum();
        let first = self.ring.get(start).map(|&(_, e)| e as usize).unwrap_or(0);
        for step in 0..len {
            let e = self
                .ring
                .get((start + step) % len)
                .map(|&(_, e)| e as usize)
                .unwrap_or(0);
            if self.load_ok(view.inflight.get(e).copied().unwrap_or(0), total) {
                return Choice {
                    host: e,
                    outcome: if e == first {
                        Outcome::Affinity
                    } else {
                        Outcome::Spill
                    },
                };
            }
        }
        Choice {
            host: first,
            outcome: Outcome::Spill,
        }
    }
}
