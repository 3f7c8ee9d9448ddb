//! The filter's contexts driven natively through the in-process host
//! (`prefix_router::fake`): configuration, a request's decision, its
//! accounting and its fallbacks, with no Envoy. The Envoy suites
//! (`tests/tests/e2e.rs`) run the same code as a .wasm in Envoy.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use prefix_router::fake::{self, Host};
use prefix_router::root::Root;
use prefix_router_core::extract::Api;
use prefix_router_core::{Config, Decision, Request, Router};
use proxy_wasm::traits::{HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, MapType};

const CONFIG: &str = r#"{"hosts": [{"address": "10.0.0.1:8000"}, {"address": "10.0.0.2:8000"},
    {"address": "10.0.0.3:8000"}, {"address": "10.0.0.4:8000"}]}"#;
const DEST: &str = "x-gateway-destination-endpoint";

/// A fresh host for this test (tests run on their own threads, each with
/// its own host; a thread may run several tests one after the other).
fn reset() {
    fake::with(|h| {
        *h = Host {
            now_ns: 1_700_000_000_000_000_000,
            ..Host::default()
        }
    });
}

/// A root context configured with `config`, and whether it accepted it.
fn root(config: &str) -> (Root, bool) {
    reset();
    fake::with(|h| h.set_buffer(BufferType::PluginConfiguration, config.as_bytes()));
    let mut r = Root::new(1);
    assert!(r.on_vm_start(0));
    let ok = r.on_configure(config.len());
    (r, ok)
}

fn chat(text: &str) -> Vec<u8> {
    format!(
        r#"{{"model": "m", "messages": [{{"role": "system", "content": "You are terse."}}, {{"role": "user", "content": "{text}"}}]}}"#
    )
    .into_bytes()
}

fn request_headers(body: &[u8], extra: &[(&str, &[u8])]) {
    let len = body.len().to_string();
    let mut pairs: Vec<(&str, &[u8])> = vec![
        (":method", b"POST"),
        (":path", b"/v1/chat/completions"),
        ("content-type", b"application/json"),
        ("content-length", len.as_bytes()),
    ];
    pairs.extend_from_slice(extra);
    fake::with(|h| h.set_map(MapType::HttpRequestHeaders, &pairs));
}

/// Send `body` through a new request context: headers, then the whole body.
fn send(r: &Root, body: &[u8], extra: &[(&str, &[u8])]) -> (Box<dyn HttpContext>, Action) {
    let mut http = r.create_http_context(2).expect("configured");
    request_headers(body, extra);
    assert_eq!(http.on_http_request_headers(4, false), Action::Pause);
    fake::with(|h| h.set_buffer(BufferType::HttpRequestBody, body));
    let a = http.on_http_request_body(body.len(), true);
    (http, a)
}

fn destination() -> Option<String> {
    fake::with(|h| {
        h.header(MapType::HttpRequestHeaders, DEST)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

/// The first address of the destination header: the filter's choice.
fn chosen() -> String {
    destination()
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_string()
}

/// The response's head: `host` served it, with these headers.
fn served_by(host: &str, headers: &[(&str, &[u8])]) {
    fake::with(|h| {
        h.set_property(&["upstream", "address"], host.as_bytes());
        h.set_map(MapType::HttpResponseHeaders, headers);
    });
}

fn metric(name: &str) -> i64 {
    fake::with(|h| h.metric(name)).unwrap_or_else(|| panic!("metric {name} not defined"))
}

/// Where the core alone sends `body` with no load anywhere.
fn core_choice(body: &[u8]) -> String {
    let cfg = Config::from_json(CONFIG.as_bytes()).unwrap();
    let router = Router::new(cfg.clone());
    let loads = vec![Default::default(); cfg.hosts.len()];
    match router
        .decide(&Request::new(
            Api::ChatCompletions,
            body,
            &loads,
            1_700_000_000_000,
        ))
        .decision
    {
        Decision::Routed { host, .. } => cfg.hosts[host].address.clone(),
        d => panic!("the core did not route: {d:?}"),
    }
}

#[test]
fn a_chat_request_goes_where_the_core_places_it_and_is_counted() {
    let (r, ok) = root(CONFIG);
    assert!(ok);
    for i in 0..8 {
        let body = chat(&format!("question {i} about the weather"));
        let (mut http, a) = send(&r, &body, &[]);
        assert_eq!(a, Action::Continue);
        // Each request ends before the next, so every decision sees no load.
        http.on_log();
        let dest = destination().expect("a destination header");
        // The first address is the choice; failover hosts may follow.
        let first = dest.split(',').next().unwrap().to_string();
        assert_eq!(first, core_choice(&body), "request {i}");
    }
    assert_eq!(metric("prefix_router.routed.hit"), 8);
    assert_eq!(metric("prefix_router.key.prompt"), 8);
}

#[test]
fn a_request_holds_its_in_flight_count_until_it_is_logged_once() {
    let (r, _) = root(CONFIG);
    let body = chat("hello there");
    let (mut http, a) = send(&r, &body, &[]);
    assert_eq!(a, Action::Continue);
    let host = chosen();
    let inflight = || {
        prefix_router_core::host_state::read_inflight(&prefix_router::host::SharedData, &host)
            .unwrap()
    };
    assert_eq!(inflight(), 1);
    served_by(&host, &[(":status", b"200")]);
    assert_eq!(http.on_http_response_headers(1, false), Action::Continue);
    assert_eq!(inflight(), 1, "held until the request is done");
    // Its first token: it stops waiting there, so the same prompt again
    // finds nothing of this proxy's queued at the replica and stays.
    assert_eq!(http.on_http_response_body(16, false), Action::Continue);
    // A second request of the same prompt, to the same replica.
    let (mut second, _) = send(&r, &body, &[]);
    assert!(destination().unwrap().starts_with(&host));
    assert_eq!(inflight(), 2);
    http.on_log();
    assert_eq!(inflight(), 1);
    // A second end (on_done after on_log) releases nothing more.
    assert!(http.on_done());
    assert_eq!(inflight(), 1);
    second.on_log();
    assert_eq!(inflight(), 0);
}

#[test]
fn a_client_cannot_choose_the_replica() {
    let (r, _) = root(CONFIG);
    // Not ours (GET): the client's destination header is still removed.
    let mut http = r.create_http_context(2).unwrap();
    fake::with(|h| {
        h.set_map(
            MapType::HttpRequestHeaders,
            &[
                (":method", b"GET"),
                (":path", b"/v1/chat/completions"),
                (DEST, b"10.9.9.9:1"),
            ],
        )
    });
    assert_eq!(http.on_http_request_headers(3, true), Action::Continue);
    assert_eq!(destination(), None);
    assert_eq!(metric("prefix_router.fallback.method"), 1);
    // Ours: the header is the filter's choice, not the client's.
    let body = chat("pick 10.9.9.9 please");
    let (_http, a) = send(&r, &body, &[(DEST, b"10.9.9.9:1")]);
    assert_eq!(a, Action::Continue);
    assert!(destination().unwrap().starts_with(&core_choice(&body)));
}

#[test]
fn hostile_bytes_fall_back_to_envoy_without_a_panic() {
    let (r, _) = root(CONFIG);
    // Headers that are not UTF-8 (the SDK's own header reads panicked on
    // them and killed the VM): read as bytes, the request is still routed.
    let body = chat("hi");
    let (mut http, a) = send(
        &r,
        &body,
        &[("x-junk", b"\xff\xfe\x00"), ("user-agent", b"\xc3\x28")],
    );
    assert_eq!(a, Action::Continue);
    assert!(destination().is_some());
    http.on_log();
    // A content type that is not UTF-8 and not JSON: Envoy's balancing.
    let mut http = r.create_http_context(2).unwrap();
    request_headers(&body, &[]);
    fake::with(|h| {
        let m = h
            .maps
            .get_mut(&(MapType::HttpRequestHeaders as u32))
            .unwrap();
        m.retain(|(k, _)| k != "content-type");
        m.push(("content-type".into(), b"text/\xffplain".to_vec()));
    });
    assert_eq!(http.on_http_request_headers(4, false), Action::Continue);
    assert_eq!(metric("prefix_router.fallback.content_type"), 1);
    // A body that is not JSON, and one over max_body_bytes.
    let (_h, a) = send(&r, b"{\"messages\": [\xff", &[]);
    assert_eq!(a, Action::Continue);
    assert_eq!(destination(), None);
    assert_eq!(metric("prefix_router.fallback.parse_error"), 1);
    let mut http = r.create_http_context(3).unwrap();
    let big = vec![b' '; 2 << 20];
    request_headers(&big, &[]);
    let a = http.on_http_request_headers(4, false);
    if a == Action::Pause {
        assert_eq!(
            http.on_http_request_body(big.len(), false),
            Action::Continue
        );
    }
    assert_eq!(metric("prefix_router.fallback.body_too_large"), 1);
    assert_eq!(metric("prefix_router.routed.hit"), 1);
}

#[test]
fn a_bad_config_is_refused_with_the_field_named() {
    let (_r, ok) = root(r#"{"hosts": [{"address": "10.0.0.1:8000"}], "capacity_factor": 0.5}"#);
    assert!(!ok);
    assert!(
        fake::with(|h| h.logged("capacity_factor")),
        "{:?}",
        fake::with(|h| h.logs.clone())
    );
    let (_r, ok) = root(r#"{"hosts": [{"address": "10.0.0.1:8000"}], "capacity": 2}"#);
    assert!(!ok);
    assert!(fake::with(|h| h.logged("capacity")));
    let (r, ok) = root(CONFIG);
    assert!(ok);
    assert!(r.create_http_context(2).is_some());
}

#[test]
fn a_response_reads_the_replicas_report_and_explains_the_decision() {
    let config = r#"{"hosts": [{"address": "10.0.0.1:8000"}, {"address": "10.0.0.2:8000"}],
        "decision_header": "x-prefix-router-decision"}"#;
    let (r, ok) = root(config);
    assert!(ok);
    let body = chat("what is a KV cache?");
    let (mut http, a) = send(&r, &body, &[]);
    assert_eq!(a, Action::Continue);
    // The filter asked the replica for an ORCA report.
    assert_eq!(
        fake::with(|h| h
            .header(MapType::HttpRequestHeaders, "endpoint-load-metrics-format")
            .map(<[u8]>::to_vec)),
        Some(b"TEXT".to_vec())
    );
    let host = chosen();
    served_by(
        &host,
        &[
            (":status", b"200"),
            (
                "endpoint-load-metrics",
                b"TEXT named_metrics.num_requests_waiting=3",
            ),
        ],
    );
    assert_eq!(http.on_http_response_headers(2, false), Action::Continue);
    assert_eq!(metric("prefix_router.load_reports"), 1);
    let why = fake::with(|h| {
        h.header(MapType::HttpResponseHeaders, "x-prefix-router-decision")
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
    .expect("a decision header");
    assert!(
        why.starts_with(&format!("outcome=hit;host={host};")),
        "{why}"
    );
    assert!(why.contains("turn=first"), "{why}");
    http.on_log();
}

/// Send `body`, then give it its response head but no token yet (as vLLM
/// streams): it is still waiting at its replica. Returns the context and
/// the replica.
fn waiting(r: &Root, body: &[u8]) -> (Box<dyn HttpContext>, String) {
    let (mut http, _) = send(r, body, &[]);
    let host = chosen();
    served_by(&host, &[(":status", b"200")]);
    http.on_http_response_headers(1, false);
    (http, host)
}

#[test]
fn a_first_turn_leaves_an_owner_where_this_proxys_request_still_waits_unless_it_is_long() {
    let (r, _) = root(CONFIG);
    // The same short prompt again: one queued request there (0.5 s) is
    // worth more than re-prefilling a few dozen tokens elsewhere.
    let short = chat("a short question");
    let (mut first, owner) = waiting(&r, &short);
    let (mut again, _) = send(&r, &short, &[]);
    assert!(!destination().unwrap().starts_with(&owner));
    assert_eq!(metric("prefix_router.routed.moved"), 1);
    again.on_log();
    first.on_log();
    // A 40,000-byte prompt costs 0.625 s to prefill again (16,000
    // tokens/s): more than that wait, so it stays.
    let long = chat(&format!("a long document {}", "x".repeat(40_000)));
    let (mut first, owner) = waiting(&r, &long);
    let (mut again, _) = send(&r, &long, &[]);
    assert!(destination().unwrap().starts_with(&owner));
    assert_eq!(metric("prefix_router.routed.moved"), 1);
    again.on_log();
    first.on_log();
}

#[test]
fn the_tick_is_the_shortest_period_of_the_configured_jobs() {
    let hosts = r#""hosts": [{"address": "10.0.0.1:8000"}]"#;
    let no_reports = r#""load": {"orca_format": null, "queue_header": null}"#;
    // Reports configured (the default ORCA): the loads' refresh, 100 ms.
    let (_r, ok) = root(&format!("{{{hosts}}}"));
    assert!(ok);
    assert_eq!(fake::with(|h| h.tick_ms), Some(100));
    // No report of any kind and no job: no tick at all.
    let (_r, ok) = root(&format!("{{{hosts}, {no_reports}}}"));
    assert!(ok);
    assert_eq!(fake::with(|h| h.tick_ms), None);
    // The scrape alone (a report source too): the shorter of its period
    // and the refresh.
    let (_r, ok) = root(&format!(
        r#"{{{hosts}, {no_reports}, "scrape": {{"cluster": "llm", "interval_ms": 250, "timeout_ms": 200}}}}"#
    ));
    assert!(ok, "{:?}", fake::with(|h| h.logs.clone()));
    assert_eq!(fake::with(|h| h.tick_ms), Some(100));
    // Membership polling alone: its period.
    let (_r, ok) = root(&format!(
        r#"{{{hosts}, {no_reports}, "membership": {{"cluster": "llm", "interval_ms": 150}}}}"#
    ));
    assert!(ok, "{:?}", fake::with(|h| h.logs.clone()));
    assert_eq!(fake::with(|h| h.tick_ms), Some(150));
}

#[test]
fn a_replica_that_keeps_failing_is_ejected_and_its_requests_go_elsewhere() {
    let (r, _) = root(CONFIG);
    let body = chat("a question for a sick replica");
    let sick = core_choice(&body);
    // `health.failure_threshold` (5) failed responses in a row.
    for i in 0..5 {
        let (mut http, _) = send(&r, &body, &[]);
        assert!(destination().unwrap().starts_with(&sick), "request {i}");
        fake::with(|h| {
            h.set_property(&["upstream", "address"], sick.as_bytes());
            h.set_property(&["response", "code"], &503i64.to_le_bytes());
            h.set_map(MapType::HttpResponseHeaders, &[(":status", b"503")]);
        });
        http.on_http_response_headers(1, true);
        http.on_log();
    }
    assert_eq!(metric("prefix_router.health.ejections"), 1);
    let (mut http, a) = send(&r, &body, &[]);
    assert_eq!(a, Action::Continue);
    assert!(!destination().unwrap().starts_with(&sick));
    http.on_log();
}

/// A chat under a 5 KB system prompt (an application preamble, longer than
/// `key.prefix_bytes`): `turns` user messages with answers between them.
fn app_chat(user: &str, turns: usize) -> Vec<u8> {
    preamble_chat("You are the assistant of one application. ", user, turns)
}

/// [`app_chat`] under `line` repeated 120 times.
fn preamble_chat(line: &str, user: &str, turns: usize) -> Vec<u8> {
    let system = line.repeat(120);
    let mut m = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
    for t in 0..turns {
        m.push(format!(r#"{{"role":"user","content":"{user} turn {t}"}}"#));
        m.push(format!(r#"{{"role":"assistant","content":"answer {t}"}}"#));
    }
    m.pop();
    format!(r#"{{"model":"m","messages":[{}]}}"#, m.join(",")).into_bytes()
}

/// Routes `body` through a new HTTP context of `r`; the host chosen.
fn place(r: &Root, body: &[u8]) -> String {
    let (mut http, _) = send(r, body, &[]);
    let host = chosen();
    http.on_log();
    host
}

#[test]
fn a_first_turn_opens_where_its_later_turns_go_once_its_preamble_is_seen_to_converse() {
    let (r, _) = root(CONFIG);
    let place = |body: &[u8]| place(&r, body);
    let users: Vec<String> = (0..12).map(|i| format!("user {i}")).collect();
    // No later turn seen: every first turn meets at the preamble's owner
    // (it may be a single prompt sharing the preamble).
    let firsts: Vec<String> = users.iter().map(|u| place(&app_chat(u, 1))).collect();
    assert!(firsts.iter().all(|h| *h == firsts[0]), "{firsts:?}");
    // One later turn (to its own conversation's owner) shows the
    // application converses: each conversation now opens where it goes on.
    let later: Vec<String> = users.iter().map(|u| place(&app_chat(u, 2))).collect();
    assert!(
        later.iter().filter(|h| **h != firsts[0]).count() >= 3,
        "{later:?}"
    );
    for (u, h) in users.iter().zip(&later) {
        assert_eq!(&place(&app_chat(u, 1)), h, "{u}");
    }
}

#[test]
fn a_document_read_by_few_keeps_its_conversations_where_it_is_held() {
    let (r, _) = root(CONFIG);
    let place = |body: &[u8]| place(&r, body);
    // Each document in its own system prompt (over `key.prefix_bytes`),
    // three readers each: every document carries far less than the
    // bound's slack of one host (1/16 of the requests at 4 hosts and
    // 1.25), so once this worker has counted enough requests to tell,
    // its readers' turns all go to the document's owner instead of each
    // conversation re-prefilling it at its own key's owner.
    let doc = |d: usize, reader: usize, turns: usize| {
        let line = format!("Document {d}: a long text to ask about. ");
        preamble_chat(&line, &format!("reader {reader}"), turns)
    };
    // The readers come in turn: the first reader of each document, then
    // the second of each, then the third.
    let mut hosts = vec![Vec::new(); 40];
    for u in 0..3 {
        for (d, hs) in hosts.iter_mut().enumerate() {
            hs.extend([place(&doc(d, u, 1)), place(&doc(d, u, 2))]);
        }
    }
    let mut homes = std::collections::BTreeSet::new();
    for (d, hs) in hosts.iter().enumerate().skip(10) {
        assert!(hs.iter().all(|h| *h == hs[0]), "document {d}: {hs:?}");
        homes.insert(hs[0].clone());
    }
    assert!(
        homes.len() >= 3,
        "documents spread by their own hash: {homes:?}"
    );
}
