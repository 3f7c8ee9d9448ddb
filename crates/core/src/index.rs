//! A learned prefix index: which hosts recently served which prompt prefix.
//!
//! ## What it records
//! The canonical prompt's chained chunk hashes `h_1..h_k`
//! ([`crate::hash::ChunkChain`]) identify every prefix of the prompt (and
//! the model). The index records one hash every `stride` chunks
//! (`h_s, h_2s, ...`; default 16 chunks of 64 bytes = 1 KiB, ~256 tokens),
//! mapping it to the hosts that served a request with that prefix, so a
//! request's `j`-th boundary hash found under host `H` means "`H` computed
//! (and probably still caches) the first `j * stride` chunks of this
//! prompt". It is updated from the host that actually served the request
//! ([`PrefixIndex::observe`], on the response), not from the routing
//! decision, so a spill or a fallback teaches it the truth.
//!
//! ## Thinning deep boundaries (`dense_boundaries`, default 16)
//! Every lookup and observation touches each recorded boundary, which in
//! the Envoy filter is one shared-data call each: linear in the prompt
//! length (a 1 MiB prompt has 1,024 boundaries at 1 KiB). So only the
//! first `D` boundaries are kept at every stride; beyond them the spacing
//! doubles each time the depth doubles: boundary number `b` (1-based, in
//! strides) is kept if `b <= D`, or if `b` is a multiple of `2^t` where
//! `2^(t-1) D < b <= 2^t D`. With `D = 16`: every 1 KiB up to 16 KiB, every
//! 2 KiB up to 32 KiB, every 4 KiB up to 64 KiB, ...: 40 boundaries for a
//! 128 KiB prompt instead of 128, 64 for 1 MiB instead of 1,024. The schedule
//! depends only on `b`, so turn `N` and turn `N + 1` share their boundaries;
//! a match is rounded down to a kept boundary, which under-credits a cached
//! prefix by at most `2 / D` of its length (12.5 % at `D = 16`). `D = 0`
//! keeps every boundary. [`thin`] applies it, [`boundary_number`] maps the
//! `j`-th kept boundary back to its depth.
//!
//! ## Lookup
//! [`PrefixIndex::lookup`] probes the request's boundary hashes from the
//! longest down and returns, per host, the longest recorded prefix in
//! bytes: one map lookup per kept boundary (see thinning above), stopping early once every host asked
//! about has a match. A match at boundary `j` is trusted without checking
//! the shorter boundaries (they are normally present: they are recorded
//! together and evicted deepest-first).
//!
//! ## Memory
//! An entry is one `(prefix hash, host)` pair. `max_entries` bounds them
//! over all hosts, least recently observed evicted first.
//!
//! ## A replica's cache capacity (`host_tokens`)
//! A replica's KV cache is an LRU: a prefix is gone once about `host_tokens`
//! newer tokens went through it. [`PrefixIndex::take_in`] runs the Envoy
//! filter's per-host capacity clock ([`CapacityClock`],
//! the same code): the caller adds the uncached prompt tokens of each
//! response (the prompt minus what the index credited the host with), and
//! when the clock has moved `host_tokens` past a checkpoint, the host's
//! entries stamped before that checkpoint's time are dropped. Entries
//! observed again since carry a newer stamp and stay, as in the replica's
//! LRU. (Earlier this index counted entries against `host_tokens / stride
//! tokens` instead; with thinning a deep entry stands for several strides,
//! so on long prompts it believed a host held up to twice its cache:
//! BENCHMARKS "Sizing the index".)
//!
//! Within one observation the deepest boundary gets the oldest stamp, so a
//! prompt's tail is evicted before its head, as a replica's LRU does.
//! Entries older than `max_age_ms` (if set) are ignored by lookups and
//! evicted lazily. [`PrefixIndex::forget_host`] drops a host's entries (a
//! restart or cache flush); [`PrefixIndex::footprint_bytes`] estimates the
//! memory used (for a metric).
//!
//! ## Determinism
//! No clock: time comes in as `now_ms`. Ordered maps only (`BTreeMap`), so
//! eviction order and results depend only on the sequence of calls; stamps
//! are `(now_ms, sequence number)`. Every operation is O(log n) per entry
//! touched.

use std::collections::BTreeMap;

/// Whether boundary number `b` (1-based, in strides) is kept when the
/// first `dense` boundaries are kept at every stride and the spacing then
/// doubles each time the depth doubles (see the module docs). `dense` 0
/// keeps every boundary; an odd `dense` is treated as the next even number.
pub fn boundary_kept(b: u64, dense: u32) -> bool {
    let d = u64::from(dense);
    if d == 0 || b <= d {
        return b > 0;
    }
    let d = d + (d & 1);
    // Smallest t >= 1 with b <= 2^t d; the spacing there is 2^t.
    let mut t = 1u32;
    while t < 63 && b > (d << t) {
        t += 1;
    }
    b.is_multiple_of(1u64 << t)
}

/// The depth (boundary number, 1-based, in strides) of the `j`-th kept
/// boundary (0-based), the inverse of [`thin`]'s selection.
pub fn boundary_number(j: usize, dense: u32) -> u64 {
    let j = j as u64;
    let d = u64::from(dense);
    if d == 0 || j < d {
        return j + 1;
    }
    let d = d + (d & 1);
    // Each tier t >= 1 keeps d / 2 boundaries, at 2^(t-1) d + i 2^t, i = 1..=d/2.
    let half = d / 2;
    let k = j - d;
    let t = 1 + k / half;
    let i = k % half + 1;
    if t >= 63 {
        return u64::MAX;
    }
    (d << (t - 1)).saturating_add(i.saturating_mul(1u64 << t))
}

/// Keep the boundaries [`boundary_kept`] selects from a full strided
/// history (`h_s, h_2s, ...`).
pub fn thin(history: &[u64], dense: u32) -> Vec<u64> {
    history
        .iter()
        .enumerate()
        .filter(|(i, _)| boundary_kept(*i as u64 + 1, dense))
        .map(|(_, h)| *h)
        .collect()
}

/// Index bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexConfig {
    /// Chunks between recorded boundaries (>= 1).
    pub stride_chunks: u32,
    /// Boundaries kept at every stride before thinning (0: all; see the
    /// module docs).
    pub dense_boundaries: u32,
    /// Bytes per chunk (the config's `chunk_bytes`).
    pub chunk_bytes: u32,
    /// Most `(prefix, host)` entries kept in total (>= 1).
    pub max_entries: usize,
    /// A replica's KV cache in tokens, the budget of each host's capacity
    /// clock ([`PrefixIndex::take_in`]; 0: no per-host bound).
    pub host_tokens: u64,
    /// Bytes per token, to convert a stride to tokens (>= 1 after rounding
    /// of the configured float; see [`IndexConfig::stride_tokens`]).
    pub bytes_per_token: f64,
    /// Entries older than this are ignored (0: never).
    pub max_age_ms: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            stride_chunks: 16,
            dense_boundaries: 16,
            chunk_bytes: 64,
            max_entries: 1 << 16,
            host_tokens: 400_000,
            bytes_per_token: 4.0,
            max_age_ms: 0,
        }
    }
}

impl IndexConfig {
    /// Bytes between boundaries.
    pub fn stride_bytes(&self) -> u64 {
        u64::from(self.stride_chunks.max(1)) * u64::from(self.chunk_bytes.max(1))
    }

    /// Prompt bytes through the `j`-th kept boundary (0-based).
    pub fn boundary_bytes(&self, j: usize) -> u64 {
        boundary_number(j, self.dense_boundaries).saturating_mul(self.stride_bytes())
    }

    /// Tokens one entry stands for (at least 1).
    pub fn stride_tokens(&self) -> u64 {
        let t = self.stride_bytes() as f64 / self.bytes_per_token.max(f64::MIN_POSITIVE);
        (t.round() as u64).max(1)
    }
}

/// Checkpoints kept per host by [`CapacityClock::advance`] (one every
/// `budget / CAPACITY_STEPS` tokens).
pub const CAPACITY_STEPS: u64 = 16;

/// A host's capacity clock: tokens taken into its cache so far, the last
/// horizon applied, and checkpoints `(clock, time_ms)`, oldest first. Kept
/// per host by [`PrefixIndex::take_in`] and, in shared data, by
/// [`crate::shared_index::advance_capacity`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityClock {
    pub clock: u64,
    pub horizon_ms: u64,
    pub checkpoints: Vec<(u64, u64)>,
}

impl CapacityClock {
    /// Decode (little-endian u64s: clock, horizon, then pairs); malformed
    /// or missing values decode as a fresh clock.
    pub fn decode(v: Option<&[u8]>) -> CapacityClock {
        let words: Vec<u64> = v
            .unwrap_or(&[])
            .chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
            .collect();
        match words.as_slice() {
            [clock, horizon_ms, rest @ ..] => CapacityClock {
                clock: *clock,
                horizon_ms: *horizon_ms,
                checkpoints: rest
                    .chunks_exact(2)
                    .filter_map(|p| match p {
                        [c, t] => Some((*c, *t)),
                        _ => None,
                    })
                    .collect(),
            },
            _ => CapacityClock::default(),
        }
    }

    /// Encode (see [`CapacityClock::decode`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 16 * self.checkpoints.len());
        out.extend_from_slice(&self.clock.to_le_bytes());
        out.extend_from_slice(&self.horizon_ms.to_le_bytes());
        for (c, t) in &self.checkpoints {
            out.extend_from_slice(&c.to_le_bytes());
            out.extend_from_slice(&t.to_le_bytes());
        }
        out
    }

    /// Add `tokens` taken in at `now_ms` with a cache of `budget` tokens;
    /// returns the new horizon if it moved: entries of this host stamped
    /// before it have been pushed out of its cache.
    pub fn advance(&mut self, tokens: u64, budget: u64, now_ms: u64) -> Option<u64> {
        if budget == 0 {
            return None;
        }
        self.clock = self.clock.saturating_add(tokens);
        let step = (budget / CAPACITY_STEPS).max(1);
        if self
            .checkpoints
            .last()
            .is_none_or(|&(c, _)| self.clock.saturating_sub(c) >= step)
        {
            self.checkpoints.push((self.clock, now_ms));
        }
        // The newest checkpoint at least `budget` tokens behind the clock:
        // the host was sent everything before its time at least `budget`
        // tokens ago.
        let target = self.clock.checked_sub(budget)?;
        let i = self.checkpoints.iter().rposition(|&(c, _)| c <= target)?;
        let t = self.checkpoints.get(i).map(|&(_, t)| t)?;
        // Older checkpoints can never be the answer again.
        self.checkpoints.drain(..i);
        if t > self.horizon_ms {
            self.horizon_ms = t;
            Some(t)
        } else {
            None
        }
    }
}

/// Something that answers "how much of this prompt does each host hold?"
/// for [`crate::cost::place`]: the in-memory [`PrefixIndex`] (simulator)
/// or the shared-data index ([`crate::shared_index::SharedLookup`], the
/// Envoy filter).
pub trait PrefixLookup {
    /// For each host in `hosts`, the longest recorded prefix of the request
    /// with boundary hashes `hashes` (shortest first), in bytes.
    fn lookup(&self, hashes: &[u64], hosts: &[usize], now_ms: u64) -> Vec<u64>;
}

impl PrefixLookup for PrefixIndex {
    fn lookup(&self, hashes: &[u64], hosts: &[usize], now_ms: u64) -> Vec<u64> {
        PrefixIndex::lookup(self, hashes, hosts, now_ms)
    }
}

/// Ordering stamp of an entry: `(now_ms, sequence)`.
type Stamp = (u64, u64);

/// Estimated bytes per entry: the entry in the prefix map (host, stamp) plus
/// its place in the global and per-host LRU maps, with B-tree overhead.
const ENTRY_BYTES: usize = 96;
/// Estimated bytes per distinct prefix hash (map key and vector header).
const PREFIX_BYTES: usize = 48;

/// The index (one per proxy: a router learns from its own responses).
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    cfg: IndexConfig,
    /// prefix hash -> hosts holding it, with their stamp.
    map: BTreeMap<u64, Vec<(u32, Stamp)>>,
    /// All entries by age.
    lru: BTreeMap<Stamp, (u64, u32)>,
    /// Per host: its entries by age.
    per_host: BTreeMap<u32, BTreeMap<Stamp, u64>>,
    /// Per host: its capacity clock ([`PrefixIndex::take_in`]).
    clocks: BTreeMap<u32, CapacityClock>,
    seq: u64,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new(cfg: IndexConfig) -> PrefixIndex {
        PrefixIndex {
            cfg,
            map: BTreeMap::new(),
            lru: BTreeMap::new(),
            per_host: BTreeMap::new(),
            clocks: BTreeMap::new(),
            seq: 0,
        }
    }

    /// The bounds.
    pub fn config(&self) -> &IndexConfig {
        &self.cfg
    }

    /// Number of `(prefix, host)` entries.
    pub fn len(&self) -> usize {
        self.lru.len()
    }

    /// No entries?
    pub fn is_empty(&self) -> bool {
        self.lru.is_empty()
    }

    /// Entries held for `host`.
    pub fn host_len(&self, host: usize) -> usize {
        u32::try_from(host)
            .ok()
            .and_then(|h| self.per_host.get(&h))
            .map_or(0, BTreeMap::len)
    }

    /// Estimated memory in bytes (entries and distinct prefixes).
    pub fn footprint_bytes(&self) -> usize {
        self.lru.len() * ENTRY_BYTES + self.map.len() * PREFIX_BYTES
    }

    /// `host` served a request whose strided boundary hashes are `hashes`
    /// (`h_s, h_2s, ...`, shortest first, as
    /// [`crate::key::KeySink::chain_history`] returns them).
    pub fn observe(&mut self, host: usize, hashes: &[u64], now_ms: u64) {
        let Ok(h) = u32::try_from(host) else {
            return;
        };
        // Deepest first: it gets the oldest stamp and is evicted first.
        for &p in hashes.iter().rev() {
            let stamp = (now_ms, self.seq);
            self.seq = self.seq.wrapping_add(1);
            let hosts = self.map.entry(p).or_default();
            let old = match hosts.iter_mut().find(|(x, _)| *x == h) {
                Some(e) => Some(std::mem::replace(&mut e.1, stamp)),
                None => {
                    hosts.push((h, stamp));
                    None
                }
            };
            let mine = self.per_host.entry(h).or_default();
            if let Some(o) = old {
                self.lru.remove(&o);
                mine.remove(&o);
            }
            self.lru.insert(stamp, (p, h));
            mine.insert(stamp, p);
        }
        while self.lru.len() > self.cfg.max_entries.max(1) {
            let Some((s, _)) = self.lru.first_key_value() else {
                break;
            };
            let s = *s;
            self.remove(s);
        }
        if self.cfg.max_age_ms > 0 {
            // Lazy expiry of a few stale entries per call (bounded work).
            for _ in 0..hashes.len().max(1) * 2 {
                match self.lru.first_key_value() {
                    Some((s, _)) if self.stale(*s, now_ms) => {
                        let s = *s;
                        self.remove(s);
                    }
                    _ => break,
                }
            }
        }
    }

    fn stale(&self, s: Stamp, now_ms: u64) -> bool {
        self.cfg.max_age_ms > 0 && now_ms.saturating_sub(s.0) > self.cfg.max_age_ms
    }

    /// Remove the entry stamped `s` from all three maps.
    fn remove(&mut self, s: Stamp) {
        let Some((p, h)) = self.lru.remove(&s) else {
            return;
        };
        if let Some(m) = self.per_host.get_mut(&h) {
            m.remove(&s);
            if m.is_empty() {
                self.per_host.remove(&h);
            }
        }
        if let Some(v) = self.map.get_mut(&p) {
            v.retain(|(x, st)| !(*x == h && *st == s));
            if v.is_empty() {
                self.map.remove(&p);
            }
        }
    }

    /// `host` took `tokens` new (uncached) tokens into its cache at
    /// `now_ms`: advance its capacity clock (the filter's
    /// [`CapacityClock::advance`] with budget `host_tokens`) and, if that
    /// pushed older prefixes out of its cache, drop the host's entries
    /// stamped before the new horizon. Returns the horizon when it moved.
    /// Does nothing with `host_tokens = 0`.
    pub fn take_in(&mut self, host: usize, tokens: u64, now_ms: u64) -> Option<u64> {
        let h = u32::try_from(host).ok()?;
        let budget = self.cfg.host_tokens;
        if budget == 0 {
            return None;
        }
        let horizon = self
            .clocks
            .entry(h)
            .or_default()
            .advance(tokens, budget, now_ms)?;
        while let Some((&s, _)) = self.per_host.get(&h).and_then(|m| m.first_key_value()) {
            if s.0 >= horizon {
                break;
            }
            self.remove(s);
        }
        Some(horizon)
    }

    /// Drop everything recorded for `host` (restart, cache flush).
    pub fn forget_host(&mut self, host: usize) {
        let Ok(h) = u32::try_from(host) else {
            return;
        };
        let Some(m) = self.per_host.remove(&h) else {
            return;
        };
        for (s, p) in m {
            self.lru.remove(&s);
            if let Some(v) = self.map.get_mut(&p) {
                v.retain(|(x, _)| *x != h);
                if v.is_empty() {
                    self.map.remove(&p);
                }
            }
        }
    }

    /// For each host in `hosts`, the longest recorded prefix of this
    /// request (boundary hashes `hashes`, shortest first) it holds, in
    /// bytes (through its deepest kept boundary; 0 if none). Probes from the
    /// longest boundary down, stopping when every host has a match.
    pub fn lookup(&self, hashes: &[u64], hosts: &[usize], now_ms: u64) -> Vec<u64> {
        let mut out = vec![0u64; hosts.len()];
        let mut left = hosts.len();
        for (j, p) in hashes.iter().enumerate().rev() {
            if left == 0 {
                break;
            }
            let Some(v) = self.map.get(p) else {
                continue;
            };
            for &(h, s) in v {
                if self.stale(s, now_ms) {
                    continue;
                }
                for (i, want) in hosts.iter().enumerate() {
                    if *want == h as usize {
                        if let Some(o) = out.get_mut(i) {
                            if *o == 0 {
                                *o = self.cfg.boundary_bytes(j);
                                left -= 1;
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// The longest recorded prefix held by `host`, in bytes.
    pub fn matched_bytes(&self, hashes: &[u64], host: usize, now_ms: u64) -> u64 {
        self.lookup(hashes, &[host], now_ms)
            .first()
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn thinning_schedule_is_consistent() {
        for d in [0u32, 2, 4, 16, 64] {
            let mut prev = 0u64;
            let mut kept = 0usize;
            for b in 1..=5000u64 {
                if boundary_kept(b, d) {
                    assert_eq!(boundary_number(kept, d), b, "d={d} j={kept}");
                    kept += 1;
                    if d > 0 && prev > 0 {
                        // The gap below a kept boundary is at most 2/d of it.
                        assert!((b - prev) as f64 <= 2.0 / f64::from(d) * b as f64 + 1.0);
                    }
                    prev = b;
                }
            }
            if d == 0 {
                assert_eq!(kept, 5000);
            }
        }
        let count = |n: u64, d: u32| (1..=n).filter(|b| boundary_kept(*b, d)).count();
        assert_eq!(count(16, 16), 16);
        assert_eq!(count(128, 16), 40);
        assert_eq!(count(1024, 16), 64);
        assert_eq!(boundary_number(16, 16), 18);
        assert_eq!(boundary_number(24, 16), 36);
        assert_eq!(thin(&[1, 2, 3, 4, 5, 6, 7, 8], 2), vec![1, 2, 4, 8]);
        assert_eq!(thin(&[1, 2, 3], 0), vec![1, 2, 3]);
        assert!(boundary_number(usize::MAX, 2) == u64::MAX);
    }

    #[test]
    fn thinned_lookup_reports_the_depth_in_bytes() {
        let cfg = IndexConfig {
            stride_chunks: 1,
            chunk_bytes: 1024,
            dense_boundaries: 2,
            ..IndexConfig::default()
        };
        let mut ix = PrefixIndex::new(cfg);
        // 8 KiB prompt: kept boundaries at 1, 2, 4, 8 KiB.
        let chain = thin(&(1..=8).collect::<Vec<u64>>(), 2);
        ix.observe(3, &chain[..3], 0); // served the first 4 KiB
        assert_eq!(ix.lookup(&chain, &[3, 1], 0), vec![4096, 0]);
    }

    use super::*;
    use proptest::prelude::*;

    fn cfg(max_entries: usize, host_tokens: u64) -> IndexConfig {
        IndexConfig {
            stride_chunks: 1,
            dense_boundaries: 0,
            chunk_bytes: 4,
            max_entries,
            host_tokens,
            bytes_per_token: 4.0,
            max_age_ms: 0,
        }
    }

    /// A prompt's boundary hashes: `base` then `len - 1` more (distinct
    /// prompts share a prefix by sharing leading values).
    fn chain(prefix: &[u64], extra: u64, len: usize) -> Vec<u64> {
        let mut v = prefix.to_vec();
        let mut x = extra;
        while v.len() < len {
            x = crate::hash::hash(&x.to_le_bytes(), 1);
            v.push(x);
        }
        v
    }

    #[test]
    fn longest_prefix_per_host() {
        let mut ix = PrefixIndex::new(cfg(1000, 0));
        let a = chain(&[], 1, 10);
        ix.observe(0, &a[..4], 0);
        ix.observe(1, &a, 0);
        let b = chain(&a[..6], 2, 12); // shares 6 boundaries with `a`
        assert_eq!(ix.lookup(&b, &[0, 1, 2], 0), vec![16, 24, 0]);
        assert_eq!(ix.matched_bytes(&a, 1, 0), 40);
    }

    #[test]
    fn capacity_clock_drops_what_the_replica_pushed_out() {
        // A 1,600-token cache: checkpoints every 100 tokens.
        let mut ix = PrefixIndex::new(cfg(1000, 1600));
        let a = chain(&[], 1, 4);
        let b = chain(&[], 2, 4);
        let c = chain(&[], 3, 4);
        ix.observe(0, &a, 10);
        assert_eq!(ix.take_in(0, 1000, 10), None);
        ix.observe(1, &b, 20);
        assert_eq!(ix.take_in(1, 5000, 20), None); // another host's clock
        ix.observe(0, &b, 20);
        assert_eq!(ix.take_in(0, 500, 20), None); // clock 1500 < 1600
        assert_eq!(ix.matched_bytes(&a, 0, 20), 16);
        // Clock 2100: no checkpoint is 1600 behind yet (the oldest is at
        // 1000).
        ix.observe(0, &c, 30);
        assert_eq!(ix.take_in(0, 600, 30), None);
        // Clock 3800: the checkpoint at 2100 (time 30) is 1700 behind.
        assert_eq!(ix.take_in(0, 1700, 40), Some(30));
        assert_eq!(ix.matched_bytes(&a, 0, 40), 0);
        assert_eq!(ix.matched_bytes(&b, 0, 40), 0);
        assert_eq!(ix.matched_bytes(&c, 0, 40), 16);
        // Host 1 keeps what it holds; `a` used again on host 0 is back.
        assert_eq!(ix.matched_bytes(&b, 1, 40), 16);
        ix.observe(0, &a, 41);
        assert_eq!(ix.matched_bytes(&a, 0, 41), 16);
        // host_tokens 0: no clock.
        let mut ix = PrefixIndex::new(cfg(1000, 0));
        ix.observe(0, &a, 0);
        assert_eq!(ix.take_in(0, u64::MAX, 1), None);
        assert_eq!(ix.matched_bytes(&a, 0, 1), 16);
    }

    #[test]
    fn forget_host() {
        let mut ix = PrefixIndex::new(cfg(1000, 0));
        let a = chain(&[], 1, 6);
        ix.observe(0, &a, 0);
        ix.observe(1, &a, 0);
        let before = ix.footprint_bytes();
        ix.forget_host(0);
        assert_eq!(ix.host_len(0), 0);
        assert_eq!(ix.len(), 6);
        assert!(ix.footprint_bytes() < before);
        assert_eq!(ix.lookup(&a, &[0, 1], 0), vec![0, 24]);
        ix.forget_host(1);
        assert!(ix.is_empty());
        assert_eq!(ix.footprint_bytes(), 0);
    }

    #[test]
    fn max_age_ignores_stale_entries() {
        let mut c = cfg(1000, 0);
        c.max_age_ms = 100;
        let mut ix = PrefixIndex::new(c);
        let a = chain(&[], 1, 3);
        ix.observe(0, &a, 1000);
        assert_eq!(ix.matched_bytes(&a, 0, 1100), 12);
        assert_eq!(ix.matched_bytes(&a, 0, 1101), 0);
        ix.observe(1, &chain(&[], 2, 3), 2000);
        assert_eq!(ix.host_len(0), 0);
    }

    #[test]
    fn default_stride_is_one_kib() {
        let c = IndexConfig::default();
        assert_eq!(c.stride_bytes(), 1024);
        assert_eq!(c.stride_tokens(), 256);
    }

    proptest! {
        /// Bounds hold after every call, lookups agree with a naive
        /// reference that keeps every observation and replays the LRU rule,
        /// and all three maps stay consistent.
        #[test]
        fn bounds_and_reference(ops in proptest::collection::vec((0usize..4, 0u64..6, 1usize..6, 0u8..10), 1..80),
                                max_entries in 1usize..30, host_tokens in 0u64..12) {
            let c = cfg(max_entries, host_tokens);
            let mut ix = PrefixIndex::new(c);
            // Reference: list of (stamp order, prefix, host), oldest first.
            let mut reference: Vec<(u64, u32)> = Vec::new();
            let mut t = 0u64;
            for (host, prompt, len, op) in ops {
                let hs = chain(&[], prompt, len);
                if op == 0 {
                    ix.forget_host(host);
                    reference.retain(|(_, h)| *h as usize != host);
                } else {
                    ix.observe(host, &hs, t);
                    for p in hs.iter().rev() {
                        reference.retain(|(q, h)| !(*q == *p && *h as usize == host));
                        reference.push((*p, host as u32));
                    }
                    while reference.len() > max_entries {
                        reference.remove(0);
                    }
                }
                t += 1;
                prop_assert!(ix.len() <= max_entries);
                prop_assert_eq!(ix.len(), reference.len());
                let per: usize = ix.per_host.values().map(BTreeMap::len).sum();
                prop_assert_eq!(per, ix.len());
                let in_map: usize = ix.map.values().map(Vec::len).sum();
                prop_assert_eq!(in_map, ix.len());
                // Lookup equals the reference's longest held boundary.
                for q in 0..6u64 {
                    let qs = chain(&[], q, 5);
                    let got = ix.lookup(&qs, &[0, 1, 2, 3], t);
                    for (h, g) in got.iter().enumerate() {
                        let want = qs.iter().enumerate().rev()
                            .find(|(_, p)| reference.iter().any(|(r, rh)| r == *p && *rh as usize == h))
                            .map_or(0, |(j, _)| (j as u64 + 1) * 4);
                        prop_assert_eq!(*g, want);
                    }
                }
            }
        }
    }
}
