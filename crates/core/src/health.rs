//! Passive health: eject a host whose responses keep failing, readmit it
//! after a cool-down.
//!
//! ## Algorithm
//! Per host, a count of consecutive failed responses (connect failure, reset,
//! 5xx, an upstream failure flag: [`verdicts`] decides, including for a try
//! Envoy retried on another host) and an `ejected_until` time.
//! When the count reaches `failure_threshold`, the host is ejected for
//! `cooldown_ms` and the count restarts. An ejected host is not eligible on
//! the ring: its keys walk on to their clockwise successors (the same ones
//! in every proxy) and come back when the cool-down ends. Any success resets
//! the count. If every host is ejected, ejection is ignored (routing to a
//! possibly-broken host beats refusing to route).
//!
//! State lives in the [`SharedStore`] (12 bytes a host), updated with a
//! compare-and-swap loop like the in-flight counts. O(1) per response.
//!
//! ## Trade-offs
//! Consecutive failures (not a rate) react fast to a dead replica and ignore
//! sporadic errors on a busy one; a host that fails every other request is
//! never ejected. The cool-down is fixed (no exponential back-off): a
//! replica that comes back gets its keys back within one cool-down.

use crate::load::{cas_update, SharedStore, StoreError};

/// Envoy's response flags (`response.flags`, its legacy bit set) that mean
/// the upstream failed the request, whatever the code: UpstreamRequestTimeout
/// (UT, 0x4), UpstreamRemoteReset (UR, 0x10), UpstreamConnectionFailure
/// (UF, 0x20), UpstreamConnectionTermination (UC, 0x40: e.g. a replica that
/// died while streaming a 200) and UpstreamRetryLimitExceeded (URX, 0x8000).
/// A client that went away (DC, LR) is not the replica's failure.
pub const UPSTREAM_FAILURE_FLAGS: u64 = 0x4 | 0x10 | 0x20 | 0x40 | 0x8000;

/// What the proxy saw of one request at its end, for passive health.
///
/// With a retry policy Envoy may try several hosts for one request; the
/// HTTP filter sees neither the failed tries nor their hosts, only the host
/// of the last try (`upstream.address`) and the number of tries
/// (`upstream.request_attempt_count`). The first try goes to the host the
/// router chose (override_host takes the destination header first), and a
/// try is retried only if it failed, so a request that took more than one
/// try and was served elsewhere failed at the chosen host ([`verdicts`]).
/// Hosts of intermediate tries (a second dead host) stay unseen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt<'a> {
    /// The host the router chose (the destination header it set), if it
    /// routed the request.
    pub chosen: Option<&'a str>,
    /// The host of the last try (`upstream.address`), if any.
    pub served: Option<&'a str>,
    /// Tries Envoy made (`upstream.request_attempt_count`; 1 without
    /// retries, 0 if unknown).
    pub attempts: u64,
    /// The response code (0: none, e.g. the client went away).
    pub code: i64,
    /// Envoy's response flags (0 if unknown).
    pub flags: u64,
}

/// What [`Attempt`] says about each host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdicts<'a> {
    /// The chosen host failed a try that was retried on another host.
    pub chosen_failed: Option<&'a str>,
    /// The last try's host and whether it served the request well (no 5xx,
    /// no upstream failure flag); `None` if the request says nothing of it
    /// (the client went away before a response).
    pub served: Option<(&'a str, bool)>,
}

/// Per-host outcomes of one request ([`Attempt`]).
pub fn verdicts<'a>(a: &Attempt<'a>) -> Verdicts<'a> {
    let chosen_failed = match (a.chosen, a.served) {
        (Some(c), s) if a.attempts > 1 && s != Some(c) => Some(c),
        _ => None,
    };
    let upstream_failed = a.flags & UPSTREAM_FAILURE_FLAGS != 0;
    let served = a.served.and_then(|s| {
        if a.code >= 500 || upstream_failed {
            Some((s, false))
        } else if a.code > 0 {
            Some((s, true))
        } else {
            None
        }
    });
    Verdicts {
        chosen_failed,
        served,
    }
}

/// Validated health settings (`failure_threshold` 0 disables ejection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Consecutive failures that eject a host (0: never eject).
    pub failure_threshold: u32,
    /// How long an ejected host stays out.
    pub cooldown_ms: u64,
}

/// One host's health record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HealthState {
    /// Failures since the last success (or ejection).
    pub consecutive_failures: u32,
    /// Ejected while `now < ejected_until_ms`.
    pub ejected_until_ms: u64,
}

impl HealthState {
    /// Whether the host is out at `now_ms`.
    pub fn ejected(&self, now_ms: u64) -> bool {
        now_ms < self.ejected_until_ms
    }

    fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        let (f, t) = b.split_at_mut(4);
        f.copy_from_slice(&self.consecutive_failures.to_le_bytes());
        t.copy_from_slice(&self.ejected_until_ms.to_le_bytes());
        b
    }

    fn decode(b: Option<&[u8]>) -> HealthState {
        let Some(b) = b else {
            return HealthState::default();
        };
        let f = b
            .get(..4)
            .and_then(|x| x.try_into().ok())
            .map(u32::from_le_bytes);
        let t = b
            .get(4..12)
            .and_then(|x| x.try_into().ok())
            .map(u64::from_le_bytes);
        match (f, t) {
            (Some(consecutive_failures), Some(ejected_until_ms)) => HealthState {
                consecutive_failures,
                ejected_until_ms,
            },
            _ => HealthState::default(),
        }
    }

    /// The state after one response (pure; used by [`record`]).
    pub fn after(self, ok: bool, now_ms: u64, cfg: &HealthConfig) -> (HealthState, bool) {
        if ok {
            return (
                HealthState {
                    consecutive_failures: 0,
                    ..self
                },
                false,
            );
        }
        if cfg.failure_threshold == 0 {
            return (self, false);
        }
        let n = self.consecutive_failures.saturating_add(1);
        if n >= cfg.failure_threshold && !self.ejected(now_ms) {
            (
                HealthState {
                    consecutive_failures: 0,
                    ejected_until_ms: now_ms.saturating_add(cfg.cooldown_ms),
                },
                true,
            )
        } else {
            (
                HealthState {
                    consecutive_failures: n,
                    ..self
                },
                false,
            )
        }
    }
}

fn key(address: &str) -> String {
    format!("prefix_router/health/{address}")
}

/// Read one host's health.
pub fn read_health<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<HealthState, StoreError> {
    let (v, _) = store.get(&key(address))?;
    Ok(HealthState::decode(v.as_deref()))
}

/// Record a response outcome; returns `true` if this response ejected the host.
pub fn record<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    ok: bool,
    now_ms: u64,
    cfg: &HealthConfig,
) -> Result<bool, StoreError> {
    cas_update(store, &key(address), |v| {
        let cur = HealthState::decode(v);
        let (next, ejected) = cur.after(ok, now_ms, cfg);
        if next == cur && v.is_some() {
            (None, false)
        } else {
            (Some(next.encode()), ejected)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::MemStore;

    const CFG: HealthConfig = HealthConfig {
        failure_threshold: 3,
        cooldown_ms: 1000,
    };

    #[test]
    fn ejects_after_threshold_and_readmits_after_cooldown() {
        let s = MemStore::default();
        assert!(!record(&s, "a", false, 0, &CFG).unwrap());
        assert!(!record(&s, "a", false, 1, &CFG).unwrap());
        assert!(record(&s, "a", false, 2, &CFG).unwrap());
        let h = read_health(&s, "a").unwrap();
        assert!(h.ejected(500));
        assert!(!h.ejected(1002));
        // Failures while ejected do not extend the cool-down.
        assert!(!record(&s, "a", false, 10, &CFG).unwrap());
        assert_eq!(read_health(&s, "a").unwrap().ejected_until_ms, 1002);
    }

    #[test]
    fn success_resets_the_count() {
        let s = MemStore::default();
        record(&s, "a", false, 0, &CFG).unwrap();
        record(&s, "a", false, 0, &CFG).unwrap();
        record(&s, "a", true, 0, &CFG).unwrap();
        assert!(!record(&s, "a", false, 0, &CFG).unwrap());
        assert!(!read_health(&s, "a").unwrap().ejected(0));
    }

    #[test]
    fn threshold_zero_never_ejects() {
        let s = MemStore::default();
        let off = HealthConfig {
            failure_threshold: 0,
            cooldown_ms: 1000,
        };
        for t in 0..100 {
            assert!(!record(&s, "a", false, t, &off).unwrap());
        }
        assert!(!read_health(&s, "a").unwrap().ejected(50));
    }

    fn attempt<'a>(
        chosen: Option<&'a str>,
        served: Option<&'a str>,
        attempts: u64,
        code: i64,
        flags: u64,
    ) -> Attempt<'a> {
        Attempt {
            chosen,
            served,
            attempts,
            code,
            flags,
        }
    }

    #[test]
    fn every_try_counts() {
        let v = |a| verdicts(&a);
        // No retry: the served host's outcome alone.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 200, 0)),
            Verdicts {
                chosen_failed: None,
                served: Some(("a", true))
            }
        );
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 503, 0x20)).served,
            Some(("a", false))
        );
        // Retried away from the chosen host and served: the chosen host failed,
        // the other one served well.
        assert_eq!(
            v(attempt(Some("a"), Some("b"), 2, 200, 0)),
            Verdicts {
                chosen_failed: Some("a"),
                served: Some(("b", true))
            }
        );
        // Every try failed: both count.
        assert_eq!(
            v(attempt(Some("a"), Some("c"), 3, 503, 0x8020)),
            Verdicts {
                chosen_failed: Some("a"),
                served: Some(("c", false))
            }
        );
        // A replica that died mid-stream: 200 with UC is a failure.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 200, 0x40)).served,
            Some(("a", false))
        );
        // The client went away (DC, LR): nothing about the replica.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 0, 0x4000 | 0x8)),
            Verdicts::default()
        );
        // A non-member destination falls back on the first try (one try):
        // nothing against the chosen host.
        assert_eq!(
            v(attempt(Some("x"), Some("b"), 1, 200, 0)).chosen_failed,
            None
        );
        // Retried onto the chosen host again (no previous_hosts predicate):
        // only the last try's outcome is known.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 2, 200, 0)),
            Verdicts {
                chosen_failed: None,
                served: Some(("a", true))
            }
        );
        // Not routed by the filter (a fallback): the served host only.
        assert_eq!(
            v(attempt(None, Some("b"), 2, 200, 0)),
            Verdicts {
                chosen_failed: None,
                served: Some(("b", true))
            }
        );
    }

    #[test]
    fn decode_tolerates_garbage() {
        assert_eq!(HealthState::decode(Some(&[1, 2])), HealthState::default());
        let h = HealthState {
            consecutive_failures: 7,
            ejected_until_ms: 99,
        };
        assert_eq!(HealthState::decode(Some(&h.encode())), h);
    }
}
