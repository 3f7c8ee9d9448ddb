//! One shared-data record per host, and one for the fleet.
//!
//! Everything a decision reads about a host lives in one value under
//! `prefix_router/host/<address>` ([`HostRecord`], [`RECORD_BYTES`] bytes,
//! fixed layout): this proxy's in-flight count and pending requests, the
//! replica's last load report, passive health, and the index rule's
//! pending prefill tokens.
//! A decision reads one record per host it looks at (the key's ring-walk
//! candidates), never the whole fleet's. Writers go through [`update`], a
//! compare-and-swap loop on the one key ([`crate::store::cas_update`]), so
//! the record's fields change together and no update is lost.
//!
//! The bound's fleet-wide total load is not summed host by host: the
//! in-flight part is kept in the fleet record `prefix_router/fleet`
//! ([`FLEET_KEY`], the sum of every host's in-flight count, changed by
//! [`add_inflight`] with exactly the change it made to the host's count),
//! and the reported part (other proxies' and clients' requests,
//! [`crate::load::HostLoad::others`]) by a periodic sum the caller keeps
//! ([`others_total`]).
//!
//! ## Layout (little-endian)
//! | bytes | field |
//! |---|---|
//! | 0..8 | in-flight count (u64) |
//! | 8..16 | report: waiting (f64) |
//! | 16..24 | report: received at, ms (u64) |
//! | 24..32 | report: running (f64) |
//! | 32..40 | report: own in-flight at the report (u64) |
//! | 40..44 | health: consecutive failures (u32) |
//! | 44..48 | health: consecutive unreachable (u32) |
//! | 48..56 | health: ejected until, ms (u64) |
//! | 56..64 | pending prefill tokens (u64) |
//! | 64 | flags: bit 0 = a report is present |
//! | 65..73 | pending requests: routed, no response byte yet (u64) |
//! | 73..81 | report: own pending requests at the report (u64) |
//!
//! A value of any other length (absent, cleared, garbage) reads as an idle,
//! healthy host with no report.

use crate::health::{HealthConfig, HealthState, Outcome};
use crate::load::{Freshness, HostLoad, Report};
use crate::store::{cas_update, cas_update_from, decode_u64, SharedStore, Snapshot, StoreError};

/// Bytes of an encoded [`HostRecord`].
pub const RECORD_BYTES: usize = 81;

/// Shared-data key of the fleet record: the sum of the hosts' in-flight
/// counts (u64).
pub const FLEET_KEY: &str = "prefix_router/fleet";

/// Shared-data key of a host's record.
pub fn key(address: &str) -> String {
    format!("prefix_router/host/{address}")
}

/// Everything the filter keeps about one host.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostRecord {
    /// Requests this proxy routed there and has not finished.
    pub inflight: u64,
    /// The replica's last load report.
    pub report: Option<Report>,
    /// Passive health.
    pub health: HealthState,
    /// The index rule's pending prefill tokens (`cost.queue = tokens`).
    pub pending_tokens: u64,
    /// Requests this proxy routed there that have no response byte yet
    /// ([`HostLoad::pending_requests`]).
    pub pending_requests: u64,
}

impl HostRecord {
    /// Apply a try's outcome to the passive health ([`HealthState::after`]);
    /// `true` if it ejected the host.
    fn record_outcome(&mut self, outcome: Outcome, now_ms: u64, cfg: &HealthConfig) -> bool {
        let (next, ejected) = self.health.after(outcome, now_ms, cfg);
        self.health = next;
        ejected
    }
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn f64_at(b: &[u8], at: usize) -> Option<f64> {
    u64_at(b, at).map(f64::from_bits)
}

impl HostRecord {
    /// The encoded record ([`RECORD_BYTES`] bytes, see the module docs).
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        let r = self.report.unwrap_or(Report {
            queue: 0.0,
            running: 0.0,
            own: 0,
            own_pending: 0,
            at_ms: 0,
        });
        let fields: [(usize, [u8; 8]); 9] = [
            (0, self.inflight.to_le_bytes()),
            (8, r.queue.to_le_bytes()),
            (16, r.at_ms.to_le_bytes()),
            (24, r.running.to_le_bytes()),
            (32, r.own.to_le_bytes()),
            (48, self.health.ejected_until_ms.to_le_bytes()),
            (56, self.pending_tokens.to_le_bytes()),
            (65, self.pending_requests.to_le_bytes()),
            (73, r.own_pending.to_le_bytes()),
        ];
        for (at, v) in fields {
            if let Some(d) = b.get_mut(at..at + 8) {
                d.copy_from_slice(&v);
            }
        }
        let small: [(usize, [u8; 4]); 2] = [
            (40, self.health.consecutive_failures.to_le_bytes()),
            (44, self.health.consecutive_unreachable.to_le_bytes()),
        ];
        for (at, v) in small {
            if let Some(d) = b.get_mut(at..at + 4) {
                d.copy_from_slice(&v);
            }
        }
        if let Some(f) = b.get_mut(64) {
            *f = u8::from(self.report.is_some());
        }
        b
    }

    /// Decode a stored value; anything but a [`RECORD_BYTES`]-byte value is
    /// the default (idle, healthy, no report).
    pub fn decode(v: Option<&[u8]>) -> HostRecord {
        v.filter(|b| b.len() == RECORD_BYTES)
            .and_then(Self::try_decode)
            .unwrap_or_default()
    }

    fn try_decode(b: &[u8]) -> Option<HostRecord> {
        let has_report = b.get(64).copied()? & 1 == 1;
        let report = has_report.then_some(Report {
            queue: f64_at(b, 8)?,
            at_ms: u64_at(b, 16)?,
            running: f64_at(b, 24)?,
            own: u64_at(b, 32)?,
            own_pending: u64_at(b, 73)?,
        });
        Some(HostRecord {
            inflight: u64_at(b, 0)?,
            report,
            health: HealthState {
                consecutive_failures: u32_at(b, 40)?,
                consecutive_unreachable: u32_at(b, 44)?,
                ejected_until_ms: u64_at(b, 48)?,
            },
            pending_tokens: u64_at(b, 56)?,
            pending_requests: u64_at(b, 65)?,
        })
    }

    /// The host's load as a decision sees it at `now_ms` (ejection from
    /// passive health; the peers' pending tokens and the recent load are
    /// the caller's).
    pub fn load(&self, now_ms: u64) -> HostLoad {
        HostLoad {
            inflight: self.inflight,
            pending_requests: self.pending_requests,
            report: self.report,
            ejected: self.health.ejected(now_ms),
            pending_prefill_tokens: self.pending_tokens,
            peer_pending_tokens: 0,
            recent: 0.0,
        }
    }
}

/// Read one host's record (the default if absent).
pub fn read<S: SharedStore + ?Sized>(store: &S, address: &str) -> Result<HostRecord, StoreError> {
    let (v, _) = store.get(&key(address))?;
    Ok(HostRecord::decode(v.as_deref()))
}

/// Read one host's record and keep what was read ([`Snapshot`]), so that
/// an update of the same record can start from it ([`update_from`]).
pub fn read_snapshot<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<(HostRecord, Snapshot), StoreError> {
    let (value, cas) = store.get(&key(address))?;
    let r = HostRecord::decode(value.as_deref());
    Ok((r, Snapshot { value, cas }))
}

/// Read-modify-write one host's record with a bounded compare-and-swap
/// loop: `f` changes the record and returns the result; a record `f`
/// leaves unchanged (and that exists) is not written.
pub fn update<S, T, F>(store: &S, address: &str, f: F) -> Result<T, StoreError>
where
    S: SharedStore + ?Sized,
    F: FnMut(&mut HostRecord) -> T,
{
    cas_update(store, &key(address), on_record(f))
}

/// [`update`] whose first attempt starts from the record as read earlier
/// ([`read_snapshot`]; re-read only if it changed since).
pub fn update_from<S, T, F>(
    store: &S,
    address: &str,
    first: Option<Snapshot>,
    f: F,
) -> Result<T, StoreError>
where
    S: SharedStore + ?Sized,
    F: FnMut(&mut HostRecord) -> T,
{
    cas_update_from(store, &key(address), first, on_record(f))
}

/// A change of a decoded record as a change of the stored bytes (nothing
/// to write when the record exists and `f` leaves it unchanged).
fn on_record<T>(
    mut f: impl FnMut(&mut HostRecord) -> T,
) -> impl FnMut(Option<&[u8]>) -> (Option<[u8; RECORD_BYTES]>, T) {
    move |v| {
        let cur = HostRecord::decode(v);
        let mut next = cur;
        let out = f(&mut next);
        if next == cur && v.is_some_and(|b| b.len() == RECORD_BYTES) {
            (None, out)
        } else {
            (Some(next.encode()), out)
        }
    }
}

/// Add `delta` to a host's in-flight count (saturating at 0) and the same
/// change to the fleet's total ([`FLEET_KEY`]); returns the host's new
/// count.
pub fn add_inflight<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    delta: i64,
) -> Result<u64, StoreError> {
    add_inflight_from(store, address, delta, None, None)
}

/// [`add_inflight`] starting from the host's record and the fleet record
/// as read earlier ([`read_snapshot`], [`read_fleet_snapshot`]): no read
/// of either unless it changed since.
pub fn add_inflight_from<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    delta: i64,
    host: Option<Snapshot>,
    fleet: Option<Snapshot>,
) -> Result<u64, StoreError> {
    add_inflight_with(store, address, delta, host, fleet, &mut |_| {})
}

/// Release one in-flight request at a host and record a try's outcome
/// there ([`HealthState::after`]) in one read-modify-write of its record
/// (then the fleet's total, as [`add_inflight`]); returns whether it
/// ejected the host.
pub fn release_and_record_health<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    outcome: Outcome,
    now_ms: u64,
    cfg: &HealthConfig,
) -> Result<bool, StoreError> {
    let mut ejected = false;
    // The closure's last run is the one written.
    add_inflight_with(store, address, -1, None, None, &mut |r| {
        ejected = r.record_outcome(outcome, now_ms, cfg);
    })?;
    Ok(ejected)
}

/// [`add_inflight_from`] letting `also` change the rest of the host's
/// record in the same compare-and-swap (e.g. the pending prefill tokens
/// the request adds; it runs again on a retry); returns the host's new
/// count.
pub fn add_inflight_with<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    delta: i64,
    host: Option<Snapshot>,
    fleet: Option<Snapshot>,
    also: &mut dyn FnMut(&mut HostRecord),
) -> Result<u64, StoreError> {
    let (old, new) = update_from(store, address, host, |r| {
        let old = r.inflight;
        r.inflight = if delta >= 0 {
            old.saturating_add(delta.unsigned_abs())
        } else {
            old.saturating_sub(delta.unsigned_abs())
        };
        also(r);
        (old, r.inflight)
    })?;
    if new != old {
        let change = if new > old {
            i64::try_from(new - old).unwrap_or(i64::MAX)
        } else {
            i64::try_from(old - new).map_or(i64::MIN, |d| -d)
        };
        crate::store::add_counter_from(store, FLEET_KEY, change, fleet)?;
    }
    Ok(new)
}

/// The fleet's total in-flight count ([`FLEET_KEY`]; 0 if absent).
pub fn read_fleet_inflight<S: SharedStore + ?Sized>(store: &S) -> Result<u64, StoreError> {
    Ok(read_fleet_snapshot(store)?.0)
}

/// [`read_fleet_inflight`], keeping what was read for a later
/// [`add_inflight_from`].
pub fn read_fleet_snapshot<S: SharedStore + ?Sized>(
    store: &S,
) -> Result<(u64, Snapshot), StoreError> {
    let (value, cas) = store.get(FLEET_KEY)?;
    Ok((decode_u64(value.as_deref()), Snapshot { value, cas }))
}

/// The reported part of the fleet's load at `now_ms`: the sum over
/// `addresses` of [`HostLoad::others`] (one read per host: the caller keeps
/// it and refreshes it periodically, off the request path). Unreadable
/// records count 0; the first error is returned beside the sum.
pub fn others_total<'a, S: SharedStore + ?Sized>(
    store: &S,
    addresses: impl IntoIterator<Item = &'a str>,
    now_ms: u64,
    f: Freshness,
) -> (u64, Option<StoreError>) {
    let mut sum = 0u64;
    let mut err = None;
    for a in addresses {
        match read(store, a) {
            Ok(r) => sum = sum.saturating_add(r.load(now_ms).others(now_ms, f)),
            Err(e) => {
                err.get_or_insert(e);
            }
        }
    }
    (sum, err)
}

/// Read one host's passive health.
pub fn read_health<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<HealthState, StoreError> {
    Ok(read(store, address)?.health)
}

/// Record a try's outcome at a host ([`HealthState::after`]); returns
/// `true` if it ejected the host.
pub fn record_health<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    outcome: Outcome,
    now_ms: u64,
    cfg: &HealthConfig,
) -> Result<bool, StoreError> {
    update(store, address, |r| r.record_outcome(outcome, now_ms, cfg))
}

/// A host's in-flight count (0 if absent).
pub fn read_inflight<S: SharedStore + ?Sized>(store: &S, address: &str) -> Result<u64, StoreError> {
    Ok(read(store, address)?.inflight)
}

/// What one request holds at the host it was routed to until its first
/// response byte: one pending request, and the index rule's pending
/// prefill tokens (0 unless `cost.queue = tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pending {
    /// Pending requests (1 for a routed request).
    pub requests: u64,
    /// Pending prefill tokens.
    pub tokens: u64,
}

impl HostRecord {
    /// Add what a routed request holds (saturating).
    pub fn add_pending(&mut self, p: Pending) {
        self.pending_requests = self.pending_requests.saturating_add(p.requests);
        self.pending_tokens = self.pending_tokens.saturating_add(p.tokens);
    }

    /// Take off what an answered or ended request held (saturating at 0).
    pub fn take_pending(&mut self, p: Pending) {
        self.pending_requests = self.pending_requests.saturating_sub(p.requests);
        self.pending_tokens = self.pending_tokens.saturating_sub(p.tokens);
    }
}

/// Take off what a request held at a host ([`HostRecord::take_pending`]).
pub fn release_pending<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    p: Pending,
) -> Result<(), StoreError> {
    update(store, address, |r| r.take_pending(p))
}

/// Store what a replica reported (`queue` waiting, `running` requests) at
/// `at_ms`, with this proxy's own in-flight count and pending requests at
/// the host as of now ([`Report::own`], [`Report::own_pending`], read in
/// the same compare-and-swap), so that [`HostLoad::others`] and
/// [`HostLoad::fresh_queue`] can tell the proxy's requests from everyone
/// else's.
pub fn record_report<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    queue: f64,
    running: f64,
    at_ms: u64,
) -> Result<(), StoreError> {
    record_report_releasing(store, address, queue, running, at_ms, Pending::default())
}

/// [`record_report`] that first takes off what the request whose
/// response carried the report held there ([`HostRecord::take_pending`]),
/// in the same update: it is answered, so no longer in the replica's
/// waiting count the report gives.
pub fn record_report_releasing<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    queue: f64,
    running: f64,
    at_ms: u64,
    release: Pending,
) -> Result<(), StoreError> {
    update(store, address, |r| {
        r.take_pending(release);
        r.report = Some(Report {
            queue,
            running,
            own: r.inflight,
            own_pending: r.pending_requests,
            at_ms,
        });
    })
}

/// Store a report for a host (last writer wins: a report is a snapshot).
pub fn store_report<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
    r: Report,
) -> Result<(), StoreError> {
    update(store, address, |rec| rec.report = Some(r))
}

/// Read one host's load: its in-flight count and report (ejection and
/// pending tokens left out: [`HostRecord::load`] has them).
pub fn read_load<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<HostLoad, StoreError> {
    let r = read(store, address)?;
    Ok(HostLoad {
        inflight: r.inflight,
        report: r.report,
        ..HostLoad::default()
    })
}

/// Forget what the filter kept about a host that left: its load report,
/// passive health and pending tokens (its in-flight count drains as its
/// requests end, keeping the fleet total right).
pub fn drop_host_state<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<(), StoreError> {
    update(store, address, |r| {
        *r = HostRecord {
            inflight: r.inflight,
            ..HostRecord::default()
        };
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    #[cfg(not(target_family = "wasm"))]
    use std::sync::Arc;

    #[test]
    fn record_round_trips_and_garbage_is_idle() {
        let r = HostRecord {
            inflight: 3,
            report: Some(Report {
                queue: 2.5,
                running: 4.0,
                own: 1,
                own_pending: 6,
                at_ms: 77,
            }),
            health: HealthState {
                consecutive_failures: 2,
                consecutive_unreachable: 1,
                ejected_until_ms: 900,
            },
            pending_tokens: 12345,
            pending_requests: 7,
        };
        assert_eq!(HostRecord::decode(Some(&r.encode())), r);
        let none = HostRecord { report: None, ..r };
        assert_eq!(HostRecord::decode(Some(&none.encode())), none);
        assert_eq!(HostRecord::decode(None), HostRecord::default());
        assert_eq!(HostRecord::decode(Some(&[1, 2, 3])), HostRecord::default());
        assert_eq!(HostRecord::decode(Some(&[])), HostRecord::default());
        assert!(r.load(899).ejected && !r.load(900).ejected);
        assert_eq!(r.load(0).pending_prefill_tokens, 12345);
    }

    #[test]
    fn inflight_keeps_the_fleet_total() {
        let s = MemStore::default();
        assert_eq!(add_inflight(&s, "a", 2), Ok(2));
        assert_eq!(add_inflight(&s, "b", 1), Ok(1));
        assert_eq!(read_fleet_inflight(&s), Ok(3));
        // The fleet total changes by what the host count changed: a count
        // saturating at 0 takes nothing off it.
        assert_eq!(add_inflight(&s, "b", -1), Ok(0));
        assert_eq!(add_inflight(&s, "b", -1), Ok(0));
        assert_eq!(read_fleet_inflight(&s), Ok(2));
        assert_eq!(add_inflight(&s, "a", -2), Ok(0));
        assert_eq!(read_fleet_inflight(&s), Ok(0));
        // Dropping a host's state keeps its in-flight count.
        add_inflight(&s, "c", 2).unwrap();
        update(&s, "c", |r| r.pending_tokens = 9).unwrap();
        drop_host_state(&s, "c").unwrap();
        assert_eq!(
            read(&s, "c").unwrap(),
            HostRecord {
                inflight: 2,
                ..HostRecord::default()
            }
        );
    }

    #[test]
    fn snapshots_and_the_combined_release_keep_every_count() {
        let s = MemStore::default();
        add_inflight(&s, "a", 1).unwrap();
        add_inflight(&s, "b", 1).unwrap();
        // A decision's reads feed the in-flight add.
        let (r, host) = read_snapshot(&s, "a").unwrap();
        let (total, fleet) = read_fleet_snapshot(&s).unwrap();
        assert_eq!((r.inflight, total), (1, 2));
        assert_eq!(
            add_inflight_from(&s, "a", 1, Some(host.clone()), Some(fleet.clone())),
            Ok(2)
        );
        // Stale snapshots (both records changed since): re-read, nothing lost.
        assert_eq!(
            add_inflight_from(&s, "a", 1, Some(host), Some(fleet)),
            Ok(3)
        );
        assert_eq!(read_fleet_inflight(&s), Ok(4));
        // Release and health in one update: the same state as one after the other.
        let t = MemStore::default();
        add_inflight(&t, "a", 3).unwrap();
        add_inflight(&t, "b", 1).unwrap();
        for at in 0..3 {
            let ejected = release_and_record_health(&s, "a", F, at, &CFG).unwrap();
            add_inflight(&t, "a", -1).unwrap();
            assert_eq!(record_health(&t, "a", F, at, &CFG).unwrap(), ejected);
            assert_eq!(ejected, at == 2);
            assert_eq!(read(&s, "a").unwrap(), read(&t, "a").unwrap());
            assert_eq!(read_fleet_inflight(&s), read_fleet_inflight(&t));
        }
        // What a request holds rides with the in-flight add and is taken
        // off with the report its response carried, before the report
        // counts this proxy's pending requests.
        let held = Pending {
            requests: 1,
            tokens: 40,
        };
        for _ in 0..2 {
            let (_, snap) = read_snapshot(&s, "p").unwrap();
            add_inflight_with(&s, "p", 1, Some(snap), None, &mut |r| r.add_pending(held)).unwrap();
        }
        record_report_releasing(&s, "p", 2.0, 1.0, 5, held).unwrap();
        let p = read(&s, "p").unwrap();
        assert_eq!(
            (p.inflight, p.pending_requests, p.pending_tokens),
            (2, 1, 40)
        );
        assert_eq!(
            p.report.map(|r| (r.own, r.own_pending, r.at_ms)),
            Some((2, 1, 5))
        );
        release_pending(&s, "p", held).unwrap();
        release_pending(&s, "p", held).unwrap();
        let p = read(&s, "p").unwrap();
        assert_eq!((p.pending_requests, p.pending_tokens), (0, 0));
        add_inflight(&s, "p", -2).unwrap();
        // At 0 it saturates and leaves the fleet's total alone.
        assert!(!release_and_record_health(&s, "a", OK, 9, &CFG).unwrap());
        assert_eq!(read(&s, "a").unwrap().inflight, 0);
        assert_eq!(read_fleet_inflight(&s), Ok(1));
    }

    #[test]
    fn others_total_sums_fresh_reports() {
        let s = MemStore::default();
        let f = Freshness::ttl(1000);
        for (a, q, at) in [("a", 3.0, 0u64), ("b", 5.0, 500), ("c", 7.0, 0)] {
            update(&s, a, |r| {
                r.report = Some(Report {
                    queue: q,
                    running: 0.0,
                    own: 0,
                    own_pending: 0,
                    at_ms: at,
                })
            })
            .unwrap();
        }
        assert_eq!(others_total(&s, ["a", "b"], 1000, f), (8, None));
        // `a` and `c` expired at 1001.
        assert_eq!(others_total(&s, ["a", "b", "c", "d"], 1001, f), (5, None));
    }

    const CFG: HealthConfig = HealthConfig {
        failure_threshold: 3,
        cooldown_ms: 1000,
        unreachable_threshold: 0,
    };
    const F: Outcome = Outcome::Failed;
    const OK: Outcome = Outcome::Ok;
    const U: Outcome = Outcome::Unreachable;

    #[test]
    fn ejects_after_threshold_and_readmits_after_cooldown() {
        let s = MemStore::default();
        assert!(!record_health(&s, "a", F, 0, &CFG).unwrap());
        assert!(!record_health(&s, "a", F, 1, &CFG).unwrap());
        assert!(record_health(&s, "a", F, 2, &CFG).unwrap());
        let h = read_health(&s, "a").unwrap();
        assert!(h.ejected(500));
        assert!(!h.ejected(1002));
        // Failures while ejected do not extend the cool-down.
        assert!(!record_health(&s, "a", F, 10, &CFG).unwrap());
        assert_eq!(read_health(&s, "a").unwrap().ejected_until_ms, 1002);
    }

    #[test]
    fn success_resets_the_count() {
        let s = MemStore::default();
        record_health(&s, "a", F, 0, &CFG).unwrap();
        record_health(&s, "a", F, 0, &CFG).unwrap();
        record_health(&s, "a", OK, 0, &CFG).unwrap();
        assert!(!record_health(&s, "a", F, 0, &CFG).unwrap());
        assert!(!read_health(&s, "a").unwrap().ejected(0));
    }

    #[test]
    fn threshold_zero_never_ejects() {
        let s = MemStore::default();
        let off = HealthConfig {
            failure_threshold: 0,
            cooldown_ms: 1000,
            unreachable_threshold: 2,
        };
        for t in 0..100 {
            assert!(!record_health(&s, "a", F, t, &off).unwrap());
            assert!(!record_health(&s, "a", U, t, &off).unwrap());
        }
        assert!(!read_health(&s, "a").unwrap().ejected(50));
    }

    #[test]
    fn store_round_trip() {
        let s = MemStore::default();
        assert_eq!(add_inflight(&s, "a", 1), Ok(1));
        assert_eq!(add_inflight(&s, "a", 1), Ok(2));
        assert_eq!(add_inflight(&s, "a", -5), Ok(0));
        store_report(
            &s,
            "a",
            Report {
                queue: 3.5,
                running: 4.0,
                own: 2,
                own_pending: 0,
                at_ms: 77,
            },
        )
        .unwrap();
        let l = read_load(&s, "a").unwrap();
        assert_eq!(l.inflight, 0);
        assert_eq!(
            l.report,
            Some(Report {
                queue: 3.5,
                running: 4.0,
                own: 2,
                own_pending: 0,
                at_ms: 77
            })
        );
        // record_report takes this proxy's in-flight count as `own`.
        add_inflight(&s, "d", 3).unwrap();
        record_report(&s, "d", 1.0, 4.0, 9).unwrap();
        let d = read_load(&s, "d").unwrap();
        assert_eq!(d.report.map(|r| r.own), Some(3));
        assert_eq!(d.others(9, Freshness::ttl(10)), 2);
        assert_eq!(d.effective(9, Freshness::ttl(10)), 5);
        assert_eq!(read_load(&s, "b").unwrap(), HostLoad::default());
    }

    // wasm32-wasip1 has no threads; the filter's CAS path is exercised by the
    // single-threaded tests there and by Envoy with --concurrency 2.
    #[cfg(not(target_family = "wasm"))]
    #[test]
    fn cas_loop_loses_no_updates_under_contention() {
        let s = Arc::new(MemStore::default());
        // The key exists before the race: a write to an absent key carries
        // no CAS (as in Envoy's shared data), so two first writes could
        // both land; this test is about the CAS loop once it exists.
        add_inflight(&*s, "h", 0).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    // Under heavy CPU contention a thread can exhaust its
                    // retries (an error the filter counts and logs); the
                    // property here is that no *successful* update is lost.
                    let add = |d: i64| while add_inflight(&*s, "h", d).is_err() {};
                    for _ in 0..2000 {
                        add(1);
                        add(1);
                        add(-1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(read_load(&*s, "h").unwrap().inflight, 8000);
    }

    #[test]
    fn unreachable_tries_eject_sooner() {
        let cfg = HealthConfig {
            failure_threshold: 5,
            cooldown_ms: 1000,
            unreachable_threshold: 2,
        };
        let s = MemStore::default();
        // Two refused connections in a row: out.
        assert!(!record_health(&s, "a", U, 0, &cfg).unwrap());
        assert!(record_health(&s, "a", U, 1, &cfg).unwrap());
        // A host that answers (even 5xx) is reachable: the streak restarts,
        // and ordinary failures need the full threshold.
        let s = MemStore::default();
        assert!(!record_health(&s, "b", U, 0, &cfg).unwrap());
        assert!(!record_health(&s, "b", F, 0, &cfg).unwrap());
        assert!(!record_health(&s, "b", U, 0, &cfg).unwrap());
        assert!(!record_health(&s, "b", F, 0, &cfg).unwrap());
        assert!(record_health(&s, "b", F, 0, &cfg).unwrap());
        // A success resets both counts.
        let s = MemStore::default();
        assert!(!record_health(&s, "c", U, 0, &cfg).unwrap());
        assert!(!record_health(&s, "c", OK, 0, &cfg).unwrap());
        assert!(!record_health(&s, "c", U, 0, &cfg).unwrap());
        // Off (0): unreachable tries are ordinary failures.
        let off = HealthConfig {
            unreachable_threshold: 0,
            ..cfg
        };
        let s = MemStore::default();
        for t in 0..4 {
            assert!(!record_health(&s, "d", U, t, &off).unwrap());
        }
        assert!(record_health(&s, "d", U, 4, &off).unwrap());
    }
}
