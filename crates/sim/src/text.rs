//! Deterministic prompt text.
//!
//! Traces without text (Mooncake: one `hash_id` per 512-token block) and the
//! synthetic generators need bytes a byte-level chunker can hash. Text is
//! drawn from a 64-symbol ASCII alphabet (letters, digits, space, period):
//! no JSON escaping, one byte = one character (so SGLang's character-level
//! tree and byte-level hashers see the same lengths), ~4 bytes a token by the
//! replica's tokenizer approximation. Equal keys give equal bytes; different
//! keys give different bytes (they diverge within the first few characters
//! with probability 1 - 64^-k).

use rand::Rng as _;

use crate::rng::seed2;

const ALPHABET: &[u8; 64] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .";

/// Bytes of one Mooncake block: 512 tokens x 4 bytes.
pub const MOONCAKE_BLOCK_BYTES: usize = 2048;
/// Tokens of one Mooncake `hash_id` block.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// Append `len` bytes of text determined by `key` to `out`.
pub fn gen_text(key: u64, len: usize, out: &mut Vec<u8>) {
    let mut r = crate::rng::rng(seed2(key, 0x7465_7874_6765_6e31)); // "textgen1"
    out.reserve(len);
    let mut left = len;
    while left > 0 {
        let mut w = r.next_u64();
        let n = left.min(10);
        for _ in 0..n {
            out.push(ALPHABET[(w & 63) as usize]);
            w >>= 6;
        }
        left -= n;
    }
}

/// Key of a Mooncake block id under a run seed.
pub fn block_key(seed: u64, id: u64) -> u64 {
    seed2(seed ^ 0x6d6f_6f6e_6361_6b65, id) // "mooncake"
}

/// Append the bytes of a Mooncake request: each id expands into
/// [`MOONCAKE_BLOCK_BYTES`] bytes, and the whole is truncated to
/// `tokens * 4` bytes (the last block is usually partial).
pub fn mooncake_text(seed: u64, ids: &[u64], tokens: u64, out: &mut Vec<u8>) {
    let want = (tokens as usize).saturating_mul(4);
    let start = out.len();
    for id in ids {
        let have = out.len() - start;
        if have >= want {
            break;
        }
        let n = (want - have).min(MOONCAKE_BLOCK_BYTES);
        gen_text(block_key(seed, *id), n, out);
    }
    // Ids missing for the tail (should not happen in Mooncake traces): pad
    // with text unique to this request's id list.
    let have = out.len() - start;
    if have < want {
        let k = ids.iter().fold(seed ^ tokens, |a, &b| seed2(a, b));
        gen_text(k, want - have, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_equal_bytes() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        gen_text(5, 100, &mut a);
        gen_text(5, 60, &mut b);
        assert_eq!(&a[..60], &b[..]);
        let mut c = Vec::new();
        gen_text(6, 100, &mut c);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| ALPHABET.contains(x)));
    }

    #[test]
    fn mooncake_blocks_share() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        mooncake_text(1, &[0, 1, 2], 1100, &mut a);
        mooncake_text(1, &[0, 1, 3], 1200, &mut b);
        assert_eq!(a.len(), 4400);
        assert_eq!(b.len(), 4800);
        assert_eq!(a[..4096], b[..4096]);
        assert_ne!(a[4096..4200], b[4096..4200]);
    }
}
