//! End-to-end tests of the `prefix-router-backend` binary over loopback.
//!
//! Each test starts its own server process on `127.0.0.1:0` (the bound
//! address is read from its first stdout line) and talks HTTP/1.1 to it with
//! a tiny keep-alive client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prefix-router-backend"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--name",
            "r-test",
            "--model",
            "sim-test",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn backend");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read first line");
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server { child, addr }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Chunk boundaries of a chunked body.
    chunks: Vec<Vec<u8>>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    fn open(addr: &str) -> Conn {
        let w = TcpStream::connect(addr).expect("connect");
        w.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Conn {
            r: BufReader::new(w.try_clone().unwrap()),
            w,
        }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read line");
        l.trim_end_matches(['\r', '\n']).to_string()
    }

    fn send_raw(&mut self, raw: &[u8]) {
        self.w.write_all(raw).unwrap();
    }

    fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        self.send_raw(req.as_bytes());
        self.response()
    }

    fn response(&mut self) -> Resp {
        let status_line = self.line();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let l = self.line();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').expect("header");
            headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
        }
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let mut body = Vec::new();
        let mut chunks = Vec::new();
        if get("transfer-encoding").as_deref() == Some("chunked") {
            loop {
                let size = usize::from_str_radix(&self.line(), 16).expect("chunk size");
                if size == 0 {
                    assert_eq!(self.line(), "");
                    break;
                }
                let mut c = vec![0; size];
                self.r.read_exact(&mut c).unwrap();
                assert_eq!(self.line(), "");
                body.extend_from_slice(&c);
                chunks.push(c);
            }
        } else {
            let n: usize = get("content-length")
                .expect("content-length")
                .parse()
                .unwrap();
            body = vec![0; n];
            self.r.read_exact(&mut body).unwrap();
        }
        Resp {
            status,
            headers,
            body,
            chunks,
        }
    }
}

fn chat_body(system: &str, user: &str, max_tokens: u64, stream: bool) -> String {
    json!({
        "model": "sim-test",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": user}]},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// `data: ...` payloads of an SSE body.
fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("bad SSE event {e:?}"))
                .to_string()
        })
        .collect()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
}

const SYSTEM: &str = "You are a meticulous assistant. Answer in full sentences, cite sources, \
                      and keep a neutral tone. This system prompt is long enough to span many blocks.";

#[test]
fn same_chat_twice_hits_the_cache() {
    let s = start(&["--time-scale", "0.05"]);
    let mut c = Conn::open(&s.addr);
    let body = chat_body(SYSTEM, "What is a prefix cache?", 8, false);

    let r1 = c.request("POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r1.status, 200, "{}", r1.text());
    assert_eq!(r1.header("x-backend-name"), Some("r-test"));
    assert_eq!(r1.header("x-cached-tokens"), Some("0"));
    let v1 = r1.json();
    assert_eq!(v1["object"], "chat.completion");
    assert_eq!(v1["model"], "sim-test");
    assert_eq!(v1["choices"][0]["finish_reason"], "length");
    assert_eq!(v1["usage"]["completion_tokens"], 8);
    assert_eq!(v1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = v1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 32);
    assert_eq!(
        v1["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        8
    );

    // Same connection (keep-alive), same prompt: cache hit.
    let r2 = c.request("POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r2.status, 200);
    let v2 = r2.json();
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached < prompt_tokens,
        "cached {cached} of {prompt_tokens}"
    );
    assert_eq!(cached % 16, 0);
    assert_eq!(
        r2.header("x-cached-tokens"),
        Some(cached.to_string().as_str())
    );
    assert_eq!(
        v1["choices"][0]["message"]["content"],
        v2["choices"][0]["message"]["content"]
    );

    // Different system prompt: no hit.
    let other = chat_body(
        "Completely different instructions here, nothing shared at all with the other one.",
        "x",
        2,
        false,
    );
    let r3 = c.request("POST", "/v1/chat/completions", &[], &other);
    assert_eq!(
        r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );

    // Completions API shares the replica's cache too.
    let p = json!({"prompt": SYSTEM.repeat(3), "max_tokens": 3}).to_string();
    let a = c.request("POST", "/v1/completions", &[], &p).json();
    let b = c.request("POST", "/v1/completions", &[], &p).json();
    assert_eq!(a["object"], "text_completion");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[test]
fn streaming_framing() {
    let s = start(&["--time-scale", "0.05"]);
    let mut c = Conn::open(&s.addr);
    let n = 12;
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        &[],
        &chat_body(SYSTEM, "stream please", n, true),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.header("x-backend-name"), Some("r-test"));
    assert!(r.header("x-cached-tokens").is_some());
    assert!(r.header("x-queue-depth").is_some());
    assert!(
        r.chunks.len() >= 2,
        "expected several HTTP chunks, got {}",
        r.chunks.len()
    );
    let events = sse_events(&r.text());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let json: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    // Role chunk, n content chunks, finish chunk, usage chunk.
    assert_eq!(json.len(), n as usize + 3);
    assert_eq!(json[0]["choices"][0]["delta"]["role"], "assistant");
    let id = json[0]["id"].as_str().unwrap().to_string();
    let mut text = String::new();
    for j in &json {
        assert_eq!(j["id"], id.as_str());
        assert_eq!(j["model"], "sim-test");
    }
    for j in &json[..json.len() - 1] {
        assert_eq!(j["object"], "chat.completion.chunk");
        text.push_str(j["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(text.split(' ').count(), n as usize);
    let finish = &json[json.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &json[json.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], n);

    // Non-streaming gives the same text.
    let full = c.request(
        "POST",
        "/v1/chat/completions",
        &[],
        &chat_body(SYSTEM, "stream please", n, false),
    );
    assert_eq!(
        full.json()["choices"][0]["message"]["content"],
        text.as_str()
    );

    // Completions streaming, without include_usage.
    let body = json!({"prompt": "tell me", "max_tokens": 3, "stream": true}).to_string();
    let r = c.request("POST", "/v1/completions", &[], &body);
    let events = sse_events(&r.text());
    assert_eq!(events.len(), 3 + 1 + 1);
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], "lorem");
    assert!(first.get("usage").is_none());

    // The connection is still usable after streams.
    assert_eq!(c.request("GET", "/health", &[], "").status, 200);
}

#[test]
fn metrics_orca_and_admin_hooks() {
    let s = start(&["--time-scale", "0.05"]);
    let mut c = Conn::open(&s.addr);
    let body = chat_body(SYSTEM, "metrics", 4, false);
    c.request("POST", "/v1/chat/completions", &[], &body);
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        &[("endpoint-load-metrics-format", "TEXT")],
        &body,
    );
    let orca = r
        .header("endpoint-load-metrics")
        .expect("ORCA header")
        .to_string();
    assert!(
        orca.starts_with("TEXT named_metrics.kv_cache_usage_perc="),
        "{orca}"
    );
    assert!(
        orca.contains(", named_metrics.num_requests_waiting=0.0"),
        "{orca}"
    );
    assert!(
        orca.contains(", named_metrics.num_requests_running="),
        "{orca}"
    );
    assert_eq!(r.header("x-queue-depth"), Some("0"));

    let m = c.request("GET", "/metrics", &[], "");
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    let text = m.text();
    let queries = metric(&text, "vllm:prefix_cache_queries_total");
    let hits = metric(&text, "vllm:prefix_cache_hits_total");
    assert!(queries > 0.0 && hits > 0.0 && hits < queries);
    assert_eq!(metric(&text, "vllm:prefix_cache_queries"), queries);
    assert_eq!(metric(&text, "vllm:prefix_cache_hits"), hits);
    assert_eq!(metric(&text, "vllm:request_success_total"), 2.0);
    assert_eq!(metric(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric(&text, "vllm:kv_cache_usage_perc"), 0.0);
    assert!(text.contains("vllm:num_requests_waiting{model_name=\"sim-test\"} 0.0"));
    assert!(text.contains("# TYPE vllm:kv_cache_usage_perc gauge"));

    // Fake a load spike.
    let r = c.request("POST", "/admin/queue", &[], r#"{"extra_waiting": 7}"#);
    assert_eq!(r.status, 200);
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        &[("endpoint-load-metrics-format", "JSON")],
        &body,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-queue-depth"), Some("7"));
    let orca = r.header("endpoint-load-metrics").unwrap();
    let v: Value = serde_json::from_str(orca.strip_prefix("JSON ").expect("JSON prefix")).unwrap();
    assert_eq!(v["named_metrics"]["num_requests_waiting"], 7.0);
    assert!(v["named_metrics"]["kv_cache_usage_perc"].is_f64());
    assert!(v["named_metrics"]["num_requests_running"].is_f64());
    let h = c.request(
        "GET",
        "/health",
        &[("endpoint-load-metrics-format", "TEXT")],
        "",
    );
    assert_eq!(h.header("x-queue-depth"), Some("7"));
    assert!(h
        .header("endpoint-load-metrics")
        .unwrap()
        .contains("num_requests_waiting=7.0"));
    assert_eq!(
        metric(
            &c.request("GET", "/metrics", &[], "").text(),
            "vllm:num_requests_waiting"
        ),
        7.0
    );
    c.request("POST", "/admin/queue", &[], r#"{"extra_waiting": 0}"#);
    assert_eq!(
        c.request("GET", "/health", &[], "").header("x-queue-depth"),
        Some("0")
    );
    assert_eq!(
        c.request("POST", "/admin/queue", &[], r#"{"extra_waiting": -1}"#)
            .status,
        400
    );
    assert_eq!(c.request("POST", "/admin/queue", &[], "nope").status, 400);
    assert_eq!(c.request("POST", "/admin/queue", &[], "{}").status, 400);
    // Other clients' running requests: reported, waiting count untouched.
    let r = c.request("POST", "/admin/queue", &[], r#"{"extra_running": 5}"#);
    assert_eq!(r.status, 200);
    let h = c.request(
        "GET",
        "/health",
        &[("endpoint-load-metrics-format", "TEXT")],
        "",
    );
    assert_eq!(h.header("x-queue-depth"), Some("0"));
    assert!(h
        .header("endpoint-load-metrics")
        .unwrap()
        .contains("num_requests_running=5.0"));
    assert_eq!(
        metric(
            &c.request("GET", "/metrics", &[], "").text(),
            "vllm:num_requests_running"
        ),
        5.0
    );
    c.request("POST", "/admin/queue", &[], r#"{"extra_running": 0}"#);

    // vLLM's flush: the cache is empty, the counters keep counting.
    let before = metric(
        &c.request("GET", "/metrics", &[], "").text(),
        "vllm:prefix_cache_queries_total",
    );
    assert!(before > 0.0);
    let r = c.request("POST", "/v1/chat/completions", &[], &body);
    assert_ne!(r.header("x-cached-tokens"), Some("0"));
    assert_eq!(
        c.request("POST", "/reset_prefix_cache", &[], "").status,
        200
    );
    let r = c.request("POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r.header("x-cached-tokens"), Some("0"));
    assert!(
        metric(
            &c.request("GET", "/metrics", &[], "").text(),
            "vllm:prefix_cache_queries_total"
        ) > before
    );

    // Reset: counters zero, cache empty.
    assert_eq!(c.request("POST", "/admin/reset", &[], "{}").status, 200);
    let text = c.request("GET", "/metrics", &[], "").text();
    assert_eq!(metric(&text, "vllm:prefix_cache_queries_total"), 0.0);
    assert_eq!(metric(&text, "vllm:request_success_total"), 0.0);
    let r = c.request("POST", "/v1/chat/completions", &[], &body);
    assert_eq!(r.header("x-cached-tokens"), Some("0"));

    // Models.
    let models = c.request("GET", "/v1/models", &[], "").json();
    assert_eq!(models["data"][0]["id"], "sim-test");
}

#[test]
fn errors_never_kill_the_server() {
    let s = start(&[]);
    let mut c = Conn::open(&s.addr);
    let r = c.request("POST", "/v1/chat/completions", &[], "{not json");
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("JSON"));
    assert_eq!(r.header("x-backend-name"), Some("r-test"));
    let r = c.request("POST", "/v1/chat/completions", &[], r#"{"messages": 3}"#);
    assert_eq!(r.status, 400);
    let r = c.request(
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "x", "max_tokens": 0}"#,
    );
    assert_eq!(r.status, 400);
    let r = c.request(
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "x", "max_tokens": 99999999}"#,
    );
    assert_eq!(r.status, 400);
    let r = c.request("GET", "/nope", &[], "");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_object());
    assert_eq!(
        c.request("GET", "/v1/chat/completions", &[], "").status,
        405
    );
    // Still fine on the same connection.
    assert_eq!(c.request("GET", "/health", &[], "").status, 200);

    // Garbage on the wire: 400, connection closed, server alive.
    let mut g = Conn::open(&s.addr);
    g.send_raw(b"THIS IS NOT HTTP\r\n\r\n");
    assert_eq!(g.response().status, 400);
    let mut bad_len = Conn::open(&s.addr);
    bad_len.send_raw(b"POST /v1/completions HTTP/1.1\r\ncontent-length: abc\r\n\r\n");
    assert_eq!(bad_len.response().status, 400);
    // Truncated request then hang-up.
    let mut t = TcpStream::connect(&s.addr).unwrap();
    t.write_all(b"POST /v1/completions HTTP/1.1\r\ncontent-length: 100\r\n\r\n{\"pro")
        .unwrap();
    drop(t);
    // Client that leaves mid-stream.
    let mut l = TcpStream::connect(&s.addr).unwrap();
    let body = json!({"prompt": "bye", "max_tokens": 2000, "stream": true}).to_string();
    write!(
        l,
        "POST /v1/completions HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let _ = l.read(&mut buf);
    drop(l);

    let mut c2 = Conn::open(&s.addr);
    assert_eq!(c2.request("GET", "/health", &[], "").status, 200);
    // The abandoned stream is aborted, so the replica drains.
    let mut running = 1.0;
    for _ in 0..100 {
        running = metric(
            &c2.request("GET", "/metrics", &[], "").text(),
            "vllm:num_requests_running",
        );
        if running == 0.0 {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(running, 0.0);
}

#[test]
fn serves_256_concurrent_requests_with_queueing() {
    // Each request lasts ~50 ms of real time (32 tokens x 15 ms x 0.1), so
    // 256 simultaneous clients queue behind 16 running slots.
    let s = start(&["--time-scale", "0.1", "--max-running", "16"]);
    let clients = 256;
    let barrier = Arc::new(Barrier::new(clients));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let addr = s.addr.clone();
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let mut c = Conn::open(&addr);
                let body = chat_body(SYSTEM, &format!("question {}", i % 8), 32, i % 2 == 0);
                barrier.wait();
                let r = c.request(
                    "POST",
                    "/v1/chat/completions",
                    &[("endpoint-load-metrics-format", "TEXT")],
                    &body,
                );
                assert_eq!(r.status, 200);
                assert_eq!(r.header("x-backend-name"), Some("r-test"));
                assert!(r.header("endpoint-load-metrics").is_some());
                let depth: u64 = r.header("x-queue-depth").unwrap().parse().unwrap();
                let cached: u64 = r.header("x-cached-tokens").unwrap().parse().unwrap();
                if i % 2 == 0 {
                    assert_eq!(
                        sse_events(&r.text()).last().map(String::as_str),
                        Some("[DONE]")
                    );
                } else {
                    assert_eq!(r.json()["usage"]["completion_tokens"], 32);
                }
                (depth, cached)
            })
        })
        .collect();
    let results: Vec<(u64, u64)> = handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .collect();
    assert_eq!(results.len(), clients);
    assert!(
        results.iter().any(|(d, _)| *d > 0),
        "expected queueing with max-running 16"
    );
    assert!(results.iter().filter(|(_, c)| *c > 0).count() > clients / 2);
    let mut c = Conn::open(&s.addr);
    let text = c.request("GET", "/metrics", &[], "").text();
    assert_eq!(metric(&text, "vllm:request_success_total"), clients as f64);
    assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_waiting"), 0.0);
}

#[test]
fn cli_help_and_bad_flags() {
    let bin = env!("CARGO_BIN_EXE_prefix-router-backend");
    let out = Command::new(bin).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--name",
        "--model",
        "--max-running",
        "--cache-tokens",
        "--prefill-tokens-per-s",
        "--decode-ms-per-token",
        "--time-scale",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    let out = Command::new(bin).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
