//! This project's policy: the very `prefix-router-core` the filter runs.
//!
//! Each request is rendered as the HTTP body a client would send
//! (`/v1/completions` with the trace's prompt text, or
//! `/v1/chat/completions` with the conversation so far) and goes through
//! [`Router::key`] and [`Router::decide`] (by `cost.mode`: the priced spill
//! by default, or `off`) exactly as in the filter: the load
//! each host is placed against is `HostLoad { inflight, report }` with this
//! proxy's own in-flight count and the replica's last reported
//! `num_requests_waiting` (the filter's default ORCA metric), which the
//! core combines as `max(inflight, fresh report)`. A fallback (no key:
//! parse error, empty prompt, body too large) is left to "Envoy's load
//! balancer", modeled as round robin.
//!
//! ## Experiment: `mode=capped`
//! Not a mode of the filter (yet): the key is the prefix through the end of
//! the first user message *capped at `prefix_bytes`*. It is computed with the
//! core itself: the conversation-mode key and the prefix-mode key are both
//! chained prefix hashes from the same model seed, so the one that hashed
//! fewer bytes is exactly the key of the shorter region, i.e. what a core
//! with `limit = prefix_bytes` in conversation mode would return. It is
//! placed by `Router::decide` with that key given (`Request::with_key`). Used in BENCHMARKS.md to measure what
//! changing the default key would do.

use prefix_router_core::config::{RawConfig, RawHost};
use prefix_router_core::load::{HostLoad, Report};
use prefix_router_core::{Decision, Request, Router};

use super::{host_address, num, Choice, Outcome, Policy, SpecError, View};
use crate::input::RouteInput;

/// Options: `mode` (`conversation`|`prefix`), `c` (capacity factor),
/// `min_capacity` (capacity floor per replica, requests),
/// `prefix_bytes`, `vnodes`, `chunk_bytes`, `reports` (`on` = `waiting`:
/// the replica's reported waiting requests, the filter's default ORCA
/// metric; `all`: waiting + running, as with `load.orca_metrics:
/// ["num_requests_waiting", "num_requests_running"]`; `off`: only in-flight
/// counts).
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub mode: String,
    pub capacity_factor: f64,
    pub min_capacity: f64,
    pub prefix_bytes: u64,
    pub vnodes: u32,
    pub chunk_bytes: u32,
    pub use_reports: Reports,
    /// `cost=spill|off` (`cost.mode`; default the filter's, `spill`).
    pub cost: String,
    /// `service_s=X` (`cost.service_s`).
    pub service_s: f64,
    /// `tps=X` (`cost.prefill_tokens_per_s`).
    pub prefill_tps: f64,
}

impl Default for Params {
    fn default() -> Self {
        let d = RawConfig::default_without_hosts();
        Params {
            mode: d.key.mode,
            capacity_factor: d.capacity_factor,
            min_capacity: d.min_capacity,
            prefix_bytes: d.key.prefix_bytes,
            vnodes: d.vnodes,
            chunk_bytes: d.chunk_bytes,
            use_reports: Reports::On,
            cost: d.cost.mode,
            service_s: d.cost.service_s,
            prefill_tps: d.cost.prefill_tokens_per_s,
        }
    }
}

impl Params {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Params, SpecError> {
        let mut p = Params::default();
        for (k, v) in opts {
            match k.as_str() {
                "mode" => p.mode = v.clone(),
                "c" | "capacity_factor" => p.capacity_factor = num(k, v)?,
                "min_capacity" | "floor" => p.min_capacity = num(k, v)?,
                "prefix_bytes" => p.prefix_bytes = num(k, v)? as u64,
                "vnodes" => p.vnodes = num(k, v)? as u32,
                "chunk_bytes" => p.chunk_bytes = num(k, v)? as u32,
                // The index rule needs a prefix index: `prefix-router-cost`.
                "cost" if v == "index" => {
                    return Err(SpecError(
                        "prefix-router: cost=index is the prefix-router-cost policy".into(),
                    ))
                }
                "cost" => p.cost = v.clone(),
                "s" | "service_s" => p.service_s = num(k, v)?,
                "tps" | "prefill_tokens_per_s" => p.prefill_tps = num(k, v)?,
                "reports" => {
                    p.use_reports = match v.as_str() {
                        "off" => Reports::Off,
                        "on" => Reports::On,
                        "waiting" => Reports::Waiting,
                        "all" => Reports::All,
                        _ => {
                            return Err(SpecError(format!(
                                "prefix-router: reports must be off, on, waiting or all, not {v:?}"
                            )))
                        }
                    }
                }
                _ => return Err(SpecError(format!("prefix-router: unknown option {k:?}"))),
            }
        }
        // Validate through the core itself.
        p.config(2)?;
        Ok(p)
    }

    /// The filter config for `hosts` replicas.
    pub fn config(&self, hosts: usize) -> Result<prefix_router_core::Config, SpecError> {
        self.config_mode(
            hosts,
            if self.capped() {
                "conversation"
            } else {
                &self.mode
            },
        )
    }

    /// `mode=capped` (the experiment above)?
    pub fn capped(&self) -> bool {
        self.mode == "capped"
    }

    fn config_mode(
        &self,
        hosts: usize,
        mode: &str,
    ) -> Result<prefix_router_core::Config, SpecError> {
        let mut raw = RawConfig::default_without_hosts();
        raw.hosts = (0..hosts)
            .map(|i| RawHost {
                address: host_address(i),
                name: None,
                weight: None,
            })
            .collect();
        raw.capacity_factor = self.capacity_factor;
        raw.min_capacity = self.min_capacity;
        raw.vnodes = self.vnodes;
        raw.chunk_bytes = self.chunk_bytes;
        raw.key.mode = mode.to_string();
        raw.key.prefix_bytes = self.prefix_bytes;
        raw.cost.mode = self.cost.clone();
        raw.cost.service_s = self.service_s;
        raw.cost.prefill_tokens_per_s = self.prefill_tps;
        raw.compile()
            .map_err(|e| SpecError(format!("prefix-router: {e}")))
    }
}

/// The project's router.
pub struct PrefixRouter {
    router: Router,
    /// `mode=capped`: the prefix-mode router whose key caps the
    /// conversation key.
    cap: Option<Router>,
    loads: Vec<HostLoad>,
    use_reports: Reports,
    rr: usize,
    /// The application preambles this proxy saw carry later turns.
    preambles: prefix_router_core::spill::Preambles,
}

impl PrefixRouter {
    pub fn new(p: &Params, hosts: usize) -> Result<Self, SpecError> {
        let cap = if p.capped() {
            Some(Router::new(p.config_mode(hosts, "prefix")?))
        } else {
            None
        };
        Ok(PrefixRouter {
            router: Router::new(p.config(hosts)?),
            cap,
            loads: vec![HostLoad::default(); hosts],
            use_reports: p.use_reports,
            rr: 0,
            preambles: Default::default(),
        })
    }

    /// The core router (tests).
    pub fn router(&self) -> &Router {
        &self.router
    }

    fn fallback(&mut self) -> Choice {
        round_robin_fallback(&mut self.rr, self.loads.len())
    }
}

/// What the filter would know of each host: its own in-flight count and,
/// if enabled, the replica's last report (as `HostLoad`).
pub(crate) fn refresh_loads(loads: &mut [HostLoad], view: &View<'_>, use_reports: Reports) {
    for (h, l) in loads.iter_mut().enumerate() {
        l.inflight = view.inflight.get(h).copied().unwrap_or(0);
        l.pending_requests = view.pending.get(h).copied().unwrap_or(0);
        l.report = match use_reports {
            Reports::Off => None,
            Reports::On | Reports::Waiting | Reports::All => {
                view.reports.get(h).copied().flatten().map(|s| Report {
                    queue: if use_reports == Reports::All {
                        f64::from(s.waiting) + f64::from(s.running)
                    } else {
                        f64::from(s.waiting)
                    },
                    running: if use_reports == Reports::On {
                        f64::from(s.running)
                    } else {
                        0.0
                    },
                    // Reports carry this proxy's counts as of their
                    // receipt (ORCA and `--sampled-reports` alike); a
                    // report without them is read against its counts now.
                    own: s.own.map_or(l.inflight, u64::from),
                    own_pending: s.own_pending.map_or(l.pending_requests, u64::from),
                    at_ms: (s.at * 1000.0).max(0.0) as u64,
                })
            }
        };
    }
}

/// Which replica report feeds the load (see [`Params`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reports {
    /// In-flight counts only.
    Off,
    /// `num_requests_waiting` as the queue and `num_requests_running` as
    /// the running count (the filter's default): the bound sees waiting +
    /// running, the cost rule prices the waiting.
    On,
    /// `num_requests_waiting` only (the filter's default before the
    /// running count).
    Waiting,
    /// `num_requests_waiting + num_requests_running` as the queue (an
    /// experiment: the cost rule then prices running requests as queued).
    All,
}

/// Envoy's fallback: round robin over the hosts.
pub(crate) fn round_robin_fallback(rr: &mut usize, hosts: usize) -> Choice {
    let host = *rr % hosts.max(1);
    *rr = rr.wrapping_add(1);
    Choice {
        host,
        outcome: Outcome::Fallback,
    }
}

impl Policy for PrefixRouter {
    fn reads_orca(&self) -> bool {
        true
    }
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        refresh_loads(&mut self.loads, view, self.use_reports);
        let mut key = match self.router.key(input.api(), input.body(), None) {
            Ok(k) => k,
            Err(_) => return self.fallback(),
        };
        if let Some(cap) = &self.cap {
            if let Ok(k) = cap.key(input.api(), input.body(), None) {
                if k.bytes_hashed < key.bytes_hashed {
                    key = k;
                }
            }
        }
        let d = self
            .router
            .decide(
                &Request::new(input.api(), input.body(), &self.loads, view.now_ms())
                    .with_key(key)
                    .with_preambles(&self.preambles),
            )
            .decision;
        // A request under an application preamble: what its preamble's history says.
        self.router.observed(&mut self.preambles, &d);
        match d {
            Decision::Routed { host, skipped, .. } => Choice {
                host,
                outcome: if skipped == 0 {
                    Outcome::Affinity
                } else {
                    Outcome::Spill
                },
            },
            Decision::Fallback(_) => self.fallback(),
        }
    }
}
