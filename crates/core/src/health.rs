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
//! State lives in the [`crate::store::SharedStore`] (12 bytes a host), updated with a
//! compare-and-swap loop like the in-flight counts. O(1) per response.
//!
//! ## Trade-offs
//! Consecutive failures (not a rate) react fast to a dead replica and ignore
//! sporadic errors on a busy one; a host that fails every other request is
//! never ejected. The cool-down is fixed (no exponential back-off): a
//! replica that comes back gets its keys back within one cool-down.

/// Envoy's response flags (`response.flags`, its legacy bit set) that mean
/// the upstream failed the request, whatever the code: UpstreamRequestTimeout
/// (UT, 0x4), UpstreamRemoteReset (UR, 0x10), UpstreamConnectionFailure
/// (UF, 0x20), UpstreamConnectionTermination (UC, 0x40: e.g. a replica that
/// died while streaming a 200), UpstreamRetryLimitExceeded (URX, 0x8000) and
/// UpstreamProtocolError (UPE, 0x800000: Envoy 1.40 flags a chunked 200 cut
/// by a dying replica so, measured).
/// A client that went away (DC, LR) is not the replica's failure.
pub const UPSTREAM_FAILURE_FLAGS: u64 = 0x4 | 0x10 | 0x20 | 0x40 | 0x8000 | 0x80_0000;

/// Flags that say the connection failed or was lost, not that the replica
/// answered badly: UpstreamConnectionFailure (UF, 0x20: it refused the
/// connection), UpstreamConnectionTermination (UC, 0x40: the connection
/// closed before the response was complete) and UpstreamProtocolError (UPE,
/// 0x800000: what a chunked response cut off by a closing connection shows
/// in Envoy 1.40). A replica that was killed shows all three at once: its
/// streams in flight end UC or UPE, new connections UF.
pub const CONNECTION_LOST_FLAGS: u64 = 0x20 | 0x40 | 0x80_0000;

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

/// One try's outcome at a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served (no 5xx, no upstream failure flag).
    Ok,
    /// Reached the host and failed (5xx, a reset or a cut stream).
    Failed,
    /// The connection failed or was lost ([`CONNECTION_LOST_FLAGS`]), or
    /// Envoy retried the try elsewhere (with `envoy/envoy.yaml`'s retry
    /// policy only tries the replica got no byte of are retried). A replica
    /// that refuses or drops connections is down, not busy:
    /// [`HealthConfig::unreachable_threshold`] ejects it after fewer of these.
    Unreachable,
}

/// What [`Attempt`] says about each host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdicts<'a> {
    /// The chosen host failed a try that was retried on another host.
    pub chosen_failed: Option<&'a str>,
    /// The last try's host and its outcome; `None` if the request says
    /// nothing of it (the client went away before a response).
    pub served: Option<(&'a str, Outcome)>,
}

/// Per-host outcomes of one request ([`Attempt`]).
pub fn verdicts<'a>(a: &Attempt<'a>) -> Verdicts<'a> {
    let chosen_failed = match (a.chosen, a.served) {
        (Some(c), s) if a.attempts > 1 && s != Some(c) => Some(c),
        _ => None,
    };
    let upstream_failed = a.flags & UPSTREAM_FAILURE_FLAGS != 0;
    let served = a.served.and_then(|s| {
        if a.flags & CONNECTION_LOST_FLAGS != 0 {
            Some((s, Outcome::Unreachable))
        } else if a.code >= 500 || upstream_failed {
            Some((s, Outcome::Failed))
        } else if a.code > 0 {
            Some((s, Outcome::Ok))
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
    /// Consecutive [`Outcome::Unreachable`] tries that eject a host sooner
    /// (0: they count as ordinary failures only). A killed replica drops its
    /// streams and refuses every connection at once, and the requests routed
    /// to it next (with retries on, hidden from clients) may come a second
    /// apart: 5 ordinary failures took up to 1.3 s in the e2e kill test,
    /// 2 lost connections eject it as its streams in flight end.
    pub unreachable_threshold: u32,
}

/// One host's health record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HealthState {
    /// Failures since the last success (or ejection).
    pub consecutive_failures: u32,
    /// [`Outcome::Unreachable`] tries since the last success, ordinary
    /// failure (the host answered) or ejection.
    pub consecutive_unreachable: u32,
    /// Ejected while `now < ejected_until_ms`.
    pub ejected_until_ms: u64,
}

impl HealthState {
    /// Whether the host is out at `now_ms`.
    pub fn ejected(&self, now_ms: u64) -> bool {
        now_ms < self.ejected_until_ms
    }

    /// The state after one try (pure; used by [`crate::host_state::record_health`]); `true` if it
    /// ejects the host.
    pub fn after(self, outcome: Outcome, now_ms: u64, cfg: &HealthConfig) -> (HealthState, bool) {
        let (failures, unreachable) = match outcome {
            Outcome::Ok => {
                return (
                    HealthState {
                        consecutive_failures: 0,
                        consecutive_unreachable: 0,
                        ..self
                    },
                    false,
                )
            }
            Outcome::Failed => (self.consecutive_failures.saturating_add(1), 0),
            Outcome::Unreachable => (
                self.consecutive_failures.saturating_add(1),
                self.consecutive_unreachable.saturating_add(1),
            ),
        };
        if cfg.failure_threshold == 0 {
            return (self, false);
        }
        let eject = failures >= cfg.failure_threshold
            || (cfg.unreachable_threshold > 0 && unreachable >= cfg.unreachable_threshold);
        if eject && !self.ejected(now_ms) {
            (
                HealthState {
                    consecutive_failures: 0,
                    consecutive_unreachable: 0,
                    ejected_until_ms: now_ms.saturating_add(cfg.cooldown_ms),
                },
                true,
            )
        } else {
            (
                HealthState {
                    consecutive_failures: failures,
                    consecutive_unreachable: unreachable,
                    ..self
                },
                false,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                served: Some(("a", Outcome::Ok))
            }
        );
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 503, 0x20)).served,
            Some(("a", Outcome::Unreachable))
        );
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 500, 0)).served,
            Some(("a", Outcome::Failed))
        );
        // A chunked 200 a dying replica cut: Envoy flags it UPE.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 200, 0x80_0000 | 0x4000)).served,
            Some(("a", Outcome::Unreachable))
        );
        // A reset stream (UR) on a live connection is an ordinary failure.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 200, 0x10)).served,
            Some(("a", Outcome::Failed))
        );
        // Retried away from the chosen host and served: the chosen host failed,
        // the other one served well.
        assert_eq!(
            v(attempt(Some("a"), Some("b"), 2, 200, 0)),
            Verdicts {
                chosen_failed: Some("a"),
                served: Some(("b", Outcome::Ok))
            }
        );
        // Every try failed: both count.
        assert_eq!(
            v(attempt(Some("a"), Some("c"), 3, 503, 0x8020)),
            Verdicts {
                chosen_failed: Some("a"),
                served: Some(("c", Outcome::Unreachable))
            }
        );
        // A replica that died mid-stream: 200 with UC is a failure.
        assert_eq!(
            v(attempt(Some("a"), Some("a"), 1, 200, 0x40)).served,
            Some(("a", Outcome::Unreachable))
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
                served: Some(("a", Outcome::Ok))
            }
        );
        // Not routed by the filter (a fallback): the served host only.
        assert_eq!(
            v(attempt(None, Some("b"), 2, 200, 0)),
            Verdicts {
                chosen_failed: None,
                served: Some(("b", Outcome::Ok))
            }
        );
    }
}
