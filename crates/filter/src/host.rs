//! Host calls, each with its error handled. Nothing here panics.

use prefix_router_core::load::{SharedStore, StoreError};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, Status};
use std::time::UNIX_EPOCH;

/// Log a line (errors of the log call itself are ignored: nowhere to report).
pub fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// Whether `level` would be logged (to skip formatting debug lines).
pub fn log_enabled(level: LogLevel) -> bool {
    match hostcalls::get_log_level() {
        Ok(l) => (l as u32) <= (level as u32),
        Err(_) => false,
    }
}

/// Milliseconds since the Unix epoch (host clock); `Err` if unavailable.
pub fn now_ms() -> Result<u64, Status> {
    let t = hostcalls::get_current_time()?;
    Ok(t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0))
}

/// A request header.
pub fn request_header(name: &str) -> Result<Option<String>, Status> {
    hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
}

/// Set (or with `None` remove) a request header.
pub fn set_request_header(name: &str, value: Option<&str>) -> Result<(), Status> {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value)
}

/// A response header.
pub fn response_header(name: &str) -> Result<Option<String>, Status> {
    hostcalls::get_map_value(MapType::HttpResponseHeaders, name)
}

/// Add a response header.
pub fn add_response_header(name: &str, value: &str) -> Result<(), Status> {
    hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value)
}

/// Answer the request locally (the request is not forwarded).
pub fn send_response(
    status: u32,
    headers: Vec<(&str, &str)>,
    body: Option<&[u8]>,
) -> Result<(), Status> {
    hostcalls::send_http_response(status, headers, body)
}

/// The buffered request body, `len` bytes from the start.
pub fn request_body(len: usize) -> Result<Vec<u8>, Status> {
    Ok(hostcalls::get_buffer(BufferType::HttpRequestBody, 0, len)?.unwrap_or_default())
}

/// The plugin configuration bytes.
pub fn plugin_configuration() -> Result<Vec<u8>, Status> {
    Ok(hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)?.unwrap_or_default())
}

/// A property as a UTF-8 string (e.g. `upstream.address`).
pub fn property_string(path: &[&str]) -> Result<Option<String>, Status> {
    Ok(hostcalls::get_property(path.to_vec())?.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// An integer property (Envoy encodes them as 8 little-endian bytes), e.g.
/// `response.code`.
pub fn property_i64(path: &[&str]) -> Result<Option<i64>, Status> {
    Ok(hostcalls::get_property(path.to_vec())?.and_then(|b| {
        let a: [u8; 8] = b.get(..8)?.try_into().ok()?;
        Some(i64::from_le_bytes(a))
    }))
}

/// proxy-wasm shared data: process-wide, shared by every worker's VM.
pub struct SharedData;

impl SharedStore for SharedData {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        hostcalls::get_shared_data(key).map_err(|s| StoreError::Other(format!("{s:?}")))
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
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
