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
//! With load gossip (`gossip.name` set) the batch is `"PRG2"` instead and
//! carries, after the observations, the sender's pending prefill:
//! ```text
//! name_len:u16 name:[u8; name_len]  m:u32
//! m x ( addr_len:u16 addr:[u8; addr_len]  pending_tokens:u64 )
//! ```
//! ([`Loads`]: the uncached prompt tokens of the requests the sender has
//! sent to each replica that have not produced a first byte yet). A
//! receiver keeps the newest per sender ([`store_peer_pending`]) and adds
//! the fresh ones to its own pending tokens, so a burst placed by one
//! Envoy is seen by the others within a gossip interval (BENCHMARKS
//! "Simultaneous arrivals, and sharing pending prefill between proxies").
//!
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
use crate::store::{SharedStore, StoreError};

/// Batch magic and version.
pub const MAGIC: &[u8; 4] = b"PRG1";

/// Magic of a batch that also carries the sender's [`Loads`].
pub const MAGIC_LOADS: &[u8; 4] = b"PRG2";

/// Most replicas one [`Loads`] may name.
pub const MAX_LOADS: usize = 4096;

/// One Envoy's pending prefill per replica, as it gossips it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loads {
    /// The sender, as its peers list it in `gossip.peers` (`gossip.name`).
    pub sender: String,
    /// (replica address, pending uncached prompt tokens).
    pub pending: Vec<(String, u64)>,
}

/// A decoded batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub fingerprint: u64,
    pub observations: Vec<Observation>,
    /// The sender's pending prefill (`"PRG2"` batches only).
    pub loads: Option<Loads>,
}

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
    encode_batch(fingerprint, obs, None)
}

/// Encode a batch, with the sender's [`Loads`] if given (`"PRG2"`; a name
/// or address longer than `u16::MAX` bytes, or entries beyond
/// [`MAX_LOADS`], are left out).
pub fn encode_batch(fingerprint: u64, obs: &[Observation], loads: Option<&Loads>) -> Vec<u8> {
    let mut out = encode_observations(
        if loads.is_some() { MAGIC_LOADS } else { MAGIC },
        fingerprint,
        obs,
    );
    if let Some(l) = loads {
        let name = if l.sender.len() <= usize::from(u16::MAX) {
            l.sender.as_str()
        } else {
            ""
        };
        put_str(&mut out, name);
        let ok: Vec<&(String, u64)> = l
            .pending
            .iter()
            .filter(|(a, _)| a.len() <= usize::from(u16::MAX))
            .take(MAX_LOADS)
            .collect();
        out.extend_from_slice(&u32::try_from(ok.len()).unwrap_or(0).to_le_bytes());
        for (a, t) in ok {
            put_str(&mut out, a);
            out.extend_from_slice(&t.to_le_bytes());
        }
    }
    out
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&u16::try_from(s.len()).unwrap_or(0).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn encode_observations(magic: &[u8; 4], fingerprint: u64, obs: &[Observation]) -> Vec<u8> {
    let ok =
        |o: &&Observation| o.host.len() <= usize::from(u16::MAX) && o.hashes.len() <= MAX_HASHES;
    let size = 16
        + obs
            .iter()
            .filter(ok)
            .map(Observation::encoded_len)
            .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(magic);
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
    fn string(&mut self, what: &str) -> Result<String, GossipError> {
        let len = usize::from(self.u16(what)?);
        let at = self.at;
        std::str::from_utf8(self.take(len, what)?)
            .map(str::to_string)
            .map_err(|_| GossipError(format!("{what} at byte {at} is not UTF-8")))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GossipError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

/// Decode a batch: its fingerprint and observations (any [`Loads`] are
/// read and dropped).
pub fn decode(bytes: &[u8]) -> Result<(u64, Vec<Observation>), GossipError> {
    let b = decode_batch(bytes)?;
    Ok((b.fingerprint, b.observations))
}

/// Decode a batch, `"PRG1"` or `"PRG2"`.
pub fn decode_batch(bytes: &[u8]) -> Result<Batch, GossipError> {
    let mut r = Reader { b: bytes, at: 0 };
    let magic = r.take(4, "the magic")?;
    let with_loads = if magic == MAGIC {
        false
    } else if magic == MAGIC_LOADS {
        true
    } else {
        return Err(GossipError(
            "not a prefix-router gossip batch (magic)".into(),
        ));
    };
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
    let loads = if with_loads {
        let sender = r.string("the sender's name")?;
        let m = r.u32("the load count")? as usize;
        if m > MAX_LOADS || m > bytes.len() / 10 {
            return Err(GossipError(format!(
                "load count {m} is more than {MAX_LOADS} or does not fit"
            )));
        }
        let mut pending = Vec::with_capacity(m);
        for _ in 0..m {
            let a = r.string("a load's address")?;
            pending.push((a, r.u64("a load's pending tokens")?));
        }
        Some(Loads { sender, pending })
    } else {
        None
    };
    if r.at != bytes.len() {
        return Err(GossipError(format!(
            "{} bytes after the last {}",
            bytes.len() - r.at,
            if with_loads { "load" } else { "observation" }
        )));
    }
    Ok(Batch {
        fingerprint: fp,
        observations: obs,
        loads,
    })
}

fn peer_key(sender: &str) -> String {
    format!("prefix_router/peer_pending/{sender}")
}

/// How long a peer's [`Loads`] count after they arrive: ten gossip
/// intervals, at least a second (a peer that stopped sending stops
/// counting).
pub fn peer_loads_max_age_ms(interval_ms: u64) -> u64 {
    interval_ms.saturating_mul(10).max(1000)
}

/// Keep `loads` as its sender's newest pending prefill, received at
/// `now_ms`, as one value per sender (overwritten whole; the newest
/// batch wins). Addresses are mapped to this filter's host indexes with
/// `host_index` (`hosts` of them); returns how many named a host this
/// filter does not list (skipped).
pub fn store_peer_pending<S: SharedStore + ?Sized>(
    store: &S,
    loads: &Loads,
    hosts: usize,
    host_index: impl Fn(&str) -> Option<usize>,
    now_ms: u64,
) -> Result<u64, StoreError> {
    let mut tokens = vec![0u64; hosts];
    let mut unknown = 0u64;
    for (a, t) in &loads.pending {
        match host_index(a).and_then(|i| tokens.get_mut(i)) {
            Some(x) => *x = x.saturating_add(*t),
            None => unknown += 1,
        }
    }
    let mut v = Vec::with_capacity(12 + 8 * hosts);
    v.extend_from_slice(&now_ms.to_le_bytes());
    v.extend_from_slice(&u32::try_from(hosts).unwrap_or(0).to_le_bytes());
    for t in &tokens {
        v.extend_from_slice(&t.to_le_bytes());
    }
    store.set(&peer_key(&loads.sender), &v, None)?;
    Ok(unknown)
}

/// The pending prefill tokens per host (`hosts` of them) that `peers`
/// reported within `max_age_ms` of `now_ms`, summed. A value of another
/// host count (the config changed) or malformed counts nothing.
pub fn read_peer_pending<S: SharedStore + ?Sized>(
    store: &S,
    peers: &[String],
    hosts: usize,
    now_ms: u64,
    max_age_ms: u64,
) -> Result<Vec<u64>, StoreError> {
    let mut sum = vec![0u64; hosts];
    for p in peers {
        let (v, _) = store.get(&peer_key(p))?;
        let Some(v) = v else { continue };
        let mut r = Reader { b: &v, at: 0 };
        let (Ok(at), Ok(n)) = (r.u64("time"), r.u32("count")) else {
            continue;
        };
        if n as usize != hosts
            || v.len() != 12 + 8 * hosts
            || now_ms.saturating_sub(at) > max_age_ms
        {
            continue;
        }
        for x in sum.iter_mut() {
            let t = r.u64("tokens").unwrap_or(0);
            *x = x.saturating_add(t);
        }
    }
    Ok(sum)
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
        // A golden value: peers built for other targets (this test also runs on wasm32)
        // must compute the same fingerprint for the same settings.
        assert_eq!(
            fingerprint(&a),
            0x4742_3d04_e5c5_8994,
            "{:#018x}",
            fingerprint(&a)
        );
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

    fn loads(sender: &str) -> Loads {
        Loads {
            sender: sender.into(),
            pending: vec![("10.0.0.1:8000".into(), 4000), ("10.0.0.2:8000".into(), 0)],
        }
    }

    #[test]
    fn batches_with_loads_round_trip_and_old_batches_still_decode() {
        let obs = vec![ob("10.0.0.1:8000", 3)];
        let l = loads("envoy-a:10000");
        let b = encode_batch(7, &obs, Some(&l));
        assert_eq!(b.get(..4), Some(&MAGIC_LOADS[..]));
        let d = decode_batch(&b).expect("decodes");
        assert_eq!(
            (d.fingerprint, &d.observations, d.loads.as_ref()),
            (7, &obs, Some(&l))
        );
        // Loads with no observations: the batch a quiet Envoy sends.
        let e = decode_batch(&encode_batch(7, &[], Some(&l))).expect("decodes");
        assert!(e.observations.is_empty());
        assert_eq!(e.loads, Some(l.clone()));
        // Without loads it is the PRG1 batch, byte for byte.
        assert_eq!(encode_batch(7, &obs, None), encode(7, &obs));
        assert_eq!(decode_batch(&encode(7, &obs)).expect("decodes").loads, None);
        // `decode` reads a PRG2 batch and drops its loads.
        assert_eq!(decode(&b).expect("decodes"), (7, obs));
        // Every truncation and any extension is rejected.
        for cut in 0..b.len() {
            assert!(
                decode_batch(b.get(..cut).unwrap_or(&[])).is_err(),
                "cut {cut}"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode_batch(&long).is_err());
    }

    #[test]
    fn peer_pending_is_kept_per_sender_and_counts_while_fresh() {
        let s = crate::store::MemStore::default();
        let hosts = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"];
        let idx = |a: &str| hosts.iter().position(|h| *h == a);
        let mut a = loads("a:1");
        a.pending.push(("10.9.9.9:8000".into(), 5));
        assert_eq!(store_peer_pending(&s, &a, 3, idx, 1_000), Ok(1));
        let b = Loads {
            sender: "b:1".into(),
            pending: vec![("10.0.0.1:8000".into(), 100), ("10.0.0.3:8000".into(), 7)],
        };
        assert_eq!(store_peer_pending(&s, &b, 3, idx, 1_500), Ok(0));
        let peers = vec!["a:1".to_string(), "b:1".to_string(), "c:1".to_string()];
        assert_eq!(
            read_peer_pending(&s, &peers, 3, 1_600, 1_000),
            Ok(vec![4100, 0, 7])
        );
        // Only the listed peers count.
        assert_eq!(
            read_peer_pending(&s, &peers[1..], 3, 1_600, 1_000),
            Ok(vec![100, 0, 7])
        );
        // A newer batch replaces the sender's values.
        let a2 = Loads {
            sender: "a:1".into(),
            pending: vec![("10.0.0.2:8000".into(), 9)],
        };
        store_peer_pending(&s, &a2, 3, idx, 1_700).expect("stores");
        assert_eq!(
            read_peer_pending(&s, &peers, 3, 1_800, 1_000),
            Ok(vec![100, 9, 7])
        );
        // Stale values stop counting: b's are from 1,500.
        assert_eq!(
            read_peer_pending(&s, &peers, 3, 2_600, 1_000),
            Ok(vec![0, 9, 0])
        );
        // Another host count (a config change) counts nothing.
        assert_eq!(
            read_peer_pending(&s, &peers, 4, 1_800, 1_000),
            Ok(vec![0; 4])
        );
        assert_eq!(peer_loads_max_age_ms(100), 1000);
        assert_eq!(peer_loads_max_age_ms(500), 5000);
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
