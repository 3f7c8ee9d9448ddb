//! Root context: configuration and the HTTP context factory.

use std::rc::Rc;

use prefix_router_core::{Config, Router};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};

use prefix_router_core::shared_index;

use crate::gossip::Gossiper;
use crate::host::{self, SharedData};
use crate::http::Http;
use crate::membership::Poller;
use crate::metrics::{self as m, Metrics};
use crate::scrape::Scraper;

/// Per-VM root: the compiled router and metric ids, shared with requests.
#[derive(Default)]
pub struct Root {
    /// Root context id (mixed into the scrape lease identity).
    pub id: u32,
    state: Option<Rc<State>>,
    scraper: Scraper,
    gossiper: Gossiper,
    poller: Poller,
    /// `membership`: the config's `hosts` (the seed), and the version of
    /// the shared host table the router was last built from (`None`: the
    /// seed's).
    seed: Vec<prefix_router_core::config::Host>,
    table_version: Option<u64>,
    /// The tick period (ms; 0: no tick) and when the next scrape is due.
    tick_ms: u64,
    next_scrape_ms: u64,
}

/// What every request of this VM needs.
pub struct State {
    pub router: Router,
    pub metrics: Metrics,
    /// This VM's linear memory as last added to `prefix_router.vm.memory_bytes`
    /// (shared with the state a membership change replaced, whose requests
    /// may still be running).
    pub memory_reported: Rc<std::cell::Cell<u64>>,
    /// Each host's recent load as this VM sees it at its decisions
    /// (the index rule's hot window; every VM reads the same shared loads).
    pub trend: std::cell::RefCell<prefix_router_core::load::LoadTrend>,
    /// `gossip.peers`: observations this VM learned and has not sent yet.
    pub outbox: std::cell::RefCell<prefix_router_core::gossip::Outbox>,
    /// The reported part of the fleet's load (the sum of every host's
    /// [`prefix_router_core::load::HostLoad::others`]), refreshed on the
    /// tick ([`crate::loads::refresh_others`]): the bound's total is the
    /// fleet record's in-flight count plus this.
    pub others: std::cell::Cell<u64>,
    /// When [`State::others`] was last refreshed (`None`: never).
    pub others_at: std::cell::Cell<Option<u64>>,
    /// The host's log level and when it was read (ms; [`State::log_enabled`]).
    pub log_level: std::cell::Cell<Option<(u32, u64)>>,
    /// When this VM last stored each host's load report
    /// ([`State::report_due`]).
    pub reported_at: std::cell::RefCell<ReportTimes>,
    /// When this VM last asked each host for one ([`State::ask_due`]).
    pub asked_at: std::cell::RefCell<ReportTimes>,
    /// The priced spill's decisions in a row whose owner had no fresh
    /// load report ([`crate::http::UNREPORTED_WARN`]).
    pub unreported: std::cell::Cell<u32>,
    /// The application preambles this VM saw carry later turns
    /// ([`prefix_router_core::spill::Preambles`]).
    pub preambles: std::cell::RefCell<prefix_router_core::spill::Preambles>,
}

/// A VM asks a host for its load report (the ORCA format header on a
/// request routed there) and stores one at most once per this many ms: the
/// rule reads a queue that changes over a request's service time, and
/// the simulator's replicas report every 50 ms. A response that comes
/// sooner is not read for its report (skipping its ORCA header read, parse
/// and shared-data update saved 7-10 us of proxy CPU a request under load,
/// `prefix-router-lab overhead`), and a request sent sooner does not ask.
pub const REPORT_EVERY_MS: u64 = 20;

/// When this VM last stored (or, in [`State::asked_at`], asked for) each
/// host's load report (ms, by host index; 0: never).
#[derive(Debug, Default)]
pub struct ReportTimes(Vec<u64>);

impl ReportTimes {
    /// Whether host `i`'s report should be read at `now` (ms): none
    /// stored in the last [`REPORT_EVERY_MS`].
    pub fn due(&self, i: usize, now: u64) -> bool {
        self.0
            .get(i)
            .is_none_or(|&t| t == 0 || now >= t.saturating_add(REPORT_EVERY_MS))
    }

    /// [`ReportTimes::due`], marking host `i` at `now` when it is.
    pub fn take(&mut self, i: usize, now: u64) -> bool {
        let due = self.due(i, now);
        if due {
            self.mark(i, now);
        }
        due
    }

    /// Host `i`'s report was stored at `now` (ms).
    pub fn mark(&mut self, i: usize, now: u64) {
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        if let Some(t) = self.0.get_mut(i) {
            *t = now.max(1);
        }
    }
}

/// How long a VM trusts the log level it read (ms): a request reads it
/// again, with a clock it reads anyway, once it is older.
pub const LOG_LEVEL_TTL_MS: u64 = 1000;

impl State {
    /// A fresh state over `router`.
    pub fn new(router: Router, metrics: Metrics) -> State {
        State {
            router,
            metrics,
            memory_reported: Rc::new(std::cell::Cell::new(0)),
            trend: std::cell::RefCell::new(Default::default()),
            outbox: std::cell::RefCell::new(Default::default()),
            others: std::cell::Cell::new(0),
            others_at: std::cell::Cell::new(None),
            log_level: std::cell::Cell::new(None),
            reported_at: std::cell::RefCell::new(ReportTimes::default()),
            asked_at: std::cell::RefCell::new(ReportTimes::default()),
            unreported: std::cell::Cell::new(0),
            preambles: Default::default(),
        }
    }

    /// Whether host `i`'s report should be read at `now` (ms)
    /// ([`ReportTimes::due`]).
    pub fn report_due(&self, i: usize, now: u64) -> bool {
        self.reported_at
            .try_borrow()
            .map_or(true, |t| t.due(i, now))
    }

    /// Host `i`'s report was stored at `now` (ms).
    pub fn mark_reported(&self, i: usize, now: u64) {
        if let Ok(mut t) = self.reported_at.try_borrow_mut() {
            t.mark(i, now);
        }
    }

    /// Whether a request routed to host `i` at `now` (ms) asks for its
    /// report: none asked in the last [`REPORT_EVERY_MS`]; if so, marked
    /// as asked.
    pub fn ask_due(&self, i: usize, now: u64) -> bool {
        self.asked_at
            .try_borrow_mut()
            .map_or(true, |mut t| t.take(i, now))
    }

    /// Whether `level` would be logged (to skip formatting debug lines),
    /// by the log level this VM read last ([`State::log_level`]): read
    /// again when none was read yet or, given the clock `now` (ms) a
    /// callback read already, when it is older than [`LOG_LEVEL_TTL_MS`]
    /// (and on the tick, when there is one).
    pub fn log_enabled(&self, level: LogLevel, now: Option<u64>) -> bool {
        let cached = self.log_level.get();
        let fresh = match (cached, now) {
            (Some((l, _)), None) => Some(l),
            (Some((l, at)), Some(t)) if t < at.saturating_add(LOG_LEVEL_TTL_MS) => Some(l),
            _ => None,
        };
        let l = match fresh {
            Some(l) => l,
            None => match crate::abi::log_level() {
                Ok(l) => {
                    let at = now.or(cached.map(|(_, at)| at)).unwrap_or(0);
                    self.log_level.set(Some((l, at)));
                    l
                }
                Err(_) => return false,
            },
        };
        l <= level as u32
    }

    /// Bring this VM's share of the memory gauge up to date (the gauge sums
    /// every VM's changes).
    pub fn report_memory(&self) {
        let now = host::linear_memory_bytes();
        let last = self.memory_reported.replace(now);
        if now != last {
            let delta =
                i64::try_from(now).unwrap_or(i64::MAX) - i64::try_from(last).unwrap_or(i64::MAX);
            self.metrics.add(self.metrics.vm_memory, delta);
        }
    }
}

impl Root {
    /// A root context with this id.
    pub fn new(id: u32) -> Root {
        Root {
            id,
            ..Root::default()
        }
    }
}

impl Root {
    /// Rebuild this VM's router over the shared host table `t` (a
    /// membership change): requests already running keep the state they
    /// started with; slots are stable, so host indices mean the same in
    /// both.
    fn apply_table(&mut self, t: &prefix_router_core::membership::Table) {
        if self.table_version == Some(t.version) {
            return;
        }
        self.table_version = Some(t.version);
        self.rebuild(Some(t.hosts()), None);
    }

    /// Apply the gossip peers a poll found (`membership.peers_cluster`).
    fn apply_peers(&mut self, peers: Vec<String>) {
        let Some(st) = &self.state else { return };
        let same = st.router.config().gossip.as_ref().map(|g| &g.peers) == Some(&peers);
        if !same {
            host::log(
                LogLevel::Info,
                &format!("prefix-router: gossip peers from Envoy: {peers:?}"),
            );
            self.rebuild(None, Some(peers));
        }
    }

    /// Replace this VM's state with one over new hosts and/or gossip peers.
    fn rebuild(
        &mut self,
        hosts: Option<Vec<prefix_router_core::config::Host>>,
        peers: Option<Vec<String>>,
    ) {
        let Some(old) = self.state.clone() else {
            return;
        };
        let mut cfg = old.router.config().clone();
        if let Some(h) = hosts {
            cfg.hosts = h;
        }
        if let (Some(p), Some(g)) = (peers, cfg.gossip.as_mut()) {
            g.peers = p;
        }
        let metrics = Metrics::define(&cfg);
        let source = if self.table_version.is_some() {
            m::SOURCE_ENVOY
        } else {
            m::SOURCE_SEED
        };
        metrics.set_membership(&cfg, source);
        let state = Rc::new(State {
            memory_reported: Rc::clone(&old.memory_reported),
            trend: std::cell::RefCell::new(
                old.trend
                    .try_borrow_mut()
                    .map(|mut t| std::mem::take(&mut *t))
                    .unwrap_or_default(),
            ),
            outbox: std::cell::RefCell::new(
                old.outbox
                    .try_borrow_mut()
                    .map(|mut o| std::mem::take(&mut *o))
                    .unwrap_or_default(),
            ),
            others: std::cell::Cell::new(old.others.get()),
            log_level: std::cell::Cell::new(old.log_level.get()),
            unreported: std::cell::Cell::new(old.unreported.get()),
            preambles: std::cell::RefCell::new(
                old.preambles
                    .try_borrow_mut()
                    .map(|mut p| std::mem::take(&mut *p))
                    .unwrap_or_default(),
            ),
            ..State::new(Router::new(cfg), metrics)
        });
        self.state = Some(state);
    }
}

impl Root {
    /// With `membership` off: a host table a configuration with it left in
    /// shared data is cleared, and if it numbered hosts otherwise than
    /// `hosts`, the shared prefix index forgets every host.
    fn retire_table(st: &Option<Rc<State>>) {
        let Some(st) = st else { return };
        let cfg = st.router.config();
        let t = match prefix_router_core::membership::read_table(&SharedData) {
            Ok(Some(t)) => t,
            Ok(None) => return,
            Err(e) => {
                host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: reading the host table: {e:?}"),
                );
                return;
            }
        };
        if cfg.cost.enabled && prefix_router_core::membership::table_disagrees(&t, &cfg.hosts) {
            let all: Vec<usize> = (0..t.slots.len().max(cfg.hosts.len())).collect();
            let now = host::now_ms().unwrap_or(0);
            match shared_index::forget_hosts(&SharedData, &all, now) {
                Ok(()) => {
                    st.metrics.inc(st.metrics.forget_hosts, 1);
                    host::log(
                        LogLevel::Info,
                        "prefix-router: host numbering changed (membership off): the shared prefix index forgot every host",
                    );
                }
                Err(e) => host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: forgetting the index's hosts: {e:?}"),
                ),
            }
        }
        if let Err(e) = prefix_router_core::membership::clear_table(&SharedData) {
            host::log(
                LogLevel::Warn,
                &format!("prefix-router: clearing the host table: {e:?}"),
            );
        }
    }
}

impl Root {
    /// Apply a validated config: its metrics, the shared index's host
    /// list, the tick, and a new state for the requests that start from
    /// now on. `false` (Envoy refuses the config) only if the tick cannot
    /// be set.
    fn configure(&mut self, cfg: Config) -> bool {
        // Feature `test-one-bucket` only (e2e
        // `shared_index_loses_no_update_under_two_workers`): one shared
        // index bucket of 64 entries, so every write contends.
        #[cfg(feature = "test-one-bucket")]
        let cfg = {
            let mut c = cfg;
            c.cost.shared.buckets = 1;
            c.cost.shared.bucket_entries = 64;
            c
        };
        log_configured(&cfg);
        let metrics = Metrics::define(&cfg);
        if cfg.cost.enabled {
            metrics.set(metrics.index_footprint, cfg.cost.shared.footprint_bytes());
            reconcile_index_hosts(&cfg, &metrics);
        }
        let tick_ms = tick_period_ms(&cfg);
        if tick_ms > 0 {
            if let Err(e) = host::set_tick_period_ms(u32::try_from(tick_ms).unwrap_or(u32::MAX)) {
                host::log(
                    LogLevel::Error,
                    &format!("prefix-router: cannot set the tick: {e:?}"),
                );
                return false;
            }
        }
        self.tick_ms = tick_ms;
        if cfg.scrape.is_some() {
            // A lease identity unique enough per VM: the clock at configure
            // time mixed with this root's id.
            let t = crate::abi::now_ns().unwrap_or(0);
            self.scraper.owner =
                prefix_router_core::hash::hash(&t.to_le_bytes(), u64::from(self.id)) | 1;
        }
        let membership = cfg.membership.is_some();
        metrics.set_membership(
            &cfg,
            if membership {
                m::SOURCE_SEED
            } else {
                m::SOURCE_STATIC
            },
        );
        self.seed = cfg.hosts.clone();
        self.table_version = None;
        self.poller = Poller::default();
        let state = Rc::new(State::new(Router::new(cfg), metrics));
        let now = host::now_ms().unwrap_or(0);
        // The log level as of now, so that requests find it known.
        if let Ok(l) = crate::abi::log_level() {
            state.log_level.set(Some((l, now)));
        }
        crate::loads::refresh_others(&state, now);
        // A reconfiguration replaces the state: take the old share
        // of the memory gauge back.
        if let Some(old) = self.state.replace(state) {
            old.metrics.add(
                old.metrics.vm_memory,
                -i64::try_from(old.memory_reported.get()).unwrap_or(0),
            );
        }
        if membership {
            // A table other VMs (or the config before) stored: route
            // over it at once rather than after the first poll.
            match prefix_router_core::membership::read_table(&SharedData) {
                Ok(Some(t)) => self.apply_table(&t),
                Ok(None) => {}
                Err(e) => host::log(
                    LogLevel::Warn,
                    &format!("prefix-router: reading the host table: {e:?}"),
                ),
            }
        } else {
            // `membership` off after a configuration with it: the
            // prefix index named hosts by the table's slots.
            Self::retire_table(&self.state);
        }
        true
    }
}

/// One tick for the periodic jobs: the shortest of their periods (ms; 0:
/// none is configured).
fn tick_period_ms(cfg: &Config) -> u64 {
    [
        cfg.scrape.as_ref().map(|s| s.interval_ms),
        cfg.gossip
            .as_ref()
            .filter(|g| !g.peers.is_empty())
            .map(|g| g.interval_ms),
        cfg.membership.as_ref().map(|m| m.interval_ms),
        // The reported part of the bound's total load.
        crate::loads::reports_configured(cfg).then_some(crate::loads::OTHERS_REFRESH_MS),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(0)
}

/// The configuration's info lines.
fn log_configured(cfg: &Config) {
    host::log(
        LogLevel::Info,
        &format!(
            "prefix-router: configured {} hosts, capacity_factor {}, min_capacity {}, {} vnodes/host, chunk {} bytes, key mode {:?}, max body {} bytes",
            cfg.hosts.len(),
            cfg.capacity_factor,
            cfg.min_capacity,
            cfg.vnodes,
            cfg.chunk_bytes,
            cfg.key.mode,
            cfg.max_body_bytes
        ),
    );
    if cfg.cost.enabled {
        let sh = cfg.cost.shared;
        host::log(
            LogLevel::Info,
            &format!(
                "prefix-router: cost rule on ({} candidates, queue {:?}), shared prefix index {} buckets x {} entries (<= {} bytes)",
                cfg.cost.params.candidates,
                cfg.cost.params.queue,
                sh.buckets,
                sh.bucket_entries,
                sh.footprint_bytes()
            ),
        );
    }
    if let Some(g) = &cfg.gossip {
        host::log(
            LogLevel::Info,
            &format!(
                "prefix-router: index gossip to {} peer(s) every {} ms through cluster {:?}, accepting at {:?}: {}",
                g.peers.len(),
                g.interval_ms,
                g.cluster,
                g.path,
                g.accept
            ),
        );
    }
    if let Some(mc) = &cfg.membership {
        host::log(
            LogLevel::Info,
            &format!(
                "prefix-router: hosts from Envoy cluster {:?}, polling {:?} through cluster {:?} every {} ms ({} seed host(s))",
                mc.cluster, mc.admin_path, mc.admin_cluster, mc.interval_ms, cfg.hosts.len()
            ),
        );
    }
}

/// The shared prefix index names hosts by index: a different host list
/// makes every entry meaningless, so it forgets them all.
fn reconcile_index_hosts(cfg: &Config, metrics: &Metrics) {
    let fp =
        prefix_router_core::hash::hosts_fingerprint(cfg.hosts.iter().map(|h| h.address.as_str()));
    let now = host::now_ms().unwrap_or(0);
    match shared_index::reconcile_hosts(&SharedData, fp, cfg.hosts.len(), now) {
        Ok(true) => {
            metrics.inc(metrics.forget_hosts, 1);
            host::log(
                LogLevel::Info,
                "prefix-router: the host list changed: the shared prefix index forgot every host",
            );
        }
        Ok(false) => {}
        Err(e) => host::log(
            LogLevel::Warn,
            &format!("prefix-router: checking the index's host list: {e:?}"),
        ),
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(st) = self.state.clone() else { return };
        if self.gossiper.response(token, &st) {
            return;
        }
        if let Some(mc) = &st.router.config().membership {
            if let Some((table, peers)) = self.poller.response(
                token,
                body_size,
                st.router.config(),
                &self.seed,
                mc,
                &st.metrics,
            ) {
                if let Some(t) = table {
                    self.apply_table(&t);
                }
                if let Some(p) = peers {
                    self.apply_peers(p);
                }
                return;
            }
        }
        if let Some(sc) = &st.router.config().scrape {
            self.scraper
                .response(token, body_size, st.router.config(), sc, &st.metrics);
        }
    }
}

/// Feature `test-trap` only: end this VM as a bug would (a wasm trap), for
/// the e2e test of the failure policy.
#[cfg(feature = "test-trap")]
pub fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::unreachable()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::process::abort()
    }
}

impl RootContext for Root {
    /// Counts this VM's start in `prefix_router.vm.starts` (an Envoy
    /// counter: it outlives the VM). Each worker thread starts its own VM,
    /// and Envoy 1.40 starts two more outside them (measured: 3, 4 and 6
    /// with 1, 2 and 4 workers), so after startup it reads workers + 2;
    /// it grows when a failed VM is reloaded (`failure_policy: FAIL_RELOAD`)
    /// or a configuration change brings a new VM. Alert on an increase
    /// without a config change.
    fn on_vm_start(&mut self, _size: usize) -> bool {
        if let Ok(id) = crate::abi::define_metric(
            proxy_wasm::types::MetricType::Counter,
            crate::metrics::VM_STARTS,
        ) {
            let _ = crate::abi::increment_metric(id, 1);
        }
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = match host::plugin_configuration() {
            Ok(b) => b,
            Err(s) => {
                host::log(
                    LogLevel::Error,
                    &format!("prefix-router: cannot read plugin configuration: {s:?}"),
                );
                return false;
            }
        };
        match Config::from_json(&bytes) {
            Ok(cfg) => self.configure(cfg),
            Err(e) => {
                // Envoy rejects the filter config when this returns false.
                host::log(LogLevel::Error, &format!("prefix-router: {e}"));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(st) = self.state.clone() else { return };
        let Ok(now) = host::now_ms() else {
            st.metrics.inc(st.metrics.host_errors, 1);
            return;
        };
        crate::loads::refresh_others(&st, now);
        match prefix_router_core::host_state::read_fleet_inflight(&SharedData) {
            Ok(n) => st.metrics.set(st.metrics.inflight, n),
            Err(_) => st.metrics.inc(st.metrics.host_errors, 1),
        }
        if let Ok(l) = crate::abi::log_level() {
            st.log_level.set(Some((l, now)));
        }
        let cfg = st.router.config();
        if let Some(sc) = &cfg.scrape {
            // Due half a tick early rather than a tick late.
            if now.saturating_add(self.tick_ms / 2) >= self.next_scrape_ms {
                self.next_scrape_ms = now.saturating_add(sc.interval_ms);
                self.scraper.tick(cfg, sc, &st.metrics);
            }
        }
        if let Some(g) = &cfg.gossip {
            self.gossiper.tick(&st, g, now, self.tick_ms);
        }
        if let Some(mc) = &cfg.membership {
            self.poller.tick(mc, &st.metrics, now, self.tick_ms);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let state = self.state.clone()?;
        Some(Box::new(Http::new(state)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_report_is_due_once_per_interval() {
        let mut t = ReportTimes::default();
        // Never stored: due, whatever the host or the clock.
        assert!(t.due(0, 0) && t.due(7, 5));
        t.mark(3, 1_000);
        assert!(!t.due(3, 1_000));
        assert!(!t.due(3, 1_000 + REPORT_EVERY_MS - 1));
        assert!(t.due(3, 1_000 + REPORT_EVERY_MS));
        // Other hosts are unaffected (the table grew past them).
        assert!(t.due(0, 1_000) && t.due(2, 1_000) && t.due(4, 1_000));
        // A clock at 0 still marks the host as stored.
        t.mark(0, 0);
        assert!(!t.due(0, REPORT_EVERY_MS - 1));
        assert!(t.due(0, REPORT_EVERY_MS + 1));
        // Asking: due once per interval, marked when due.
        let mut a = ReportTimes::default();
        assert!(a.take(2, 500));
        assert!(!a.take(2, 500 + REPORT_EVERY_MS - 1));
        assert!(a.take(2, 500 + REPORT_EVERY_MS));
        assert!(!a.take(2, 500 + REPORT_EVERY_MS));
    }
}
