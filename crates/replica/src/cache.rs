//! [`PrefixCache`]: a block-granular prefix KV cache.
//!
//! ## Model
//!
//! * Capacity is in tokens (`capacity_tokens`); blocks hold `block_tokens`
//!   tokens each. KV memory is shared between
//!   - **cached blocks** (keyed by chained [`BlockHash`]), each either
//!     *pinned* (ref-count > 0: used by a running request) or *evictable*
//!     (ref-count 0), and
//!   - **private tokens** reserved by running requests for KV that is never
//!     shared (the trailing partial block and the generated tokens).
//! * Invariant (except under forced admission, see [`PrefixCache::acquire`]):
//!   `resident_blocks * block_tokens + private_tokens <= capacity_tokens`.
//! * Evictable blocks are evicted **LRU** (least recently released first)
//!   when room is needed. When a request releases its blocks they are
//!   released tail-first, so a prefix's deepest blocks are evicted before its
//!   root, as vLLM's free-block queue does.
//! * A lookup ([`PrefixCache::lookup`]) returns how many *leading* blocks of
//!   a prompt are cached (stopping at the first miss).
//! * Counters, like vLLM v1's `vllm:prefix_cache_queries` /
//!   `vllm:prefix_cache_hits`, are in tokens: each counted query
//!   ([`PrefixCache::query`]) adds the prompt's token count to `queries` and
//!   the cached tokens to `hits`. As in vLLM, at least one prompt token is
//!   always recomputed: a fully cached prompt hits all but its last block.
//! * [`PrefixCache::usage`] is vLLM's `kv_cache_usage_perc`: the fraction of
//!   memory held by running requests (pinned blocks + private tokens);
//!   evictable cached blocks count as free, as in vLLM.
//!
//! Deterministic: no decision depends on hash-map iteration order.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::prompt::BlockHash;

/// Hasher for keys that are already well-mixed 64-bit hashes.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Copy)]
struct Entry {
    refs: u32,
    /// LRU position while evictable (refs == 0).
    tick: u64,
}

/// Prefix KV cache over chained block hashes. See the module docs.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    block_tokens: u32,
    capacity_tokens: u64,
    map: IdMap<BlockHash, Entry>,
    /// Evictable blocks by LRU tick (smallest = least recently used).
    lru: BTreeMap<u64, BlockHash>,
    tick: u64,
    pinned_blocks: u64,
    private_tokens: u64,
    queries: u64,
    hits: u64,
    evictions: u64,
}

impl PrefixCache {
    /// Empty cache of `capacity_tokens` tokens with `block_tokens`-token
    /// blocks (`0` is treated as 1).
    pub fn new(capacity_tokens: u64, block_tokens: u32) -> Self {
        Self {
            block_tokens: block_tokens.max(1),
            capacity_tokens,
            map: IdMap::default(),
            lru: BTreeMap::new(),
            tick: 0,
            pinned_blocks: 0,
            private_tokens: 0,
            queries: 0,
            hits: 0,
            evictions: 0,
        }
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Capacity in tokens.
    pub fn capacity_tokens(&self) -> u64 {
        self.capacity_tokens
    }

    fn bt(&self) -> u64 {
        u64::from(self.block_tokens)
    }

    /// Is this block resident (pinned or evictable)?
    pub fn contains(&self, block: BlockHash) -> bool {
        self.map.contains_key(&block)
    }

    /// Number of leading blocks of `blocks` that are resident. Pure: no
    /// counters, no LRU update.
    pub fn lookup(&self, blocks: &[BlockHash]) -> usize {
        blocks
            .iter()
            .take_while(|b| self.map.contains_key(b))
            .count()
    }

    /// Tokens of a `prompt_tokens`-token prompt with these blocks that would
    /// be served from cache: leading cached blocks, capped so that at least
    /// one token is recomputed (vLLM v1 behaviour). Pure.
    pub fn cached_tokens(&self, blocks: &[BlockHash], prompt_tokens: u64) -> u64 {
        let bt = self.bt();
        let max_blocks = prompt_tokens.saturating_sub(1) / bt;
        let hit_blocks = (self.lookup(blocks) as u64).min(max_blocks);
        hit_blocks * bt
    }

    /// Counted lookup: like [`Self::cached_tokens`], and adds
    /// `prompt_tokens` to the query counter and the result to the hit
    /// counter.
    pub fn query(&mut self, blocks: &[BlockHash], prompt_tokens: u64) -> u64 {
        let hit = self.cached_tokens(blocks, prompt_tokens);
        self.queries = self.queries.saturating_add(prompt_tokens);
        self.hits = self.hits.saturating_add(hit);
        hit
    }

    /// Could [`Self::acquire`] pin/insert `blocks` and reserve
    /// `private_tokens` without exceeding capacity (evicting unpinned blocks
    /// as needed)? Conservative if `blocks` has duplicates.
    pub fn fits(&self, blocks: &[BlockHash], private_tokens: u64) -> bool {
        let mut newly_pinned = 0u64;
        for b in blocks {
            match self.map.get(b) {
                Some(e) if e.refs > 0 => {}
                _ => newly_pinned += 1,
            }
        }
        let need = (self.pinned_blocks + newly_pinned)
            .saturating_mul(self.bt())
            .saturating_add(self.private_tokens)
            .saturating_add(private_tokens);
        need <= self.capacity_tokens
    }

    /// Pin `blocks` (inserting missing ones) and reserve `private_tokens`,
    /// evicting LRU unpinned blocks to make room.
    ///
    /// Returns `false` (and changes nothing) if it does not fit, unless
    /// `force` is set: then it always succeeds and memory may exceed
    /// capacity until released (used to admit a request larger than the
    /// whole cache when nothing else runs). Every successful `acquire` must
    /// be matched by a [`Self::release`] with the same arguments.
    pub fn acquire(&mut self, blocks: &[BlockHash], private_tokens: u64, force: bool) -> bool {
        if !force && !self.fits(blocks, private_tokens) {
            return false;
        }
        // 1. Pin the resident ones so eviction cannot take them.
        let mut missing = 0u64;
        for b in blocks {
            if let Some(e) = self.map.get_mut(b) {
                if e.refs == 0 {
                    self.lru.remove(&e.tick);
                    self.pinned_blocks += 1;
                }
                e.refs = e.refs.saturating_add(1);
            } else {
                missing += 1;
            }
        }
        // 2. Make room for the missing blocks and the private tokens.
        self.private_tokens = self.private_tokens.saturating_add(private_tokens);
        let extra = missing.saturating_mul(self.bt());
        self.evict_until(extra);
        // 3. Insert the missing ones, pinned.
        for b in blocks {
            if !self.map.contains_key(b) {
                self.map.insert(*b, Entry { refs: 1, tick: 0 });
                self.pinned_blocks += 1;
            }
        }
        true
    }

    /// Unpin `blocks` and free `private_tokens` (the arguments of a previous
    /// successful [`Self::acquire`]). Blocks are released tail-first, so the
    /// deepest blocks become least recently used. Unknown blocks are ignored.
    pub fn release(&mut self, blocks: &[BlockHash], private_tokens: u64) {
        for b in blocks.iter().rev() {
            if let Some(e) = self.map.get_mut(b) {
                if e.refs == 0 {
                    continue;
                }
                e.refs -= 1;
                if e.refs == 0 {
                    self.tick += 1;
                    e.tick = self.tick;
                    self.lru.insert(self.tick, *b);
                    self.pinned_blocks = self.pinned_blocks.saturating_sub(1);
                }
            }
        }
        self.private_tokens = self.private_tokens.saturating_sub(private_tokens);
        // After a forced acquire memory may exceed capacity: trim now.
        self.evict_until(0);
    }

    /// Evict LRU unpinned blocks until `extra` more tokens fit (or nothing
    /// is evictable).
    fn evict_until(&mut self, extra: u64) {
        let bt = self.bt();
        while (self.map.len() as u64)
            .saturating_mul(bt)
            .saturating_add(self.private_tokens)
            .saturating_add(extra)
            > self.capacity_tokens
        {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            self.map.remove(&victim);
            self.evictions += 1;
        }
    }

    /// Drop every unpinned block (pinned blocks of running requests stay).
    pub fn clear(&mut self) {
        while let Some((_, victim)) = self.lru.pop_first() {
            self.map.remove(&victim);
        }
    }

    /// Zero the query/hit/eviction counters.
    pub fn reset_counters(&mut self) {
        self.queries = 0;
        self.hits = 0;
        self.evictions = 0;
    }

    /// Tokens queried so far (vLLM `prefix_cache_queries`).
    pub fn queries(&self) -> u64 {
        self.queries
    }

    /// Tokens hit so far (vLLM `prefix_cache_hits`).
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Resident blocks (pinned + evictable).
    pub fn resident_blocks(&self) -> usize {
        self.map.len()
    }

    /// Pinned blocks.
    pub fn pinned_blocks(&self) -> u64 {
        self.pinned_blocks
    }

    /// Private (non-cacheable) tokens reserved by running requests.
    pub fn private_tokens(&self) -> u64 {
        self.private_tokens
    }

    /// Resident tokens (pinned + evictable blocks) plus private tokens.
    pub fn used_tokens(&self) -> u64 {
        (self.map.len() as u64)
            .saturating_mul(self.bt())
            .saturating_add(self.private_tokens)
    }

    /// Fraction of capacity held by running requests (pinned blocks and
    /// private tokens), clamped to `0..=1`. Evictable blocks count as free.
    pub fn usage(&self) -> f64 {
        if self.capacity_tokens == 0 {
            return if self.pinned_blocks > 0 || self.private_tokens > 0 {
                1.0
            } else {
                0.0
            };
        }
        let held = self.pinned_blocks * self.bt() + self.private_tokens;
        (held as f64 / self.capacity_tokens as f64).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// A cache of 4 blocks of 1 token, for easy counting.
    fn tiny() -> PrefixCache {
        PrefixCache::new(4, 1)
    }

    fn insert(c: &mut PrefixCache, blocks: &[u64]) {
        assert!(c.acquire(blocks, 0, false));
        c.release(blocks, 0);
    }

    #[test]
    fn lookup_counts_leading_blocks_only() {
        let mut c = PrefixCache::new(100, 1);
        insert(&mut c, &[1, 2, 3]);
        assert_eq!(c.lookup(&[1, 2, 3, 4]), 3);
        assert_eq!(c.lookup(&[1, 9, 3]), 1);
        assert_eq!(c.lookup(&[9, 1, 2]), 0);
        assert_eq!(c.lookup(&[]), 0);
    }

    #[test]
    fn lru_evicts_least_recently_released_and_tail_first() {
        let mut c = tiny();
        insert(&mut c, &[1, 2]); // released tail-first: 2 older than 1
        insert(&mut c, &[3, 4]); // 4 then 3
        assert_eq!(c.resident_blocks(), 4);
        // Need one slot: evicts 2 (oldest), then 1.
        insert(&mut c, &[5]);
        assert!(!c.contains(2));
        assert!(c.contains(1));
        insert(&mut c, &[6]);
        assert!(!c.contains(1));
        assert!(c.contains(3) && c.contains(4));
        // Re-using 4 refreshes it: next victim is 3.
        insert(&mut c, &[4]);
        insert(&mut c, &[7]);
        assert!(!c.contains(3));
        assert!(c.contains(4));
        assert_eq!(c.evictions(), 3);
    }

    #[test]
    fn pinned_blocks_are_not_evicted() {
        let mut c = tiny();
        assert!(c.acquire(&[1, 2, 3], 0, false));
        insert(&mut c, &[4]);
        // Only 4 is evictable; 5 needs room -> evicts 4, not 1..3.
        insert(&mut c, &[5]);
        assert!(c.contains(1) && c.contains(2) && c.contains(3));
        assert!(!c.contains(4));
        // 2 more blocks cannot fit while 1..3 are pinned.
        assert!(!c.fits(&[6, 7], 0));
        assert!(!c.acquire(&[6, 7], 0, false));
        assert!(!c.contains(6));
        // Shared pin: a second user of block 1 keeps it pinned.
        assert!(c.acquire(&[1], 0, false));
        c.release(&[1, 2, 3], 0);
        assert_eq!(c.pinned_blocks(), 1);
        assert!(c.acquire(&[8, 9, 10], 0, false));
        assert!(c.contains(1));
        c.release(&[1], 0);
        c.release(&[8, 9, 10], 0);
        assert_eq!(c.pinned_blocks(), 0);
        assert_eq!(c.usage(), 0.0);
    }

    #[test]
    fn private_tokens_share_capacity() {
        let mut c = tiny();
        insert(&mut c, &[1, 2, 3, 4]);
        assert!(c.acquire(&[], 3, false)); // evicts 3 blocks
        assert_eq!(c.resident_blocks(), 1);
        assert!((c.usage() - 0.75).abs() < 1e-12);
        assert!(!c.fits(&[9, 10], 0));
        c.release(&[], 3);
        assert_eq!(c.private_tokens(), 0);
    }

    #[test]
    fn forced_acquire_overflows_then_trims() {
        let mut c = tiny();
        assert!(!c.fits(&[1, 2, 3, 4, 5, 6], 0));
        assert!(c.acquire(&[1, 2, 3, 4, 5, 6], 0, true));
        assert_eq!(c.resident_blocks(), 6);
        assert_eq!(c.usage(), 1.0);
        c.release(&[1, 2, 3, 4, 5, 6], 0);
        assert_eq!(c.resident_blocks(), 4);
        // Tail released first -> tail evicted first; root survives.
        assert!(c.contains(1) && c.contains(4) && !c.contains(5));
    }

    #[test]
    fn hit_counting_in_tokens() {
        let mut c = PrefixCache::new(1000, 16);
        // 40-token prompt with 2 full blocks.
        assert_eq!(c.query(&[1, 2], 40), 0);
        assert_eq!((c.queries(), c.hits()), (40, 0));
        assert!(c.acquire(&[1, 2], 8, false));
        c.release(&[1, 2], 8);
        assert_eq!(c.query(&[1, 2], 40), 32);
        assert_eq!((c.queries(), c.hits()), (80, 32));
        // A fully cached 32-token prompt recomputes its last block.
        assert_eq!(c.query(&[1, 2], 32), 16);
        assert_eq!((c.queries(), c.hits()), (112, 48));
        // lookup / cached_tokens do not count.
        assert_eq!(c.cached_tokens(&[1, 2], 100), 32);
        assert_eq!(c.queries(), 112);
        c.reset_counters();
        assert_eq!((c.queries(), c.hits()), (0, 0));
        c.clear();
        assert_eq!(c.resident_blocks(), 0);
    }
}
