//! The server: a scheduler thread owning the [`Replica`], hyper on a tokio
//! runtime for the connections, and the endpoints.
//!
//! ## Threads and tasks
//!
//! * The **scheduler** thread advances the replica to the current simulated
//!   time, delivers [`Event`]s to the waiting request handlers over channels,
//!   and sleeps on a condition variable until the replica's next event (or a
//!   new submission wakes it).
//! * Each **connection** is a task serving HTTP/1.1 with hyper (keep-alive)
//!   on one thread (a tokio current-thread runtime); its handler submits
//!   generations to the replica under the shared lock and awaits
//!   `FirstToken` / `Done` on its channel. A streamed response's tokens are
//!   written by a task of their own. Nothing awaits while holding the lock.
//!   Up to [`MAX_CONNECTIONS`] connections are served at once; more get
//!   `503` and are closed. A stream whose client has gone away is aborted
//!   in the replica at its next chunk (and a request whose handler hyper
//!   dropped before its first token, at that token).
//!
//! ## Responses
//!
//! Every response carries `x-backend-name`, `x-cached-tokens` (0 outside
//! generations) and `x-queue-depth` (reported waiting count). When the
//! request has `endpoint-load-metrics-format: TEXT` or `JSON`, it also
//! carries the ORCA header `endpoint-load-metrics`, in vLLM's format plus
//! `num_requests_running`:
//!
//! ```text
//! endpoint-load-metrics: TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0, named_metrics.num_requests_running=2.0
//! endpoint-load-metrics: JSON {"named_metrics": {"kv_cache_usage_perc": 0.4, "num_requests_waiting": 3.0, "num_requests_running": 2.0}}
//! ```
//!
//! Load values are read when the response head is sent: at the first token
//! for streams, at completion otherwise. With `--early-stream-head` a
//! stream's head goes out at once with none of the load headers nor
//! `x-cached-tokens`, as vLLM's and SGLang's servers send it (their SSE
//! response starts before the engine has the request; vLLM attaches ORCA
//! only to non-streamed responses). The reported waiting count
//! (`x-queue-depth`, ORCA, `/metrics`) is the real one plus the
//! `extra_waiting` set by `POST /admin/queue`, and the reported running
//! count (ORCA, `/metrics`) the real one plus its `extra_running` (test
//! hooks standing for other clients' requests; scheduling is unaffected).
//!
//! ## Metrics (`GET /metrics`, Prometheus text 0.0.4, label `model_name`)
//!
//! Gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` (and the v0 name `vllm:gpu_cache_usage_perc`);
//! counters `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`
//! (what vLLM v1's prometheus_client exposes for its `vllm:prefix_cache_*`
//! counters) plus the same values under the bare names
//! `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`;
//! `vllm:request_success_total{finished_reason="length"}`,
//! `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`; histograms
//! `vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`
//! (simulated seconds, vLLM's buckets). `POST /admin/reset` zeroes the
//! counters and histograms and drops the unpinned cache; `POST
//! /reset_prefix_cache` (vLLM's endpoint) only drops the unpinned cache,
//! and the counters go on counting.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::channel::{Channel, Sender};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use prefix_router_replica::{Event, Prompt, Replica, ReqId};
use serde_json::{json, Value};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

use crate::cli::Config;
use crate::http::{self, Body, BodyError, Headers, Request};
use crate::openai::{self, Api, ApiError, GenRequest, Meta};

/// Max simultaneously served connections; more get `503` and are closed.
pub const MAX_CONNECTIONS: usize = 4096;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (b, c) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

#[derive(Debug, Clone)]
struct Stats {
    success: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    ttft: Histogram,
    e2e: Histogram,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            success: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

/// A request handler waiting for its events.
struct Sub {
    tx: UnboundedSender<Event>,
    t_submit: f64,
    prompt_tokens: u64,
    output_tokens: u64,
    /// Prompt + generated text, kept in the prefix cache at Done (vLLM keeps
    /// the KV of generated tokens too, so the next chat turn hits it).
    extended: Prompt,
}

struct State {
    replica: Replica,
    subs: HashMap<ReqId, Sub>,
    next_id: ReqId,
    extra_waiting: u64,
    extra_running: u64,
    stats: Stats,
}

/// Load as reported to clients (waiting includes `extra_waiting`, running
/// `extra_running`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub waiting: u64,
    pub running: u64,
    pub kv_usage: f64,
}

/// Python-like float formatting (`3.0`, `0.4`).
fn pyf(x: f64) -> String {
    format!("{x:?}")
}

/// ORCA `endpoint-load-metrics` header value for `format` (`TEXT`/`JSON`,
/// case-insensitive), or `None` for other formats.
pub fn orca_header(format: &str, load: &Load) -> Option<String> {
    let kv = pyf(load.kv_usage);
    let waiting = pyf(load.waiting as f64);
    let running = pyf(load.running as f64);
    if format.trim().eq_ignore_ascii_case("TEXT") {
        Some(format!(
            "TEXT named_metrics.kv_cache_usage_perc={kv}, named_metrics.num_requests_waiting={waiting}, named_metrics.num_requests_running={running}"
        ))
    } else if format.trim().eq_ignore_ascii_case("JSON") {
        Some(format!(
            "JSON {{\"named_metrics\": {{\"kv_cache_usage_perc\": {kv}, \"num_requests_waiting\": {waiting}, \"num_requests_running\": {running}}}}}"
        ))
    } else {
        None
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct MetricsSnapshot {
    load: Load,
    queries: u64,
    hits: u64,
    stats: Stats,
}

fn render_metrics(model: &str, m: &MetricsSnapshot) -> String {
    let label = format!("model_name=\"{}\"", escape_label(model));
    let mut out = String::new();
    let mut single = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{label}}} {}", pyf(value));
    };
    single(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        m.load.running as f64,
    );
    single(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        m.load.waiting as f64,
    );
    single(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        m.load.kv_usage,
    );
    single(
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "GPU KV-cache usage (vLLM v0 name). 1 means 100 percent usage.",
        m.load.kv_usage,
    );
    single(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        m.queries as f64,
    );
    single(
        "vllm:prefix_cache_queries",
        "counter",
        "Same as vllm:prefix_cache_queries_total (name without the _total suffix).",
        m.queries as f64,
    );
    single(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        m.hits as f64,
    );
    single(
        "vllm:prefix_cache_hits",
        "counter",
        "Same as vllm:prefix_cache_hits_total (name without the _total suffix).",
        m.hits as f64,
    );
    single(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        m.stats.prompt_tokens as f64,
    );
    single(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        m.stats.generation_tokens as f64,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_success_total Count of successfully processed requests."
    );
    let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
    let _ = writeln!(
        out,
        "vllm:request_success_total{{finished_reason=\"length\",{label}}} {}",
        pyf(m.stats.success as f64)
    );
    for (name, help, h) in [
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds (simulated).",
            &m.stats.ttft,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds (simulated).",
            &m.stats.e2e,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (b, c) in h.bounds.iter().zip(&h.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\",{label}}} {}",
                pyf(*b),
                pyf(*c as f64)
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\",{label}}} {}",
            pyf(h.count as f64)
        );
        let _ = writeln!(out, "{name}_count{{{label}}} {}", pyf(h.count as f64));
        let _ = writeln!(out, "{name}_sum{{{label}}} {}", pyf(h.sum));
    }
    out
}

struct Shared {
    cfg: Config,
    start: Instant,
    created: u64,
    state: Mutex<State>,
    wake: Condvar,
    connections: AtomicUsize,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

type Reply = Response<Body>;

/// `(name, value)` of the header that closes the connection after a response.
fn close() -> (String, String) {
    ("connection".into(), "close".into())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Current simulated time.
    fn sim_now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.cfg.time_scale
    }

    /// Real time from now until simulated time `t` (capped at 1 s).
    fn real_until(&self, t: f64) -> Duration {
        let target = Duration::try_from_secs_f64((t * self.cfg.time_scale).max(0.0))
            .unwrap_or(Duration::from_secs(1));
        target
            .saturating_sub(self.start.elapsed())
            .min(Duration::from_secs(1))
    }

    fn load(&self, st: &State) -> Load {
        Load {
            waiting: (st.replica.num_waiting() as u64).saturating_add(st.extra_waiting),
            running: (st.replica.num_running() as u64).saturating_add(st.extra_running),
            kv_usage: st.replica.kv_usage(),
        }
    }

    /// Advance the replica to `now` and deliver events.
    fn pump(&self, st: &mut State, now: f64) {
        let events = st.replica.advance(now);
        let mut gone = Vec::new();
        for ev in events {
            let id = ev.req_id();
            match ev {
                Event::FirstToken { t, .. } => {
                    if let Some(sub) = st.subs.get(&id) {
                        let ttft = t - sub.t_submit;
                        let prompt_tokens = sub.prompt_tokens;
                        let delivered = sub.tx.send(ev).is_ok();
                        st.stats.ttft.observe(ttft);
                        st.stats.prompt_tokens += prompt_tokens;
                        if !delivered {
                            gone.push(id);
                        }
                    }
                }
                Event::Done { t, .. } => {
                    if let Some(sub) = st.subs.remove(&id) {
                        st.replica.remember(&sub.extended);
                        st.stats.success += 1;
                        st.stats.generation_tokens += sub.output_tokens;
                        st.stats.e2e.observe(t - sub.t_submit);
                        let _ = sub.tx.send(ev);
                    }
                }
            }
        }
        for id in gone {
            // The request's handler is gone (its client closed the
            // connection): stop simulating it.
            if st.subs.remove(&id).is_some() {
                st.replica.abort(id, now);
            }
        }
    }

    fn abort(&self, id: ReqId) {
        let mut st = self.lock();
        let now = self.sim_now();
        self.pump(&mut st, now);
        if st.subs.remove(&id).is_some() {
            st.replica.abort(id, now);
        }
        self.wake.notify_one();
    }

    fn scheduler(&self) {
        let mut st = self.lock();
        loop {
            let now = self.sim_now();
            self.pump(&mut st, now);
            let wait = match st.replica.next_event_time() {
                Some(t) => self.real_until(t),
                None => Duration::from_secs(1),
            };
            if wait.is_zero() {
                continue;
            }
            st = self
                .wake
                .wait_timeout(st, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Headers every response carries, with load read now.
    fn headers(&self, req: Option<&Request>, cached: u64, content_type: &str) -> (Headers, Load) {
        let load = {
            let st = self.lock();
            self.load(&st)
        };
        let mut h: Headers = vec![
            ("content-type".into(), content_type.into()),
            ("x-backend-name".into(), self.cfg.name.clone()),
            ("x-cached-tokens".into(), cached.to_string()),
            ("x-queue-depth".into(), load.waiting.to_string()),
        ];
        if let Some(orca) = req
            .and_then(|r| r.header("endpoint-load-metrics-format"))
            .and_then(|f| orca_header(f, &load))
        {
            h.push(("endpoint-load-metrics".into(), orca));
        }
        // Test hook: load headers a proxy cannot read as UTF-8, a raw 0xFF
        // byte (written as one octet, see `http::octets`) before every number.
        if req.is_some_and(|r| r.header("x-sim-bad-load-headers").is_some()) {
            for (n, v) in h.iter_mut() {
                if n == "endpoint-load-metrics" {
                    *v = v.replace('=', "=\u{ff}").replace(": ", ": \u{ff}");
                } else if n == "x-queue-depth" {
                    v.insert(0, '\u{ff}');
                }
            }
        }
        (h, load)
    }

    fn respond_json(&self, req: Option<&Request>, status: u16, body: &Value) -> Reply {
        let (h, _) = self.headers(req, 0, "application/json");
        http::full(status, &h, body.to_string())
    }

    fn respond_error(&self, req: Option<&Request>, e: &ApiError) -> Reply {
        let (h, _) = self.headers(req, 0, "application/json");
        http::full(e.status, &h, e.body())
    }

    /// An error answer after which the connection is closed (the request
    /// could not be read whole).
    fn respond_error_close(&self, e: &ApiError) -> Reply {
        let (mut h, _) = self.headers(None, 0, "application/json");
        h.push(close());
        http::full(e.status, &h, e.body())
    }

    /// One request off a connection: read its body, route it.
    async fn handle(self: Arc<Self>, req: hyper::Request<Incoming>, over_limit: bool) -> Reply {
        if over_limit {
            let e = ApiError::new(503, "ServiceUnavailable", "too many connections");
            return self.respond_error_close(&e);
        }
        let (parts, incoming) = req.into_parts();
        let body = match http::read_body(&parts, incoming).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                let e = ApiError::new(413, "PayloadTooLarge", "body too large");
                return self.respond_error_close(&e);
            }
            Err(BodyError::Bad(msg)) => {
                return self.respond_error_close(&ApiError::bad_request(msg));
            }
        };
        let req = Request::new(&parts, body);
        self.route(&req).await
    }

    async fn route(self: &Arc<Self>, req: &Request) -> Reply {
        let method = req.method.as_str();
        match (method, req.path.as_str()) {
            ("GET", "/health") => {
                let (h, _) = self.headers(Some(req), 0, "text/plain");
                http::full(200, &h, Bytes::new())
            }
            ("GET", "/v1/models") => {
                let body = json!({
                    "object": "list",
                    "data": [{
                        "id": self.cfg.model,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "prefix-router-backend",
                        "root": self.cfg.model,
                        "parent": null,
                        "max_model_len": self.cfg.max_model_len,
                        "permission": [],
                    }],
                });
                self.respond_json(Some(req), 200, &body)
            }
            ("GET", "/metrics") => {
                let snap = {
                    let mut st = self.lock();
                    let now = self.sim_now();
                    self.pump(&mut st, now);
                    MetricsSnapshot {
                        load: self.load(&st),
                        queries: st.replica.cache().queries(),
                        hits: st.replica.cache().hits(),
                        stats: st.stats.clone(),
                    }
                };
                let body = render_metrics(&self.cfg.model, &snap);
                let (h, _) = self.headers(Some(req), 0, "text/plain; version=0.0.4; charset=utf-8");
                http::full(200, &h, body)
            }
            ("POST", "/v1/chat/completions") => match openai::parse_chat(&req.body) {
                Ok(g) => self.generate(req, g).await,
                Err(e) => self.respond_error(Some(req), &e),
            },
            ("POST", "/v1/completions") => match openai::parse_completion(&req.body) {
                Ok(g) => self.generate(req, g).await,
                Err(e) => self.respond_error(Some(req), &e),
            },
            ("POST", "/admin/queue") => {
                let v = serde_json::from_slice::<Value>(&req.body).ok();
                let field = |name: &str| -> Result<Option<u64>, ()> {
                    match v.as_ref().and_then(|v| v.get(name)) {
                        None => Ok(None),
                        Some(x) => x.as_u64().map(Some).ok_or(()),
                    }
                };
                match (field("extra_waiting"), field("extra_running")) {
                    (Ok(wait), Ok(run)) if wait.is_some() || run.is_some() => {
                        let (wait, run) = {
                            let mut st = self.lock();
                            if let Some(n) = wait {
                                st.extra_waiting = n;
                            }
                            if let Some(n) = run {
                                st.extra_running = n;
                            }
                            (st.extra_waiting, st.extra_running)
                        };
                        let body = json!({ "extra_waiting": wait, "extra_running": run });
                        self.respond_json(Some(req), 200, &body)
                    }
                    _ => {
                        let e = ApiError::bad_request(
                            "expected a JSON body {\"extra_waiting\": N, \"extra_running\": M} (either or both) with N, M >= 0",
                        );
                        self.respond_error(Some(req), &e)
                    }
                }
            }
            ("POST", "/admin/reset") => {
                {
                    let mut st = self.lock();
                    let now = self.sim_now();
                    self.pump(&mut st, now);
                    st.replica.reset_cache();
                    st.stats = Stats::default();
                }
                self.respond_json(Some(req), 200, &json!({ "reset": true }))
            }
            ("POST", "/reset_prefix_cache") => {
                {
                    let mut st = self.lock();
                    let now = self.sim_now();
                    self.pump(&mut st, now);
                    st.replica.flush_cache();
                }
                self.respond_json(Some(req), 200, &json!({ "flushed": true }))
            }
            (
                _,
                "/health"
                | "/v1/models"
                | "/metrics"
                | "/v1/chat/completions"
                | "/v1/completions"
                | "/admin/queue"
                | "/admin/reset"
                | "/reset_prefix_cache",
            ) => {
                let e = ApiError::new(
                    405,
                    "MethodNotAllowed",
                    format!("method {method} not allowed on {}", req.path),
                );
                self.respond_error(Some(req), &e)
            }
            _ => {
                let e = ApiError::not_found(format!("no route for {method} {}", req.path));
                self.respond_error(Some(req), &e)
            }
        }
    }

    async fn generate(self: &Arc<Self>, req: &Request, g: GenRequest) -> Reply {
        if self.cfg.instant {
            // Overhead measurements: no scheduler, no cache, no waiting.
            let (h, _) = self.headers(Some(req), 0, "application/json");
            let body = br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}]}"#;
            return http::full(200, &h, Bytes::from_static(body));
        }
        let prompt = Prompt::from_bytes(&g.prompt, self.cfg.cost.block_tokens);
        let prompt_tokens = prompt.tokens();
        let total = prompt_tokens.saturating_add(g.max_tokens);
        if total > self.cfg.max_model_len {
            let e = ApiError::bad_request(format!(
                "This model's maximum context length is {} tokens. However, you requested {total} tokens ({prompt_tokens} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                self.cfg.max_model_len, g.max_tokens
            ));
            return self.respond_error(Some(req), &e);
        }
        // Prompt + the text this request will generate: what stays cached at
        // Done (built after the length check: max_tokens is bounded here).
        let extended = {
            let mut b = g.prompt.clone();
            b.extend_from_slice(openai::text_range(0, g.max_tokens).as_bytes());
            Prompt::from_bytes(&b, self.cfg.cost.block_tokens)
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let id = {
            let mut st = self.lock();
            let now = self.sim_now();
            self.pump(&mut st, now);
            let id = st.next_id;
            st.next_id += 1;
            if let Err(e) = st.replica.submit(id, prompt, g.max_tokens, now) {
                drop(st);
                let e = ApiError::new(500, "InternalServerError", e.to_string());
                return self.respond_error(Some(req), &e);
            }
            st.subs.insert(
                id,
                Sub {
                    tx,
                    t_submit: now,
                    prompt_tokens,
                    output_tokens: g.max_tokens,
                    extended,
                },
            );
            id
        };
        self.wake.notify_one();

        let prefix = match g.api {
            Api::Chat => "chatcmpl",
            Api::Completions => "cmpl",
        };
        let rid = format!("{prefix}-{}-{id}", self.cfg.name);
        let created = unix_now();
        let dropped = || {
            ApiError::new(
                500,
                "InternalServerError",
                "request was dropped by the scheduler",
            )
        };

        if g.stream && self.cfg.early_stream_head {
            return self.stream_early(&g, id, rid, created, prompt_tokens, rx);
        }

        // Wait for the first token. (If the client goes away meanwhile, hyper
        // drops this future and with it `rx`: the scheduler then finds the
        // request gone at its first token and aborts it.)
        let cached = loop {
            match rx.recv().await {
                Some(Event::FirstToken { cached_tokens, .. }) => break cached_tokens,
                Some(Event::Done { .. }) => continue,
                None => return self.respond_error(Some(req), &dropped()),
            }
        };
        let usage = openai::usage(prompt_tokens, g.max_tokens, cached);

        if !g.stream {
            if !wait_done(&mut rx).await {
                return self.respond_error(Some(req), &dropped());
            }
            let meta = Meta {
                api: g.api,
                id: &rid,
                created,
                model: &self.cfg.model,
            };
            let body = openai::full_response(&meta, &openai::text_range(0, g.max_tokens), usage);
            let (h, _) = self.headers(Some(req), cached, "application/json");
            return http::full(200, &h, body.to_string());
        }

        // Streamed: the head and the first token now, the rest from a task
        // that paces tokens until the replica says Done.
        let (mut h, load) = self.headers(Some(req), cached, "text/event-stream");
        h.push(("cache-control".into(), "no-cache".into()));
        let step = self.cfg.cost.decode_step_time(load.running as usize) * self.cfg.time_scale;
        let step = Duration::try_from_secs_f64(step.max(0.0)).unwrap_or(Duration::ZERO);
        let (mut body_tx, body) = Channel::<Bytes, Infallible>::new(STREAM_BUFFER);
        let stream = SseStream {
            api: g.api,
            rid,
            created,
            max_tokens: g.max_tokens,
            include_usage: g.include_usage,
            usage,
            step,
        };
        // The channel is new: the first chunk always fits.
        let _ = body_tx.try_send(Frame::data(Bytes::from(stream.first(&self.cfg.model))));
        let shared = Arc::clone(self);
        tokio::spawn(async move {
            if stream.pace(&shared, rx, body_tx).await.is_err() {
                shared.abort(id);
            }
        });
        http::response(200, &h, body.boxed())
    }
}

impl Shared {
    /// A streamed generation whose head goes out now, before its first
    /// token, with no load headers (`--early-stream-head`: what vLLM and
    /// SGLang do). A task waits for the first token, then writes and paces
    /// the chunks as [`Shared::generate`] does; a client gone by then is
    /// found at that first write and the request aborted.
    fn stream_early(
        self: &Arc<Self>,
        g: &GenRequest,
        id: ReqId,
        rid: String,
        created: u64,
        prompt_tokens: u64,
        mut rx: UnboundedReceiver<Event>,
    ) -> Reply {
        let h: Headers = vec![
            ("content-type".into(), "text/event-stream".into()),
            ("x-backend-name".into(), self.cfg.name.clone()),
            ("cache-control".into(), "no-cache".into()),
        ];
        let (mut body_tx, body) = Channel::<Bytes, Infallible>::new(STREAM_BUFFER);
        let shared = Arc::clone(self);
        let (api, max_tokens, include_usage) = (g.api, g.max_tokens, g.include_usage);
        tokio::spawn(async move {
            let cached = loop {
                match rx.recv().await {
                    Some(Event::FirstToken { cached_tokens, .. }) => break cached_tokens,
                    Some(Event::Done { .. }) => continue,
                    // Dropped by the scheduler: end the stream short.
                    None => return,
                }
            };
            let running = {
                let st = shared.lock();
                shared.load(&st).running
            };
            let step = shared.cfg.cost.decode_step_time(running as usize) * shared.cfg.time_scale;
            let step = Duration::try_from_secs_f64(step.max(0.0)).unwrap_or(Duration::ZERO);
            let stream = SseStream {
                api,
                rid,
                created,
                max_tokens,
                include_usage,
                usage: openai::usage(prompt_tokens, max_tokens, cached),
                step,
            };
            let first = Bytes::from(stream.first(&shared.cfg.model));
            if body_tx.send_data(first).await.is_err()
                || stream.pace(&shared, rx, body_tx).await.is_err()
            {
                shared.abort(id);
            }
        });
        http::response(200, &h, body.boxed())
    }
}

/// Data frames a stream's body may hold before its task waits for the
/// connection to take them.
const STREAM_BUFFER: usize = 16;

/// What a streamed generation's task needs to write its chunks.
struct SseStream {
    api: Api,
    rid: String,
    created: u64,
    max_tokens: u64,
    include_usage: bool,
    usage: Value,
    /// Real time between paced tokens (the expected decode step).
    step: Duration,
}

impl SseStream {
    fn meta<'a>(&'a self, model: &'a str) -> Meta<'a> {
        Meta {
            api: self.api,
            id: &self.rid,
            created: self.created,
            model,
        }
    }

    fn token(&self, model: &str, i: u64) -> Vec<u8> {
        openai::sse(&openai::chunk(
            &self.meta(model),
            &openai::token_text(i),
            false,
            None,
            self.include_usage,
        ))
    }

    /// The first chunk(s): the chat role chunk, then token 0.
    fn first(&self, model: &str) -> Vec<u8> {
        let mut first = Vec::new();
        if self.api == Api::Chat {
            first.extend(openai::sse(&openai::chunk(
                &self.meta(model),
                "",
                true,
                None,
                self.include_usage,
            )));
        }
        first.extend(self.token(model, 0));
        first
    }

    /// Pace tokens at the expected decode step; never emit the last one
    /// before the replica says Done; then the rest, the finish chunk, the
    /// usage chunk if asked and `[DONE]`. `Err` when the client is gone or
    /// the scheduler dropped the request.
    async fn pace(
        &self,
        shared: &Shared,
        mut rx: UnboundedReceiver<Event>,
        mut out: Sender<Bytes, Infallible>,
    ) -> Result<(), ()> {
        let model = shared.cfg.model.as_str();
        let n = self.max_tokens;
        let mut emitted = 1u64;
        loop {
            let ev = if emitted + 1 < n && !self.step.is_zero() {
                match tokio::time::timeout(self.step, rx.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        out.send_data(Bytes::from(self.token(model, emitted)))
                            .await
                            .map_err(|_| ())?;
                        emitted += 1;
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            match ev {
                Some(Event::Done { .. }) => break,
                Some(Event::FirstToken { .. }) => {}
                None => return Err(()),
            }
        }
        let mut rest = Vec::new();
        for i in emitted..n {
            rest.extend(self.token(model, i));
        }
        let meta = self.meta(model);
        rest.extend(openai::sse(&openai::chunk(
            &meta,
            "",
            false,
            Some("length"),
            self.include_usage,
        )));
        if self.include_usage {
            rest.extend(openai::sse(&openai::usage_chunk(&meta, self.usage.clone())));
        }
        rest.extend_from_slice(openai::SSE_DONE);
        out.send_data(Bytes::from(rest)).await.map_err(|_| ())
        // Dropping `out` ends the body (the last chunk, `0\r\n\r\n`).
    }
}

async fn wait_done(rx: &mut UnboundedReceiver<Event>) -> bool {
    loop {
        match rx.recv().await {
            Some(Event::Done { .. }) => return true,
            Some(Event::FirstToken { .. }) => {}
            None => return false,
        }
    }
}

/// A bound, not yet running server.
pub struct Server {
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
}

/// A server running on background threads (for in-process use).
#[derive(Debug, Clone, Copy)]
pub struct ServerHandle {
    pub addr: SocketAddr,
}

impl Server {
    /// Bind `cfg.listen` and set up the replica.
    pub fn bind(cfg: Config) -> io::Result<Server> {
        if !(cfg.time_scale > 0.0 && cfg.time_scale.is_finite()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "time_scale must be > 0",
            ));
        }
        // std's bind sets SO_REUSEADDR: a restarted replica gets its port
        // back at once.
        let listener = std::net::TcpListener::bind(&cfg.listen)?;
        listener.set_nonblocking(true)?;
        let replica = Replica::new(cfg.cost.clone());
        let shared = Arc::new(Shared {
            start: Instant::now(),
            created: unix_now(),
            state: Mutex::new(State {
                replica,
                subs: HashMap::new(),
                next_id: 1,
                extra_waiting: 0,
                extra_running: 0,
                stats: Stats::default(),
            }),
            wake: Condvar::new(),
            connections: AtomicUsize::new(0),
            cfg,
        });
        Ok(Server { listener, shared })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serve forever: the scheduler on a thread of its own, every
    /// connection on the current thread (a tokio current-thread runtime: a
    /// request costs microseconds of CPU, and one thread spares the wake-ups
    /// between workers a multi-thread runtime pays per request).
    pub fn run(self) -> io::Result<()> {
        let sched = Arc::clone(&self.shared);
        thread::Builder::new()
            .name("scheduler".into())
            .spawn(move || sched.scheduler())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(self.accept_loop())
    }

    /// Serve on background threads.
    pub fn spawn(self) -> io::Result<ServerHandle> {
        let addr = self.local_addr()?;
        thread::Builder::new()
            .name("acceptor".into())
            .spawn(move || {
                if let Err(e) = self.run() {
                    eprintln!("server stopped: {e}");
                }
            })?;
        Ok(ServerHandle { addr })
    }

    async fn accept_loop(self) -> io::Result<()> {
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .max_header_size(http::MAX_HEADER_BYTES)
            .max_headers(http::MAX_HEADER_COUNT)
            // Idle keep-alive connections stay open as long as the client
            // wants (Envoy's pool closes them): no header read timeout.
            .header_read_timeout(None);
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let shared = Arc::clone(&self.shared);
            let over_limit = shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS;
            let mut builder = http1.clone();
            // Over the limit: one 503 and close.
            builder.keep_alive(!over_limit);
            tokio::spawn(async move {
                let svc_shared = Arc::clone(&shared);
                let svc = service_fn(move |req| {
                    let s = Arc::clone(&svc_shared);
                    async move { Ok::<_, Infallible>(s.handle(req, over_limit).await) }
                });
                let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                shared.connections.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orca_formats() {
        let load = Load {
            waiting: 3,
            running: 2,
            kv_usage: 0.4,
        };
        assert_eq!(
            orca_header("TEXT", &load).unwrap(),
            "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0, named_metrics.num_requests_running=2.0"
        );
        let json = orca_header("json", &load).unwrap();
        assert_eq!(
            json,
            "JSON {\"named_metrics\": {\"kv_cache_usage_perc\": 0.4, \"num_requests_waiting\": 3.0, \"num_requests_running\": 2.0}}"
        );
        let v: Value = serde_json::from_str(json.strip_prefix("JSON ").unwrap()).unwrap();
        assert_eq!(v["named_metrics"]["num_requests_waiting"], 3.0);
        assert!(orca_header("PROTO", &load).is_none());
    }

    #[test]
    fn metrics_text() {
        let mut stats = Stats::default();
        stats.ttft.observe(0.05);
        stats.success = 7;
        let text = render_metrics(
            "m\"x",
            &MetricsSnapshot {
                load: Load {
                    waiting: 5,
                    running: 2,
                    kv_usage: 0.25,
                },
                queries: 100,
                hits: 40,
                stats,
            },
        );
        for line in [
            "vllm:num_requests_waiting{model_name=\"m\\\"x\"} 5.0",
            "vllm:num_requests_running{model_name=\"m\\\"x\"} 2.0",
            "vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25",
            "vllm:prefix_cache_queries_total{model_name=\"m\\\"x\"} 100.0",
            "vllm:prefix_cache_queries{model_name=\"m\\\"x\"} 100.0",
            "vllm:prefix_cache_hits_total{model_name=\"m\\\"x\"} 40.0",
            "vllm:prefix_cache_hits{model_name=\"m\\\"x\"} 40.0",
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"m\\\"x\"} 7.0",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.04\",model_name=\"m\\\"x\"} 0.0",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.06\",model_name=\"m\\\"x\"} 1.0",
            "vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\"} 1.0",
            "# TYPE vllm:prefix_cache_hits_total counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
