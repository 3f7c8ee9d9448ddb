//! The hosts' loads for one decision, read from shared data on demand
//! ([`prefix_router_core::router::LoadSource`]): one record per host the
//! decision asks about ([`prefix_router_core::host_state`]), each read at
//! most once; the fleet's total load from the fleet record and this VM's
//! periodic sum of the reported loads ([`State::others`]), so the host
//! calls of a request do not grow with the fleet.
//!
//! What a decision read is kept ([`Snapshot`]): the in-flight add of the
//! chosen host writes its record and the fleet record with the CAS tokens
//! of those reads ([`HostLoads::take_snapshot`],
//! [`HostLoads::take_fleet_snapshot`]), reading either again only if it
//! changed in between.
//!
//! With the index rule's hot-host rule on
//! ([`prefix_router_core::Router::reads_every_host`]) the decision compares
//! every host with the fleet's mean: [`HostLoads::read_every_host`] reads
//! them all (one record each) and folds them into the VM's recent loads.

use std::cell::{Cell, RefCell};

use prefix_router_core::cost::QueueMode;
use prefix_router_core::host_state;
use prefix_router_core::load::{Freshness, HostLoad};
use prefix_router_core::router::LoadSource;
use prefix_router_core::store::Snapshot;
use proxy_wasm::types::LogLevel;

use crate::host::{self, SharedData};
use crate::root::State;

/// One request's reads of the hosts' shared state.
pub struct HostLoads<'a> {
    st: &'a State,
    now: u64,
    /// Per host: 0 not read yet, else 1 + its place in `read`.
    slot: RefCell<Vec<u32>>,
    read: RefCell<Vec<HostLoad>>,
    /// Per place in `read`: the record as read, with its CAS token.
    snaps: RefCell<Vec<Option<Snapshot>>>,
    /// The fleet record's in-flight total as read (at most once).
    fleet: RefCell<Option<(u64, Snapshot)>>,
    /// Every host was read ([`HostLoads::read_every_host`]): the total is
    /// their sum.
    every: Cell<bool>,
    /// Load gossip: the pending prefill the peer Envoys reported, per
    /// host (read once, at the first host asked about).
    peers: RefCell<Option<Vec<u64>>>,
}

fn host_error(st: &State, what: &str, err: impl std::fmt::Debug) {
    st.metrics.inc(st.metrics.host_errors, 1);
    host::log(LogLevel::Warn, &format!("prefix-router: {what}: {err:?}"));
}

impl<'a> HostLoads<'a> {
    /// Nothing read yet.
    pub fn new(st: &'a State, now: u64) -> HostLoads<'a> {
        HostLoads {
            st,
            now,
            slot: RefCell::new(Vec::new()),
            read: RefCell::new(Vec::new()),
            snaps: RefCell::new(Vec::new()),
            fleet: RefCell::new(None),
            every: Cell::new(false),
            peers: RefCell::new(None),
        }
    }

    /// Read one host's record: in-flight count, report, passive-health
    /// ejection, and for the index rule's token queue the pending prefill
    /// (its own and the peers'). A failed read counts a host error and
    /// reads as idle. Free slots of the membership table are not read.
    fn fetch(&self, h: usize) -> (HostLoad, Option<Snapshot>) {
        let cfg = self.st.router.config();
        let Some(c) = cfg.hosts.get(h).filter(|c| c.weight > 0.0) else {
            return (HostLoad::default(), None);
        };
        let (mut l, snap) = match host_state::read_snapshot(&SharedData, &c.address) {
            Ok((r, snap)) => (r.load(self.now), snap),
            Err(e) => {
                host_error(self.st, "reading a host's shared state", e);
                return (HostLoad::default(), None);
            }
        };
        if cfg.health.failure_threshold == 0 {
            l.ejected = false;
        }
        let tokens_mode = cfg.cost.enabled && cfg.cost.params.queue == QueueMode::Tokens;
        if !tokens_mode {
            l.pending_prefill_tokens = 0;
        } else if let Some(g) = cfg.gossip.as_ref().filter(|g| !g.peers.is_empty()) {
            let mut peers = self.peers.borrow_mut();
            let all = peers.get_or_insert_with(|| {
                let max_age = prefix_router_core::gossip::peer_loads_max_age_ms(g.interval_ms);
                prefix_router_core::gossip::read_peer_pending(
                    &SharedData,
                    &g.peers,
                    cfg.hosts.len(),
                    self.now,
                    max_age,
                )
                .unwrap_or_else(|e| {
                    host_error(self.st, "reading the peers' pending prefill", e);
                    Vec::new()
                })
            });
            l.peer_pending_tokens = all.get(h).copied().unwrap_or(0);
        }
        (l, Some(snap))
    }

    /// Host `h`'s record as this decision read it, if it did (taken: an
    /// update that starts from it makes it stale).
    pub fn take_snapshot(&self, h: usize) -> Option<Snapshot> {
        let i = self.slot.borrow().get(h).copied()?.checked_sub(1)?;
        self.snaps.borrow_mut().get_mut(i as usize)?.take()
    }

    /// The fleet record as this decision read it, if it did (taken).
    pub fn take_fleet_snapshot(&self) -> Option<Snapshot> {
        self.fleet.borrow_mut().take().map(|(_, s)| s)
    }

    /// Every host's load, read now (one record each), with the VM's recent
    /// loads folded in (the hot-host rule); later asks are answered from
    /// these.
    pub fn read_every_host(&self) {
        let n = self.st.router.config().hosts.len();
        let first = self.read.borrow().is_empty();
        let mut all: Vec<HostLoad> = (0..n).map(|h| self.load(h)).collect();
        match self.st.trend.try_borrow_mut() {
            Ok(mut t) => self.st.router.track_recent(&mut t, &mut all, self.now),
            Err(_) => self.st.metrics.inc(self.st.metrics.host_errors, 1),
        }
        // The snapshots follow the order of the reads: host order only if
        // nothing was read before (as when the decision starts here).
        if !first {
            self.snaps.borrow_mut().clear();
        }
        *self.slot.borrow_mut() = (1..=n).map(|i| u32::try_from(i).unwrap_or(0)).collect();
        *self.read.borrow_mut() = all;
        self.every.set(true);
    }
}

impl LoadSource for HostLoads<'_> {
    fn load(&self, h: usize) -> HostLoad {
        let n = self.st.router.config().hosts.len();
        if h >= n {
            return HostLoad::default();
        }
        let known = self.slot.borrow().get(h).copied().unwrap_or(0);
        if let Some(l) = known
            .checked_sub(1)
            .and_then(|i| self.read.borrow().get(i as usize).copied())
        {
            return l;
        }
        let (l, snap) = self.fetch(h);
        let mut slot = self.slot.borrow_mut();
        if slot.len() < n {
            slot.resize(n, 0);
        }
        let mut read = self.read.borrow_mut();
        read.push(l);
        self.snaps.borrow_mut().push(snap);
        if let Some(s) = slot.get_mut(h) {
            *s = u32::try_from(read.len()).unwrap_or(0);
        }
        l
    }

    /// The sum of every host's effective load when every host was read;
    /// otherwise the fleet record's in-flight total plus this VM's last
    /// sum of the reported loads beyond this proxy's own
    /// ([`State::others`], refreshed on the tick).
    fn total(&self, now_ms: u64, fresh: Freshness) -> u64 {
        if self.every.get() {
            return self
                .read
                .borrow()
                .iter()
                .map(|l| l.effective(now_ms, fresh))
                .sum();
        }
        let known = self.fleet.borrow().as_ref().map(|(t, _)| *t);
        let inflight = match known {
            Some(t) => t,
            None => match host_state::read_fleet_snapshot(&SharedData) {
                Ok((t, snap)) => {
                    *self.fleet.borrow_mut() = Some((t, snap));
                    t
                }
                Err(e) => {
                    host_error(self.st, "reading the fleet's in-flight total", e);
                    0
                }
            },
        };
        inflight.saturating_add(self.st.others.get())
    }
}

/// Refresh this VM's sum of the reported loads beyond this proxy's own
/// ([`State::others`]): one read per host, on the tick, off the request
/// path. Nothing to do when no load reports are configured.
pub fn refresh_others(st: &State, now: u64) {
    let cfg = st.router.config();
    if !reports_configured(cfg) {
        return;
    }
    // Every [`OTHERS_REFRESH_MS`], or every `hosts / 2` ms for a larger
    // fleet (1,024 hosts: 512 ms), so the background reads stay about 2,000
    // per second per worker at most.
    let period = OTHERS_REFRESH_MS.max(cfg.hosts.len() as u64 / 2);
    if let Some(at) = st.others_at.get() {
        if now
            < at.saturating_add(period)
                .saturating_sub(OTHERS_REFRESH_MS / 2)
        {
            return;
        }
    }
    st.others_at.set(Some(now));
    let addrs = cfg
        .hosts
        .iter()
        .filter(|h| h.weight > 0.0)
        .map(|h| h.address.as_str());
    let (sum, err) = host_state::others_total(&SharedData, addrs, now, cfg.load.freshness());
    st.others.set(sum);
    if let Some(e) = err {
        host_error(st, "summing the hosts' reported loads", e);
    }
}

/// Whether replicas' load reports can reach the shared records (ORCA, a
/// queue header, or scrapes): only then is there a reported load to sum.
pub fn reports_configured(cfg: &prefix_router_core::Config) -> bool {
    cfg.load.orca_format.is_some() || cfg.load.queue_header.is_some() || cfg.scrape.is_some()
}

/// How often a VM refreshes [`State::others`] (ms): reports are snapshots
/// already, and what they count beyond this proxy's own changes only with
/// a new report or at `load.report_ttl_ms` (10,000 by default).
pub const OTHERS_REFRESH_MS: u64 = 100;
