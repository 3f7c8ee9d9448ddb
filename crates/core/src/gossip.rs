//! Index gossip: proxies tell each other which host served which prompt.
//!
//! ## Why
//! Each proxy's prefix index ([`crate::index`], [`crate::shared_index`])
//! learns from the responses that proxy saw. With K independent proxies
//! (several Envoys behind an L4 balancer) each sees about 1/K of them, so a
//! conversation placed by one proxy is unknown to the others, which place
//! its next turn by load alone. In the simulator (Mooncake, issue 4's loads,
//! twelve seeds) four proxies' hit rate is 0.92-1.02x one proxy's; with
//! every observation shared 100 ms later it is 1.03-1.18x (BENCHMARKS,
//! "Index gossip: four proxies that tell each other what they learned").
//!
//! ## Algorithm
//! After a response, the proxy queues an [`Observation`] (the serving
//! host's address, the uncached prompt tokens it took in, and the prompt's
//! strided chain hashes, exactly what it records in its own index) in an
//! [`Outbox`]. Every `gossip.interval_ms` it sends the queued observations
//! as one batch ([`encode`]) to every configured peer. A peer decodes it
//! ([`decode`]), checks the [`fingerprint`] (same chunk size and strides,
//! so the same prompt has the same hashes), and records each observation
//! in its own index as if it had seen the response: the prefix entries, and
//! the host's capacity clock advanced by the tokens (so the index also
//! forgets by the fleet's traffic, not only its own).
//!
//! No clock, no IO here: the filter ([`crate`]'s caller) does the timing
//! and the HTTP calls. Gossip is soft state: a lost or rejected batch only
//! costs hits, never a request; the ring and the bound are unchanged.
//!
//! ## Wire format (little-endian)
//! ```text
//! "PRG1"  fingerprint:u64  count:u32
//! count x ( addr_len:u16 addr:[u8; addr_len]  tokens:u64  n:u32  hashes:[u64; n] )
//! ```
//! Decoding is strict: a short, over-long or malformed batch is rejected
//! whole with a [`GossipError`] saying where.
//!
//! ## Complexity
//! Encoding and decoding are O(bytes). A batch of B observations of n
//! hashes each is 12 + B (14 + len(addr) + 8n) bytes: about 150-300 bytes
//! per observation with the default strides.

use std::collections::VecDeque;
use std::fmt;

use crate::index::IndexConfig;

/// Batch magic and version.
pub const MAGIC: &[u8; 4] = b"PRG1";

/// Most hashes one observation may carry (a 16 MiB prompt at 64-byte
/// chunks and stride 1 would need 262,144; the defaults keep about 100).
pub const MAX_HASHES: usize = 1 << 16;

/// One response, as a proxy learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The serving host's address, as in the filter's `hosts`.
    pub host: String,
    /// Uncached prompt tokens the host took into its cache.
    pub tokens: u64,
    /// The prompt's strided chain hashes.
    pub hashes: Vec<u64>,
}

impl Observation {
    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        14 + self.host.len() + 8 * self.hashes.len()
    }
}

/// Why a batch was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GossipError(pub String);

impl fmt::Display for GossipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gossip batch rejected: {}", self.0)
    }
}

/// The hashing settings two proxies must share for their chain hashes to
/// mean the same prompt: chunk size, stride and dense boundaries.
pub fn fingerprint(ix: &IndexConfig) -> u64 {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&ix.chunk_bytes.to_le_bytes());
    b.extend_from_slice(&ix.stride_chunks.to_le_bytes());
    b.extend_from_slice(&ix.dense_boundaries.to_le_bytes());
    crate::hash::hash(&b, u64::from_le_bytes(*b"PRGOSSIP"))
}

/// Encode a batch (observations whose address is longer than `u16::MAX`
/// bytes or with more than [`MAX_HASHES`] hashes are skipped).
pub fn encode(fingerprint: u64, obs: &[Observation]) -> Vec<u8> {
    let ok =
        |o: &&Observation| o.host.len() <= usize::from(u16::MAX) && o.hashes.len() <= MAX_HASHES;
    let size = 16
        + obs
            .iter()
            .filter(ok)
            .map(Observation::encoded_len)
            .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&fingerprint.to_le_bytes());
    let n = obs.iter().filter(ok).count();
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
    for o in obs.iter().filter(ok) {
        out.extend_from_slice(&u16::try_from(o.host.len()).unwrap_or(0).to_le_bytes());
        out.extend_from_slice(o.host.as_bytes());
        out.extend_from_slice(&o.tokens.to_le_bytes());
        out.extend_from_slice(&u32::try_from(o.hashes.len()).unwrap_or(0).to_le_bytes());
        for h in &o.hashes {
            out.extend_from_slice(&h.to_le_bytes());
        }
    }
    out
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GossipError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                GossipError(format!(
                    "truncated at byte {} reading {what} ({n} bytes, {} left)",
                    self.at,
                    self.b.len() - self.at.min(self.b.len())
                ))
            })?;
        let s = self.b.get(self.at..end).unwrap_or(&[]);
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self, what: &str) -> Result<u16, GossipError> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([
            s.first().copied().unwrap_or(0),
            s.get(1).copied().unwrap_or(0),
        ]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GossipError> {
        let s = self.take(4, what)?;
        let mut a = [0u8; 4];
        a.copy_from_slice(s);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GossipError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

/// Decode a batch: its fingerprint and observations.
pub fn decode(bytes: &[u8]) -> Result<(u64, Vec<Observation>), GossipError> {
    let mut r = Reader { b: bytes, at: 0 };
    if r.take(4, "the magic")? != MAGIC {
        return Err(GossipError(
            "not a prefix-router gossip batch (magic)".into(),
        ));
    }
    let fp = r.u64("the fingerprint")?;
    let count = r.u32("the count")? as usize;
    // Each observation takes at least 14 bytes: a count beyond that is a lie.
    if count > bytes.len() / 14 {
        return Err(GossipError(format!(
            "count {count} does not fit in {} bytes",
            bytes.len()
        )));
    }
    let mut obs = Vec::with_capacity(count);
    for i in 0..count {
        let len = usize::from(r.u16("an address length")?);
        let host = std::str::from_utf8(r.take(len, "an address")?)
            .map_err(|_| GossipError(format!("observation {i}: address is not UTF-8")))?
            .to_string();
        let tokens = r.u64("a token count")?;
        let n = r.u32("a hash count")? as usize;
        if n > MAX_HASHES {
            return Err(GossipError(format!(
                "observation {i}: {n} hashes, more than {MAX_HASHES}"
            )));
        }
        let mut hashes = Vec::with_capacity(n.min(bytes.len() / 8));
        for _ in 0..n {
            hashes.push(r.u64("a hash")?);
        }
        obs.push(Observation {
            host,
            tokens,
            hashes,
        });
    }
    if r.at != bytes.len() {
        return Err(GossipError(format!(
            "{} bytes after the last observation",
            bytes.len() - r.at
        )));
    }
    Ok((fp, obs))
}

/// Observations waiting to be sent, bounded in bytes: when full, the
/// oldest are dropped (counted), since newer ones matter more.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: VecDeque<Observation>,
    bytes: usize,
    /// Observations dropped because the outbox was full.
    pub dropped: u64,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Outbox {
        Outbox::default()
    }

    /// Queue `o`, dropping the oldest while over `max_bytes` (an
    /// observation larger than `max_bytes` on its own is dropped).
    pub fn push(&mut self, o: Observation, max_bytes: usize) {
        let n = o.encoded_len();
        if n + 16 > max_bytes {
            self.dropped += 1;
            return;
        }
        self.bytes += n;
        self.queue.push_back(o);
        while self.bytes + 16 > max_bytes {
            match self.queue.pop_front() {
                Some(old) => {
                    self.bytes -= old.encoded_len();
                    self.dropped += 1;
                }
                None => break,
            }
        }
    }

    /// Take everything queued (at most `max_bytes` encoded, by
    /// construction).
    pub fn take(&mut self) -> Vec<Observation> {
        self.bytes = 0;
        self.queue.drain(..).collect()
    }

    /// Observations queued.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ob(h: &str, n: usize) -> Observation {
        Observation {
            host: h.into(),
            tokens: 1234,
            hashes: (0..n as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect(),
        }
    }

    #[test]
    fn round_trip() {
        let obs = vec![ob("127.0.0.1:8001", 3), ob("10.0.0.7:8000", 0), ob("h", 40)];
        let b = encode(42, &obs);
        assert_eq!(
            b.len(),
            16 + obs.iter().map(Observation::encoded_len).sum::<usize>()
        );
        assert_eq!(decode(&b).unwrap(), (42, obs));
        assert_eq!(decode(&encode(7, &[])).unwrap(), (7, vec![]));
    }

    #[test]
    fn golden_bytes() {
        let b = encode(
            1,
            &[Observation {
                host: "a:1".into(),
                tokens: 2,
                hashes: vec![3],
            }],
        );
        let want: Vec<u8> = [
            &b"PRG1"[..],
            &1u64.to_le_bytes(),
            &1u32.to_le_bytes(),
            &3u16.to_le_bytes(),
            b"a:1",
            &2u64.to_le_bytes(),
            &1u32.to_le_bytes(),
            &3u64.to_le_bytes(),
        ]
        .concat();
        assert_eq!(b, want);
    }

    #[test]
    fn every_truncation_and_extension_is_rejected() {
        let b = encode(9, &[ob("127.0.0.1:8001", 5), ob("x", 2)]);
        for cut in 0..b.len() {
            let e = decode(&b[..cut]).unwrap_err();
            assert!(
                e.0.contains("truncated") || e.0.contains("magic") || e.0.contains("fit"),
                "{cut}: {e}"
            );
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(decode(&longer).unwrap_err().0.contains("after the last"));
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(decode(&bad).unwrap_err().0.contains("magic"));
        // A huge count in a tiny batch is refused before allocating.
        let mut lie = encode(9, &[]);
        lie[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&lie).unwrap_err().0.contains("does not fit"));
        // Hash count over the limit.
        let mut many = encode(9, &[ob("h", 0)]);
        let at = many.len() - 4;
        many[at..].copy_from_slice(&((MAX_HASHES as u32) + 1).to_le_bytes());
        assert!(decode(&many).unwrap_err().0.contains("more than"));
        // Address not UTF-8.
        let mut utf = encode(9, &[ob("ab", 0)]);
        utf[18] = 0xff;
        assert!(decode(&utf).unwrap_err().0.contains("UTF-8"));
    }

    #[test]
    fn fingerprint_follows_the_hashing_settings() {
        let a = IndexConfig::default();
        assert_eq!(fingerprint(&a), fingerprint(&a));
        let b = IndexConfig {
            stride_chunks: a.stride_chunks + 1,
            ..a
        };
        let c = IndexConfig {
            chunk_bytes: a.chunk_bytes * 2,
            ..a
        };
        let d = IndexConfig {
            dense_boundaries: a.dense_boundaries + 1,
            ..a
        };
        let e = IndexConfig {
            host_tokens: a.host_tokens + 1,
            ..a
        };
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert_ne!(fingerprint(&a), fingerprint(&d));
        // Not a hashing setting: peers may size their caches differently.
        assert_eq!(fingerprint(&a), fingerprint(&e));
    }

    #[test]
    fn outbox_keeps_the_newest_within_its_bound() {
        let mut o = Outbox::new();
        let one = ob("127.0.0.1:8001", 10).encoded_len();
        let max = 16 + 3 * one;
        for i in 0..5 {
            let mut x = ob("127.0.0.1:8001", 10);
            x.tokens = i;
            o.push(x, max);
        }
        assert_eq!(o.len(), 3);
        assert_eq!(o.dropped, 2);
        let got = o.take();
        assert_eq!(
            got.iter().map(|x| x.tokens).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert!(encode(0, &got).len() <= max);
        assert!(o.is_empty());
        // Too big on its own.
        o.push(ob("h", 1000), 1000);
        assert_eq!((o.len(), o.dropped), (0, 3));
    }
}
