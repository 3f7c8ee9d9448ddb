//! Host calls, each with its error handled. Nothing here panics: every
//! call goes through [`crate::abi`], which maps every host status to a
//! `Result` and returns values as bytes; this module decodes them (header
//! values lossily, so a non-UTF-8 byte becomes U+FFFD instead of a panic).

use crate::abi;
use prefix_router_core::store::{SharedStore, StoreError};
use proxy_wasm::types::{BufferType, LogLevel, MapType, Status};

/// Log a line (errors of the log call itself are ignored: nowhere to report).
pub fn log(level: LogLevel, msg: &str) {
    let _ = abi::log(level, msg);
}

/// Whether `level` would be logged (to skip formatting debug lines).
pub fn log_enabled(level: LogLevel) -> bool {
    abi::log_level().is_ok_and(|l| l <= level as u32)
}

/// Milliseconds since the Unix epoch (host clock); `Err` if unavailable.
pub fn now_ms() -> Result<u64, Status> {
    Ok(abi::now_ns()? / 1_000_000)
}

/// Bytes as text: invalid UTF-8 becomes U+FFFD (no allocation when valid).
pub fn text(b: Vec<u8>) -> String {
    match String::from_utf8(b) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// The request headers, read with one host call
/// ([`RequestHeaders::read`]), or header by header when that failed.
pub struct RequestHeaders {
    /// The host's serialization of every header (well-formed:
    /// [`abi::map_get`] reads it); `None`: ask the host for each header.
    raw: Option<Vec<u8>>,
}

impl RequestHeaders {
    /// Every request header in one call. `Err`: the call failed or gave a
    /// malformed map; [`RequestHeaders::each`] still reads them.
    pub fn read() -> Result<RequestHeaders, Status> {
        match abi::header_pairs(MapType::HttpRequestHeaders)? {
            Some(raw) if abi::map_get(&raw, "").is_some() => Ok(RequestHeaders { raw: Some(raw) }),
            Some(_) => Err(Status::ParseFailure),
            // No request header map: no headers.
            None => Ok(RequestHeaders {
                raw: Some(Vec::new()),
            }),
        }
    }

    /// Headers read one host call each, as they are asked for.
    pub fn each() -> RequestHeaders {
        RequestHeaders { raw: None }
    }

    /// A header's first value (lossy UTF-8; names match without regard to
    /// ASCII case, as the host's own lookup does).
    pub fn get(&self, name: &str) -> Result<Option<String>, Status> {
        Ok(self.get_bytes(name)?.map(text))
    }

    /// A header's first value as the client sent it ([`RequestHeaders::get`]
    /// without the UTF-8 repair): values that differ only in invalid bytes
    /// stay different.
    pub fn get_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, Status> {
        match self.find(name) {
            Some(v) => Ok(v.map(<[u8]>::to_vec)),
            None => abi::header(MapType::HttpRequestHeaders, name),
        }
    }

    /// Whether the request has header `name` (`None`: not known without a
    /// host call).
    pub fn has(&self, name: &str) -> Option<bool> {
        self.find(name).map(|v| v.is_some())
    }

    /// Header `name`'s first value from the one call's map (`None`: no
    /// such map).
    fn find(&self, name: &str) -> Option<Option<&[u8]>> {
        abi::map_get(self.raw.as_deref()?, name)
    }
}

/// Set (or with `None` remove) a request header.
pub fn set_request_header(name: &str, value: Option<&str>) -> Result<(), Status> {
    abi::set_header(MapType::HttpRequestHeaders, name, value.map(str::as_bytes))
}

/// A response header (lossy UTF-8).
pub fn response_header(name: &str) -> Result<Option<String>, Status> {
    Ok(abi::header(MapType::HttpResponseHeaders, name)?.map(text))
}

/// A header of an HTTP call's response (lossy UTF-8).
pub fn call_response_header(name: &str) -> Result<Option<String>, Status> {
    Ok(abi::header(MapType::HttpCallResponseHeaders, name)?.map(text))
}

/// Add a response header.
pub fn add_response_header(name: &str, value: &str) -> Result<(), Status> {
    abi::add_header(MapType::HttpResponseHeaders, name, value.as_bytes())
}

/// Answer the request locally (the request is not forwarded).
pub fn send_response(
    status: u32,
    headers: Vec<(&str, &str)>,
    body: Option<&[u8]>,
) -> Result<(), Status> {
    let h: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    abi::send_response(status, &h, body)
}

/// The buffered request body, `len` bytes from the start.
pub fn request_body(len: usize) -> Result<Vec<u8>, Status> {
    Ok(abi::buffer(BufferType::HttpRequestBody, 0, len)?.unwrap_or_default())
}

/// An HTTP call's response body, `len` bytes from the start.
pub fn call_response_body(len: usize) -> Result<Vec<u8>, Status> {
    Ok(abi::buffer(BufferType::HttpCallResponseBody, 0, len)?.unwrap_or_default())
}

/// The plugin configuration bytes.
pub fn plugin_configuration() -> Result<Vec<u8>, Status> {
    Ok(abi::buffer(BufferType::PluginConfiguration, 0, usize::MAX)?.unwrap_or_default())
}

/// A property as text (lossy UTF-8), e.g. `upstream.address`.
pub fn property_string(path: &[&str]) -> Result<Option<String>, Status> {
    Ok(abi::property(path)?.map(text))
}

/// An integer property (Envoy encodes them as 8 little-endian bytes), e.g.
/// `response.code`.
pub fn property_i64(path: &[&str]) -> Result<Option<i64>, Status> {
    Ok(abi::property(path)?.and_then(|b| {
        let a: [u8; 8] = b.get(..8)?.try_into().ok()?;
        Some(i64::from_le_bytes(a))
    }))
}

/// Set the root context's tick period.
pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    abi::set_tick_period_ms(ms)
}

/// A `dispatch_http_call` Envoy refused with `BadArgument`: what Envoy 1.40
/// answers when no cluster has that name (the filter cannot list Envoy's
/// clusters at configure time, so this is the first place a mistyped
/// `scrape.cluster` or `gossip.cluster` shows). Counts it in `counter` and,
/// the first time for this VM (`logged`), logs an error naming `field`.
/// Returns whether `e` was such a refusal.
pub fn unknown_cluster(
    e: Status,
    field: &str,
    cluster: &str,
    metrics: &crate::metrics::Metrics,
    counter: u32,
    logged: &mut bool,
) -> bool {
    if e != Status::BadArgument {
        return false;
    }
    metrics.inc(counter, 1);
    if !std::mem::replace(logged, true) {
        log(
            LogLevel::Error,
            &format!(
                "prefix-router: {field} = {cluster:?}: Envoy refused the call (BadArgument): it has no cluster of that name; nothing is sent until it does (counted in prefix_router.{field_metric}.unknown_cluster)",
                field_metric = field.split('.').next().unwrap_or(field)
            ),
        );
    }
    true
}

/// proxy-wasm shared data: process-wide, shared by every worker's VM.
pub struct SharedData;

impl SharedStore for SharedData {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        abi::shared_get(key).map_err(|s| StoreError::Other(format!("{s:?}")))
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match abi::shared_set(key, value, cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(s) => Err(StoreError::Other(format!("{s:?}"))),
        }
    }
}

/// Bytes of this VM's linear memory (0 off wasm32, e.g. in native tests).
pub fn linear_memory_bytes() -> u64 {
    #[cfg(target_arch = "wasm32")]
    {
        (core::arch::wasm32::memory_size(0) as u64).saturating_mul(65536)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0
    }
}
