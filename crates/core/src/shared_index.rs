//! The prefix index in process-wide shared data (the Envoy filter's view of
//! [`crate::index`]), and the pending prefill tokens per host.
//!
//! ## Layout
//! A fixed number of buckets (`buckets`, default 4096), each one
//! shared-data value under the key `prefix_router/idx/<bucket>`. A value is
//! up to `bucket_entries` (default 8) entries of [`ENTRY_BYTES`] = 18
//! bytes, little-endian: prefix hash (u64), host index (u16), stamp (u64).
//! A strided boundary hash goes to bucket `mix(hash) % buckets`. Memory is
//! therefore bounded by `buckets x bucket_entries x 18` bytes (590 KB with
//! the defaults), reported by [`SharedIndexConfig::footprint_bytes`],
//! however many prompts and hosts there are.
//!
//! ## Updates
//! [`SharedIndexConfig::observe`] is called with the host that actually
//! served a request and the request's strided chain; every touched bucket
//! is rewritten with a compare-and-swap retry loop (at most
//! [`crate::store::CAS_RETRIES`] attempts, like [`crate::host_state::add_inflight`]),
//! so concurrent workers lose no entries. An existing `(hash, host)` entry
//! is refreshed; a full bucket evicts its oldest entry. The stamp is
//! `now_ms << 16` plus a per-observation rank that makes a prompt's deepest
//! boundary the oldest, so a prompt's tail is evicted before its head (as
//! in [`crate::index::PrefixIndex`]).
//!
//! ## Lookups
//! [`SharedLookup`] implements [`PrefixLookup`] for the cost rule: it
//! probes the request's boundaries from the longest down (each bucket read
//! once per lookup) and stops once every candidate host has a match.
//! Entries older than `max_age_ms` (if set) are ignored.
//!
//! ## Forgetting
//! A replica that restarts (or is ejected, or is removed from the config)
//! no longer holds what the index says. Instead of scanning every bucket,
//! one shared-data value [`FORGET_KEY`] keeps a cutoff time per host index
//! (`u64` ms, little-endian, one per host): entries of host `h` stamped
//! before `cutoff[h]` are ignored by lookups and dropped by the next write
//! of their bucket. [`forget_hosts`] raises cutoffs (O(1) per host, one CAS
//! loop); [`reconcile_hosts`] forgets every host when the configured host
//! list differs from the one the index was built with (entries name hosts
//! by index). Each lookup and each observation reads the cutoffs once.
//!
//! ## A replica's cache capacity (`cost.host_tokens`)
//! A replica's KV cache is an LRU of bounded size: a prefix it computed is
//! gone once about `host_tokens` newer tokens have gone through it. The
//! index cannot see evictions, so it keeps a per-host capacity clock
//! ([`advance_capacity`], key `prefix_router/idx/capacity/<host>`): the
//! uncached prompt tokens each response added to that host, with
//! checkpoints `(clock, time)` every `host_tokens / 16` tokens. When the
//! clock has moved `host_tokens` past a checkpoint, everything the host
//! was sent before that checkpoint's time has been pushed out of its LRU,
//! and the host's forget cutoff is raised to that time (the same cutoff as
//! "Forgetting" below). An entry that was refreshed since (the prefix was
//! used again) carries a newer stamp and stays, as in the replica's LRU.
//! Error: at most `host_tokens / 16` tokens late, and generated tokens
//! (which vLLM also caches) are not counted, so the estimate errs towards
//! remembering. One CAS update of a value of about 16 + 16 x 18 bytes (at
//! most ~18 checkpoints are live) per
//! observed response; the cutoff write only when the horizon moves.
//!
//! ## Robustness
//! A value that is not a whole number of entries is decoded up to its last
//! whole entry (trailing bytes dropped); a bucket holding more than
//! `bucket_entries` entries (e.g. written by a config with a larger bound)
//! is trimmed on the next write. Host indices beyond the config's hosts
//! never match a candidate. Store errors are reported, never panics.
//!
//! ## Pending prefill tokens
//! The host's record ([`crate::host_state`], `prefix_router/host/<address>`)
//! keeps, beside its in-flight count, the prompt tokens of requests routed
//! there that have not yet produced a response
//! ([`crate::host_state::Pending`]; [`read_pending_tokens`]). They feed
//! [`crate::load::HostLoad::pending_prefill_tokens`] for `queue = "tokens"`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

use crate::index::{CapacityClock, PrefixLookup};
use crate::store::{cas_update, SharedStore, StoreError};

/// Bytes per encoded entry: hash (8) + host (2) + stamp (8).
pub const ENTRY_BYTES: usize = 18;

/// Shared-data key of the per-host forget cutoffs.
pub const FORGET_KEY: &str = "prefix_router/idx/forget";
/// Shared-data key of the fingerprint of the host list the index was built
/// with.
pub const HOSTS_KEY: &str = "prefix_router/idx/hosts";

/// Decode the forget cutoffs (trailing bytes ignored).
pub fn decode_cutoffs(v: Option<&[u8]>) -> Vec<u64> {
    v.unwrap_or(&[])
        .chunks_exact(8)
        .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
        .collect()
}

/// The forget cutoffs, indexed by host (missing hosts: 0).
pub fn read_cutoffs<S: SharedStore + ?Sized>(store: &S) -> Result<Vec<u64>, StoreError> {
    let (v, _) = store.get(FORGET_KEY)?;
    Ok(decode_cutoffs(v.as_deref()))
}

/// Forget what the index knows about `hosts` (indices) as of `now_ms`:
/// their entries stamped earlier stop counting. One CAS loop.
pub fn forget_hosts<S: SharedStore + ?Sized>(
    store: &S,
    hosts: &[usize],
    now_ms: u64,
) -> Result<(), StoreError> {
    let cutoff = now_ms.min((1u64 << 48) - 1);
    cas_update(store, FORGET_KEY, |v| {
        let mut cut = decode_cutoffs(v);
        for &h in hosts {
            if h > usize::from(u16::MAX) {
                continue;
            }
            if cut.len() <= h {
                cut.resize(h + 1, 0);
            }
            if let Some(c) = cut.get_mut(h) {
                *c = (*c).max(cutoff);
            }
        }
        let bytes: Vec<u8> = cut.iter().flat_map(|c| c.to_le_bytes()).collect();
        (Some(bytes), ())
    })
}

/// Shared-data key of host `h`'s capacity clock.
pub fn capacity_key(h: usize) -> String {
    format!("prefix_router/idx/capacity/{h}")
}

/// Host `h` took `tokens` new tokens into its cache at `now_ms`: advance
/// its capacity clock (one CAS loop) and return the new horizon if it
/// moved; the caller then raises the host's cutoff with [`forget_hosts`].
pub fn advance_capacity<S: SharedStore + ?Sized>(
    store: &S,
    h: usize,
    tokens: u64,
    budget: u64,
    now_ms: u64,
) -> Result<Option<u64>, StoreError> {
    if budget == 0 {
        return Ok(None);
    }
    cas_update(store, &capacity_key(h), |v| {
        let mut clock = CapacityClock::decode(v);
        let moved = clock.advance(tokens, budget, now_ms);
        (Some(clock.encode()), moved)
    })
}

/// Make the index agree with the configured host list, identified by
/// `fingerprint` (e.g. a hash of the ordered addresses): if the index was
/// built with another list, forget all `n_hosts` (and any beyond) and
/// record the new fingerprint. Returns whether it forgot. A process's first
/// configuration finds no fingerprint and forgets nothing.
pub fn reconcile_hosts<S: SharedStore + ?Sized>(
    store: &S,
    fingerprint: u64,
    n_hosts: usize,
    now_ms: u64,
) -> Result<bool, StoreError> {
    let (v, cas) = store.get(HOSTS_KEY)?;
    let stored = v
        .as_deref()
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes);
    if stored == Some(fingerprint) {
        return Ok(false);
    }
    match store.set(HOSTS_KEY, &fingerprint.to_le_bytes(), cas) {
        Ok(()) => {}
        // Another VM of this process got there first with the same config.
        Err(StoreError::CasMismatch) => return Ok(false),
        Err(e) => return Err(e),
    }
    if stored.is_none() {
        return Ok(false);
    }
    let old = read_cutoffs(store)?.len();
    let all: Vec<usize> = (0..n_hosts.max(old).min(usize::from(u16::MAX) + 1)).collect();
    forget_hosts(store, &all, now_ms)?;
    Ok(true)
}

/// Result of [`SharedIndexConfig::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    /// Entries written or refreshed.
    pub entries: u64,
    /// Change of the bytes stored in the touched buckets (eviction of
    /// forgotten entries can make it negative).
    pub bytes_delta: i64,
}

/// Shape of the shared index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedIndexConfig {
    /// Number of buckets (>= 1).
    pub buckets: u32,
    /// Entries kept per bucket (>= 1).
    pub bucket_entries: u32,
    /// Bytes between recorded boundaries (stride x chunk bytes).
    pub stride_bytes: u64,
    /// Boundaries kept at every stride before thinning
    /// ([`crate::index::boundary_number`]; 0: all).
    pub dense_boundaries: u32,
    /// Entries older than this are ignored by lookups (0: never).
    pub max_age_ms: u64,
}

impl Default for SharedIndexConfig {
    fn default() -> Self {
        SharedIndexConfig {
            buckets: 4096,
            bucket_entries: 8,
            stride_bytes: 1024,
            dense_boundaries: 16,
            max_age_ms: 0,
        }
    }
}

/// One decoded entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Strided boundary hash.
    pub hash: u64,
    /// Host index (into the config's hosts).
    pub host: u16,
    /// `now_ms << 16 | rank` (larger = newer).
    pub stamp: u64,
}

/// Decode a bucket value, ignoring trailing garbage.
pub fn decode(bytes: &[u8]) -> Vec<Entry> {
    bytes
        .chunks_exact(ENTRY_BYTES)
        .filter_map(|c| {
            Some(Entry {
                hash: u64::from_le_bytes(c.get(0..8)?.try_into().ok()?),
                host: u16::from_le_bytes(c.get(8..10)?.try_into().ok()?),
                stamp: u64::from_le_bytes(c.get(10..18)?.try_into().ok()?),
            })
        })
        .collect()
}

/// Encode a bucket value.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for e in entries {
        out.extend_from_slice(&e.hash.to_le_bytes());
        out.extend_from_slice(&e.host.to_le_bytes());
        out.extend_from_slice(&e.stamp.to_le_bytes());
    }
    out
}

/// Shared-data key of a bucket.
pub fn bucket_key(bucket: u32) -> String {
    format!("prefix_router/idx/{bucket}")
}

fn stamp(now_ms: u64, rank: usize) -> u64 {
    let t = now_ms.min((1u64 << 48) - 1);
    (t << 16) | (rank.min(0xFFFF) as u64)
}

impl SharedIndexConfig {
    /// Upper bound of the shared data used, bytes.
    pub fn footprint_bytes(&self) -> u64 {
        u64::from(self.buckets.max(1)) * u64::from(self.bucket_entries.max(1)) * ENTRY_BYTES as u64
    }

    /// Bucket of a boundary hash.
    pub fn bucket(&self, hash: u64) -> u32 {
        let mixed = (hash ^ (hash >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        ((mixed >> 32) % u64::from(self.buckets.max(1))) as u32
    }

    fn stale(&self, e: &Entry, now_ms: u64) -> bool {
        self.max_age_ms > 0 && now_ms.saturating_sub(e.stamp >> 16) > self.max_age_ms
    }

    /// Whether `e` predates its host's forget cutoff.
    fn forgotten(e: &Entry, cutoffs: &[u64]) -> bool {
        cutoffs
            .get(usize::from(e.host))
            .is_some_and(|&c| (e.stamp >> 16) < c)
    }

    /// `host` served a request whose strided boundary hashes are `hashes`
    /// (shortest first). Returns what was written; on store errors the
    /// remaining buckets are still attempted and the first error is
    /// returned alongside (the counts cover the buckets that were written).
    pub fn observe<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        host: usize,
        hashes: &[u64],
        now_ms: u64,
    ) -> (Observed, Option<StoreError>) {
        self.observe_many(store, &[(host, hashes)], now_ms)
    }

    /// [`SharedIndexConfig::observe`] for several responses at once (a
    /// received gossip batch): the forget cutoffs are read once and every
    /// touched bucket is rewritten once, with all the batch's entries for
    /// it, instead of once per response. The result is the same as
    /// observing them one by one at `now_ms` unless a bucket overflows:
    /// then it keeps the newest `bucket_entries` of its own and all the
    /// batch's entries together, where one by one each observation's
    /// would have been trimmed in turn. An observation whose host index
    /// does not fit the index (over 65,535) is skipped and reported as the
    /// error; the others are written.
    pub fn observe_many<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        observations: &[(usize, &[u64])],
        now_ms: u64,
    ) -> (Observed, Option<StoreError>) {
        let mut out = Observed::default();
        let mut first_err = None;
        let cutoffs = match read_cutoffs(store) {
            Ok(c) => c,
            Err(e) => {
                first_err = Some(e);
                Vec::new()
            }
        };
        // bucket -> (hash, host, stamp); the deepest boundary of each
        // observation gets rank 0 (oldest).
        let mut by_bucket: BTreeMap<u32, Vec<(u64, u16, u64)>> = BTreeMap::new();
        for &(host, hashes) in observations {
            let Ok(h) = u16::try_from(host) else {
                if first_err.is_none() {
                    first_err = Some(StoreError::Other(format!(
                        "host index {host} does not fit the shared index"
                    )));
                }
                continue;
            };
            let k = hashes.len();
            for (j, &p) in hashes.iter().enumerate() {
                by_bucket
                    .entry(self.bucket(p))
                    .or_default()
                    .push((p, h, stamp(now_ms, k - 1 - j)));
            }
        }
        let cap = self.bucket_entries.max(1) as usize;
        for (b, items) in by_bucket {
            match self.update_bucket(store, b, &items, cap, &cutoffs) {
                Ok(delta) => {
                    out.entries += items.len() as u64;
                    out.bytes_delta += delta;
                }
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        (out, first_err)
    }

    /// Rewrite one bucket; returns the change in its size, bytes.
    fn update_bucket<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        bucket: u32,
        items: &[(u64, u16, u64)],
        cap: usize,
        cutoffs: &[u64],
    ) -> Result<i64, StoreError> {
        cas_update(store, &bucket_key(bucket), |v| {
            let before = v.map_or(0, <[u8]>::len);
            let mut entries = decode(v.unwrap_or(&[]));
            entries.retain(|e| !Self::forgotten(e, cutoffs));
            for &(p, host, s) in items {
                match entries.iter_mut().find(|e| e.hash == p && e.host == host) {
                    Some(e) => e.stamp = e.stamp.max(s),
                    None => entries.push(Entry {
                        hash: p,
                        host,
                        stamp: s,
                    }),
                }
            }
            // Oldest first out; keep the newest `cap`.
            entries.sort_by_key(|e| std::cmp::Reverse(e.stamp));
            entries.truncate(cap);
            let bytes = encode(&entries);
            let delta = i64::try_from(bytes.len()).unwrap_or(i64::MAX)
                - i64::try_from(before).unwrap_or(i64::MAX);
            (Some(bytes), delta)
        })
    }

    /// For each of `hosts`, the longest recorded prefix of this request it
    /// holds, in bytes. Buckets that cannot be read count as empty; the
    /// first such error is returned alongside.
    pub fn lookup<S: SharedStore + ?Sized>(
        &self,
        store: &S,
        hashes: &[u64],
        hosts: &[usize],
        now_ms: u64,
    ) -> (Vec<u64>, Option<StoreError>) {
        let mut out = vec![0u64; hosts.len()];
        let mut left = hosts.len();
        let mut err = None;
        let cutoffs = match read_cutoffs(store) {
            Ok(c) => c,
            Err(e) => {
                err = Some(e);
                Vec::new()
            }
        };
        let mut cache: BTreeMap<u32, Vec<Entry>> = BTreeMap::new();
        for (j, &p) in hashes.iter().enumerate().rev() {
            if left == 0 {
                break;
            }
            let b = self.bucket(p);
            let entries = cache
                .entry(b)
                .or_insert_with(|| match store.get(&bucket_key(b)) {
                    Ok((v, _)) => decode(v.as_deref().unwrap_or(&[])),
                    Err(e) => {
                        if err.is_none() {
                            err = Some(e);
                        }
                        Vec::new()
                    }
                });
            for e in entries.iter() {
                if e.hash != p || self.stale(e, now_ms) || Self::forgotten(e, &cutoffs) {
                    continue;
                }
                for (i, want) in hosts.iter().enumerate() {
                    if *want == usize::from(e.host) {
                        if let Some(o) = out.get_mut(i) {
                            if *o == 0 {
                                *o = crate::index::boundary_number(j, self.dense_boundaries)
                                    .saturating_mul(self.stride_bytes);
                                left = left.saturating_sub(1);
                            }
                        }
                    }
                }
            }
        }
        (out, err)
    }
}

/// The shared index as a [`PrefixLookup`] for [`crate::cost::place`]:
/// store errors are counted (the caller reports them after placing).
pub struct SharedLookup<'a, S: SharedStore + ?Sized> {
    store: &'a S,
    cfg: SharedIndexConfig,
    errors: Cell<u32>,
    first_error: RefCell<Option<StoreError>>,
}

impl<'a, S: SharedStore + ?Sized> SharedLookup<'a, S> {
    /// A lookup view over `store`.
    pub fn new(store: &'a S, cfg: SharedIndexConfig) -> Self {
        SharedLookup {
            store,
            cfg,
            errors: Cell::new(0),
            first_error: RefCell::new(None),
        }
    }

    /// Lookups that hit a store error, and the first error.
    pub fn errors(&self) -> (u32, Option<StoreError>) {
        (self.errors.get(), self.first_error.borrow().clone())
    }
}

impl<S: SharedStore + ?Sized> PrefixLookup for SharedLookup<'_, S> {
    fn lookup(&self, hashes: &[u64], hosts: &[usize], now_ms: u64) -> Vec<u64> {
        let (out, err) = self.cfg.lookup(self.store, hashes, hosts, now_ms);
        if let Some(e) = err {
            self.errors.set(self.errors.get().saturating_add(1));
            let mut f = self.first_error.borrow_mut();
            if f.is_none() {
                *f = Some(e);
            }
        }
        out
    }
}

/// A host's pending prefill tokens (0 if never set or garbage).
pub fn read_pending_tokens<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<u64, StoreError> {
    Ok(crate::host_state::read(store, address)?.pending_tokens)
}

/// Shared-data key of the learned prefill rate (`learn_prefill`): one
/// f64, tokens per second, shared by the workers of one Envoy.
pub const LEARNED_PREFILL_KEY: &str = "prefix_router/learn/prefill_tps";

fn decode_f64(v: Option<&[u8]>) -> Option<f64> {
    v.and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(f64::from_le_bytes)
        .filter(|x| x.is_finite() && *x > 0.0)
}

/// The learned prefill rate, `None` before the first usable sample (or if
/// the stored value is garbage).
pub fn read_learned_prefill<S: SharedStore + ?Sized>(store: &S) -> Result<Option<f64>, StoreError> {
    let (v, _) = store.get(LEARNED_PREFILL_KEY)?;
    Ok(decode_f64(v.as_deref()))
}

/// Fold one response into the learned prefill rate
/// ([`crate::cost::learn_prefill_rate`]) with a compare-and-swap, so
/// concurrent workers lose no sample. Returns the new rate, or `None` if
/// the sample was not usable (nothing is written then).
pub fn learn_prefill<S: SharedStore + ?Sized>(
    store: &S,
    configured: f64,
    sample: &crate::cost::PrefillSample,
) -> Result<Option<f64>, StoreError> {
    cas_update(store, LEARNED_PREFILL_KEY, |v| {
        let cur = decode_f64(v).unwrap_or(configured);
        match crate::cost::learn_prefill_rate(cur, configured, sample) {
            Some(r) => (Some(r.to_le_bytes()), Some(r)),
            None => (None, None),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::CAPACITY_STEPS;
    use crate::store::MemStore;

    #[test]
    fn learned_prefill_rate_round_trip() {
        let s = MemStore::default();
        assert_eq!(read_learned_prefill(&s), Ok(None));
        let sample = crate::cost::PrefillSample {
            uncached_tokens: 4_000,
            ttfb_ms: 250,
            ahead_tokens: 0,
        };
        let r = learn_prefill(&s, 64_000.0, &sample).unwrap().unwrap();
        assert!(r < 64_000.0 && r > 16_000.0, "{r}");
        assert_eq!(read_learned_prefill(&s), Ok(Some(r)));
        // An unusable sample writes nothing.
        let busy = crate::cost::PrefillSample {
            ahead_tokens: 10,
            ..sample
        };
        assert_eq!(learn_prefill(&s, 64_000.0, &busy), Ok(None));
        assert_eq!(read_learned_prefill(&s), Ok(Some(r)));
        // Garbage in the store reads as nothing and restarts from the config.
        s.set(LEARNED_PREFILL_KEY, b"xx", None).unwrap();
        assert_eq!(read_learned_prefill(&s), Ok(None));
        let again = learn_prefill(&s, 64_000.0, &sample).unwrap().unwrap();
        assert!((again - r).abs() < 1e-6);
    }

    /// `observe` as a `Result` of the entries written.
    fn obs<S: SharedStore + ?Sized>(
        c: &SharedIndexConfig,
        s: &S,
        host: usize,
        hashes: &[u64],
        now: u64,
    ) -> Result<u64, StoreError> {
        match c.observe(s, host, hashes, now) {
            (_, Some(e)) => Err(e),
            (o, None) => Ok(o.entries),
        }
    }

    #[test]
    fn forgetting_a_host_hides_and_then_drops_its_entries() {
        let s = MemStore::default();
        let c = cfg(1, 8);
        let (o, e) = c.observe(&s, 0, &[1, 2, 3], 100);
        assert!(e.is_none());
        assert_eq!(o.entries, 3);
        assert_eq!(o.bytes_delta, 3 * ENTRY_BYTES as i64);
        obs(&c, &s, 1, &[1, 2], 100).unwrap();
        assert_eq!(c.lookup(&s, &[1, 2, 3], &[0, 1], 100).0, vec![3000, 2000]);
        // Host 0 restarts at t=200: its entries stop counting, host 1's stay.
        forget_hosts(&s, &[0], 200).unwrap();
        assert_eq!(read_cutoffs(&s).unwrap(), vec![200]);
        assert_eq!(c.lookup(&s, &[1, 2, 3], &[0, 1], 200).0, vec![0, 2000]);
        // The next write of the bucket drops them (negative size change)...
        let (o, _) = c.observe(&s, 1, &[9], 201);
        assert_eq!(o.bytes_delta, (1 - 3) * ENTRY_BYTES as i64);
        // ... and what host 0 serves after the restart counts again.
        obs(&c, &s, 0, &[1], 202).unwrap();
        assert_eq!(c.lookup(&s, &[1, 2, 3], &[0, 1], 202).0, vec![1000, 2000]);
        // Cutoffs never move back; unknown hosts are padded.
        forget_hosts(&s, &[0], 150).unwrap();
        forget_hosts(&s, &[3], 300).unwrap();
        assert_eq!(read_cutoffs(&s).unwrap(), vec![200, 0, 0, 300]);
    }

    #[test]
    fn a_changed_host_list_forgets_everything() {
        let s = MemStore::default();
        let c = cfg(4, 8);
        // First configuration: nothing to forget.
        assert_eq!(reconcile_hosts(&s, 0xAAAA, 2, 10), Ok(false));
        obs(&c, &s, 0, &[1], 10).unwrap();
        obs(&c, &s, 1, &[2], 10).unwrap();
        // Same list again (another VM, or a reload): nothing forgotten.
        assert_eq!(reconcile_hosts(&s, 0xAAAA, 2, 20), Ok(false));
        assert_eq!(c.lookup(&s, &[1], &[0], 20).0, vec![1000]);
        // Another list: host indices may now name other replicas.
        assert_eq!(reconcile_hosts(&s, 0xBBBB, 3, 30), Ok(true));
        assert_eq!(c.lookup(&s, &[1], &[0], 30).0, vec![0]);
        assert_eq!(c.lookup(&s, &[2], &[1], 30).0, vec![0]);
        assert_eq!(read_cutoffs(&s).unwrap(), vec![30, 30, 30]);
        // Garbage cutoffs read as none.
        assert!(decode_cutoffs(Some(&[1, 2, 3])).is_empty());
    }

    fn cfg(buckets: u32, n: u32) -> SharedIndexConfig {
        SharedIndexConfig {
            buckets,
            bucket_entries: n,
            stride_bytes: 1000,
            dense_boundaries: 0,
            max_age_ms: 0,
        }
    }

    #[test]
    fn observe_then_lookup() {
        let s = MemStore::default();
        let c = cfg(4096, 8);
        let chain: Vec<u64> = (1..=10).map(|i| i * 0x1234_5678_9abc).collect();
        assert_eq!(obs(&c, &s, 2, &chain[..6], 100), Ok(6));
        assert_eq!(obs(&c, &s, 1, &chain[..3], 100), Ok(3));
        let (m, e) = c.lookup(&s, &chain, &[0, 1, 2], 100);
        assert!(e.is_none());
        assert_eq!(m, vec![0, 3000, 6000]);
        // The trait view agrees.
        let v = SharedLookup::new(&s, c);
        assert_eq!(v.lookup(&chain, &[2, 1], 100), vec![6000, 3000]);
        assert_eq!(v.errors().0, 0);
        assert_eq!(c.footprint_bytes(), 4096 * 8 * 18);
    }

    #[test]
    fn observing_a_batch_equals_observing_one_by_one() {
        // Buckets large enough never to overflow: the same bytes either way.
        let c = cfg(16, 64);
        let chains: Vec<(usize, Vec<u64>)> = (0..12u64)
            .map(|i| {
                let shared = (i % 3) * 1_000; // some prompts share a head
                let hashes = (0..(3 + i % 5)).map(|j| shared + j * 7 + i * 100).collect();
                ((i % 4) as usize, hashes)
            })
            .collect();
        let one = MemStore::default();
        let many = MemStore::default();
        // Something older in the store, and a forgotten host.
        for st in [&one, &many] {
            obs(&c, st, 1, &[5, 6, 7], 10).unwrap();
            obs(&c, st, 3, &[8, 9], 10).unwrap();
            forget_hosts(st, &[3], 20).unwrap();
        }
        let mut total = Observed::default();
        for (h, hs) in &chains {
            let (o, e) = c.observe(&one, *h, hs, 30);
            assert!(e.is_none());
            total.entries += o.entries;
            total.bytes_delta += o.bytes_delta;
        }
        let batch: Vec<(usize, &[u64])> = chains.iter().map(|(h, v)| (*h, v.as_slice())).collect();
        let (o, e) = c.observe_many(&many, &batch, 30);
        assert!(e.is_none());
        assert_eq!(o, total);
        for b in 0..16 {
            let k = bucket_key(b);
            assert_eq!(
                one.get(&k).unwrap().0,
                many.get(&k).unwrap().0,
                "bucket {b}"
            );
        }
        // A host index that does not fit is reported; the rest is written.
        let s = MemStore::default();
        let big: &[u64] = &[1, 2];
        let (o, e) = c.observe_many(&s, &[(70_000, big), (2, &[3, 4, 5])], 40);
        assert!(matches!(e, Some(StoreError::Other(m)) if m.contains("70000")));
        assert_eq!(o.entries, 3);
        assert_eq!(c.lookup(&s, &[3, 4, 5], &[2], 40).0, vec![3000]);
        // A full bucket keeps the batch's newest entries (shallowest first).
        let tight = cfg(1, 4);
        let s = MemStore::default();
        tight.observe_many(&s, &[(0, &[1, 2, 3]), (1, &[1, 2, 3])], 50);
        let (v, _) = s.get(&bucket_key(0)).unwrap();
        let mut kept: Vec<(u64, u16)> = decode(&v.unwrap())
            .iter()
            .map(|e| (e.hash, e.host))
            .collect();
        kept.sort();
        assert_eq!(kept, vec![(1, 0), (1, 1), (2, 0), (2, 1)]);
    }

    #[test]
    fn bucket_bound_evicts_oldest_deepest_first() {
        let s = MemStore::default();
        let c = cfg(1, 4);
        let chain: Vec<u64> = (1..=6).collect();
        obs(&c, &s, 0, &chain, 10).unwrap();
        let (v, _) = s.get(&bucket_key(0)).unwrap();
        let v = v.unwrap();
        assert_eq!(v.len(), 4 * ENTRY_BYTES);
        // The four shallowest survive.
        let mut kept: Vec<u64> = decode(&v).iter().map(|e| e.hash).collect();
        kept.sort();
        assert_eq!(kept, vec![1, 2, 3, 4]);
        assert_eq!(c.lookup(&s, &chain, &[0], 10).0, vec![4000]);
        // A newer observation by another host evicts the oldest.
        obs(&c, &s, 1, &[7], 20).unwrap();
        let (v, _) = s.get(&bucket_key(0)).unwrap();
        let hashes: Vec<u64> = decode(&v.unwrap()).iter().map(|e| e.hash).collect();
        assert!(hashes.contains(&7) && !hashes.contains(&4));
    }

    #[test]
    fn max_age_and_garbage() {
        let s = MemStore::default();
        let c = SharedIndexConfig {
            max_age_ms: 50,
            ..cfg(16, 8)
        };
        obs(&c, &s, 0, &[42], 100).unwrap();
        assert_eq!(c.lookup(&s, &[42], &[0], 150).0, vec![1000]);
        assert_eq!(c.lookup(&s, &[42], &[0], 151).0, vec![0]);
        // Garbage in every bucket: lookups see nothing, writes recover.
        for b in 0..16 {
            s.set(&bucket_key(b), b"garbage-that-is-not-18-bytes-x2--", None)
                .unwrap();
        }
        assert_eq!(c.lookup(&s, &[42, 43], &[0, 1], 100).0, vec![0, 0]);
        obs(&c, &s, 3, &[42, 43], 200).unwrap();
        assert_eq!(c.lookup(&s, &[42, 43], &[3], 200).0, vec![2000]);
        // Trailing bytes are dropped; overlong buckets trimmed on write.
        assert!(decode(&[1, 2, 3]).is_empty());
        let many: Vec<Entry> = (0..20)
            .map(|i| Entry {
                hash: 1000 + i,
                host: 9,
                stamp: i,
            })
            .collect();
        let b = c.bucket(5);
        s.set(&bucket_key(b), &encode(&many), None).unwrap();
        obs(&c, &s, 0, &[5], 300).unwrap();
        let (v, _) = s.get(&bucket_key(b)).unwrap();
        assert_eq!(decode(&v.unwrap()).len(), 8);
        // A host index that does not fit is an error, not a panic.
        assert!(obs(&c, &s, 70_000, &[1], 0).is_err());
    }

    #[test]
    fn pending_tokens_counter() {
        let s = MemStore::default();
        assert_eq!(read_pending_tokens(&s, "a"), Ok(0));
        let p = |tokens| crate::host_state::Pending {
            requests: 1,
            tokens,
        };
        crate::host_state::update(&s, "a", |r| r.add_pending(p(500))).unwrap();
        crate::host_state::update(&s, "a", |r| r.add_pending(p(250))).unwrap();
        assert_eq!(read_pending_tokens(&s, "a"), Ok(750));
        crate::host_state::release_pending(&s, "a", p(1000)).unwrap();
        assert_eq!(read_pending_tokens(&s, "a"), Ok(0));
        s.set("prefix_router/host/b", b"xyz", None).unwrap();
        assert_eq!(read_pending_tokens(&s, "b"), Ok(0));
    }

    /// A store whose reads fail.
    struct Broken;
    impl SharedStore for Broken {
        fn get(&self, _: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
            Err(StoreError::Other("down".into()))
        }
        fn set(&self, _: &str, _: &[u8], _: Option<u32>) -> Result<(), StoreError> {
            Err(StoreError::Other("down".into()))
        }
    }

    #[test]
    fn store_errors_are_reported() {
        let c = cfg(8, 8);
        assert!(obs(&c, &Broken, 0, &[1, 2], 0).is_err());
        let (m, e) = c.lookup(&Broken, &[1, 2], &[0], 0);
        assert_eq!(m, vec![0]);
        assert!(e.is_some());
        let v = SharedLookup::new(&Broken, c);
        assert_eq!(v.lookup(&[1], &[0], 0), vec![0]);
        assert_eq!(v.errors().0, 1);
    }

    #[test]
    fn capacity_clock_moves_the_horizon_after_a_cache_worth_of_tokens() {
        let mut c = CapacityClock::default();
        // A 1,600-token cache: checkpoints every 100 tokens.
        assert_eq!(c.advance(500, 1600, 10), None);
        assert_eq!(c.advance(500, 1600, 20), None);
        assert_eq!(c.advance(500, 1600, 30), None); // clock 1500 < budget
                                                    // Clock 2100: the checkpoint at clock 500 (time 10) is 1600 behind.
        assert_eq!(c.advance(600, 1600, 40), Some(10));
        assert_eq!(c.advance(0, 1600, 50), None); // nothing new
                                                  // Clock 2600: the checkpoint at clock 1000 (time 20).
        assert_eq!(c.advance(500, 1600, 60), Some(20));
        assert!(c.checkpoints.len() <= CAPACITY_STEPS as usize + 2);
        let back = CapacityClock::decode(Some(&c.encode()));
        assert_eq!(back, c);
        assert_eq!(
            CapacityClock::decode(Some(&[1, 2, 3])),
            CapacityClock::default()
        );
        // No budget: never moves.
        let mut d = CapacityClock::default();
        assert_eq!(d.advance(u64::MAX, 0, 1), None);
        // Many small steps keep the checkpoint list bounded.
        let mut e = CapacityClock::default();
        for t in 0..10_000u64 {
            e.advance(7, 1600, t);
        }
        assert!(
            e.checkpoints.len() <= CAPACITY_STEPS as usize + 2,
            "{}",
            e.checkpoints.len()
        );
        assert!(e.horizon_ms > 9_000);
    }

    #[test]
    fn capacity_horizon_hides_what_the_replica_has_evicted() {
        let s = MemStore::default();
        let c = cfg(64, 8);
        // Host 0 served prefix 1 at t=5, then 2,000 new tokens at t=10..
        obs(&c, &s, 0, &[1], 5).unwrap();
        assert_eq!(advance_capacity(&s, 0, 1000, 1500, 5).unwrap(), None);
        obs(&c, &s, 0, &[2], 10).unwrap();
        assert_eq!(advance_capacity(&s, 0, 1000, 1500, 10).unwrap(), None);
        // Clock 3000: the checkpoint at clock 1000 (time 5) is 1500 behind.
        let h = advance_capacity(&s, 0, 1000, 1500, 20).unwrap();
        assert_eq!(h, Some(5));
        forget_hosts(&s, &[0], 5).unwrap();
        // Prefix 1 (stamped at 5) still counts: only entries before 5 go.
        assert_eq!(c.lookup(&s, &[1], &[0], 30).0, vec![1000]);
        let h = advance_capacity(&s, 0, 1000, 1500, 40).unwrap();
        assert_eq!(h, Some(10));
        forget_hosts(&s, &[0], 10).unwrap();
        assert_eq!(c.lookup(&s, &[1], &[0], 50).0, vec![0]);
        assert_eq!(c.lookup(&s, &[2], &[0], 50).0, vec![1000]);
        // Another host is untouched.
        assert_eq!(advance_capacity(&s, 1, 10, 1500, 50).unwrap(), None);
    }

    #[cfg(not(target_family = "wasm"))]
    #[test]
    fn concurrent_observers_lose_no_entries() {
        use std::sync::Arc;
        let s = Arc::new(MemStore::default());
        // One bucket with room for everything: nothing may be lost.
        let c = cfg(1, 256);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        let p = t * 1000 + i;
                        while obs(&c, &*s, t as usize, &[p], i).is_err() {}
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for t in 0..4u64 {
            for i in 0..50u64 {
                let p = t * 1000 + i;
                assert_eq!(
                    c.lookup(&*s, &[p], &[t as usize], 0).0,
                    vec![1000],
                    "lost {p}"
                );
            }
        }
        // And with small buckets the bound holds under contention.
        let s = Arc::new(MemStore::default());
        let c = cfg(2, 3);
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..100u64 {
                        while obs(&c, &*s, t as usize, &[t * 1000 + i], i).is_err() {}
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for b in 0..2 {
            let (v, _) = s.get(&bucket_key(b)).unwrap();
            assert!(decode(&v.unwrap_or_default()).len() <= 3);
        }
    }
}
