//! Active scrape: one VM per Envoy process periodically fetches every
//! replica's Prometheus `/metrics` through the replicas' cluster and stores
//! the queue depth as that host's load report (the same slot the ORCA and
//! plain-header reports use, so the freshest signal wins).
//!
//! - Election: `on_tick` runs in every VM (main thread and each worker). A
//!   lease in shared data (`owner id`, `expires ms`), taken and renewed with
//!   compare-and-swap, lets exactly one VM scrape; if it stops ticking, the
//!   lease expires after two intervals and another VM takes over.
//! - Targeting: the call goes to the cluster with the destination header set
//!   to the replica, so Envoy's override_host policy sends it to that replica.
//! - Failures (no lease, dispatch error, non-200, unparsable body, timeout)
//!   are counted in `prefix_router.scrape_errors` and never touch requests.
//!   A dispatch Envoy refuses because it has no `scrape.cluster` (the filter
//!   cannot list clusters at configure time) is also counted in
//!   `prefix_router.scrape.unknown_cluster` and logged once per VM as an
//!   error naming the field ([`crate::host::unknown_cluster`]).

use std::collections::BTreeMap;
use std::time::Duration;

use prefix_router_core::config::{Config, ScrapeConfig};
use prefix_router_core::host_state;
use prefix_router_core::scrape::{
    counter_reset, first_counter, flush_check, queue_depth, take_served_credit,
};
use prefix_router_core::shared_index;
use prefix_router_core::store::{SharedStore, StoreError, CAS_RETRIES};
use proxy_wasm::hostcalls;
use proxy_wasm::types::LogLevel;

use crate::host::{self, SharedData};
use crate::metrics::Metrics;

const LEASE_KEY: &str = "prefix_router/scrape_lease";

/// Per-VM scrape state.
#[derive(Debug, Default)]
pub struct Scraper {
    /// This VM's lease identity.
    pub owner: u64,
    /// Outstanding calls: token → host address.
    pending: BTreeMap<u32, String>,
    /// Whether this VM logged that Envoy has no `scrape.cluster`.
    unknown_logged: bool,
}

fn decode_lease(v: Option<&[u8]>) -> (u64, u64) {
    let owner = v
        .and_then(|b| b.get(..8))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let exp = v
        .and_then(|b| b.get(8..16))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    (owner, exp)
}

/// Take or renew the lease; `Ok(true)` if this VM holds it now.
pub fn acquire_lease<S: SharedStore + ?Sized>(
    store: &S,
    owner: u64,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<bool, StoreError> {
    for _ in 0..CAS_RETRIES {
        let (v, cas) = store.get(LEASE_KEY)?;
        let (cur, exp) = decode_lease(v.as_deref());
        if cur != owner && exp > now_ms {
            return Ok(false);
        }
        let mut b = [0u8; 16];
        let (o, e) = b.split_at_mut(8);
        o.copy_from_slice(&owner.to_le_bytes());
        e.copy_from_slice(&now_ms.saturating_add(ttl_ms).to_le_bytes());
        match store.set(LEASE_KEY, &b, cas) {
            Ok(()) => return Ok(true),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

impl Scraper {
    /// One tick: if this VM holds the lease, dispatch a scrape to every host.
    pub fn tick(&mut self, cfg: &Config, sc: &ScrapeConfig, metrics: &Metrics) {
        let now = match host::now_ms() {
            Ok(t) => t,
            Err(_) => return,
        };
        match acquire_lease(
            &SharedData,
            self.owner,
            now,
            sc.interval_ms.saturating_mul(2),
        ) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: scrape lease: {e:?}"),
                );
                return;
            }
        }
        // Calls still outstanding from the last tick timed out or were lost.
        if !self.pending.is_empty() {
            metrics.inc(metrics.scrape_errors, self.pending.len() as u64);
            self.pending.clear();
        }
        // Free slots of the membership table (weight 0) are no replica.
        for h in cfg.hosts.iter().filter(|h| h.weight > 0.0) {
            let headers = vec![
                (":method", "GET"),
                (":path", sc.path.as_str()),
                (":authority", h.address.as_str()),
                (cfg.destination_header.as_str(), h.address.as_str()),
            ];
            match hostcalls::dispatch_http_call(
                &sc.cluster,
                headers,
                None,
                vec![],
                Duration::from_millis(sc.timeout_ms),
            ) {
                Ok(token) => {
                    self.pending.insert(token, h.address.clone());
                }
                Err(e) => {
                    metrics.inc(metrics.scrape_errors, 1);
                    if !host::unknown_cluster(
                        e,
                        "scrape.cluster",
                        &sc.cluster,
                        metrics,
                        metrics.scrape_unknown_cluster,
                        &mut self.unknown_logged,
                    ) {
                        host::log(
                            LogLevel::Warn,
                            &format!(
                                "prefix-router: scrape of {} not dispatched: {e:?}",
                                h.address
                            ),
                        );
                    }
                }
            }
        }
    }

    /// A scrape answered (or failed: status 503 / no body on timeout).
    pub fn response(
        &mut self,
        token: u32,
        body_size: usize,
        cfg: &Config,
        sc: &ScrapeConfig,
        metrics: &Metrics,
    ) {
        let Some(addr) = self.pending.remove(&token) else {
            return;
        };
        let status = host::call_response_header(":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        if status != "200" {
            metrics.inc(metrics.scrape_errors, 1);
            host::log(
                LogLevel::Debug,
                &format!("prefix-router: scrape of {addr}: status {status:?}"),
            );
            return;
        }
        let body = match host::call_response_body(body_size) {
            Ok(b) => b,
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: scrape body of {addr}: {e:?}"),
                );
                return;
            }
        };
        let text = String::from_utf8_lossy(&body);
        if cfg.cost.enabled && !sc.restart_metrics.is_empty() {
            Self::detect_restart(&addr, &text, cfg, sc, metrics);
        }
        if cfg.cost.enabled && !sc.hit_metrics.is_empty() {
            Self::detect_flush(&addr, &text, cfg, sc, metrics);
        }
        let q = match queue_depth(&text, &sc.queue_metrics) {
            Ok(Some(q)) => q,
            Ok(None) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Debug,
                    &format!(
                        "prefix-router: scrape of {addr}: none of {:?} in /metrics",
                        sc.queue_metrics
                    ),
                );
                return;
            }
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Debug,
                    &format!("prefix-router: scrape of {addr}: {e}"),
                );
                return;
            }
        };
        // The running count is optional: absent or unreadable counts 0.
        let running = if sc.running_metrics.is_empty() {
            0.0
        } else {
            match queue_depth(&text, &sc.running_metrics) {
                Ok(r) => r.unwrap_or(0.0),
                Err(e) => {
                    metrics.inc(metrics.scrape_errors, 1);
                    host::log(
                        LogLevel::Debug,
                        &format!("prefix-router: scrape of {addr}: {e}"),
                    );
                    0.0
                }
            }
        };
        let at_ms = host::now_ms().unwrap_or(0);
        match host_state::record_report(&SharedData, &addr, q, running, at_ms) {
            Ok(()) => metrics.inc(metrics.scrapes, 1),
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: storing scrape of {addr}: {e:?}"),
                );
            }
        }
    }
}

impl Scraper {
    /// A replica whose prefix-cache hits since the last scrape fell far
    /// below what the index credited it with has lost the cache the index
    /// believes in (a flush): forget its prefix-index entries
    /// ([`prefix_router_core::scrape`], "Flush detection").
    fn detect_flush(addr: &str, text: &str, cfg: &Config, sc: &ScrapeConfig, metrics: &Metrics) {
        let hits = match first_counter(text, &sc.hit_metrics) {
            Ok(Some(v)) => v,
            // No hit counter in this scrape: nothing to compare with.
            Ok(None) | Err(_) => return,
        };
        // Always take the credit, so that each comparison covers one
        // interval between scrapes.
        let credited = match take_served_credit(&SharedData, addr) {
            Ok(c) => c,
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: reading {addr}'s index credit: {e:?}"),
                );
                return;
            }
        };
        let (credited, grown) = match flush_check(&SharedData, addr, hits, credited) {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: storing {addr}'s hit counter: {e:?}"),
                );
                return;
            }
        };
        Self::forget(
            addr,
            cfg,
            metrics,
            metrics.forget_flushed,
            &format!(
                "hit {grown:.0} tokens in an interval the index credited with {credited}: cache flushed"
            ),
        );
    }

    /// Drop `addr`'s prefix-index entries (its cache is gone), counting it
    /// in `counter` and logging `why`.
    fn forget(addr: &str, cfg: &Config, metrics: &Metrics, counter: u32, why: &str) {
        let Some(idx) = cfg.host_index(addr) else {
            return;
        };
        let now = host::now_ms().unwrap_or(0);
        match shared_index::forget_hosts(&SharedData, &[idx], now) {
            Ok(()) => {
                metrics.inc(counter, 1);
                host::log(
                    LogLevel::Info,
                    &format!("prefix-router: {addr} {why}: its prefix-index entries are forgotten"),
                );
            }
            Err(e) => {
                metrics.inc(metrics.host_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: forgetting {addr}'s index entries: {e:?}"),
                );
            }
        }
    }

    /// A replica whose restart counter went down lost its KV cache: forget
    /// its prefix-index entries.
    fn detect_restart(addr: &str, text: &str, cfg: &Config, sc: &ScrapeConfig, metrics: &Metrics) {
        let Ok(Some(v)) = first_counter(text, &sc.restart_metrics) else {
            return;
        };
        match counter_reset(&SharedData, addr, v) {
            Ok(false) => {}
            Ok(true) => Self::forget(
                addr,
                cfg,
                metrics,
                metrics.forget_restart,
                &format!("restarted (its {:?} went down)", sc.restart_metrics),
            ),
            Err(e) => {
                metrics.inc(metrics.scrape_errors, 1);
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: storing {addr}'s restart counter: {e:?}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::store::MemStore;

    #[test]
    fn one_owner_at_a_time_and_takeover_after_expiry() {
        let s = MemStore::default();
        assert_eq!(acquire_lease(&s, 1, 0, 100), Ok(true));
        assert_eq!(acquire_lease(&s, 2, 50, 100), Ok(false));
        assert_eq!(acquire_lease(&s, 1, 60, 100), Ok(true)); // renew: now until 160
        assert_eq!(acquire_lease(&s, 2, 150, 100), Ok(false));
        assert_eq!(acquire_lease(&s, 2, 161, 100), Ok(true)); // owner 1 stopped ticking
        assert_eq!(acquire_lease(&s, 1, 170, 100), Ok(false));
    }
}
