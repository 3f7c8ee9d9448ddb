//! HTTP/1.1 framing as Envoy and the lab meet it, over loopback connections
//! to an in-process server (`Server::spawn`); the endpoints' behaviour is in
//! tests/server.rs. Keep-alive and pipelining, chunked request bodies with
//! `Expect: 100-continue`, SSE streamed with chunked transfer encoding
//! (close-delimited for HTTP/1.0), the test hook's raw 0xFF octets in the
//! load headers, non-UTF-8 request headers, limits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use prefix_router_backend::{Config, Server};

fn start(cfg: Config) -> SocketAddr {
    let server = Server::bind(Config {
        listen: "127.0.0.1:0".to_string(),
        name: "r1".to_string(),
        model: "m".to_string(),
        ..cfg
    })
    .unwrap();
    server.spawn().unwrap().addr
}

fn fast() -> SocketAddr {
    start(Config {
        time_scale: 0.01,
        ..Config::default()
    })
}

/// One parsed response: status line, headers as raw bytes (lower-cased
/// names), and the decoded body.
#[derive(Debug)]
struct Resp {
    status_line: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// Sizes of the body's chunks when it was sent chunked.
    chunks: Option<Vec<usize>>,
}

impl Resp {
    fn status(&self) -> u16 {
        self.status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn header_str(&self, name: &str) -> Option<&str> {
        self.header(name).map(|v| std::str::from_utf8(v).unwrap())
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

fn line<R: BufRead>(r: &mut R) -> Vec<u8> {
    let mut l = Vec::new();
    r.read_until(b'\n', &mut l).unwrap();
    assert!(l.ends_with(b"\r\n"), "line {l:?}");
    l.truncate(l.len() - 2);
    l
}

/// Reads one response (skipping `100 Continue`); returns it and whether a
/// `100 Continue` came first. A body without length or chunking is read to
/// the end of the connection.
fn read_resp<R: BufRead>(r: &mut R) -> (Resp, bool) {
    let mut continued = false;
    loop {
        let status_line = String::from_utf8(line(r)).unwrap();
        let mut headers = Vec::new();
        loop {
            let l = line(r);
            if l.is_empty() {
                break;
            }
            let colon = l.iter().position(|b| *b == b':').unwrap();
            let name = String::from_utf8(l[..colon].to_vec())
                .unwrap()
                .to_ascii_lowercase();
            let value = l[colon + 1..].trim_ascii().to_vec();
            headers.push((name, value));
        }
        if status_line.contains(" 100 ") {
            continued = true;
            continue;
        }
        let mut resp = Resp {
            status_line,
            headers,
            body: Vec::new(),
            chunks: None,
        };
        if resp.header("transfer-encoding") == Some(b"chunked") {
            let mut sizes = Vec::new();
            loop {
                let size =
                    usize::from_str_radix(std::str::from_utf8(&line(r)).unwrap(), 16).unwrap();
                if size == 0 {
                    assert!(line(r).is_empty());
                    break;
                }
                let mut chunk = vec![0; size];
                r.read_exact(&mut chunk).unwrap();
                assert!(line(r).is_empty());
                resp.body.extend(chunk);
                sizes.push(size);
            }
            resp.chunks = Some(sizes);
        } else if let Some(n) = resp.header_str("content-length") {
            let mut body = vec![0; n.parse().unwrap()];
            r.read_exact(&mut body).unwrap();
            resp.body = body;
        } else {
            r.read_to_end(&mut resp.body).unwrap();
        }
        return (resp, continued);
    }
}

fn connect(addr: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

/// True if the server closed the connection (EOF) rather than keeping it.
fn closed(r: &mut BufReader<TcpStream>) -> bool {
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    rest.is_empty()
}

fn chat(max_tokens: u64, stream: bool) -> String {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hello, this is a test of the simulator"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

fn post(path: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let addr = fast();
    let (mut w, mut r) = connect(addr);
    for i in 0..3 {
        w.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let (resp, _) = read_resp(&mut r);
        assert_eq!(resp.status(), 200, "#{i}");
        assert_eq!(resp.header_str("x-backend-name"), Some("r1"));
        assert_eq!(resp.header_str("x-queue-depth"), Some("0"));
        assert_eq!(resp.header_str("x-cached-tokens"), Some("0"));
        w.write_all(&post("/v1/chat/completions", "", &chat(3, false)))
            .unwrap();
        let (resp, _) = read_resp(&mut r);
        assert_eq!(resp.status(), 200, "#{i}: {}", resp.text());
        let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"]["completion_tokens"], 3);
    }
    // Pipelined: two requests in one write, two answers in order.
    w.write_all(
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\nGET /nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(read_resp(&mut r).0.status(), 200);
    let (resp, _) = read_resp(&mut r);
    assert_eq!(resp.status(), 404);
    assert!(resp.text().contains("NotFoundError"), "{}", resp.text());
    assert!(closed(&mut r), "connection: close was not honoured");
}

#[test]
fn chunked_request_bodies_with_expect_continue() {
    let addr = fast();
    let (mut w, mut r) = connect(addr);
    let body = chat(2, false);
    let mut req = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n".to_vec();
    for part in body.as_bytes().chunks(7) {
        req.extend(format!("{:x};ext=1\r\n", part.len()).as_bytes());
        req.extend(part);
        req.extend(b"\r\n");
    }
    req.extend(b"0\r\nx-trailer: 1\r\n\r\n");
    w.write_all(&req).unwrap();
    let (resp, continued) = read_resp(&mut r);
    assert!(continued, "no 100 Continue");
    assert_eq!(resp.status(), 200, "{}", resp.text());
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    // The connection is still usable.
    w.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_resp(&mut r).0.status(), 200);
}

/// The `data:` payloads of an SSE body.
fn events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect()
}

#[test]
fn streams_sse_with_chunked_transfer_then_keeps_the_connection() {
    // Slow enough decode that tokens are paced in separate chunks.
    let addr = start(Config {
        time_scale: 0.2,
        ..Config::default()
    });
    let (mut w, mut r) = connect(addr);
    let n = 12;
    w.write_all(&post(
        "/v1/chat/completions",
        "endpoint-load-metrics-format: TEXT\r\n",
        &chat(n, true),
    ))
    .unwrap();
    let (resp, _) = read_resp(&mut r);
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header_str("content-type"), Some("text/event-stream"));
    assert_eq!(resp.header_str("cache-control"), Some("no-cache"));
    let orca = resp.header_str("endpoint-load-metrics").unwrap();
    assert!(
        orca.starts_with("TEXT named_metrics.kv_cache_usage_perc=")
            && orca.contains("named_metrics.num_requests_running=1.0"),
        "{orca}"
    );
    let chunks = resp.chunks.clone().unwrap();
    assert!(chunks.len() > 2, "tokens were not streamed: {chunks:?}");
    let text = resp.text();
    let ev = events(&text);
    assert_eq!(ev.last(), Some(&"[DONE]"));
    // Role chunk, n tokens, finish chunk, usage chunk, [DONE].
    assert_eq!(ev.len() as u64, 1 + n + 1 + 1 + 1, "{text}");
    let usage: serde_json::Value = serde_json::from_str(ev[ev.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], n);
    let finish: serde_json::Value = serde_json::from_str(ev[ev.len() - 3]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    w.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_resp(&mut r).0.status(), 200);
    assert!(closed(&mut r));
}

#[test]
fn early_stream_head_comes_before_the_first_token_without_load_headers() {
    // A long prompt at a slow prefill: about 1.5 s of prefill, real time.
    let addr = start(Config {
        time_scale: 1.0,
        early_stream_head: true,
        cost: prefix_router_replica::cost::CostModel {
            prefill_tokens_per_s: 2000.0,
            ..Default::default()
        },
        ..Config::default()
    });
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "lorem ipsum ".repeat(1000)}],
        "max_tokens": 3,
        "stream": true,
    })
    .to_string();
    let (mut w, mut r) = connect(addr);
    let t0 = std::time::Instant::now();
    w.write_all(&post(
        "/v1/chat/completions",
        "endpoint-load-metrics-format: TEXT\r\n",
        &body,
    ))
    .unwrap();
    // The status line and headers, as vLLM sends them: at once, no load headers.
    let status = line(&mut r);
    let head_at = t0.elapsed();
    assert!(status.starts_with(b"HTTP/1.1 200"), "{status:?}");
    let mut names = Vec::new();
    loop {
        let l = line(&mut r);
        if l.is_empty() {
            break;
        }
        let l = String::from_utf8(l).unwrap().to_ascii_lowercase();
        names.push(l.split(':').next().unwrap().to_string());
    }
    for n in ["endpoint-load-metrics", "x-queue-depth", "x-cached-tokens"] {
        assert!(!names.iter().any(|h| h == n), "{n} in {names:?}");
    }
    assert!(names.iter().any(|h| h == "x-backend-name"), "{names:?}");
    // The head was sent before the first token: with the whole head read, no byte of the
    // body has arrived (the prefill takes about 1.5 s more).
    assert!(r.buffer().is_empty(), "body bytes came with the head");
    w.set_nonblocking(true).unwrap();
    let mut peek = [0u8; 1];
    let early = w.peek(&mut peek);
    w.set_nonblocking(false).unwrap();
    assert!(
        matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the body was already there when the head was read ({head_at:?} after the request): {early:?}"
    );
    // The first chunk: after the prefill (a lower bound: a slow machine only delays it).
    let size = line(&mut r);
    let first_at = t0.elapsed();
    assert!(!size.is_empty());
    assert!(
        first_at >= Duration::from_secs(1),
        "first token at {first_at:?}, before the prefill's 1.5 s"
    );
}

#[test]
fn http10_gets_a_close_delimited_stream() {
    let addr = fast();
    let (mut w, mut r) = connect(addr);
    let body = r#"{"prompt": "abc", "max_tokens": 3, "stream": true}"#;
    w.write_all(
        format!(
            "POST /v1/completions HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let (resp, _) = read_resp(&mut r);
    assert_eq!(resp.status(), 200);
    assert!(resp.chunks.is_none());
    assert_eq!(resp.header("content-length"), None);
    let text = resp.text();
    assert_eq!(events(&text).len(), 3 + 1 + 1, "{text}");
}

#[test]
fn bad_load_headers_hook_writes_raw_ff_octets() {
    let addr = fast();
    let (mut w, mut r) = connect(addr);
    w.write_all(&post(
        "/v1/chat/completions",
        "endpoint-load-metrics-format: TEXT\r\nx-sim-bad-load-headers: 1\r\nconnection: close\r\n",
        &chat(2, false),
    ))
    .unwrap();
    let (resp, _) = read_resp(&mut r);
    assert_eq!(resp.status(), 200);
    let q = resp.header("x-queue-depth").unwrap();
    assert_eq!(q, b"\xff0");
    let orca = resp.header("endpoint-load-metrics").unwrap();
    assert!(
        orca.starts_with(b"TEXT named_metrics.kv_cache_usage_perc=\xff"),
        "{orca:?}"
    );
    assert_eq!(orca.iter().filter(|b| **b == 0xff).count(), 3, "{orca:?}");
    // Non-UTF-8 request header values are read, not refused.
    let (mut w, mut r) = connect(addr);
    w.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\ncontent-type: text/\xe9\r\nx-s: \xff\xfe\r\nconnection: close\r\n\r\n").unwrap();
    assert_eq!(read_resp(&mut r).0.status(), 200);
}

#[test]
fn oversized_or_garbled_requests_get_an_error_and_a_closed_connection() {
    let addr = fast();
    // A declared body over the limit: 413 before any body byte (no
    // 100 Continue), and the connection closes.
    let (mut w, mut r) = connect(addr);
    w.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 999999999999\r\n\r\n",
    )
    .unwrap();
    let (resp, continued) = read_resp(&mut r);
    assert!(!continued);
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.header_str("x-backend-name"), Some("r1"));
    assert!(closed(&mut r));
    // A chunked body that runs over the limit.
    let (mut w, mut r) = connect(addr);
    w.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..33 {
        w.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .unwrap();
        if w.write_all(&chunk).is_err() || w.write_all(b"\r\n").is_err() {
            break;
        }
    }
    let (resp, _) = read_resp(&mut r);
    assert_eq!(resp.status(), 413);
    // A bad chunk size.
    let (mut w, mut r) = connect(addr);
    w.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    )
    .unwrap();
    assert_eq!(read_resp(&mut r).0.status(), 400);
    assert!(closed(&mut r));
    // Still serving.
    let (mut w, mut r) = connect(addr);
    w.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_resp(&mut r).0.status(), 200);
}
