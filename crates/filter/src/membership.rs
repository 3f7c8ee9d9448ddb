//! Membership from the Envoy cluster (`membership` in the filter JSON;
//! logic in [`prefix_router_core::membership`]).
//!
//! Every VM, on its tick, GETs `membership.admin_path` through
//! `membership.admin_cluster` (a loopback cluster to this Envoy's admin
//! listener). The answer goes to the core: [`parse_admin_clusters`] reads
//! `membership.cluster`'s hosts and [`sync`] merges them into the host
//! table in shared data (compare-and-swap, so all VMs agree on the slots).
//! The VM whose merge changed the table drops the state of the hosts that
//! left (their load reports, health, pending prefill and prefix-index
//! entries); every VM whose table version differs from the one its router
//! was built with rebuilds its router ([`crate::root::Root`]). Failures
//! (dispatch refused, non-200, timeout, unreadable answer, no such cluster,
//! no hosts) keep the current hosts and are counted in
//! `prefix_router.membership.poll_errors`.

use std::time::Duration;

use prefix_router_core::config::Config;
use prefix_router_core::membership::{parse_admin_clusters, sync, Change, MembershipConfig, Table};
use prefix_router_core::shared_index;
use proxy_wasm::hostcalls;
use proxy_wasm::types::LogLevel;

use crate::host::{self, SharedData};
use crate::metrics::Metrics;

/// Per-VM polling state.
#[derive(Debug, Default)]
pub struct Poller {
    /// The outstanding call, if any.
    pending: Option<u32>,
    /// When the next poll is due (host clock, ms).
    next_ms: u64,
    /// Whether this VM logged that Envoy has no `membership.admin_cluster`.
    unknown_logged: bool,
}

impl Poller {
    /// One tick: poll if due.
    pub fn tick(&mut self, m: &MembershipConfig, metrics: &Metrics, now: u64, tick_ms: u64) {
        if now.saturating_add(tick_ms / 2) < self.next_ms {
            return;
        }
        self.next_ms = now.saturating_add(m.interval_ms);
        if self.pending.take().is_some() {
            // The last poll never answered.
            metrics.inc(metrics.membership_poll_errors, 1);
        }
        let headers = vec![
            (":method", "GET"),
            (":path", m.admin_path.as_str()),
            (":authority", "envoy-admin"),
        ];
        match hostcalls::dispatch_http_call(
            &m.admin_cluster,
            headers,
            None,
            vec![],
            Duration::from_millis(m.timeout_ms),
        ) {
            Ok(t) => self.pending = Some(t),
            Err(e) => {
                metrics.inc(metrics.membership_poll_errors, 1);
                if !host::unknown_cluster(
                    e,
                    "membership.admin_cluster",
                    &m.admin_cluster,
                    metrics,
                    metrics.membership_unknown_cluster,
                    &mut self.unknown_logged,
                ) {
                    host::log(
                        LogLevel::Warn,
                        &format!("prefix-router: membership poll not dispatched: {e:?}"),
                    );
                }
            }
        }
    }

    /// A poll answered (or failed). Returns whether the token was this
    /// poller's, the shared table as stored after merging the answer
    /// (`None` if the answer was not usable), and with
    /// `membership.peers_cluster` the gossip peers it lists.
    pub fn response(
        &mut self,
        token: u32,
        body_size: usize,
        cfg: &Config,
        seed: &[prefix_router_core::config::Host],
        m: &MembershipConfig,
        metrics: &Metrics,
    ) -> Option<(Option<Table>, Option<Vec<String>>)> {
        if self.pending != Some(token) {
            return None;
        }
        let mut peers = None;
        let table = self.answer(body_size, cfg, seed, m, metrics, &mut peers);
        Some((table, peers))
    }

    fn answer(
        &mut self,
        body_size: usize,
        cfg: &Config,
        seed: &[prefix_router_core::config::Host],
        m: &MembershipConfig,
        metrics: &Metrics,
        peers: &mut Option<Vec<String>>,
    ) -> Option<Table> {
        self.pending = None;
        let status = host::call_response_header(":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        if status != "200" {
            metrics.inc(metrics.membership_poll_errors, 1);
            host::log(
                LogLevel::Debug,
                &format!("prefix-router: membership poll: status {status:?}"),
            );
            return None;
        }
        let body = match host::call_response_body(body_size) {
            Ok(b) => b,
            Err(e) => {
                metrics.inc(metrics.membership_poll_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: membership poll body: {e:?}"),
                );
                return None;
            }
        };
        if let Some(pc) = &m.peers_cluster {
            let own = cfg.gossip.as_ref().and_then(|g| g.name.as_deref());
            match prefix_router_core::membership::parse_peers(&body, pc, own) {
                Ok(p) => *peers = Some(p),
                Err(e) => {
                    metrics.inc(metrics.membership_poll_errors, 1);
                    host::log(
                        LogLevel::Debug,
                        &format!("prefix-router: gossip peers of {pc:?}: {e}"),
                    );
                }
            }
        }
        let members = match parse_admin_clusters(&body, &m.cluster) {
            Ok(v) => v,
            Err(e) => {
                metrics.inc(metrics.membership_poll_errors, 1);
                host::log(
                    LogLevel::Debug,
                    &format!("prefix-router: membership of {:?}: {e}", m.cluster),
                );
                return None;
            }
        };
        match sync(&SharedData, &members, seed) {
            Ok((table, change)) => {
                if !change.is_empty() {
                    apply_change(&change, cfg, metrics);
                }
                Some(table)
            }
            Err(e) => {
                metrics.inc(metrics.host_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: storing the host table: {e:?}"),
                );
                None
            }
        }
    }
}

/// The VM that stored a change: count and log it, and drop what was kept
/// about the hosts that left.
fn apply_change(change: &Change, cfg: &Config, metrics: &Metrics) {
    metrics.inc(metrics.membership_changes, 1);
    host::log(
        LogLevel::Info,
        &format!(
            "prefix-router: membership changed: {} host(s) came (slots {:?}), {} went ({:?}), {} updated (slots {:?})",
            change.added.len(),
            change.added,
            change.removed.len(),
            change.removed,
            change.updated.len(),
            change.updated
        ),
    );
    let now = host::now_ms().unwrap_or(0);
    for (slot, addr) in &change.removed {
        if let Err(e) = prefix_router_core::membership::drop_host_state(&SharedData, addr) {
            metrics.inc(metrics.host_errors, 1);
            host::log(
                LogLevel::Warn,
                &format!("prefix-router: dropping {addr}'s state: {e:?}"),
            );
        }
        if cfg.cost.enabled {
            match shared_index::forget_hosts(&SharedData, &[*slot], now) {
                Ok(()) => metrics.inc(metrics.forget_hosts, 1),
                Err(e) => {
                    metrics.inc(metrics.host_errors, 1);
                    host::log(
                        LogLevel::Warn,
                        &format!("prefix-router: forgetting {addr}'s index entries: {e:?}"),
                    );
                }
            }
        }
    }
    // A slot reused by a newcomer must not inherit its predecessor's entries.
    if cfg.cost.enabled && !change.added.is_empty() {
        if let Err(e) = shared_index::forget_hosts(&SharedData, &change.added, now) {
            metrics.inc(metrics.host_errors, 1);
            host::log(
                LogLevel::Warn,
                &format!("prefix-router: forgetting reused slots' index entries: {e:?}"),
            );
        }
    }
}
