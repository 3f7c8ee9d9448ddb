//! Per-request state machine.
//!
//! 1. Request headers (all read with one host call): strip any
//!    client-supplied destination header; let the
//!    core classify the request (path, method, content type, length). Not
//!    ours → continue untouched (counted fallback). Ours → ask the replica for
//!    an ORCA load report and pause to buffer the body.
//! 2. Request body: buffer until end of stream (or fall back once it exceeds
//!    `max_body_bytes`), decide (the core reads the loads of the hosts it
//!    looks at from shared data, [`crate::loads`]: one record per host),
//!    set the destination header, count the request in flight (written
//!    with the compare-and-swap tokens of the decision's reads of the
//!    host's record and the fleet record), continue.
//! 3. Response headers: read the replica's load report (ORCA or plain
//!    header) for the host that actually served (`upstream.address`); add the
//!    decision header if configured.
//! 4. The first response body byte (the head, if the response has no body):
//!    the request stops being pending at its host (unless its report took it
//!    off) and the index rule takes its prefill-rate sample. vLLM and SGLang
//!    send a stream's head before its first token; the first body byte is
//!    that token. Later body chunks cost one comparison.
//! 5. Log / done: the in-flight count is released exactly once (at log in
//!    the same update of the host's record as its passive-health outcome
//!    when the host that served holds it); passive
//!    health records the request's outcome at the host of its last try, and
//!    (from the response headers on) a failure at the chosen host if Envoy
//!    retried the request elsewhere ([`prefix_router_core::health::verdicts`]).
//!
//! With `cost.mode = index` step 2 also hashes the whole prompt's strided chain
//! and places by the cost rule, reading the shared-data prefix index
//! ([`prefix_router_core::shared_index`]) and, with `queue = tokens`,
//! the candidates' pending prefill tokens (this request's uncached prompt
//! tokens, its prompt minus the prefix the index credited the chosen host
//! with, are added to that host's, in the same update as its in-flight
//! count); step 3 records the chain under the host that
//! actually served (2xx only) and releases the pending tokens in the same
//! update as the load report when that host reported, else step 4 does
//! (or log / done if no response byte came; exactly once).
//! A host that passive health ejects has its index entries forgotten.
//!
//! Host calls are kept few: the clock is read at most once per callback,
//! `upstream.address` once, the tries
//! (`upstream.request_attempt_count`) only when another host served, the
//! log level from the VM's cache ([`State::log_enabled`]), and
//! `prefix_router.hostcalls.last` is set once per request.
//!
//! With `gossip.accept`, a POST to `gossip.path` is not routed: its body is
//! buffered, recorded in the index ([`crate::gossip::apply`]) and answered
//! here (204, or 400/405/413 with the reason); with `gossip.peers`, step 3
//! also queues what it recorded for the peers ([`crate::gossip`]).

use std::rc::Rc;

use prefix_router_core::config::CostMode;
use prefix_router_core::cost::{self, QueueMode};
use prefix_router_core::extract::Api;
use prefix_router_core::health;
use prefix_router_core::host_state;
use prefix_router_core::load;
use prefix_router_core::router::LoadSource;
use prefix_router_core::scrape as core_scrape;
use prefix_router_core::shared_index::{self, SharedLookup};
use prefix_router_core::{Decision, FallbackCause, Request, RequestHead};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};

use crate::host::{self, SharedData};
use crate::loads::HostLoads;
use crate::root::State;

/// ORCA request header asking the replica for a load report.
pub const ORCA_FORMAT_HEADER: &str = "endpoint-load-metrics-format";
/// ORCA response header.
pub const ORCA_HEADER: &str = "endpoint-load-metrics";
/// Feature `test-trap` only: a request with this header traps the VM.
#[cfg(feature = "test-trap")]
pub const TEST_TRAP_HEADER: &str = "x-prefix-router-test-trap";

/// Decisions in a row with no fresh report for their replica after which
/// a VM logs, once per run of them, that the priced spill runs without
/// reports (`Http::note_reports`).
pub const UNREPORTED_WARN: u32 = 100;

/// One request.
pub struct Http {
    st: Rc<State>,
    api: Option<Api>,
    /// The session header's value as sent (any bytes).
    session: Option<Vec<u8>>,
    decision: Option<Decision>,
    /// Body bytes buffered so far.
    body_size: usize,
    /// Address whose in-flight count this request holds.
    inflight: Option<String>,
    /// The configured host that served this request (`upstream.address`),
    /// once known: read once, used by reports, the index and health.
    served: Option<(String, usize)>,
    /// Cost rule: the prompt's strided chain, to record under the host
    /// that serves it.
    chain: Vec<u64>,
    /// Cost rule: the canonical prompt's length in bytes.
    prompt_bytes: u64,
    /// Cost rule: the address and what this request holds there until its
    /// first response byte ([`host_state::Pending`]): one pending request
    /// (the priced spill's own part of a queue,
    /// [`load::HostLoad::fresh_queue`]) and, with the index rule's `queue =
    /// tokens`, its prompt tokens.
    pending: Option<(String, host_state::Pending)>,
    /// The index rule's prefill learning: (chosen host, uncached tokens, routing time,
    /// work known ahead of it there) for the prefill-rate sample taken at
    /// the first response byte.
    learn: Option<(usize, u64, u64, u64)>,
    /// The response's head has come and its first body byte not yet: the
    /// first byte ([`Http::first_byte`]) is still to be marked. vLLM and
    /// SGLang send a stream's head before its first token, so the head
    /// does not mark it.
    awaiting_body: bool,
    /// This request is a gossip batch from a peer (`gossip.accept`): the
    /// filter answers it and never forwards it.
    gossip_rx: bool,
    /// Passive health already counted the chosen host's retried try.
    retry_checked: bool,
    /// The failover hosts named after the chosen one in the destination
    /// header (comma-separated; empty: none), shown in the decision header.
    failover: String,
    /// Host calls this request's callbacks made so far, and how many of
    /// them `prefix_router.hostcalls` counts already.
    calls: u64,
    calls_reported: u64,
    /// The host clock (ms) as this callback read it: read at most once per
    /// callback ([`Http::now`]; cleared when a callback starts).
    clock: Option<u64>,
    /// `upstream.address`, once read and present (the last try's host:
    /// fixed from the response headers on).
    upstream: Option<String>,
}

impl Http {
    /// A request context over the VM's state.
    pub fn new(st: Rc<State>) -> Http {
        Http {
            st,
            api: None,
            session: None,
            decision: None,
            body_size: 0,
            inflight: None,
            served: None,
            chain: Vec::new(),
            prompt_bytes: 0,
            pending: None,
            learn: None,
            awaiting_body: false,
            gossip_rx: false,
            retry_checked: false,
            failover: String::new(),
            calls: 0,
            calls_reported: 0,
            clock: None,
            upstream: None,
        }
    }

    /// Answer a gossip request locally: 204 when applied, else `status`
    /// with the reason (counted in `prefix_router.gossip.rejected`).
    fn gossip_answer(&mut self, body_size: usize) -> Action {
        let st = Rc::clone(&self.st);
        let Some(g) = st.router.config().gossip.as_ref() else {
            return Action::Continue;
        };
        let result = match (host::request_body(body_size), host::now_ms()) {
            (Ok(body), Ok(now)) => {
                crate::gossip::apply(&st, g, &body, now).map_err(|e| (400, e.to_string()))
            }
            (Err(e), _) | (_, Err(e)) => Err((500, format!("host call failed: {e:?}"))),
        };
        match result {
            Ok(a) => {
                st.metrics.inc(st.metrics.gossip_applied, a.applied);
                st.metrics.inc(st.metrics.gossip_loads, a.loads);
                st.metrics
                    .inc(st.metrics.gossip_unknown_host, a.unknown_host);
                self.respond(204, "")
            }
            Err((status, why)) => self.reject_gossip(status, &why),
        }
    }

    fn reject_gossip(&mut self, status: u32, why: &str) -> Action {
        self.st.metrics.inc(self.st.metrics.gossip_rejected, 1);
        host::log(LogLevel::Warn, &format!("prefix-router: {why}"));
        self.respond(status, why)
    }

    fn respond(&mut self, status: u32, body: &str) -> Action {
        let b = (!body.is_empty()).then_some(body.as_bytes());
        if let Err(e) = host::send_response(status, vec![("content-type", "text/plain")], b) {
            self.host_error("answering a gossip request", e);
        }
        Action::Pause
    }

    fn host_error(&self, what: &str, err: impl std::fmt::Debug) {
        self.st.metrics.inc(self.st.metrics.host_errors, 1);
        host::log(LogLevel::Warn, &format!("prefix-router: {what}: {err:?}"));
    }

    fn fallback(&mut self, c: FallbackCause) -> Action {
        self.api = None;
        let d = Decision::Fallback(c);
        self.st.metrics.record(&d);
        if self.st.log_enabled(LogLevel::Debug, self.clock) {
            host::log(
                LogLevel::Debug,
                &format!("prefix-router: {}", d.describe(self.st.router.config())),
            );
        }
        self.decision = Some(d);
        Action::Continue
    }

    fn header(&self, heads: &host::RequestHeaders, name: &str) -> Option<String> {
        self.header_bytes(heads, name).map(host::text)
    }

    /// A request header's value as sent (the session header: values that
    /// differ only in invalid UTF-8 must give different keys).
    fn header_bytes(&self, heads: &host::RequestHeaders, name: &str) -> Option<Vec<u8>> {
        match heads.get_bytes(name) {
            Ok(v) => v,
            Err(e) => {
                self.host_error(&format!("reading request header {name}"), e);
                None
            }
        }
    }

    /// Step 2: read the request's inputs, make one core call, apply it.
    /// The hosts' loads are read on demand ([`HostLoads`]): only the hosts
    /// the decision looks at.
    fn decide(&mut self, api: Api, body_size: usize) -> Action {
        let body = match host::request_body(body_size) {
            Ok(b) => b,
            Err(e) => {
                self.host_error("reading request body", e);
                return self.fallback(FallbackCause::HostError);
            }
        };
        let st = Rc::clone(&self.st);
        let now = self.now().unwrap_or(0);
        let loads = HostLoads::new(&st, now);
        if st.router.reads_every_host() {
            loads.read_every_host();
        }
        let params = self.cost_params();
        let session = self.session.take();
        let req = Request::new(api, &body, &[], now)
            .with_source(&loads)
            .with_session(session.as_deref())
            .with_params(&params);
        let d = self.place(req);
        self.note_reports(&d);
        self.session = session;
        if let Decision::Routed {
            host, cached, key, ..
        } = d
        {
            let applied = self.apply(host, key.hash, cached.unwrap_or(0), &loads, &params, now);
            if let Err(cause) = applied {
                return self.fallback(cause);
            }
        }
        st.metrics.record(&d);
        if st.log_enabled(LogLevel::Debug, self.clock) {
            let line = format!("prefix-router: {}", d.describe(st.router.config()));
            host::log(LogLevel::Debug, &line);
        }
        self.decision = Some(d);
        self.api = None;
        Action::Continue
    }

    /// Count the priced spill's decisions in a row whose owner had no
    /// fresh load report (`SpillNote::reported`), and at
    /// [`UNREPORTED_WARN`] of them log that the rule runs without reports:
    /// behind vLLM, streamed responses carry no ORCA, so with the default
    /// config a first turn weighs only this Envoy's own requests and a
    /// later turn never moves. Once per run of them, and only when reports
    /// are configured to arrive.
    fn note_reports(&self, d: &Decision) {
        let Decision::Routed {
            spill: Some(note), ..
        } = d
        else {
            return;
        };
        let st = &self.st;
        if !crate::loads::reports_configured(st.router.config()) {
            return;
        }
        if note.reported {
            st.unreported.set(0);
            return;
        }
        let n = st.unreported.get().saturating_add(1);
        st.unreported.set(n);
        if n == UNREPORTED_WARN {
            host::log(
                LogLevel::Warn,
                &format!(
                    "prefix-router: {n} decisions in a row found no fresh load report for their replica \
                     (vLLM sends ORCA on non-streamed responses only): first turns weigh only this \
                     Envoy's own requests and later turns never move; configure \"scrape\" \
                     (docs/operations.md, \"Load reports\")"
                ),
            );
        }
    }

    /// The cost parameters, with the learned prefill rate when
    /// the index rule is on and a rate was learned.
    fn cost_params(&self) -> cost::CostParams {
        let cfg = self.st.router.config();
        let mut params = cfg.cost.params;
        if cfg.cost.enabled && cfg.cost.learn_prefill {
            match shared_index::read_learned_prefill(&SharedData) {
                Ok(Some(r)) => params = params.with_prefill_rate(r),
                Ok(None) => {}
                Err(e) => self.host_error("reading the learned prefill rate", e),
            }
        }
        params
    }

    /// The core's decision; the index rule reads the shared-data prefix
    /// index and keeps the prompt's chain to record under the host that
    /// serves it (empty when the body gave no key).
    fn place(&mut self, req: Request<'_>) -> Decision {
        let st = Rc::clone(&self.st);
        let cfg = st.router.config();
        if !cfg.cost.enabled {
            // A borrow that fails (it cannot: one request at a time per
            // VM) decides without the preambles.
            let d = match st.preambles.try_borrow() {
                Ok(p) => st.router.decide(&req.with_preambles(&p)).decision,
                Err(_) => st.router.decide(&req).decision,
            };
            if let Ok(mut p) = st.preambles.try_borrow_mut() {
                st.router.observed(&mut p, &d);
            }
            return d;
        }
        let view = SharedLookup::new(&SharedData, cfg.cost.shared);
        let decided = st.router.decide(&req.with_index(&view));
        let (n, first) = view.errors();
        if n > 0 {
            st.metrics.inc(st.metrics.host_errors, u64::from(n - 1));
            self.host_error("reading the shared prefix index", first);
        }
        self.prompt_bytes = decided.chain.bytes;
        self.chain = decided.chain.hashes;
        decided.decision
    }

    /// Apply a routed decision: the destination header (the chosen host,
    /// then its ring successors for Envoy's retries), the in-flight count,
    /// and for the index rule its credited tokens, the prefill-rate sample
    /// and the pending prefill. `Err`: the header could not be set.
    fn apply(
        &mut self,
        idx: usize,
        key: u64,
        cached: u64,
        loads: &HostLoads<'_>,
        params: &cost::CostParams,
        now: u64,
    ) -> Result<(), FallbackCause> {
        let st = Rc::clone(&self.st);
        let cfg = st.router.config();
        let h = cfg.hosts.get(idx).ok_or(FallbackCause::HostError)?;
        let failover = st.router.failover_from(key, idx, loads, now);
        let dest = st
            .router
            .destination(idx, &failover)
            .unwrap_or_else(|| h.address.clone());
        self.failover = dest
            .split_once(',')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
        if let Err(e) = host::set_request_header(&cfg.destination_header, Some(&dest)) {
            self.host_error("setting the destination header", e);
            return Err(FallbackCause::HostError);
        }
        // A load report, where this VM will read it: not asked of this host
        // in the last `REPORT_EVERY_MS` (`State::ask_due`).
        if let Some(f) = cfg.load.orca_format.filter(|_| st.ask_due(idx, now)) {
            if let Err(e) = host::set_request_header(ORCA_FORMAT_HEADER, Some(f.as_str())) {
                self.host_error("asking for an ORCA report", e);
            }
        }
        // The index rule with `queue = tokens`: the prefill this request
        // adds at the host (its prompt minus what the index credited the
        // host with), counted in the same update as the in-flight count.
        let tokens_mode = cfg.cost.params.queue == QueueMode::Tokens;
        let uncached = if cfg.cost.enabled {
            params.pending_tokens(self.prompt_bytes, cached)
        } else {
            0
        };
        let pending = if cfg.cost.enabled && tokens_mode {
            uncached
        } else {
            0
        };
        // From the decision's reads of the host's record and the fleet
        // record: written with their CAS tokens, re-read only if they changed.
        let (host_snap, fleet_snap) = (loads.take_snapshot(idx), loads.take_fleet_snapshot());
        // One pending request for the priced spill's queue (the default)
        // and the index rule; the plain ring reads no queue.
        let held = host_state::Pending {
            requests: u64::from(cfg.cost.mode != CostMode::Off),
            tokens: pending,
        };
        match host_state::add_inflight_with(
            &SharedData,
            &h.address,
            1,
            host_snap,
            fleet_snap,
            &mut |r| r.add_pending(held),
        ) {
            Ok(_) => {
                self.inflight = Some(h.address.clone());
                if held != host_state::Pending::default() {
                    self.pending = Some((h.address.clone(), held));
                }
            }
            Err(e) => self.host_error("counting in-flight", e),
        }
        if !cfg.cost.enabled {
            return Ok(());
        }
        // What the index believes the host holds of this prompt, to compare
        // with the replicas' own prefix-cache hit counters.
        let credited = params.pending_tokens(cached, 0);
        st.metrics.inc(st.metrics.credited_tokens, credited);
        if cfg.cost.learn_prefill {
            // Work ahead of this request there: pending prefill tokens and
            // others' waiting requests (tokens mode), or any request of
            // ours in flight (requests mode, which does not track tokens).
            let l = loads.load(idx);
            let mut ahead = l.pending_ahead(now, cfg.load.freshness(), params);
            if !tokens_mode {
                ahead = ahead.saturating_add(l.inflight);
            }
            self.learn = Some((idx, uncached, now, ahead));
        }
        Ok(())
    }

    /// The configured host that served this request, if any (cached once
    /// found; an unknown upstream is asked again later, e.g. at log time).
    fn served_host(&mut self) -> Option<(String, usize)> {
        if self.served.is_none() {
            if let Some(a) = self.upstream_address() {
                if let Some(i) = self.st.router.config().host_index(&a) {
                    self.served = Some((a, i));
                }
            }
        }
        self.served.clone()
    }

    /// `upstream.address`: the host of the last try (kept once present;
    /// absent is asked again later, e.g. at log time).
    fn upstream_address(&mut self) -> Option<String> {
        if self.upstream.is_none() {
            match host::property_string(&["upstream", "address"]) {
                Ok(a) => self.upstream = a,
                Err(e) => self.host_error("reading upstream.address", e),
            }
        }
        self.upstream.clone()
    }

    /// The host clock in ms, or `None` (counted and logged): read at most
    /// once per callback.
    fn now(&mut self) -> Option<u64> {
        if self.clock.is_none() {
            match host::now_ms() {
                Ok(t) => self.clock = Some(t),
                Err(e) => self.host_error("reading the clock", e),
            }
        }
        self.clock
    }

    fn read_report(&mut self) {
        let Some((served, idx)) = self.served_host() else {
            return;
        };
        // At most one report per host per `REPORT_EVERY_MS` from this VM.
        let Some(now) = self.now() else { return };
        if !self.st.report_due(idx, now) {
            return;
        }
        let cfg = self.st.router.config();
        let mut queue: Option<f64> = None;
        let mut running = 0.0;
        if cfg.load.orca_format.is_some() {
            if let Ok(Some(v)) = host::response_header(ORCA_HEADER) {
                if !cfg.load.orca_running_metrics.is_empty() {
                    // Errors are counted once, below, by the queue parse.
                    if let Ok(Some(r)) = load::parse_orca(&v, &cfg.load.orca_running_metrics) {
                        running = r;
                    }
                }
                match load::parse_orca(&v, &cfg.load.orca_metrics) {
                    Ok(q) => queue = q,
                    Err(e) => {
                        self.st.metrics.inc(self.st.metrics.load_report_errors, 1);
                        host::log(
                            LogLevel::Debug,
                            &format!("prefix-router: {served}: {}", e.0),
                        );
                    }
                }
            }
        }
        if queue.is_none() {
            if let Some(name) = &cfg.load.queue_header {
                if let Ok(Some(v)) = host::response_header(name) {
                    match load::parse_queue_header(&v) {
                        Ok(q) => queue = Some(q),
                        Err(e) => {
                            self.st.metrics.inc(self.st.metrics.load_report_errors, 1);
                            host::log(
                                LogLevel::Debug,
                                &format!("prefix-router: {served}: {}", e.0),
                            );
                        }
                    }
                }
            }
        }
        let Some(q) = queue else { return };
        // What this request holds there is released in the same update,
        // before the report counts this Envoy's pending requests.
        let release = match &self.pending {
            Some((a, held)) if *a == served => *held,
            _ => host_state::Pending::default(),
        };
        // With this Envoy's own requests at the host as of now (this
        // request included: it is still in flight).
        match host_state::record_report_releasing(&SharedData, &served, q, running, now, release) {
            Ok(()) => {
                if release != host_state::Pending::default() {
                    self.pending = None;
                }
                self.st.mark_reported(idx, now);
                self.st.metrics.inc(self.st.metrics.load_reports, 1)
            }
            Err(e) => self.host_error("storing a load report", e),
        }
    }

    /// The address of the host this request was routed to, if the filter
    /// routed it.
    fn chosen(&self) -> Option<String> {
        match &self.decision {
            Some(Decision::Routed { host, .. }) => self
                .st
                .router
                .config()
                .hosts
                .get(*host)
                .map(|h| h.address.clone()),
            _ => None,
        }
    }

    /// What Envoy tells of this request's tries ([`health::Attempt`]),
    /// read only where [`health::verdicts`] uses it: the tries only while
    /// the chosen host's retried try is unchecked and another host (or
    /// none) served, the code and flags only at log time (`final_outcome`)
    /// and only if a host served.
    fn attempt_info(
        &mut self,
        chosen: Option<&str>,
        final_outcome: bool,
    ) -> (Option<String>, u64, i64, u64) {
        let served = self.upstream_address();
        let attempts = if !self.retry_checked && chosen.is_some() && served.as_deref() != chosen {
            match host::property_i64(&["upstream", "request_attempt_count"]) {
                Ok(n) => n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
                Err(e) => {
                    self.host_error("reading upstream.request_attempt_count", e);
                    0
                }
            }
        } else {
            0
        };
        if !final_outcome || served.is_none() {
            return (served, attempts, 0, 0);
        }
        let code = match host::property_i64(&["response", "code"]) {
            Ok(c) => c.unwrap_or(0),
            Err(e) => {
                self.host_error("reading response.code", e);
                0
            }
        };
        let flags = match host::property_i64(&["response", "flags"]) {
            Ok(f) => f.and_then(|f| u64::try_from(f).ok()).unwrap_or(0),
            Err(e) => {
                self.host_error("reading response.flags", e);
                0
            }
        };
        (served, attempts, code, flags)
    }

    /// Passive health of every try Envoy made ([`health::verdicts`]): the
    /// chosen host failed if Envoy retried the request elsewhere (counted
    /// as soon as the response headers show it, so a dead replica is
    /// ejected while its retried requests succeed), and the host of the last
    /// try by the response code and flags (at log time, `final_outcome`;
    /// a request the client abandoned says nothing).
    fn record_health(&mut self, final_outcome: bool) {
        if self.st.router.config().health.failure_threshold == 0 {
            return;
        }
        if self.retry_checked && !final_outcome {
            return;
        }
        let chosen = self.chosen();
        let (served, attempts, code, flags) = self.attempt_info(chosen.as_deref(), final_outcome);
        let v = health::verdicts(&health::Attempt {
            chosen: chosen.as_deref(),
            served: served.as_deref(),
            attempts,
            code,
            flags,
        });
        if !std::mem::replace(&mut self.retry_checked, true) {
            if let Some(c) = v.chosen_failed {
                self.st
                    .metrics
                    .inc(self.st.metrics.health_retried_failures, 1);
                let why = format!(
                    "a try Envoy retried elsewhere, {attempts} tries, served by {}",
                    served.as_deref().unwrap_or("none")
                );
                self.health_outcome(c, health::Outcome::Unreachable, &why, final_outcome);
            }
        }
        if !final_outcome {
            return;
        }
        if let Some((s, outcome)) = v.served {
            let why = format!("last: {code}, response flags {flags:#x}");
            self.health_outcome(s, outcome, &why, true);
        }
    }

    /// Record one host's outcome; eject it (and forget its prefix-index
    /// entries) when that makes `failure_threshold` consecutive failures.
    /// At the request's end (`release`), if this request holds an in-flight
    /// count at that host, it is released in the same update of the
    /// host's record.
    fn health_outcome(&mut self, addr: &str, outcome: health::Outcome, why: &str, release: bool) {
        let st = Rc::clone(&self.st);
        let cfg = st.router.config();
        let Some(idx) = cfg.host_index(addr) else {
            return;
        };
        let Some(now) = self.now() else { return };
        let recorded = if release && self.inflight.as_deref() == Some(addr) {
            self.inflight = None;
            host_state::release_and_record_health(&SharedData, addr, outcome, now, &cfg.health)
        } else {
            host_state::record_health(&SharedData, addr, outcome, now, &cfg.health)
        };
        match recorded {
            Ok(true) => {
                self.st.metrics.inc(self.st.metrics.ejections, 1);
                let after = if outcome == health::Outcome::Unreachable
                    && cfg.health.unreachable_threshold > 0
                {
                    format!(
                        "{} consecutive failed tries or {} it did not take",
                        cfg.health.failure_threshold, cfg.health.unreachable_threshold
                    )
                } else {
                    format!("{} consecutive failed tries", cfg.health.failure_threshold)
                };
                host::log(
                    LogLevel::Warn,
                    &format!(
                        "prefix-router: ejecting {addr} for {} ms after {after} (last: {why})",
                        cfg.health.cooldown_ms
                    ),
                );
                // Whatever it held is presumed gone (a crash or restart):
                // forget its prefix-index entries.
                if cfg.cost.enabled {
                    match shared_index::forget_hosts(&SharedData, &[idx], now) {
                        Ok(()) => self.st.metrics.inc(self.st.metrics.forget_ejected, 1),
                        Err(e) => self.host_error("forgetting an ejected host's index entries", e),
                    }
                }
            }
            Ok(false) => {}
            Err(e) => self.host_error("recording health", e),
        }
    }

    /// The index rule, at the response headers: keep the prefill-rate
    /// sample ([`Http::learn`]) only for a streamed 2xx response from the
    /// chosen host; [`Http::learn_prefill`] takes it at the first byte.
    fn keep_prefill_sample(&mut self) {
        let Some((idx, ..)) = self.learn else {
            return;
        };
        if self.served_host().map(|(_, i)| i) != Some(idx) {
            self.learn = None;
            return;
        }
        let streamed = matches!(
            host::response_header("content-type"),
            Ok(Some(v)) if v.trim_start().to_ascii_lowercase().starts_with("text/event-stream")
        );
        let ok = matches!(
            host::response_header(":status"),
            Ok(Some(v)) if v.trim().parse::<u16>().is_ok_and(|c| (200..300).contains(&c))
        );
        if !streamed || !ok {
            self.learn = None;
        }
    }

    /// The index rule, at the first response byte (a stream's first
    /// token): a request that had no work ahead of it is a prefill-rate
    /// sample.
    fn learn_prefill(&mut self) {
        let Some((_, uncached, start, ahead)) = self.learn.take() else {
            return;
        };
        let Some(now) = self.now() else { return };
        let sample = cost::PrefillSample {
            uncached_tokens: uncached,
            ttfb_ms: now.saturating_sub(start),
            ahead_tokens: ahead,
        };
        let configured = self.st.router.config().cost.params.prefill_tokens_per_s;
        match shared_index::learn_prefill(&SharedData, configured, &sample) {
            Ok(Some(r)) => {
                // `as` saturates; the rate is within 8x of a validated config value.
                self.st
                    .metrics
                    .set(self.st.metrics.prefill_tps, r.round() as u64);
                if self.st.log_enabled(LogLevel::Debug, self.clock) {
                    host::log(
                        LogLevel::Debug,
                        &format!(
                            "prefix-router: prefill sample {uncached} tokens in {} ms; learned {r:.0} tok/s",
                            sample.ttfb_ms
                        ),
                    );
                }
            }
            Ok(None) => {}
            Err(e) => self.host_error("updating the learned prefill rate", e),
        }
    }

    /// Cost rule: record this request's chain under the host that served
    /// it (2xx responses only; at most once).
    fn observe_index(&mut self) {
        if self.chain.is_empty() {
            return;
        }
        let chain = std::mem::take(&mut self.chain);
        let ok = match host::response_header(":status") {
            Ok(Some(v)) => v
                .trim()
                .parse::<u16>()
                .is_ok_and(|c| (200..300).contains(&c)),
            Ok(None) => false,
            Err(e) => {
                self.host_error("reading :status", e);
                false
            }
        };
        if !ok {
            return;
        }
        let Some((addr, idx)) = self.served_host() else {
            return;
        };
        self.record_served_credit(&addr, idx);
        let Some(now) = self.now() else { return };
        let cfg = self.st.router.config();
        let (done, err) = cfg.cost.shared.observe(&SharedData, idx, &chain, now);
        self.st
            .metrics
            .inc(self.st.metrics.index_observed, done.entries);
        self.st
            .metrics
            .add(self.st.metrics.index_used, done.bytes_delta);
        if let Some(e) = err {
            self.host_error("updating the shared prefix index", e);
        }
        let tokens = self.uncached_tokens(idx);
        crate::gossip::advance_capacity(&self.st, idx, tokens, now);
        if let Some(g) = cfg.gossip.as_ref().filter(|g| !g.peers.is_empty()) {
            match self.st.outbox.try_borrow_mut() {
                Ok(mut o) => o.push(
                    prefix_router_core::gossip::Observation {
                        host: addr,
                        tokens,
                        hashes: chain,
                    },
                    g.max_batch_bytes,
                ),
                Err(e) => self.host_error("queueing a gossip observation", e),
            }
        }
    }

    /// Prefix bytes the index credited host `idx` with for this request (0
    /// if the request was not routed there by the cost rule).
    fn credited_at(&self, idx: usize) -> u64 {
        match &self.decision {
            Some(Decision::Routed {
                host,
                cached: Some(c),
                ..
            }) if *host == idx => *c,
            _ => 0,
        }
    }

    /// Flush detection (`scrape.hit_metrics`): the prefix tokens the index
    /// credited this request with, now that the credited host answered,
    /// count towards the hits its next scrape should show
    /// ([`prefix_router_core::scrape`]).
    fn record_served_credit(&mut self, addr: &str, idx: usize) {
        let cfg = self.st.router.config();
        if cfg.scrape.as_ref().is_none_or(|s| s.hit_metrics.is_empty()) {
            return;
        }
        let credited = self.credited_at(idx);
        if credited == 0 {
            return;
        }
        let tokens = cfg.cost.params.pending_tokens(credited, 0);
        if let Err(e) = core_scrape::add_served_credit(&SharedData, addr, tokens) {
            self.host_error("counting the index's credit for flush detection", e);
        }
    }

    /// The prompt tokens host `idx` took into its cache for this request:
    /// the prompt minus the prefix the index credited it with (they advance
    /// its capacity clock, [`crate::gossip::advance_capacity`]).
    fn uncached_tokens(&self, idx: usize) -> u64 {
        let cfg = self.st.router.config();
        let bytes = self.prompt_bytes.saturating_sub(self.credited_at(idx));
        (bytes as f64 / cfg.cost.params.bytes_per_token).ceil() as u64
    }

    /// Release what this request holds at its host ([`Http::pending`]):
    /// at its first response byte (when no report took it off with the
    /// report) or at its end, whichever comes first.
    fn release_pending(&mut self) {
        if let Some((addr, held)) = self.pending.take() {
            if let Err(e) = host_state::release_pending(&SharedData, &addr, held) {
                self.host_error("releasing pending requests", e);
            }
        }
    }

    fn release(&mut self) {
        self.release_pending();
        if let Some(addr) = self.inflight.take() {
            if let Err(e) = host_state::add_inflight(&SharedData, &addr, -1) {
                self.host_error("releasing in-flight", e);
            }
        }
    }
}

/// The callbacks' work; [`HttpContext`] and [`Context`] count the host
/// calls each makes ([`Http::counted`]).
impl Http {
    fn done(&mut self) {
        self.release();
    }

    fn request_headers(&mut self, end_of_stream: bool) -> Action {
        // Every header in one host call.
        let heads = match host::RequestHeaders::read() {
            Ok(h) => h,
            Err(e) => {
                self.host_error("reading the request headers", e);
                host::RequestHeaders::each()
            }
        };
        #[cfg(feature = "test-trap")]
        if matches!(heads.get(TEST_TRAP_HEADER), Ok(Some(_))) {
            crate::root::trap();
        }
        let st = Rc::clone(&self.st);
        let cfg = st.router.config();
        // Never let a client pick the backend, whatever happens next.
        if heads.has(&cfg.destination_header) != Some(false) {
            if let Err(e) = host::set_request_header(&cfg.destination_header, None) {
                self.host_error("removing the destination header", e);
            }
        }
        let method = self.header(&heads, ":method").unwrap_or_default();
        let path = self.header(&heads, ":path").unwrap_or_default();
        if let Some(g) = cfg.gossip.as_ref().filter(|g| g.accept) {
            if path.split('?').next() == Some(g.path.as_str()) {
                if method != "POST" {
                    return self.reject_gossip(405, "gossip: only POST is accepted");
                }
                if end_of_stream {
                    return self.reject_gossip(400, "gossip: empty batch");
                }
                self.gossip_rx = true;
                return Action::Pause;
            }
        }
        let content_type = self.header(&heads, "content-type");
        let content_length = self
            .header(&heads, "content-length")
            .and_then(|v| v.trim().parse().ok());
        let head = RequestHead {
            method: &method,
            path: &path,
            content_type: content_type.as_deref(),
            content_length,
        };
        let api = match self.st.router.classify(&head) {
            Ok(a) => a,
            Err(c) => return self.fallback(c),
        };
        if end_of_stream {
            return self.fallback(FallbackCause::NoBody);
        }
        if let Some(h) = &cfg.key.session_header {
            self.session = self.header_bytes(&heads, h);
        }
        self.api = Some(api);
        Action::Pause
    }

    fn request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.gossip_rx {
            let max = self
                .st
                .router
                .config()
                .gossip
                .as_ref()
                .map_or(0, |g| g.max_batch_bytes);
            if body_size > max {
                self.gossip_rx = false;
                return self.reject_gossip(413, &format!("gossip: batch over {max} bytes"));
            }
            if !end_of_stream {
                return Action::Pause;
            }
            self.gossip_rx = false;
            return self.gossip_answer(body_size);
        }
        let Some(api) = self.api else {
            return Action::Continue;
        };
        if body_size as u64 > self.st.router.config().max_body_bytes {
            return self.fallback(FallbackCause::BodyTooLarge);
        }
        self.body_size = body_size;
        if !end_of_stream {
            return Action::Pause;
        }
        if body_size == 0 {
            // Headers without end of stream, then an empty chunk or frame.
            return self.fallback(FallbackCause::NoBody);
        }
        self.decide(api, body_size)
    }

    fn request_trailers(&mut self) -> Action {
        // A body that ended with trailers: decide on what was buffered.
        match self.api {
            Some(api) if self.body_size > 0 => self.decide(api, self.body_size),
            Some(_) => self.fallback(FallbackCause::NoBody),
            None => Action::Continue,
        }
    }

    fn response_headers(&mut self, end_of_stream: bool) -> Action {
        self.record_health(false);
        self.keep_prefill_sample();
        // Releases what this request holds pending with the report, when
        // the host that served holds it: a report taken now counts this
        // request as it is now.
        self.read_report();
        if end_of_stream {
            self.first_byte();
        } else {
            self.awaiting_body = true;
        }
        self.observe_index();
        if let (Some(h), Some(d)) = (&self.st.router.config().decision_header, &self.decision) {
            let mut v = d.describe(self.st.router.config());
            if !self.failover.is_empty() {
                v.push_str(";failover=");
                v.push_str(&self.failover);
            }
            if let Err(e) = host::add_response_header(h, &v) {
                self.host_error("adding the decision header", e);
            }
        }
        Action::Continue
    }

    /// The first byte of the response's body (or its head, when it has no
    /// body): a stream's first token. The request stops being pending at its
    /// host, and the index rule takes its prefill-rate sample.
    fn first_byte(&mut self) {
        self.awaiting_body = false;
        self.learn_prefill();
        self.release_pending();
    }

    fn response_body(&mut self) -> Action {
        if self.awaiting_body {
            self.first_byte();
        }
        Action::Continue
    }

    fn log(&mut self) {
        self.release_pending();
        // Releases the in-flight count with the served host's outcome in
        // one update when that host holds it; `release` does any other.
        self.record_health(true);
        self.release();
    }

    /// Run one callback's work, counting the host calls it makes.
    fn counted<T>(&mut self, f: impl FnOnce(&mut Http) -> T) -> T {
        self.clock = None;
        let t0 = crate::abi::calls();
        let out = f(self);
        self.calls = self
            .calls
            .saturating_add(crate::abi::calls().wrapping_sub(t0));
        out
    }

    /// Add this request's host calls since the last report to
    /// `prefix_router.hostcalls` and set `prefix_router.hostcalls.last` to
    /// its count so far (these calls are not counted). At log, and at done
    /// only if calls were made since (Envoy 1.40 calls log first, and done
    /// then has nothing left to do), so once per request; whichever comes
    /// last leaves the whole count.
    fn report_calls(&mut self, always: bool) {
        let m = &self.st.metrics;
        let new = self.calls.saturating_sub(self.calls_reported);
        if new == 0 && !always {
            return;
        }
        if new > 0 {
            m.inc(m.hostcalls, new);
        }
        m.set(m.hostcalls_last, self.calls);
        self.calls_reported = self.calls;
    }
}

impl Context for Http {
    fn on_done(&mut self) -> bool {
        self.counted(Http::done);
        self.report_calls(false);
        // Bookkeeping of the VM, not of this request: not counted.
        self.st.report_memory();
        true
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.counted(|h| h.request_headers(end_of_stream))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.counted(|h| h.request_body(body_size, end_of_stream))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.counted(Http::request_trailers)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.counted(|h| h.response_headers(end_of_stream))
    }

    fn on_http_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        if !self.awaiting_body {
            return Action::Continue;
        }
        self.counted(Http::response_body)
    }

    fn on_log(&mut self) {
        self.counted(Http::log);
        self.report_calls(true);
    }
}
