//! An in-process proxy-wasm host for native builds, so the filter's
//! contexts ([`crate::root::Root`], [`crate::http::Http`]) run in plain
//! `cargo test` without Envoy.
//!
//! On `wasm32` the calls of [`crate::abi`] are the host's imports; on
//! every other target they land in [`abi`] below, which serves them from
//! one [`Host`] per thread (headers, bodies, properties, shared data,
//! metrics, the clock, logs, local responses). A test sets what Envoy
//! would hold ([`with`]), drives the contexts' callbacks, and reads what
//! the filter wrote. Buffers are handed over as the real host does, as an
//! allocation of exactly their size that [`crate::abi`] takes ownership of.
//!
//! `proxy_http_call` is not here: the filter reaches it through the SDK
//! (scrape, gossip, membership), which native tests do not drive.

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::types::{BufferType, MapType};

/// What the host holds for this thread.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// The clock, ns since the Unix epoch.
    pub now_ns: u64,
    /// The log level the filter reads (0: trace, everything is logged).
    pub log_level: u32,
    /// Lines logged: (level, message).
    pub logs: Vec<(u32, String)>,
    /// The tick period the root context asked for.
    pub tick_ms: Option<u32>,
    /// Header maps by `MapType` number: (name, value) in order.
    pub maps: HashMap<u32, Vec<(String, Vec<u8>)>>,
    /// Buffers by `BufferType` number.
    pub buffers: HashMap<u32, Vec<u8>>,
    /// Properties by path (parts joined by NUL).
    pub properties: HashMap<Vec<u8>, Vec<u8>>,
    /// Shared data: key -> (value, CAS).
    pub shared: HashMap<String, (Vec<u8>, u32)>,
    /// Metrics in definition order: (type number, name, value).
    pub metrics: Vec<(u32, String, i64)>,
    /// The last local response sent: (status, body).
    pub local_response: Option<(u32, Vec<u8>)>,
}

impl Host {
    /// Replace a header map.
    pub fn set_map(&mut self, map: MapType, pairs: &[(&str, &[u8])]) {
        self.maps.insert(
            map as u32,
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
        );
    }

    /// A header's first value (names match without regard to ASCII case).
    pub fn header(&self, map: MapType, name: &str) -> Option<&[u8]> {
        self.maps
            .get(&(map as u32))?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Replace a buffer.
    pub fn set_buffer(&mut self, t: BufferType, bytes: &[u8]) {
        self.buffers.insert(t as u32, bytes.to_vec());
    }

    /// Set a property (`path` as the filter names it, e.g. `["upstream", "address"]`).
    pub fn set_property(&mut self, path: &[&str], value: &[u8]) {
        self.properties
            .insert(path.join("\0").into_bytes(), value.to_vec());
    }

    /// A metric's value by name (`None`: not defined).
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.metrics
            .iter()
            .find(|(_, n, _)| n == name)
            .map(|&(_, _, v)| v)
    }

    /// Whether a logged line contains `s`.
    pub fn logged(&self, s: &str) -> bool {
        self.logs.iter().any(|(_, m)| m.contains(s))
    }
}

thread_local! {
    static HOST: RefCell<Host> = RefCell::new(Host {
        now_ns: 1_700_000_000_000_000_000,
        ..Host::default()
    });
}

/// Read or change this thread's host.
pub fn with<R>(f: impl FnOnce(&mut Host) -> R) -> R {
    HOST.with(|h| f(&mut h.borrow_mut()))
}

/// The host calls of [`crate::abi`] on native targets.
#[allow(clippy::too_many_arguments, clippy::missing_safety_doc)]
pub mod abi {
    use super::with;

    const OK: u32 = 0;
    const NOT_FOUND: u32 = 1;
    const BAD_ARGUMENT: u32 = 2;
    const CAS_MISMATCH: u32 = 8;

    /// Bytes the caller passed, as a slice (empty for a null pointer).
    unsafe fn slice<'a>(p: *const u8, n: usize) -> &'a [u8] {
        if p.is_null() || n == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(p, n)
        }
    }

    unsafe fn text(p: *const u8, n: usize) -> String {
        String::from_utf8_lossy(slice(p, n)).into_owned()
    }

    /// Hand `bytes` to the caller as an allocation of exactly their size,
    /// as `proxy_on_memory_allocate` makes them.
    unsafe fn give(bytes: &[u8], data: *mut *mut u8, size: *mut usize) {
        let b: Box<[u8]> = bytes.into();
        *size = b.len();
        *data = Box::into_raw(b).cast::<u8>();
    }

    pub unsafe fn proxy_log(level: u32, data: *const u8, size: usize) -> u32 {
        let m = text(data, size);
        with(|h| h.logs.push((level, m)));
        OK
    }
    pub unsafe fn proxy_get_log_level(level: *mut u32) -> u32 {
        *level = with(|h| h.log_level);
        OK
    }
    pub unsafe fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32 {
        *t = with(|h| h.now_ns);
        OK
    }
    pub unsafe fn proxy_set_tick_period_milliseconds(period: u32) -> u32 {
        with(|h| h.tick_ms = Some(period));
        OK
    }
    pub unsafe fn proxy_get_buffer_bytes(
        t: u32,
        start: usize,
        max: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32 {
        let b = with(|h| h.buffers.get(&t).cloned());
        match b {
            None => NOT_FOUND,
            Some(b) => {
                let from = start.min(b.len());
                let to = from.saturating_add(max).min(b.len());
                give(b.get(from..to).unwrap_or_default(), data, size);
                OK
            }
        }
    }
    pub unsafe fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32 {
        let k = text(key, key_size);
        let v = with(|h| {
            h.maps
                .get(&map)?
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(&k))
                .map(|(_, v)| v.clone())
        });
        match v {
            Some(v) => {
                give(&v, data, size);
                OK
            }
            None => NOT_FOUND,
        }
    }
    pub unsafe fn proxy_get_header_map_pairs(
        map: u32,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32 {
        let pairs = with(|h| h.maps.get(&map).cloned().unwrap_or_default());
        let refs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        give(&crate::abi::serialize_map(&refs), data, size);
        OK
    }
    pub unsafe fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32 {
        proxy_remove_header_map_value(map, key, key_size);
        proxy_add_header_map_value(map, key, key_size, value, value_size)
    }
    pub unsafe fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32 {
        let k = text(key, key_size);
        with(|h| {
            if let Some(m) = h.maps.get_mut(&map) {
                m.retain(|(n, _)| !n.eq_ignore_ascii_case(&k));
            }
        });
        OK
    }
    pub unsafe fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32 {
        let (k, v) = (text(key, key_size), slice(value, value_size).to_vec());
        with(|h| h.maps.entry(map).or_default().push((k, v)));
        OK
    }
    pub unsafe fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
    ) -> u32 {
        let p = slice(path, path_size).to_vec();
        match with(|h| h.properties.get(&p).cloned()) {
            Some(v) => {
                give(&v, data, size);
                OK
            }
            None => NOT_FOUND,
        }
    }
    pub unsafe fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32 {
        let k = text(key, key_size);
        match with(|h| h.shared.get(&k).cloned()) {
            Some((v, c)) => {
                give(&v, data, size);
                *cas = c;
                OK
            }
            None => NOT_FOUND,
        }
    }
    pub unsafe fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32 {
        let (k, v) = (text(key, key_size), slice(value, value_size).to_vec());
        with(|h| {
            let now = h.shared.get(&k).map_or(0, |e| e.1);
            if cas != 0 && cas != now {
                return CAS_MISMATCH;
            }
            h.shared.insert(k, (v, now.wrapping_add(1).max(1)));
            OK
        })
    }
    pub unsafe fn proxy_send_local_response(
        status: u32,
        _details: *const u8,
        _details_size: usize,
        body: *const u8,
        body_size: usize,
        _headers: *const u8,
        _headers_size: usize,
        _grpc_status: i32,
    ) -> u32 {
        let b = slice(body, body_size).to_vec();
        with(|h| h.local_response = Some((status, b)));
        OK
    }
    pub unsafe fn proxy_define_metric(
        t: u32,
        name: *const u8,
        name_size: usize,
        id: *mut u32,
    ) -> u32 {
        let n = text(name, name_size);
        let i = with(|h| {
            let at = match h.metrics.iter().position(|(_, m, _)| *m == n) {
                Some(at) => at,
                None => {
                    h.metrics.push((t, n, 0));
                    h.metrics.len() - 1
                }
            };
            u32::try_from(at).ok()
        });
        match i {
            Some(i) => {
                *id = i;
                OK
            }
            None => BAD_ARGUMENT,
        }
    }
    pub unsafe fn proxy_increment_metric(id: u32, offset: i64) -> u32 {
        with(|h| match h.metrics.get_mut(id as usize) {
            Some(m) => {
                m.2 = m.2.saturating_add(offset);
                OK
            }
            None => NOT_FOUND,
        })
    }
    pub unsafe fn proxy_record_metric(id: u32, value: u64) -> u32 {
        with(|h| match h.metrics.get_mut(id as usize) {
            Some(m) => {
                m.2 = i64::try_from(value).unwrap_or(i64::MAX);
                OK
            }
            None => NOT_FOUND,
        })
    }
}

/// The SDK's own imports (`proxy_wasm::hostcalls`), which the contexts'
/// default trait methods reach: defined so that native builds link. The
/// filter calls the host through [`crate::abi`]; any of these answers
/// `InternalFailure`.
#[allow(clippy::too_many_arguments)]
mod sdk {
    use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status, StreamType};

    /// `fn name(types..);` -> an exported stub answering `InternalFailure`.
    macro_rules! stubs {
        ($(fn $name:ident($($t:ty),* $(,)?);)*) => {$(
            #[no_mangle]
            pub extern "C" fn $name($(_: $t),*) -> Status {
                Status::InternalFailure
            }
        )*};
    }

    stubs! {
        fn proxy_log(LogLevel, *const u8, usize);
        fn proxy_get_log_level(*mut LogLevel);
        fn proxy_get_current_time_nanoseconds(*mut u64);
        fn proxy_set_tick_period_milliseconds(u32);
        fn proxy_get_buffer_bytes(BufferType, usize, usize, *mut *mut u8, *mut usize);
        fn proxy_set_buffer_bytes(BufferType, usize, usize, *const u8, usize);
        fn proxy_get_header_map_pairs(MapType, *mut *mut u8, *mut usize);
        fn proxy_set_header_map_pairs(MapType, *const u8, usize);
        fn proxy_get_header_map_value(MapType, *const u8, usize, *mut *mut u8, *mut usize);
        fn proxy_remove_header_map_value(MapType, *const u8, usize);
        fn proxy_replace_header_map_value(MapType, *const u8, usize, *const u8, usize);
        fn proxy_add_header_map_value(MapType, *const u8, usize, *const u8, usize);
        fn proxy_get_property(*const u8, usize, *mut *mut u8, *mut usize);
        fn proxy_set_property(*const u8, usize, *const u8, usize);
        fn proxy_get_shared_data(*const u8, usize, *mut *mut u8, *mut usize, *mut u32);
        fn proxy_set_shared_data(*const u8, usize, *const u8, usize, u32);
        fn proxy_register_shared_queue(*const u8, usize, *mut u32);
        fn proxy_resolve_shared_queue(*const u8, usize, *const u8, usize, *mut u32);
        fn proxy_dequeue_shared_queue(u32, *mut *mut u8, *mut usize);
        fn proxy_enqueue_shared_queue(u32, *const u8, usize);
        fn proxy_continue_stream(StreamType);
        fn proxy_close_stream(StreamType);
        fn proxy_send_local_response(u32, *const u8, usize, *const u8, usize, *const u8, usize, i32);
        fn proxy_http_call(*const u8, usize, *const u8, usize, *const u8, usize, *const u8, usize, u32, *mut u32);
        fn proxy_grpc_call(*const u8, usize, *const u8, usize, *const u8, usize, *const u8, usize, *const u8, usize, u32, *mut u32);
        fn proxy_grpc_stream(*const u8, usize, *const u8, usize, *const u8, usize, *const u8, usize, *mut u32);
        fn proxy_grpc_send(u32, *const u8, usize, bool);
        fn proxy_grpc_cancel(u32);
        fn proxy_grpc_close(u32);
        fn proxy_get_status(*mut u32, *mut *mut u8, *mut usize);
        fn proxy_set_effective_context(u32);
        fn proxy_call_foreign_function(*const u8, usize, *const u8, usize, *mut *mut u8, *mut usize);
        fn proxy_done();
        fn proxy_define_metric(MetricType, *const u8, usize, *mut u32);
        fn proxy_get_metric(u32, *mut u64);
        fn proxy_record_metric(u32, u64);
        fn proxy_increment_metric(u32, i64);
    }
}
