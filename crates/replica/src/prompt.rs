//! Prompts as the replica sees them: a token count plus chained block hashes.
//!
//! ## Tokenization
//!
//! The replica has its own tokenizer approximation, independent of the
//! router: `tokens = ceil(bytes / 4)` ([`BYTES_PER_TOKEN`] = 4, the usual
//! rule of thumb for English BPE tokenizers).
//!
//! ## Blocks
//!
//! The KV cache works on blocks of `block_tokens` tokens (default 16, vLLM's
//! default `--block-size`). With 4 bytes per token a 16-token block is 64
//! bytes of prompt. Only **full** blocks are cacheable (as in vLLM); the
//! trailing partial block is private to the request.
//!
//! Each block hash is *chained*: it is a hash of the previous block's hash
//! and the block's own content, so it identifies the whole prefix up to and
//! including that block. The hash is FNV-1a 64 seeded with the previous block
//! hash, followed by the splitmix64 finalizer (to spread FNV's weak low
//! bits). It deliberately shares no code with the router core (which uses
//! xxh3), so the router and the server are independent.
//!
//! ## Explicit block ids
//!
//! A trace such as Mooncake's gives `hash_ids`, one id per 512-token block.
//! [`Prompt::from_block_ids`] turns "N tokens with these block ids" into a
//! prompt for a cache with any block size that divides the id block size:
//! each id is expanded into `id_block_tokens / block_tokens` cache blocks,
//! all chained.

/// Identity of a cache block (chained: identifies the whole prefix through
/// this block).
pub type BlockHash = u64;

/// Bytes per token of the replica's tokenizer approximation.
pub const BYTES_PER_TOKEN: usize = 4;

/// Default tokens per KV block (vLLM's default block size).
pub const DEFAULT_BLOCK_TOKENS: u32 = 16;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Chain seed of the first block of a byte prompt.
const ROOT_BYTES: u64 = 0x5052_4546_4958_0001;
/// Chain seed of the first block of an explicit-id prompt.
const ROOT_IDS: u64 = 0x5052_4546_4958_0002;

/// Approximate token count of `len` bytes: `ceil(len / 4)`.
pub fn approx_tokens(len: usize) -> u64 {
    len.div_ceil(BYTES_PER_TOKEN) as u64
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

fn finalize(mut z: u64) -> u64 {
    // splitmix64 finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of one block's bytes chained on the previous block hash.
pub fn chain_bytes(prev: BlockHash, block: &[u8]) -> BlockHash {
    let h = fnv1a(FNV_OFFSET, &prev.to_le_bytes());
    finalize(fnv1a(h, block))
}

/// Hash of an explicit block id (and sub-block index) chained on the
/// previous block hash.
pub fn chain_id(prev: BlockHash, id: u64, sub: u32) -> BlockHash {
    let mut h = fnv1a(FNV_OFFSET, &prev.to_le_bytes());
    h = fnv1a(h, &id.to_le_bytes());
    finalize(fnv1a(h, &sub.to_le_bytes()))
}

/// A prompt: its token count and the chained hashes of its full blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    tokens: u64,
    block_tokens: u32,
    blocks: Vec<BlockHash>,
}

impl Prompt {
    /// Prompt from raw prompt bytes (e.g. the chat-templated text).
    ///
    /// `tokens = ceil(len / 4)`; full blocks are the complete
    /// `4 * block_tokens`-byte chunks. `block_tokens == 0` is treated as 1.
    pub fn from_bytes(bytes: &[u8], block_tokens: u32) -> Self {
        let block_tokens = block_tokens.max(1);
        let block_bytes = (block_tokens as usize).saturating_mul(BYTES_PER_TOKEN);
        let mut prev = ROOT_BYTES;
        let blocks = bytes
            .chunks_exact(block_bytes)
            .map(|chunk| {
                prev = chain_bytes(prev, chunk);
                prev
            })
            .collect();
        Self {
            tokens: approx_tokens(bytes.len()),
            block_tokens,
            blocks,
        }
    }

    /// Prompt of `tokens` tokens whose content is identified by explicit
    /// block ids, one per `id_block_tokens` tokens (Mooncake: 512).
    ///
    /// Each id is expanded into `id_block_tokens / block_tokens` cache
    /// blocks (at least 1; `id_block_tokens` should be a multiple of
    /// `block_tokens`), all chained, and only the `tokens / block_tokens`
    /// full blocks are kept. Ids are chained too, so ids need only be unique
    /// per prefix, as Mooncake's are. Missing ids leave the rest uncacheable.
    pub fn from_block_ids(
        tokens: u64,
        ids: &[u64],
        id_block_tokens: u32,
        block_tokens: u32,
    ) -> Self {
        let block_tokens = block_tokens.max(1);
        let per_id = (id_block_tokens / block_tokens).max(1);
        let full = tokens / u64::from(block_tokens);
        let mut blocks = Vec::new();
        let mut prev = ROOT_IDS;
        'outer: for id in ids {
            for sub in 0..per_id {
                if blocks.len() as u64 >= full {
                    break 'outer;
                }
                prev = chain_id(prev, *id, sub);
                blocks.push(prev);
            }
        }
        Self {
            tokens,
            block_tokens,
            blocks,
        }
    }

    /// Prompt of `tokens` tokens with no cacheable blocks.
    pub fn uncacheable(tokens: u64, block_tokens: u32) -> Self {
        Self {
            tokens,
            block_tokens: block_tokens.max(1),
            blocks: Vec::new(),
        }
    }

    /// Prompt length in tokens.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Tokens per block these hashes were computed for.
    pub fn block_tokens(&self) -> u32 {
        self.block_tokens
    }

    /// Chained hashes of the full blocks, in prompt order.
    pub fn blocks(&self) -> &[BlockHash] {
        &self.blocks
    }

    /// Tokens covered by full (cacheable) blocks.
    pub fn block_covered_tokens(&self) -> u64 {
        self.blocks.len() as u64 * u64::from(self.block_tokens)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_ceil_bytes_over_four() {
        assert_eq!(approx_tokens(0), 0);
        assert_eq!(approx_tokens(1), 1);
        assert_eq!(approx_tokens(4), 1);
        assert_eq!(approx_tokens(5), 2);
        let p = Prompt::from_bytes(&[b'a'; 130], 16);
        assert_eq!(p.tokens(), 33);
        assert_eq!(p.blocks().len(), 2); // two full 64-byte blocks
        assert_eq!(p.block_covered_tokens(), 32);
    }

    #[test]
    fn hashes_are_chained() {
        let a = [b"A".repeat(64), b"B".repeat(64)].concat();
        let b = [b"C".repeat(64), b"B".repeat(64)].concat();
        let pa = Prompt::from_bytes(&a, 16);
        let pb = Prompt::from_bytes(&b, 16);
        // Same second block content, different prefix: different hash.
        assert_ne!(pa.blocks()[1], pb.blocks()[1]);
        // Shared prefix: same leading hashes.
        let c = [b"A".repeat(64), b"Z".repeat(64)].concat();
        let pc = Prompt::from_bytes(&c, 16);
        assert_eq!(pa.blocks()[0], pc.blocks()[0]);
        assert_ne!(pa.blocks()[1], pc.blocks()[1]);
        // Deterministic.
        assert_eq!(pa, Prompt::from_bytes(&a, 16));
    }

    #[test]
    fn block_ids_expand_and_truncate() {
        // 1000 tokens, Mooncake 512-token ids, 16-token cache blocks:
        // 62 full blocks; id 0 gives 32, id 1 gives the next 30.
        let p = Prompt::from_block_ids(1000, &[7, 8], 512, 16);
        assert_eq!(p.tokens(), 1000);
        assert_eq!(p.blocks().len(), 62);
        let q = Prompt::from_block_ids(1024, &[7, 9], 512, 16);
        assert_eq!(p.blocks()[..32], q.blocks()[..32]);
        assert_ne!(p.blocks()[32], q.blocks()[32]);
        // Same block size as the ids: one block per id.
        let r = Prompt::from_block_ids(1100, &[7, 8, 9], 512, 512);
        assert_eq!(r.blocks().len(), 2);
        // Too few ids: rest uncacheable.
        let s = Prompt::from_block_ids(4096, &[1], 512, 512);
        assert_eq!(s.blocks().len(), 1);
    }
}
