//! Passive health: eject a host whose responses keep failing, readmit it
//! after a cool-down.
//!
//! ## Algorithm
//! Per host, a count of consecutive failed responses (connect failure, reset,
//! 5xx: the adapter decides what a failure is) and an `ejected_until` time.
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
