//! Minimal HTTP/1.1 server-side framing (std only).
//!
//! Enough for Envoy, curl and test clients: request line + headers (header
//! names lower-cased), bodies by `Content-Length` or `Transfer-Encoding:
//! chunked`, `Expect: 100-continue`, persistent connections (HTTP/1.1 default
//! keep-alive, `Connection: close` honoured; HTTP/1.0 only with
//! `Connection: keep-alive`), responses with `Content-Length`, and streamed
//! responses with chunked transfer encoding. Limits: 16 KiB per header line,
//! 64 KiB of headers, 32 MiB of body. Malformed input yields an error (the
//! caller answers 400/413 and closes), never a panic.

use std::io::{self, BufRead, Read, Write};

/// Max bytes of one request/header line.
pub const MAX_LINE: usize = 16 * 1024;
/// Max bytes of all header lines.
pub const MAX_HEADERS: usize = 64 * 1024;
/// Max request body bytes.
pub const MAX_BODY: usize = 32 * 1024 * 1024;

/// A parsed request.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    pub query: String,
    /// Minor HTTP version (HTTP/1.x).
    pub minor: u8,
    /// Headers with lower-cased names, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// First header with this (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// Should the connection stay open after the response?
    pub fn keep_alive(&self) -> bool {
        if self.minor == 0 {
            self.has_token("connection", "keep-alive")
        } else {
            !self.has_token("connection", "close")
        }
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub enum ReadError {
    /// Clean EOF before a request started.
    Closed,
    Io(io::Error),
    /// Malformed request (answer 400).
    Bad(String),
    /// Over a size limit (answer 413 or 431).
    TooLarge(&'static str),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Read one line (up to `\n`), without the line terminator. `Ok(None)` on
/// EOF before any byte.
fn read_line<R: BufRead>(r: &mut R, max: usize) -> Result<Option<String>, ReadError> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(max as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        if buf.len() > max {
            return Err(ReadError::TooLarge("header line too long"));
        }
        return Err(ReadError::Bad("unexpected end of stream".to_string()));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    // Field values are octets (RFC 9110 5.5): accept any byte, as real
    // servers (uvicorn, h11) do, reading UTF-8 where it is valid and each
    // byte as ISO-8859-1 otherwise.
    Ok(Some(match String::from_utf8(buf) {
        Ok(s) => s,
        Err(e) => e.as_bytes().iter().map(|b| char::from(*b)).collect(),
    }))
}

/// Read one request. `out` receives `100 Continue` if the client expects it.
pub fn read_request<R: BufRead, W: Write>(r: &mut R, out: &mut W) -> Result<Request, ReadError> {
    // Request line (tolerate empty lines before it, RFC 9112 2.2).
    let line = loop {
        match read_line(r, MAX_LINE)? {
            None => return Err(ReadError::Closed),
            Some(l) if l.is_empty() => continue,
            Some(l) => break l,
        }
    };
    if !line.is_ascii() {
        return Err(ReadError::Bad(format!("request line not ASCII {line:?}")));
    }
    let mut parts = line.split(' ').filter(|p| !p.is_empty());
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Bad(format!("bad request line {line:?}")));
    };
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => return Err(ReadError::Bad(format!("unsupported version {version:?}"))),
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.to_string(), String::new()),
    };
    let mut req = Request {
        method: method.to_string(),
        path,
        query,
        minor,
        headers: Vec::new(),
        body: Vec::new(),
    };
    let mut total = 0usize;
    loop {
        let Some(line) = read_line(r, MAX_LINE)? else {
            return Err(ReadError::Bad("unexpected end of headers".to_string()));
        };
        if line.is_empty() {
            break;
        }
        total += line.len() + 2;
        if total > MAX_HEADERS {
            return Err(ReadError::TooLarge("headers too large"));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Bad(format!("bad header line {line:?}")));
        };
        if name.is_empty() || name.ends_with(' ') || name.ends_with('\t') {
            return Err(ReadError::Bad(format!("bad header name {name:?}")));
        }
        req.headers
            .push((name.to_ascii_lowercase(), value.trim().to_string()));
    }

    let chunked = req.has_token("transfer-encoding", "chunked");
    let content_length = match req.header("content-length") {
        Some(v) => Some(
            v.parse::<usize>()
                .map_err(|_| ReadError::Bad(format!("bad content-length {v:?}")))?,
        ),
        None => None,
    };
    if !chunked && content_length.unwrap_or(0) > MAX_BODY {
        return Err(ReadError::TooLarge("body too large"));
    }
    let has_body = chunked || content_length.unwrap_or(0) > 0;
    if has_body
        && minor == 1
        && req
            .header("expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        out.flush()?;
    }
    if chunked {
        req.body = read_chunked(r)?;
    } else if let Some(n) = content_length {
        let mut body = vec![0u8; n];
        r.read_exact(&mut body)?;
        req.body = body;
    }
    Ok(req)
}

fn read_chunked<R: BufRead>(r: &mut R) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let Some(line) = read_line(r, MAX_LINE)? else {
            return Err(ReadError::Bad("unexpected end of chunked body".to_string()));
        };
        let size_str = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|_| ReadError::Bad(format!("bad chunk size {size_str:?}")))?;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                match read_line(r, MAX_LINE)? {
                    None => return Ok(body),
                    Some(l) if l.is_empty() => return Ok(body),
                    Some(_) => {}
                }
            }
        }
        if body.len().saturating_add(size) > MAX_BODY {
            return Err(ReadError::TooLarge("body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        if let Some(dst) = body.get_mut(start..) {
            r.read_exact(dst)?;
        }
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(ReadError::Bad("missing CRLF after chunk".to_string()));
        }
    }
}

/// Standard reason phrase.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

fn head(status: u16, headers: &[(String, String)], keep_alive: bool) -> Vec<u8> {
    let mut h = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    for (n, v) in headers {
        h.extend_from_slice(n.as_bytes());
        h.extend_from_slice(b": ");
        // HTTP field values are octets: characters up to U+00FF are written
        // as one byte each (ISO-8859-1, as RFC 9110 reads obs-text), others
        // as UTF-8. Every value this server sends is ASCII except the test
        // hook's (`x-sim-bad-load-headers`), which needs a raw 0xFF byte.
        // Never let a value break the framing.
        for c in v.chars().filter(|c| *c != '\r' && *c != '\n') {
            match u8::try_from(u32::from(c)) {
                Ok(b) => h.push(b),
                Err(_) => h.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        h.extend_from_slice(b"\r\n");
    }
    h.extend_from_slice(if keep_alive {
        b"connection: keep-alive\r\n"
    } else {
        b"connection: close\r\n"
    });
    h
}

/// Write a complete response with `Content-Length`.
pub fn write_response<W: Write>(
    w: &mut W,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = head(status, headers, keep_alive);
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    w.write_all(&out)?;
    w.flush()
}

/// A response body streamed with chunked transfer encoding (HTTP/1.1), or
/// raw until close (HTTP/1.0 clients).
pub struct Streaming<'a, W: Write> {
    w: &'a mut W,
    chunked: bool,
}

impl<'a, W: Write> Streaming<'a, W> {
    /// Write the head of a streamed response.
    pub fn start(
        w: &'a mut W,
        status: u16,
        headers: &[(String, String)],
        http11: bool,
        keep_alive: bool,
    ) -> io::Result<Self> {
        let keep_alive = keep_alive && http11;
        let mut out = head(status, headers, keep_alive);
        if http11 {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        out.extend_from_slice(b"\r\n");
        w.write_all(&out)?;
        w.flush()?;
        Ok(Self { w, chunked: http11 })
    }

    /// Send `data` now (one chunk).
    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.chunked {
            let mut out = format!("{:x}\r\n", data.len()).into_bytes();
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
            self.w.write_all(&out)?;
        } else {
            self.w.write_all(data)?;
        }
        self.w.flush()
    }

    /// End the body.
    pub fn finish(self) -> io::Result<()> {
        if self.chunked {
            self.w.write_all(b"0\r\n\r\n")?;
        }
        self.w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn parse(raw: &[u8]) -> (Result<Request, ReadError>, Vec<u8>) {
        let mut r = Cursor::new(raw.to_vec());
        let mut out = Vec::new();
        (read_request(&mut r, &mut out), out)
    }

    #[test]
    fn parses_content_length_and_keepalive() {
        let (req, _) = parse(
            b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Y:  z \r\n\r\nhello",
        );
        let req = req.unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/v1/completions");
        assert_eq!(req.query, "x=1");
        assert_eq!(req.body, b"hello");
        assert_eq!(req.header("x-y"), Some("z"));
        assert!(req.keep_alive());
        let (req, _) = parse(b"GET / HTTP/1.0\r\n\r\n");
        assert!(!req.unwrap().keep_alive());
        let (req, _) = parse(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(!req.unwrap().keep_alive());
    }

    #[test]
    fn parses_chunked_and_expect() {
        let (req, out) = parse(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: x\r\n\r\n",
        );
        assert_eq!(req.unwrap().body, b"abcde");
        assert!(out.starts_with(b"HTTP/1.1 100 Continue"));
    }

    #[test]
    fn pipelined_requests() {
        let mut r = Cursor::new(
            b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi".to_vec(),
        );
        let mut out = Vec::new();
        assert_eq!(read_request(&mut r, &mut out).unwrap().path, "/a");
        assert_eq!(read_request(&mut r, &mut out).unwrap().body, b"hi");
        assert!(matches!(
            read_request(&mut r, &mut out),
            Err(ReadError::Closed)
        ));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        for raw in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc",
            b"GET / HTTP/1.1\r\nHost: a",
            b"\xff\xfe / HTTP/1.1\r\n\r\n",
        ] {
            let (req, _) = parse(raw);
            assert!(req.is_err(), "{raw:?}");
        }
        let (req, _) = parse(b"POST / HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n");
        assert!(matches!(req, Err(ReadError::TooLarge(_))));
        let long = [
            b"GET /".to_vec(),
            vec![b'a'; MAX_LINE + 10],
            b" HTTP/1.1\r\n\r\n".to_vec(),
        ]
        .concat();
        assert!(matches!(parse(&long).0, Err(ReadError::TooLarge(_))));
    }

    #[test]
    fn writes_responses() {
        let mut out = Vec::new();
        write_response(
            &mut out,
            200,
            &[("x-a".into(), "b\r\nevil: 1".into())],
            b"hi",
            true,
        )
        .unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(s.contains("x-a: bevil: 1\r\n"));
        assert!(s.ends_with("content-length: 2\r\n\r\nhi"));
        let mut out = Vec::new();
        let mut st = Streaming::start(&mut out, 200, &[], true, true).unwrap();
        st.send(b"data: x\n\n").unwrap();
        st.finish().unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.ends_with("transfer-encoding: chunked\r\n\r\n9\r\ndata: x\n\n\r\n0\r\n\r\n"));
    }
}
