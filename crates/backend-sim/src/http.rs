//! The HTTP/1.1 side, on hyper: how requests reach the handlers and how their
//! answers leave.
//!
//! hyper does the framing: request bodies by `Content-Length` or
//! `Transfer-Encoding: chunked`, `Expect: 100-continue` (sent when the body
//! is first read), persistent connections (HTTP/1.1 default keep-alive,
//! `Connection: close` honoured, HTTP/1.0 only with `Connection:
//! keep-alive`), responses with `Content-Length`, and streamed responses with
//! chunked transfer encoding (close-delimited for HTTP/1.0 clients). This
//! module turns a hyper request into a [`Request`] (the whole body read,
//! header values as text) and [`Headers`] into a hyper response.
//!
//! Limits: [`MAX_HEADER_BYTES`] of request line and headers (hyper answers
//! `431` and closes), [`MAX_HEADER_COUNT`] header lines (`431`),
//! [`MAX_BODY`] of body (the server answers `413` and closes). Malformed
//! requests get hyper's `400` and a closed connection, never a panic.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode, Version};

/// Max bytes of the request line and headers together.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Max header lines in a request.
pub const MAX_HEADER_COUNT: usize = 1024;
/// Max request body bytes.
pub const MAX_BODY: usize = 32 * 1024 * 1024;

/// A response body: a whole one, or a stream fed by a task.
pub type Body = BoxBody<Bytes, Infallible>;

/// Response headers, lower-case names, in order.
pub type Headers = Vec<(String, String)>;

/// A request with its whole body.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    pub query: String,
    /// Minor HTTP version (HTTP/1.x).
    pub minor: u8,
    /// Headers with lower-cased names, in order; values trimmed, read as
    /// UTF-8 where valid and as ISO-8859-1 otherwise (see [`text`]).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The request of `parts` with `body`.
    pub fn new(parts: &hyper::http::request::Parts, body: Vec<u8>) -> Request {
        Request {
            method: parts.method.as_str().to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            minor: if parts.version == Version::HTTP_10 {
                0
            } else {
                1
            },
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_string(),
                        text(v.as_bytes()).trim().to_string(),
                    )
                })
                .collect(),
            body,
        }
    }

    /// First header with this (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// Over [`MAX_BODY`] (answer 413).
    TooLarge,
    /// Malformed framing or a broken connection (answer 400).
    Bad(String),
}

/// Reads the whole body of `parts`, at most [`MAX_BODY`] bytes. A declared
/// `Content-Length` over the limit is refused before any byte is read (and
/// before `100 Continue` is sent).
pub async fn read_body(
    parts: &hyper::http::request::Parts,
    body: Incoming,
) -> Result<Vec<u8>, BodyError> {
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(BodyError::TooLarge);
    }
    // One copy, into a buffer of the declared size: no merging of chunks.
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| BodyError::Bad(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len().saturating_add(data.len()) > MAX_BODY {
                return Err(BodyError::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Header bytes as text: UTF-8 where valid, else each byte as ISO-8859-1
/// (field values are octets, RFC 9110 5.5; uvicorn and h11 read them so).
pub fn text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|b| char::from(*b)).collect(),
    }
}

/// A header value's octets: characters up to U+00FF as one byte each
/// (ISO-8859-1, as RFC 9110 reads obs-text), others as UTF-8; control
/// characters (CR, LF, NUL, ...) and DEL dropped, so no value can break the
/// framing. Every value this server sends is ASCII except the test hook's
/// (`x-sim-bad-load-headers`), which needs a raw 0xFF byte.
pub fn octets(v: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    for c in v.chars().filter(|c| *c == '\t' || !c.is_control()) {
        match u8::try_from(u32::from(c)) {
            Ok(b) => out.push(b),
            Err(_) => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// A response with `headers` (a header whose name is not a valid token is
/// left out) and `body`.
pub fn response(status: u16, headers: &[(String, String)], body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let map = r.headers_mut();
    for (n, v) in headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(n.as_bytes()),
            HeaderValue::from_bytes(&octets(v)),
        ) {
            map.append(n, v);
        }
    }
    r
}

/// A complete response (sent with `Content-Length`).
pub fn full(status: u16, headers: &[(String, String)], body: impl Into<Bytes>) -> Response<Body> {
    response(status, headers, Full::new(body.into()).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octets_are_latin1_and_never_break_framing() {
        assert_eq!(octets("a=\u{ff}1"), b"a=\xff1");
        assert_eq!(octets("b\r\nevil: 1"), b"bevil: 1");
        assert_eq!(octets("x\u{0}\u{7f}\ty"), b"x\ty");
        assert_eq!(octets("\u{20ac}"), "\u{20ac}".as_bytes());
        assert!(HeaderValue::from_bytes(&octets("TEXT a=\u{ff}0.5")).is_ok());
    }

    #[test]
    fn header_text_falls_back_to_latin1() {
        assert_eq!(text(b"text/plain"), "text/plain");
        assert_eq!(text("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_eq!(text(b"text/\xe9"), "text/\u{e9}");
        assert_eq!(octets(&text(b"s\xff\xfe")), b"s\xff\xfe");
    }

    #[test]
    fn responses_carry_raw_octets() {
        let r = full(
            200,
            &[
                ("x-queue-depth".into(), "\u{ff}3".into()),
                ("x-a".into(), "b\r\nevil: 1".into()),
                ("bad name".into(), "dropped".into()),
            ],
            "hi",
        );
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-queue-depth"].as_bytes(), b"\xff3");
        assert_eq!(r.headers()["x-a"].as_bytes(), b"bevil: 1");
        assert_eq!(r.headers().len(), 2);
        assert_eq!(full(999, &[], "").status(), 999);
        assert_eq!(full(1000, &[], "").status(), 500);
    }
}
