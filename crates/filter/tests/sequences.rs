//! Any order Envoy may call a request's callbacks in, with hostile bytes
//! anywhere a client or a replica writes them: no panic (a panic kills the
//! worker's VM), and once every request is logged, nothing is left held:
//! no in-flight count, no pending request, at any host or in the fleet
//! total. Driven natively through the in-process host
//! (`prefix_router::fake`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use prefix_router::fake::{self, Host};
use prefix_router::host::SharedData;
use prefix_router::root::Root;
use prefix_router_core::host_state;
use proptest::prelude::*;
use proxy_wasm::traits::RootContext;
use proxy_wasm::types::{BufferType, MapType};

const HOSTS: [&str; 3] = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];

fn config(decision_header: bool) -> String {
    format!(
        r#"{{"hosts": [{{"address": "{}"}}, {{"address": "{}"}}, {{"address": "{}"}}],
            "key": {{"session_header": "x-session"}}{}}}"#,
        HOSTS[0],
        HOSTS[1],
        HOSTS[2],
        if decision_header {
            r#", "decision_header": "x-why""#
        } else {
            ""
        }
    )
}

/// Bytes a client might send: valid chat bodies, truncated or corrupted
/// ones, or noise.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let chat = ("[a-z ]{0,40}", 0usize..3).prop_map(|(t, turns)| {
        let mut m = vec![r#"{"role": "system", "content": "Be brief."}"#.to_string()];
        for i in 0..=turns {
            m.push(format!(r#"{{"role": "user", "content": "{t} {i}"}}"#));
            m.push(format!(r#"{{"role": "assistant", "content": "ok {i}"}}"#));
        }
        m.pop();
        format!(r#"{{"model": "m", "messages": [{}]}}"#, m.join(", ")).into_bytes()
    });
    prop_oneof![
        6 => chat.clone(),
        1 => (chat.clone(), any::<usize>()).prop_map(|(b, cut)| b[..cut % (b.len() + 1)].to_vec()),
        1 => (chat, any::<usize>(), any::<u8>()).prop_map(|(mut b, at, x)| {
            let i = at % b.len();
            b[i] = x;
            b
        }),
        1 => proptest::collection::vec(any::<u8>(), 0..200),
    ]
}

/// A header value: printable, or any bytes at all.
fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,30}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..30),
    ]
}

/// The upstream a response says served it.
fn upstream() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        (0usize..3).prop_map(|i| Some(HOSTS[i].as_bytes().to_vec())),
        value().prop_map(Some),
        Just(None),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    /// The body in `n` chunks (Envoy passes the buffered size so far);
    /// the last ends the stream if `true` (else trailers may end it).
    Body(usize, bool),
    Trailers,
    /// Response headers: status, ORCA value, upstream address.
    Response(Vec<u8>, Vec<u8>, Option<Vec<u8>>),
    ResponseBody,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let body = (1usize..4, any::<bool>()).prop_map(|(n, t)| Step::Body(n, t));
    let resp = (
        prop_oneof![Just(b"200".to_vec()), Just(b"503".to_vec()), value()],
        prop_oneof![
            Just(
                b"TEXT named_metrics.num_requests_waiting=3, named_metrics.num_requests_running=2"
                    .to_vec()
            ),
            value()
        ],
        upstream(),
    )
        .prop_map(|(s, o, u)| Step::Response(s, o, u));
    // In Envoy's order, each step optional: a request can be reset at any
    // point (then only log and done follow).
    (
        proptest::option::weighted(0.9, body),
        any::<bool>(),
        proptest::option::weighted(0.8, resp),
        any::<bool>(),
    )
        .prop_map(|(b, trailers, r, rb)| {
            let mut v = Vec::new();
            if let Some(b) = b {
                let ends = matches!(b, Step::Body(_, true));
                v.push(b);
                if !ends && trailers {
                    v.push(Step::Trailers);
                }
            }
            if let Some(r) = r {
                v.push(r);
                if rb {
                    v.push(Step::ResponseBody);
                }
            }
            v
        })
}

#[derive(Debug, Clone)]
struct Req {
    method: Vec<u8>,
    path: Vec<u8>,
    content_type: Vec<u8>,
    length: Option<Vec<u8>>,
    session: Option<Vec<u8>>,
    body: Vec<u8>,
    end_at_headers: bool,
    steps: Vec<Step>,
    /// Log before done (Envoy's order), or done alone.
    log: bool,
}

fn request() -> impl Strategy<Value = Req> {
    (
        prop_oneof![9 => Just(b"POST".to_vec()), 1 => value()],
        prop_oneof![8 => Just(b"/v1/chat/completions".to_vec()), 1 => Just(b"/v1/completions?x=1".to_vec()), 1 => value()],
        prop_oneof![9 => Just(b"application/json".to_vec()), 1 => value()],
        proptest::option::weighted(0.1, value()),
        proptest::option::weighted(0.3, value()),
        body(),
        prop::bool::weighted(0.05),
        steps(),
        prop::bool::weighted(0.9),
    )
        .prop_map(
            |(method, path, content_type, length, session, body, end_at_headers, steps, log)| Req {
                method,
                path,
                content_type,
                length,
                session,
                body,
                end_at_headers,
                steps,
                log,
            },
        )
}

fn run(r: &Root, q: &Req, id: u32) {
    let mut http = r.create_http_context(id).unwrap();
    let len = q.body.len().to_string();
    let mut heads: Vec<(&str, &[u8])> = vec![
        (":method", &q.method),
        (":path", &q.path),
        ("content-type", &q.content_type),
        (
            "content-length",
            q.length.as_deref().unwrap_or(len.as_bytes()),
        ),
        ("x-gateway-destination-endpoint", b"10.9.9.9:1"),
    ];
    if let Some(s) = &q.session {
        heads.push(("x-session", s));
    }
    fake::with(|h| h.set_map(MapType::HttpRequestHeaders, &heads));
    http.on_http_request_headers(heads.len(), q.end_at_headers);
    for s in &q.steps {
        match s {
            Step::Body(n, ends) => {
                for i in 1..=*n {
                    let upto = q.body.len() * i / n;
                    fake::with(|h| h.set_buffer(BufferType::HttpRequestBody, &q.body[..upto]));
                    http.on_http_request_body(upto, i == *n && *ends);
                }
            }
            Step::Trailers => {
                http.on_http_request_trailers(0);
            }
            Step::Response(status, orca, up) => {
                fake::with(|h| {
                    h.set_map(
                        MapType::HttpResponseHeaders,
                        &[(":status", status), ("endpoint-load-metrics", orca)],
                    );
                    match up {
                        Some(u) => h.set_property(&["upstream", "address"], u),
                        None => {
                            h.properties.remove(b"upstream\0address".as_slice());
                        }
                    }
                });
                http.on_http_response_headers(2, false);
            }
            Step::ResponseBody => {
                http.on_http_response_body(5, false);
            }
        }
    }
    if q.log {
        http.on_log();
    }
    http.on_done();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_callback_order_and_any_bytes_leave_nothing_held(
        reqs in proptest::collection::vec(request(), 1..6),
        decision_header in any::<bool>(),
        interleave in any::<bool>(),
    ) {
        fake::with(|h| *h = Host { now_ns: 1_700_000_000_000_000_000, ..Host::default() });
        let cfg = config(decision_header);
        fake::with(|h| h.set_buffer(BufferType::PluginConfiguration, cfg.as_bytes()));
        let mut r = Root::new(1);
        prop_assert!(r.on_configure(cfg.len()));
        if interleave {
            // Every request's headers and body first, then every response:
            // several requests in flight at once.
            let mut ctxs = Vec::new();
            for (i, q) in reqs.iter().enumerate() {
                let mut http = r.create_http_context(10 + i as u32).unwrap();
                let len = q.body.len().to_string();
                let heads: Vec<(&str, &[u8])> = vec![
                    (":method", &q.method),
                    (":path", &q.path),
                    ("content-type", &q.content_type),
                    ("content-length", len.as_bytes()),
                ];
                fake::with(|h| h.set_map(MapType::HttpRequestHeaders, &heads));
                http.on_http_request_headers(heads.len(), false);
                fake::with(|h| h.set_buffer(BufferType::HttpRequestBody, &q.body));
                http.on_http_request_body(q.body.len(), true);
                ctxs.push(http);
            }
            for http in ctxs.iter_mut().rev() {
                fake::with(|h| {
                    h.set_map(MapType::HttpResponseHeaders, &[(":status", b"200")]);
                    h.set_property(&["upstream", "address"], HOSTS[1].as_bytes());
                });
                http.on_http_response_headers(1, false);
                http.on_log();
                http.on_done();
            }
        } else {
            for (i, q) in reqs.iter().enumerate() {
                run(&r, q, 10 + i as u32);
            }
        }
        for a in HOSTS {
            let rec = host_state::read(&SharedData, a).unwrap();
            prop_assert_eq!(rec.inflight, 0, "in flight at {}", a);
            prop_assert_eq!(rec.pending_requests, 0, "pending at {}", a);
        }
        prop_assert_eq!(host_state::read_fleet_inflight(&SharedData).unwrap(), 0);
    }
}
