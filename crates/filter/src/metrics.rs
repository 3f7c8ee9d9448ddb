//! Counters, defined once per VM and named `prefix_router.*`. Envoy 1.40
//! shows them in `/stats` as `wasmcustom.prefix_router.*` and in
//! `/stats/prometheus` as `prefix_router_*` (no prefix).
//!
//! | name | meaning |
//! |---|---|
//! | `prefix_router.routed.hit` | routed to the first candidate (the group's ring owner, or the key's) |
//! | `prefix_router.routed.spill` | routed past the first candidate because it was over its load bound, or ejected or unhealthy |
//! | `prefix_router.routed.moved` | routed to a later candidate whose shorter queue paid the miss (`spill`, the default), or that won on its estimate over the first host under the bound (`index`) |
//! | `prefix_router.spill_hops` | hosts skipped in total by spills |
//! | `prefix_router.key.{prompt,session,user,raw}` | where routed keys came from (`raw`: a body over extraction's work budget, keyed by its messages (Responses: `input` items) as written through the first user message) |
//! | `prefix_router.fallback.<cause>` | left to Envoy's LB: path, method, content_type, no_body, body_too_large, parse_error, empty_prompt, too_complex, host_error |
//! | `prefix_router.bytes_hashed` | prompt bytes hashed for keys |
//! | `prefix_router.load_reports` / `prefix_router.load_report_errors` | replica load reports read / not understood |
//! | `prefix_router.host_errors` | host calls that failed (details in the log) |
//! | `prefix_router.health.ejections` | hosts ejected by passive health |
//! | `prefix_router.health.retried_failures` | requests whose try at the chosen host failed and that Envoy retried on another host (a failure for passive health, though the client got an answer) |
//! | `prefix_router.scrapes` / `prefix_router.scrape_errors` | active `/metrics` scrapes stored / failed |
//! | `prefix_router.scrape.unknown_cluster` / `prefix_router.gossip.unknown_cluster` | calls Envoy refused because it has no cluster named `scrape.cluster` / `gossip.cluster` (a config error the filter cannot see at configure time; also logged once per VM at error level naming the field): alert on > 0 |
//! | `prefix_router.host.<name>.routed` | routed requests per host (name with non-alphanumerics as `_`) |
//! | `prefix_router.index.observed` | `cost.mode = index`: boundary entries written to the shared prefix index |
//! | `prefix_router.index.footprint_bytes` | `cost.mode = index`: gauge, upper bound of the shared index's memory (4,096 buckets x 8 entries x 18 bytes) |
//! | `prefix_router.index.used_bytes` | `cost.mode = index`: gauge, bytes the shared index holds now (sum of every VM's changes; this process's lifetime) |
//! | `prefix_router.index.forget.{restart,ejected,hosts_changed}` | `cost.mode = index`: times a host's index entries were dropped: the scrape saw its restart counter go down, passive health ejected it, the host list changed |
//! | `prefix_router.index.forget.flushed` | `cost.mode = index` with `scrape.hit_metrics`: times a host's entries were dropped because its prefix-cache hits fell below 10 % of what the index credited it with over at least 4,096 credited tokens (a cache flush, e.g. vLLM's `/reset_prefix_cache`; `prefix_router_core::scrape`) |
//! | `prefix_router.index.forget.capacity` | `cost.mode = index`: times a host's capacity horizon moved (`cost.host_tokens` newer tokens pushed older entries out of its cache) |
//! | `prefix_router.cost.credited_tokens` | `cost.mode = index`: prompt tokens the index credited the chosen hosts with (cached bytes / `bytes_per_token`, rounded up): compare with the replicas' prefix-cache hits (vLLM `vllm:prefix_cache_hits_total`) to check `cost.host_tokens` |
//! | `prefix_router.cost.hot_skipped` | `cost.mode = index`: hosts passed over on a key's walk because they were hot (recent load above 1.12 x the fleet's mean, over a 20 s window) and at their hot bound (the fleet's mean, or for a prompt they hold half of the pure bound or the floor less the fleet's mean, counted in this Envoy's own requests), though under their capacity; each decision also says `hot_skipped=N` in its header and debug log |
//! | `prefix_router.cost.prefill_tps` | `cost.mode = index`: gauge, the learned prefill rate in tokens per second (set at each usable sample) |
//! | `prefix_router.gossip.sent` | `gossip.peers`: observations sent (each batch counts its observations once per peer it was dispatched to) |
//! | `prefix_router.gossip.send_errors` | `gossip.peers`: batches not dispatched, answered non-2xx, or timed out |
//! | `prefix_router.gossip.dropped` | `gossip.peers`: observations dropped unsent because the outbox held `max_batch_bytes` |
//! | `prefix_router.gossip.applied` / `prefix_router.gossip.unknown_host` | `gossip.accept`: received observations recorded in this Envoy's index / naming a host not in its `hosts` (skipped) |
//! | `prefix_router.gossip.loads_applied` | `gossip.accept`: peers' pending-prefill snapshots recorded |
//! | `prefix_router.gossip.rejected` | `gossip.accept`: received batches refused (malformed, too large, another fingerprint, not a POST); the 400 answer and the log say why |
//! | `prefix_router.membership.hosts` / `prefix_router.membership.healthy` | gauges: hosts the filter routes among (the static `hosts`, or the members of `membership.cluster`), and how many of them Envoy considers healthy |
//! | `prefix_router.membership.source` | gauge: where the hosts came from: 0 the static `hosts` list, 1 the `hosts` seed while no `membership` poll has answered yet, 2 Envoy's cluster (`membership`) |
//! | `prefix_router.membership.changes` | `membership`: host table changes stored (a host came, went, or changed health, weight or address) |
//! | `prefix_router.membership.poll_errors` / `prefix_router.membership.unknown_cluster` | `membership`: polls of Envoy's admin that failed (not dispatched, non-200, timeout, unreadable, no such cluster, no hosts: the hosts are kept) / that Envoy refused because it has no `membership.admin_cluster` (also logged once per VM naming the field) |
//! | `prefix_router.vm.starts` | VMs of this filter started (`on_vm_start`; an Envoy counter, so it outlives a VM): workers + 2 after startup (Envoy 1.40 starts two VMs outside the workers), one more for each VM Envoy reloads after a failure (`failure_policy: FAIL_RELOAD`) or a config change brings. Alert on an increase without a config change; Envoy's own `wasm.<plugin>.vm_reload` (`envoy_wasm_prefix_router_vm_reload`) counts the reloads alone |
//! | `prefix_router.hostcalls` / `prefix_router.hostcalls.last` | proxy-wasm host calls the filter made in requests' callbacks (headers to log), summed / gauge, the last finished request's: divide the counter by the requests (`routed.*` + `fallback.*`) for calls per request; it does not grow with the number of hosts |
//! | `prefix_router.vm.memory_bytes` | gauge, linear memory of this filter's VMs that serve requests (one per worker thread), summed; each VM updates its share when a request finishes |
//! | `prefix_router.inflight` | gauge, this Envoy's requests the filter routed that have not ended (the fleet record, [`prefix_router_core::host_state::FLEET_KEY`]), set on every VM's tick: 0 when idle; one that stays above 0 with no traffic is a held count (a VM that failed mid-request) |

use prefix_router_core::{Config, Decision, FallbackCause, KeySource};
use proxy_wasm::types::MetricType;

/// VMs started ([`crate::root::Root`]'s `on_vm_start`).
pub const VM_STARTS: &str = "prefix_router.vm.starts";

/// Metric ids of this VM (0 = not defined; incrementing it fails quietly).
#[derive(Debug, Default)]
pub struct Metrics {
    hit: u32,
    spill: u32,
    moved: u32,
    spill_hops: u32,
    key: [u32; KeySource::ALL.len()],
    fallback: [u32; FallbackCause::ALL.len()],
    bytes_hashed: u32,
    pub load_reports: u32,
    pub load_report_errors: u32,
    pub host_errors: u32,
    pub ejections: u32,
    pub health_retried_failures: u32,
    pub scrapes: u32,
    pub scrape_errors: u32,
    pub scrape_unknown_cluster: u32,
    pub index_observed: u32,
    pub index_footprint: u32,
    pub index_used: u32,
    pub forget_restart: u32,
    pub forget_ejected: u32,
    pub forget_hosts: u32,
    pub forget_capacity: u32,
    pub forget_flushed: u32,
    pub vm_memory: u32,
    /// `prefix_router.inflight`.
    pub inflight: u32,
    pub hostcalls: u32,
    pub hostcalls_last: u32,
    pub prefill_tps: u32,
    pub credited_tokens: u32,
    hot_skipped: u32,
    pub gossip_sent: u32,
    pub gossip_send_errors: u32,
    pub gossip_dropped: u32,
    pub gossip_applied: u32,
    pub gossip_unknown_host: u32,
    pub gossip_rejected: u32,
    pub gossip_loads: u32,
    pub gossip_unknown_cluster: u32,
    pub membership_hosts: u32,
    pub membership_healthy: u32,
    pub membership_source: u32,
    pub membership_changes: u32,
    pub membership_poll_errors: u32,
    pub membership_unknown_cluster: u32,
    per_host: Vec<u32>,
}

fn def(name: &str) -> u32 {
    crate::abi::define_metric(MetricType::Counter, name).unwrap_or(0)
}

fn def_gauge(name: &str) -> u32 {
    crate::abi::define_metric(MetricType::Gauge, name).unwrap_or(0)
}

fn gossip(cfg: &Config, name: &str) -> u32 {
    if cfg.gossip.is_some() {
        def(&format!("prefix_router.gossip.{name}"))
    } else {
        0
    }
}

fn membership(cfg: &Config, name: &str) -> u32 {
    if cfg.membership.is_some() {
        def(&format!("prefix_router.membership.{name}"))
    } else {
        0
    }
}

/// `prefix_router.membership.source`: the hosts are the static `hosts`
/// list (no `membership`).
pub const SOURCE_STATIC: u64 = 0;
/// `prefix_router.membership.source`: `membership` is on, no poll has
/// answered yet: the `hosts` seed (possibly empty) routes.
pub const SOURCE_SEED: u64 = 1;
/// `prefix_router.membership.source`: the hosts come from Envoy's cluster.
pub const SOURCE_ENVOY: u64 = 2;

impl Metrics {
    /// Set the membership gauges: hosts known (present), how many of them
    /// Envoy considers healthy, and where they came from.
    pub fn set_membership(&self, cfg: &Config, source: u64) {
        let (mut n, mut ok) = (0u64, 0u64);
        for h in cfg.hosts.iter().filter(|h| h.weight > 0.0) {
            n += 1;
            ok += u64::from(h.healthy);
        }
        self.set(self.membership_hosts, n);
        self.set(self.membership_healthy, ok);
        self.set(self.membership_source, source);
    }

    /// Define every counter for this config.
    pub fn define(cfg: &Config) -> Metrics {
        let mut key = [0; KeySource::ALL.len()];
        for (slot, s) in key.iter_mut().zip(KeySource::ALL) {
            *slot = def(&format!("prefix_router.key.{}", s.as_str()));
        }
        let mut fallback = [0; FallbackCause::ALL.len()];
        for (slot, c) in fallback.iter_mut().zip(FallbackCause::ALL) {
            *slot = def(&format!("prefix_router.fallback.{}", c.as_str()));
        }
        Metrics {
            hit: def("prefix_router.routed.hit"),
            spill: def("prefix_router.routed.spill"),
            moved: def("prefix_router.routed.moved"),
            spill_hops: def("prefix_router.spill_hops"),
            key,
            fallback,
            bytes_hashed: def("prefix_router.bytes_hashed"),
            load_reports: def("prefix_router.load_reports"),
            load_report_errors: def("prefix_router.load_report_errors"),
            host_errors: def("prefix_router.host_errors"),
            ejections: def("prefix_router.health.ejections"),
            health_retried_failures: def("prefix_router.health.retried_failures"),
            scrapes: def("prefix_router.scrapes"),
            scrape_errors: def("prefix_router.scrape_errors"),
            scrape_unknown_cluster: if cfg.scrape.is_some() {
                def("prefix_router.scrape.unknown_cluster")
            } else {
                0
            },
            index_observed: if cfg.cost.enabled {
                def("prefix_router.index.observed")
            } else {
                0
            },
            index_footprint: if cfg.cost.enabled {
                def_gauge("prefix_router.index.footprint_bytes")
            } else {
                0
            },
            index_used: if cfg.cost.enabled {
                def_gauge("prefix_router.index.used_bytes")
            } else {
                0
            },
            forget_restart: if cfg.cost.enabled {
                def("prefix_router.index.forget.restart")
            } else {
                0
            },
            forget_ejected: if cfg.cost.enabled {
                def("prefix_router.index.forget.ejected")
            } else {
                0
            },
            forget_hosts: if cfg.cost.enabled {
                def("prefix_router.index.forget.hosts_changed")
            } else {
                0
            },
            forget_capacity: if cfg.cost.enabled {
                def("prefix_router.index.forget.capacity")
            } else {
                0
            },
            forget_flushed: if cfg.cost.enabled {
                def("prefix_router.index.forget.flushed")
            } else {
                0
            },
            vm_memory: def_gauge("prefix_router.vm.memory_bytes"),
            inflight: def_gauge("prefix_router.inflight"),
            hostcalls: def("prefix_router.hostcalls"),
            hostcalls_last: def_gauge("prefix_router.hostcalls.last"),
            prefill_tps: if cfg.cost.enabled && cfg.cost.learn_prefill {
                def_gauge("prefix_router.cost.prefill_tps")
            } else {
                0
            },
            credited_tokens: if cfg.cost.enabled {
                def("prefix_router.cost.credited_tokens")
            } else {
                0
            },
            hot_skipped: if cfg.cost.enabled && cfg.cost.params.hot_window_s > 0.0 {
                def("prefix_router.cost.hot_skipped")
            } else {
                0
            },
            gossip_sent: gossip(cfg, "sent"),
            gossip_send_errors: gossip(cfg, "send_errors"),
            gossip_dropped: gossip(cfg, "dropped"),
            gossip_applied: gossip(cfg, "applied"),
            gossip_unknown_host: gossip(cfg, "unknown_host"),
            gossip_rejected: gossip(cfg, "rejected"),
            gossip_loads: gossip(cfg, "loads_applied"),
            gossip_unknown_cluster: gossip(cfg, "unknown_cluster"),
            membership_hosts: def_gauge("prefix_router.membership.hosts"),
            membership_healthy: def_gauge("prefix_router.membership.healthy"),
            membership_source: def_gauge("prefix_router.membership.source"),
            membership_changes: membership(cfg, "changes"),
            membership_poll_errors: membership(cfg, "poll_errors"),
            membership_unknown_cluster: membership(cfg, "unknown_cluster"),
            per_host: cfg
                .hosts
                .iter()
                .map(|h| {
                    if h.weight <= 0.0 {
                        // A free slot of the membership table.
                        return 0;
                    }
                    def(&format!(
                        "prefix_router.host.{}.routed",
                        prefix_router_core::config::metric_name(&h.name)
                    ))
                })
                .collect(),
        }
    }

    /// Add to a counter, ignoring failures (a metric must never fail a request).
    pub fn inc(&self, id: u32, by: u64) {
        if id != 0 && by > 0 {
            let _ = crate::abi::increment_metric(id, by.min(i64::MAX as u64) as i64);
        }
    }

    /// Add a signed change to a gauge, ignoring failures.
    pub fn add(&self, id: u32, delta: i64) {
        if id != 0 && delta != 0 {
            let _ = crate::abi::increment_metric(id, delta);
        }
    }

    /// Set a gauge, ignoring failures.
    pub fn set(&self, id: u32, value: u64) {
        if id != 0 {
            let _ = crate::abi::record_metric(id, value);
        }
    }

    /// Count a decision.
    pub fn record(&self, d: &Decision) {
        match d {
            Decision::Routed {
                host,
                skipped,
                key,
                moved,
                hot_skipped,
                ..
            } => {
                self.inc(self.hot_skipped, u64::from(*hot_skipped));
                if *moved {
                    self.inc(self.moved, 1);
                } else if *skipped == 0 {
                    self.inc(self.hit, 1);
                } else {
                    self.inc(self.spill, 1);
                    self.inc(self.spill_hops, u64::from(*skipped));
                }
                let i = KeySource::ALL
                    .iter()
                    .position(|s| s == &key.source)
                    .unwrap_or(0);
                self.inc(self.key.get(i).copied().unwrap_or(0), 1);
                self.inc(self.bytes_hashed, key.bytes_hashed);
                self.inc(self.per_host.get(*host).copied().unwrap_or(0), 1);
            }
            Decision::Fallback(c) => self.fallback(*c),
        }
    }

    /// Count a fallback.
    pub fn fallback(&self, c: FallbackCause) {
        let i = FallbackCause::ALL.iter().position(|x| x == &c).unwrap_or(0);
        self.inc(self.fallback.get(i).copied().unwrap_or(0), 1);
    }
}
