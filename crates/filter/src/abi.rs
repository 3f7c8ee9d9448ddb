//! The proxy-wasm ABI calls the filter makes, declared here rather than
//! reached through `proxy_wasm::hostcalls`.
//!
//! Why: the SDK (0.2) panics inside several of its wrappers, and a panic
//! kills the worker's VM (with `FAIL_OPEN` every later request on that
//! worker then bypasses the filter):
//! - `get_map_value` decodes a header with `String::from_utf8(..).unwrap()`,
//!   so one non-UTF-8 byte in a header the filter reads was enough;
//! - every wrapper ends in `panic!("unexpected status")` for a status it
//!   did not expect, and its `Status` enum would be undefined behaviour for
//!   a status number it does not list.
//!
//! `proxy_http_call` stays with the SDK (`hostcalls::dispatch_http_call`):
//! its dispatcher must register the call's token to route the answer, and
//! that registration is private to the SDK. It panics only for a status
//! other than Ok, BadArgument and InternalFailure, which Envoy's
//! `httpCall` does not return for valid memory.
//!
//! Here every call returns its raw status as a number, every status other
//! than the expected ones becomes an `Err`, and values come back as bytes;
//! callers decode them ([`crate::host`]). Buffers the host returns were
//! allocated through the SDK's exported `proxy_on_memory_allocate` (a boxed
//! slice of exactly `size` bytes), which is what `Vec::from_raw_parts` with
//! capacity `size` expects, as the SDK itself does.

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};

/// Status numbers of the ABI (proxy-wasm spec 0.2.1, `WasmResult`).
const OK: u32 = 0;
const NOT_FOUND: u32 = 1;

/// A status number as the SDK's enum, for logs and for callers that match
/// on it; numbers the enum does not list become `InternalFailure`.
fn status(n: u32) -> Status {
    match n {
        1 => Status::NotFound,
        2 => Status::BadArgument,
        3 => Status::SerializationFailure,
        4 => Status::ParseFailure,
        7 => Status::Empty,
        8 => Status::CasMismatch,
        _ => Status::InternalFailure,
    }
}

fn ok(n: u32) -> Result<(), Status> {
    if n == OK {
        Ok(())
    } else {
        Err(status(n))
    }
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_log_level(level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map_type: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_add_header_map_value(
        map_type: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status_code: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name: *const u8,
        name_size: usize,
        id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
}

/// Native builds (unit tests, docs, clippy) call the in-process host of
/// [`crate::fake`] instead.
#[cfg(not(target_arch = "wasm32"))]
use crate::fake::abi::*;

/// Host calls made by this VM so far (every call through this module
/// counts one; `proxy_http_call` through the SDK does not).
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count() {
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Host calls this VM has made through this module so far: the filter
/// takes differences around a request's callbacks
/// (`prefix_router.hostcalls`).
pub fn calls() -> u64 {
    CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Take ownership of a buffer the host returned (null: none).
///
/// # Safety
/// `data` is null or was returned by the host for `size` bytes, allocated
/// through `proxy_on_memory_allocate(size)`.
unsafe fn owned(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        None
    } else {
        Some(Vec::from_raw_parts(data, size, size))
    }
}

/// Log a line.
pub fn log(level: LogLevel, msg: &str) -> Result<(), Status> {
    count();
    // SAFETY: pointer and length of a live &str.
    ok(unsafe { proxy_log(level as u32, msg.as_ptr(), msg.len()) })
}

/// The host's log level (`Trace` for a number out of range).
pub fn log_level() -> Result<u32, Status> {
    count();
    let mut l = 0u32;
    // SAFETY: a valid out-pointer.
    ok(unsafe { proxy_get_log_level(&mut l) })?;
    Ok(l)
}

/// Host clock, ns since the Unix epoch.
pub fn now_ns() -> Result<u64, Status> {
    count();
    let mut t = 0u64;
    // SAFETY: a valid out-pointer.
    ok(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

/// Set the root context's tick period.
pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    count();
    // SAFETY: plain value.
    ok(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// Bytes `start..start + max` of a buffer (`None`: no buffer).
pub fn buffer(t: BufferType, start: usize, max: usize) -> Result<Option<Vec<u8>>, Status> {
    count();
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid out-pointers; the result is owned as documented above.
    match unsafe { proxy_get_buffer_bytes(t as u32, start, max, &mut data, &mut size) } {
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(None),
        n => Err(status(n)),
    }
}

/// A header's value as bytes (`None`: absent).
pub fn header(map: MapType, name: &str) -> Result<Option<Vec<u8>>, Status> {
    count();
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid pointers; the result is owned as documented above.
    match unsafe {
        proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    } {
        OK => Ok(Some(unsafe { owned(data, size) }.unwrap_or_default())),
        NOT_FOUND => Ok(None),
        n => Err(status(n)),
    }
}

/// Every header of a map in one call, as the host serialized them
/// ([`map_get`] reads them; `None`: no such map).
pub fn header_pairs(map: MapType) -> Result<Option<Vec<u8>>, Status> {
    count();
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid out-pointers; the result is owned as documented above.
    match unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) } {
        OK => Ok(Some(unsafe { owned(data, size) }.unwrap_or_default())),
        NOT_FOUND => Ok(None),
        n => Err(status(n)),
    }
}

/// Replace a header, or remove it with `None`.
pub fn set_header(map: MapType, name: &str, value: Option<&[u8]>) -> Result<(), Status> {
    count();
    // SAFETY: pointers and lengths of live slices.
    ok(unsafe {
        match value {
            Some(v) => proxy_replace_header_map_value(
                map as u32,
                name.as_ptr(),
                name.len(),
                v.as_ptr(),
                v.len(),
            ),
            None => proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()),
        }
    })
}

/// Add a header value.
pub fn add_header(map: MapType, name: &str, value: &[u8]) -> Result<(), Status> {
    count();
    // SAFETY: pointers and lengths of live slices.
    ok(unsafe {
        proxy_add_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// A property's bytes (`None`: absent). `path` parts are joined by NUL.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    count();
    let mut p = Vec::with_capacity(path.iter().map(|s| s.len() + 1).sum());
    for (i, part) in path.iter().enumerate() {
        if i > 0 {
            p.push(0);
        }
        p.extend_from_slice(part.as_bytes());
    }
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: valid pointers; the result is owned as documented above.
    match unsafe { proxy_get_property(p.as_ptr(), p.len(), &mut data, &mut size) } {
        OK => Ok(unsafe { owned(data, size) }),
        NOT_FOUND => Ok(None),
        n => Err(status(n)),
    }
}

/// A shared-data value and its CAS (`None`: absent).
pub fn shared_get(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
    count();
    let mut data = std::ptr::null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    // SAFETY: valid pointers; the result is owned as documented above.
    match unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) }
    {
        OK => Ok((unsafe { owned(data, size) }, (cas > 0).then_some(cas))),
        NOT_FOUND => Ok((None, None)),
        n => Err(status(n)),
    }
}

/// Set a shared-data value (`cas`: only if unchanged since read).
pub fn shared_set(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    count();
    // SAFETY: pointers and lengths of live slices.
    ok(unsafe {
        proxy_set_shared_data(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    })
}

/// The proxy-wasm header-map serialization: count, then (name length,
/// value length) pairs, then each name and value NUL-terminated.
pub(crate) fn serialize_map(map: &[(&str, &[u8])]) -> Vec<u8> {
    let n: usize = map.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
    let mut b = Vec::with_capacity(4 + n);
    b.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (k, v) in map {
        b.extend_from_slice(&(k.len() as u32).to_le_bytes());
        b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in map {
        b.extend_from_slice(k.as_bytes());
        b.push(0);
        b.extend_from_slice(v);
        b.push(0);
    }
    b
}

/// Walk the proxy-wasm header-map serialization ([`serialize_map`]'s
/// format), calling `visit` with each (name, value) pair in order until it
/// returns `true`. `false` if `b` is malformed (short, a length past the
/// end, a missing NUL terminator, or bytes left over), checked in full
/// before the first visit; never panics. An empty buffer is an empty map
/// (what a host may return for a map with no headers).
fn walk_map<'a>(b: &'a [u8], mut visit: impl FnMut(&'a [u8], &'a [u8]) -> bool) -> bool {
    let u32_at = |at: usize| -> Option<usize> {
        let a: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(a)).ok()
    };
    // Pass 0 checks the layout, pass 1 visits.
    for pass in 0..2 {
        if b.is_empty() {
            return true;
        }
        let Some(n) = u32_at(0) else { return false };
        // Each pair takes 8 bytes of lengths and 2 NULs at least.
        if n > b.len() / 10 {
            return false;
        }
        let mut at = 4 + n * 8;
        for i in 0..n {
            let lens = 4 + i * 8;
            let pair = (|| {
                let (kl, vl) = (u32_at(lens)?, u32_at(lens + 4)?);
                let k_end = at.checked_add(kl)?;
                let v_at = k_end.checked_add(1)?;
                let v_end = v_at.checked_add(vl)?;
                let (k, v) = (b.get(at..k_end)?, b.get(v_at..v_end)?);
                (b.get(k_end) == Some(&0) && b.get(v_end) == Some(&0)).then_some((k, v, v_end + 1))
            })();
            let Some((k, v, next)) = pair else {
                return false;
            };
            at = next;
            if pass == 1 && visit(k, v) {
                return true;
            }
        }
        if at != b.len() {
            return false;
        }
    }
    true
}

/// Header `name`'s first value in a serialized map (names match without
/// regard to ASCII case); `None`: the map is malformed (short, a length
/// past the end, a missing NUL terminator, or bytes left over).
pub fn map_get<'a>(b: &'a [u8], name: &str) -> Option<Option<&'a [u8]>> {
    let mut found = None;
    let ok = walk_map(b, |k, v| {
        let hit = k.eq_ignore_ascii_case(name.as_bytes());
        if hit {
            found = Some(v);
        }
        hit
    });
    ok.then_some(found)
}

/// Every (name, value) pair of a serialized map; `None`: malformed.
pub fn decode_map(b: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    walk_map(b, |k, v| {
        out.push((k, v));
        false
    })
    .then_some(out)
}

/// Answer the request locally.
pub fn send_response(
    code: u32,
    headers: &[(&str, &[u8])],
    body: Option<&[u8]>,
) -> Result<(), Status> {
    count();
    let h = serialize_map(headers);
    let (bp, bl) = body.map_or((std::ptr::null(), 0), |b| (b.as_ptr(), b.len()));
    // SAFETY: pointers and lengths of live slices.
    ok(unsafe {
        proxy_send_local_response(code, std::ptr::null(), 0, bp, bl, h.as_ptr(), h.len(), -1)
    })
}

/// Define a metric, returning its id.
pub fn define_metric(t: MetricType, name: &str) -> Result<u32, Status> {
    count();
    let mut id = 0u32;
    // SAFETY: pointer and length of a live &str; a valid out-pointer.
    ok(unsafe { proxy_define_metric(t as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Add `by` to a metric.
pub fn increment_metric(id: u32, by: i64) -> Result<(), Status> {
    count();
    // SAFETY: plain values.
    ok(unsafe { proxy_increment_metric(id, by) })
}

/// Set a gauge.
pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    count();
    // SAFETY: plain values.
    ok(unsafe { proxy_record_metric(id, value) })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn header_maps_serialize_as_the_abi_says() {
        let b = serialize_map(&[("a", b"xy"), (":s", b"")]);
        let mut want = vec![2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(b"a\0xy\0:s\0\0");
        assert_eq!(b, want);
        assert_eq!(serialize_map(&[]), vec![0, 0, 0, 0]);
    }

    #[test]
    fn header_maps_decode_what_serializes() {
        let pairs: [(&str, &[u8]); 4] = [
            (":path", b"/v1/chat/completions"),
            ("content-type", b"application/json"),
            ("x-empty", b""),
            ("x-bin", b"\xff\x00\x01"),
        ];
        let b = serialize_map(&pairs);
        let got = decode_map(&b).unwrap();
        let want: Vec<(&[u8], &[u8])> = pairs.iter().map(|(k, v)| (k.as_bytes(), *v)).collect();
        assert_eq!(got, want);
        assert_eq!(decode_map(&serialize_map(&[])), Some(Vec::new()));
        assert_eq!(decode_map(&[]), Some(Vec::new()));
        // Lookups: the first value, names in any ASCII case.
        let dup = serialize_map(&[("a", b"1"), ("B", b"2"), ("b", b"3")]);
        assert_eq!(map_get(&dup, "b"), Some(Some(&b"2"[..])));
        assert_eq!(map_get(&dup, "A"), Some(Some(&b"1"[..])));
        assert_eq!(map_get(&dup, "c"), Some(None));
        assert_eq!(map_get(&dup[..dup.len() - 1], "a"), None);
    }

    #[test]
    fn malformed_header_maps_are_none_not_panics() {
        let b = serialize_map(&[("a", b"xy"), (":s", b"")]);
        // Every truncation, and a byte too many.
        for end in 1..b.len() {
            assert_eq!(decode_map(&b[..end]), None, "cut at {end}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_map(&long), None);
        // A missing NUL terminator.
        let mut bad = b.clone();
        let last = bad.len() - 1;
        bad[last] = b'z';
        assert_eq!(decode_map(&bad), None);
        // Counts and lengths near u32::MAX.
        assert_eq!(decode_map(&[0xff, 0xff, 0xff, 0xff]), None);
        let mut huge = b.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_map(&huge), None);
        // Arbitrary bytes never panic.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..200 {
            let mut v = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push((x % 7) as u8);
            }
            let _ = decode_map(&v);
            let _ = map_get(&v, "a");
        }
    }

    #[test]
    fn unknown_statuses_are_errors_not_panics() {
        assert_eq!(ok(0), Ok(()));
        assert_eq!(ok(12), Err(Status::InternalFailure));
        assert_eq!(ok(8), Err(Status::CasMismatch));
        assert_eq!(ok(u32::MAX), Err(Status::InternalFailure));
    }
}
