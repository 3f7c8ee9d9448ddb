//! The one hash of prefix-router: xxh3-64 with explicit seeds.
//!
//! Everything that must agree between proxies, between the filter (32-bit wasm)
//! and native code (simulator, tests, benches), and across restarts is hashed
//! here with [`xxh3_64_with_seed`] and one of the documented seeds below. No
//! `DefaultHasher`, no `RandomState`: those are randomized per process.
//!
//! ## Chained chunk hashes
//! The canonical prompt byte stream (see [`crate::extract`]) is cut into fixed
//! chunks of `chunk_bytes` bytes. With `h_0 = model_seed(model, salt)`:
//!
//! ```text
//! h_i = xxh3_64(chunk_i, seed = h_{i-1})
//! ```
//!
//! so `h_i` identifies the whole prefix through chunk `i` (and the model). The
//! hash of a prefix that ends inside a chunk is the same recurrence applied to
//! the partial last chunk ([`ChunkChain::prefix_hash`]); this is how the
//! routing key of a conversation is formed without hashing any byte twice.
//!
//! Golden vectors in the tests pin all of this; they run natively and under
//! wasm32-wasip1, which proves the filter and native code agree.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed for the model name (the model scopes every key).
pub const MODEL_SEED: u64 = 0x7072_6678_6d6f_6465; // "prfxmode"
/// Mixed into the model seed when the request carries a cache salt.
pub const SALT_SEED: u64 = 0x7072_6678_7361_6c74; // "prfxsalt"
/// Seed for session keys (explicit session header or the `user` field).
pub const SESSION_SEED: u64 = 0x7072_6678_7365_7373; // "prfxsess"
/// Seed for ring points: `xxh3_64(name ++ le_u32(vnode), RING_SEED)`.
pub const RING_SEED: u64 = 0x7072_6678_7269_6e67; // "prfxring"
/// Seed for the stable marker hash of non-text content parts.
pub const PART_SEED: u64 = 0x7072_6678_7061_7274; // "prfxpart"
/// Seed for the fingerprint of the configured host list (the shared prefix
/// index names hosts by index): `xxh3_64(addr_0 ++ "\n" ++ addr_1 ..., HOSTS_SEED)`.
pub const HOSTS_SEED: u64 = 0x7072_6678_686f_7374; // "prfxhost"

/// Seed for raw keys: a body over extraction's work budget is keyed by its
/// `messages` array (Responses: `input`) as written, from its `[` through
/// its first user message: `xxh3_64(those bytes, RAW_SEED)` ([`raw_key`]).
pub const RAW_SEED: u64 = 0x7072_6678_7261_7777; // "prfxraww"

/// The raw key of a body's message bytes (see [`RAW_SEED`]).
pub fn raw_key(messages_head: &[u8]) -> u64 {
    hash(messages_head, RAW_SEED)
}

/// Fingerprint of an ordered host list.
pub fn hosts_fingerprint<'a>(addresses: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut joined = Vec::new();
    for a in addresses {
        joined.extend_from_slice(a.as_bytes());
        joined.push(b'\n');
    }
    hash(&joined, HOSTS_SEED)
}

/// xxh3-64 of `bytes` with `seed`.
#[inline]
pub fn hash(bytes: &[u8], seed: u64) -> u64 {
    xxh3_64_with_seed(bytes, seed)
}

/// The first seed of every chain: the model name, and the cache salt if any.
pub fn model_seed(model: &[u8], salt: Option<&[u8]>) -> u64 {
    let h = hash(model, MODEL_SEED);
    match salt {
        Some(s) => hash(s, h ^ SALT_SEED),
        None => h,
    }
}

/// The key of an explicit session identifier, scoped by the model seed.
pub fn session_key(model_seed: u64, session: &[u8]) -> u64 {
    hash(session, model_seed ^ SESSION_SEED)
}

/// A ring point: `xxh3_64(name ++ le_u32(vnode), RING_SEED)`. Ring building
/// is not on the request path, so a small allocation is fine.
pub fn ring_point(name: &[u8], vnode: u32) -> u64 {
    let mut v = Vec::with_capacity(name.len() + 4);
    v.extend_from_slice(name);
    v.extend_from_slice(&vnode.to_le_bytes());
    hash(&v, RING_SEED)
}

/// Streaming chained-chunk hasher over the canonical prompt bytes.
///
/// Bytes are fed with [`ChunkChain::write`] in any split; the result depends
/// only on the concatenated bytes. Full chunks are hashed straight from the
/// caller's slice when possible (no copy); only a partial chunk is buffered.
#[derive(Debug, Clone)]
pub struct ChunkChain {
    chunk: usize,
    buf: Vec<u8>,
    h: u64,
    chunks: u64,
    bytes: u64,
    history: Option<Vec<u64>>,
    /// Record `h_i` only when `i` is a multiple of this (1: every chunk).
    stride: u64,
}

impl ChunkChain {
    /// A chain starting at `seed` (normally [`model_seed`]) over chunks of
    /// `chunk_bytes` bytes (a value of 0 is treated as 1).
    pub fn new(seed: u64, chunk_bytes: usize) -> Self {
        let chunk = chunk_bytes.max(1);
        ChunkChain {
            chunk,
            buf: Vec::with_capacity(chunk),
            h: seed,
            chunks: 0,
            bytes: 0,
            history: None,
            stride: 1,
        }
    }

    /// Like [`ChunkChain::new`], also recording every `h_i` (for prefix
    /// indexes and the simulator).
    pub fn with_history(seed: u64, chunk_bytes: usize) -> Self {
        let mut c = Self::new(seed, chunk_bytes);
        c.history = Some(Vec::new());
        c
    }

    /// Like [`ChunkChain::with_history`], but recording only `h_i` for `i`
    /// a multiple of `stride` chunks (`h_s, h_2s, ...`; a stride of 0 is
    /// treated as 1). The prefix index records at a stride to bound its
    /// entries; the hashes themselves are the same as without a stride.
    pub fn with_strided_history(seed: u64, chunk_bytes: usize, stride: u32) -> Self {
        let mut c = Self::with_history(seed, chunk_bytes);
        c.stride = u64::from(stride.max(1));
        c
    }

    fn push_chunk(&mut self, chunk: &[u8]) {
        self.h = hash(chunk, self.h);
        self.chunks += 1;
        if let Some(h) = self.history.as_mut() {
            if self.chunks.is_multiple_of(self.stride) {
                h.push(self.h);
            }
        }
    }

    /// Feed bytes.
    pub fn write(&mut self, mut data: &[u8]) {
        self.bytes += data.len() as u64;
        if !self.buf.is_empty() {
            let need = self.chunk - self.buf.len();
            let take = need.min(data.len());
            let (head, rest) = data.split_at(take);
            self.buf.extend_from_slice(head);
            data = rest;
            if self.buf.len() < self.chunk {
                return;
            }
            let full = std::mem::take(&mut self.buf);
            self.push_chunk(&full);
            self.buf = full;
            self.buf.clear();
        }
        let mut it = data.chunks_exact(self.chunk);
        for c in it.by_ref() {
            self.push_chunk(c);
        }
        self.buf.extend_from_slice(it.remainder());
    }

    /// Hash identifying every byte written so far: the chain through the
    /// last full chunk, continued over the partial chunk if there is one.
    pub fn prefix_hash(&self) -> u64 {
        if self.buf.is_empty() {
            self.h
        } else {
            hash(&self.buf, self.h)
        }
    }

    /// `h_k` for the last full chunk `k` (the seed if there is none).
    pub fn chain_hash(&self) -> u64 {
        self.h
    }

    /// Number of full chunks hashed.
    pub fn full_chunks(&self) -> u64 {
        self.chunks
    }

    /// Number of bytes written.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The recorded `h_1..h_k` if created [`ChunkChain::with_history`]
    /// (`h_s, h_2s, ...` with [`ChunkChain::with_strided_history`]).
    pub fn history(&self) -> &[u64] {
        self.history.as_deref().unwrap_or(&[])
    }
}

/// All chain hashes `h_1..h_k` of `bytes` (full chunks only).
pub fn chain_hashes(seed: u64, chunk_bytes: usize, bytes: &[u8]) -> Vec<u64> {
    let mut c = ChunkChain::with_history(seed, chunk_bytes);
    c.write(bytes);
    c.history().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Golden vectors: these exact values must come out of every build
    // (native x86_64 and wasm32-wasip1). The model seed and chain values were
    // cross-checked against an independent xxh3 implementation (the C
    // library behind PyPI `xxhash` 3.5.0: `xxh3_64_intdigest(data, seed)`);
    // `cargo run -p prefix-router-core --example golden` prints them all. Changing them changes routing for
    // every deployed proxy: do it only with a version note.
    #[test]
    fn golden_model_seed() {
        assert_eq!(model_seed(b"", None), 0x8ce9_114e_c785_a7e1);
        assert_eq!(model_seed(b"llama-3.1-8b", None), GOLD_MODEL);
        assert_eq!(model_seed(b"llama-3.1-8b", Some(b"tenant-a")), GOLD_SALTED);
    }

    const GOLD_MODEL: u64 = 0x1714_5822_8d9e_12a6;
    const GOLD_SALTED: u64 = 0xb708_a973_90f5_989f;

    #[test]
    fn golden_chain() {
        let seed = model_seed(b"llama-3.1-8b", None);
        let text: Vec<u8> = (0..200u32).map(|i| (i % 251) as u8).collect();
        let hs = chain_hashes(seed, 64, &text);
        assert_eq!(hs, GOLD_CHAIN.to_vec());
        let mut c = ChunkChain::new(seed, 64);
        c.write(&text);
        assert_eq!(c.prefix_hash(), GOLD_PREFIX);
    }
    const GOLD_CHAIN: [u64; 3] = [
        0xcb51_447e_eef5_7b88,
        0x83bd_aa49_6696_ed08,
        0x68b4_88d4_e560_764a,
    ];
    const GOLD_PREFIX: u64 = 0xe77e_8874_2ec4_c5a8;

    #[test]
    fn golden_ring_and_session() {
        assert_eq!(ring_point(b"127.0.0.1:18001", 0), GOLD_RING0);
        assert_eq!(ring_point(b"127.0.0.1:18001", 7), GOLD_RING7);
        assert_eq!(
            session_key(model_seed(b"m", None), b"sess-42"),
            GOLD_SESSION
        );
    }
    #[test]
    fn golden_raw_key() {
        assert_eq!(raw_key(br#"[{"role":"user","content":"hi"}"#), GOLD_RAW);
    }
    const GOLD_RAW: u64 = 0x3e09_8f90_5e19_71bc;

    const GOLD_RING0: u64 = 0xe682_4217_4ee9_c520;
    const GOLD_RING7: u64 = 0xc07f_1d7c_a01b_dc61;
    const GOLD_SESSION: u64 = 0x8df3_9240_bb3e_dc78;

    #[test]
    fn strided_history_is_every_stride_th_hash() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
        let all = chain_hashes(3, 64, &data);
        let mut c = ChunkChain::with_strided_history(3, 64, 16);
        c.write(&data);
        let want: Vec<u64> = all.iter().skip(15).step_by(16).copied().collect();
        assert_eq!(c.history(), &want[..]);
        assert_eq!(c.history().len(), 5000 / 64 / 16);
        // The prefix hash is unaffected by recording.
        let mut plain = ChunkChain::new(3, 64);
        plain.write(&data);
        assert_eq!(c.prefix_hash(), plain.prefix_hash());
    }

    proptest! {
        /// The result depends only on the bytes, not on how they were split.
        #[test]
        fn split_invariance(data in proptest::collection::vec(any::<u8>(), 0..600),
                            cuts in proptest::collection::vec(0usize..600, 0..8),
                            chunk in 1usize..100) {
            let mut whole = ChunkChain::with_history(7, chunk);
            whole.write(&data);
            let mut cuts = cuts.into_iter().map(|c| c.min(data.len())).collect::<Vec<_>>();
            cuts.sort_unstable();
            let mut parts = ChunkChain::with_history(7, chunk);
            let mut last = 0;
            for c in cuts { parts.write(&data[last..c]); last = c; }
            parts.write(&data[last..]);
            prop_assert_eq!(whole.prefix_hash(), parts.prefix_hash());
            prop_assert_eq!(whole.history(), parts.history());
            prop_assert_eq!(whole.full_chunks() as usize, data.len() / chunk);
        }

        /// h_i of a longer stream equals h_i of its prefix: turn N+1 shares
        /// turn N's chain.
        #[test]
        fn prefix_shares_chain(data in proptest::collection::vec(any::<u8>(), 0..600), extra in proptest::collection::vec(any::<u8>(), 0..200)) {
            let a = chain_hashes(1, 16, &data);
            let mut longer = data.clone();
            longer.extend_from_slice(&extra);
            let b = chain_hashes(1, 16, &longer);
            prop_assert_eq!(&b[..a.len()], &a[..]);
        }
    }
}
