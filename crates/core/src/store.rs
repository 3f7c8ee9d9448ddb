//! The process-wide shared-data store the core keeps its cross-worker
//! state in, as a small trait so the core has no proxy-wasm dependency:
//! proxy-wasm shared data in the filter ([`SharedStore`] over the host's
//! `get_shared_data` / `set_shared_data`), a mutex map ([`MemStore`]) in
//! tests and the simulator.
//!
//! Values are bytes with a compare-and-swap token. Writers go through
//! [`cas_update`], a bounded retry loop ([`CAS_RETRIES`]), so concurrent
//! worker threads lose no updates; counters are little-endian `u64`s
//! ([`add_counter`], [`decode_u64`]). The modules that keep state here
//! ([`crate::host_state`], [`crate::scrape`],
//! [`crate::shared_index`], [`crate::gossip`]) each own their keys under
//! `prefix_router/`.

use std::collections::HashMap;

/// Errors of a [`SharedStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The value changed since it was read (compare-and-swap failed).
    CasMismatch,
    /// Anything else the host reported.
    Other(String),
}

/// Process-wide key-value store with compare-and-swap (proxy-wasm shared
/// data in the filter; a mutex map in tests and the simulator).
pub trait SharedStore {
    /// Value and its CAS token.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;
    /// Set `value` if the CAS token still matches (`None`: unconditional).
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// Retries of a CAS loop before giving up (contention is between a handful
/// of worker threads, so this is never reached in practice).
pub const CAS_RETRIES: usize = 1024;

/// A little-endian u64 value (0 if absent or not 8 bytes).
pub fn decode_u64(v: Option<&[u8]>) -> u64 {
    match v.and_then(|b| <[u8; 8]>::try_from(b).ok()) {
        Some(a) => u64::from_le_bytes(a),
        None => 0,
    }
}

/// Read-modify-write the value under `key` with a bounded compare-and-swap
/// loop (at most [`CAS_RETRIES`] attempts): `f` gets the current value
/// (`None` if absent) and returns the value to write (`None`: write
/// nothing) and the result. A concurrent writer makes `f` run again on the
/// newer value, so no update is lost.
pub fn cas_update<S, T, B, F>(store: &S, key: &str, f: F) -> Result<T, StoreError>
where
    S: SharedStore + ?Sized,
    B: AsRef<[u8]>,
    F: FnMut(Option<&[u8]>) -> (Option<B>, T),
{
    cas_update_from(store, key, None, f)
}

/// A value as read from a [`SharedStore`] with its CAS token, kept so
/// that a later [`cas_update_from`] of the same key can start from it
/// instead of reading it again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// The value (`None`: absent).
    pub value: Option<Vec<u8>>,
    /// Its CAS token.
    pub cas: Option<u32>,
}

/// [`cas_update`] whose first attempt starts from `first`, a value read
/// earlier (one `get` fewer): if the key changed since, the write's CAS
/// fails and [`cas_update`] reads it again as usual. A snapshot without a
/// CAS token (an absent key) is not used, since a write without one cannot
/// tell that another writer came first.
pub fn cas_update_from<S, T, B, F>(
    store: &S,
    key: &str,
    first: Option<Snapshot>,
    mut f: F,
) -> Result<T, StoreError>
where
    S: SharedStore + ?Sized,
    B: AsRef<[u8]>,
    F: FnMut(Option<&[u8]>) -> (Option<B>, T),
{
    let mut out = None;
    cas_loop(store, key, first, &mut |v, buf| {
        let (write, o) = f(v);
        out = Some(o);
        let Some(bytes) = write else {
            return false;
        };
        buf.clear();
        buf.extend_from_slice(bytes.as_ref());
        true
    })?;
    // `f` ran before any `Ok`.
    out.ok_or(StoreError::CasMismatch)
}

/// An update as [`cas_loop`] runs it: the current value in, the new one
/// written into the buffer, and whether to write it.
type Update<'a> = dyn FnMut(Option<&[u8]>, &mut Vec<u8>) -> bool + 'a;

/// The one retry loop behind [`cas_update_from`], whatever the update:
/// `f` writes the new value into the buffer and says whether to write it.
/// (Generic in the update, it was copied into every caller: 270 bytes
/// more .wasm. The price is one copy of the new value into the buffer.)
fn cas_loop<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    first: Option<Snapshot>,
    f: &mut Update<'_>,
) -> Result<(), StoreError> {
    let mut buf = Vec::new();
    // The snapshot, when it has a CAS token, is one attempt more.
    let mut read = first.and_then(|s| s.cas.map(|c| (s.value, Some(c))));
    let attempts = CAS_RETRIES + usize::from(read.is_some());
    for _ in 0..attempts {
        let (v, cas) = match read.take() {
            Some(r) => r,
            None => store.get(key)?,
        };
        if !f(v.as_deref(), &mut buf) {
            return Ok(());
        }
        match store.set(key, &buf, cas) {
            Ok(()) => return Ok(()),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Other(
        "compare-and-swap retries exhausted".into(),
    ))
}

/// Add `delta` to the u64 counter under `key` (saturating at 0) with a
/// bounded compare-and-swap loop; returns the new value.
pub fn add_counter<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    delta: i64,
) -> Result<u64, StoreError> {
    add_counter_from(store, key, delta, None)
}

/// [`add_counter`] starting from a value read earlier ([`cas_update_from`]).
pub fn add_counter_from<S: SharedStore + ?Sized>(
    store: &S,
    key: &str,
    delta: i64,
    first: Option<Snapshot>,
) -> Result<u64, StoreError> {
    cas_update_from(store, key, first, |v| {
        let cur = decode_u64(v);
        let new = if delta >= 0 {
            cur.saturating_add(delta.unsigned_abs())
        } else {
            cur.saturating_sub(delta.unsigned_abs())
        };
        (Some(new.to_le_bytes()), new)
    })
}

/// An in-memory [`SharedStore`] (tests, simulator).
#[derive(Debug, Default)]
pub struct MemStore {
    inner: std::sync::Mutex<HashMap<String, (Vec<u8>, u32)>>,
}

impl SharedStore for MemStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        let g = self
            .inner
            .lock()
            .map_err(|_| StoreError::Other("poisoned".into()))?;
        Ok(match g.get(key) {
            Some((v, c)) => (Some(v.clone()), Some(*c)),
            None => (None, None),
        })
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut g = self
            .inner
            .lock()
            .map_err(|_| StoreError::Other("poisoned".into()))?;
        let cur = g.get(key).map(|(_, c)| *c);
        if let Some(c) = cas {
            if cur != Some(c) {
                return Err(StoreError::CasMismatch);
            }
        }
        let next = cur.unwrap_or(0).wrapping_add(1).max(1);
        g.insert(key.to_string(), (value.to_vec(), next));
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counters_saturate_and_decode() {
        let s = MemStore::default();
        assert_eq!(add_counter(&s, "k", 2), Ok(2));
        assert_eq!(add_counter(&s, "k", -5), Ok(0));
        assert_eq!(add_counter(&s, "k", i64::MAX), Ok(i64::MAX as u64));
        assert_eq!(
            decode_u64(s.get("k").unwrap().0.as_deref()),
            i64::MAX as u64
        );
        assert_eq!(decode_u64(None), 0);
        assert_eq!(decode_u64(Some(&[1, 2, 3])), 0);
        // A CAS token that no longer matches is refused.
        let (_, cas) = s.get("k").unwrap();
        s.set("k", b"x", None).unwrap();
        assert_eq!(s.set("k", b"y", cas), Err(StoreError::CasMismatch));
        // `f` returning no value writes nothing.
        assert_eq!(cas_update(&s, "k", |_| (None::<Vec<u8>>, 7)), Ok(7));
        assert_eq!(s.get("k").unwrap().0.as_deref(), Some(&b"x"[..]));
    }

    /// A store that counts its calls.
    #[derive(Default)]
    struct Counting {
        inner: MemStore,
        gets: std::sync::atomic::AtomicUsize,
    }
    impl SharedStore for Counting {
        fn get(&self, k: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.get(k)
        }
        fn set(&self, k: &str, v: &[u8], c: Option<u32>) -> Result<(), StoreError> {
            self.inner.set(k, v, c)
        }
    }

    #[test]
    fn updates_start_from_a_snapshot_and_reread_when_it_is_stale() {
        use std::sync::atomic::Ordering;
        let s = Counting::default();
        let add = |first: Option<Snapshot>| {
            cas_update_from(&s, "k", first, |v| {
                let n = decode_u64(v) + 1;
                (Some(n.to_le_bytes()), n)
            })
        };
        // An absent key: a snapshot without CAS is not trusted.
        assert_eq!(add(Some(Snapshot::default())), Ok(1));
        assert_eq!(s.gets.load(Ordering::SeqCst), 1);
        // A current snapshot: no read.
        let (value, cas) = s.inner.get("k").unwrap();
        let snap = Snapshot { value, cas };
        assert_eq!(add(Some(snap.clone())), Ok(2));
        assert_eq!(s.gets.load(Ordering::SeqCst), 1);
        // The same snapshot again is stale: its write fails and the loop
        // reads the current value, losing no update.
        assert_eq!(add(Some(snap)), Ok(3));
        assert_eq!(s.gets.load(Ordering::SeqCst), 2);
        assert_eq!(decode_u64(s.inner.get("k").unwrap().0.as_deref()), 3);
    }

    /// A store whose first CAS attempts fail, as when another worker wins.
    struct Flaky {
        inner: MemStore,
        fail: std::sync::atomic::AtomicUsize,
    }
    impl SharedStore for Flaky {
        fn get(&self, k: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
            self.inner.get(k)
        }
        fn set(&self, k: &str, v: &[u8], c: Option<u32>) -> Result<(), StoreError> {
            use std::sync::atomic::Ordering;
            if self.fail.load(Ordering::SeqCst) > 0 {
                self.fail.fetch_sub(1, Ordering::SeqCst);
                return Err(StoreError::CasMismatch);
            }
            self.inner.set(k, v, c)
        }
    }

    #[test]
    fn cas_retries_then_gives_up() {
        let f = Flaky {
            inner: MemStore::default(),
            fail: 3.into(),
        };
        assert_eq!(add_counter(&f, "x", 1), Ok(1));
        f.fail
            .store(CAS_RETRIES + 1, std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(add_counter(&f, "x", 1), Err(StoreError::Other(_))));
    }
}
