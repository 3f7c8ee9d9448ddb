//! SGLang router policies, re-implemented from the public Rust source of
//! `sgl-project/sglang` (`sgl-model-gateway`, formerly `sgl-router`):
//!
//! * `cache_aware`: `sgl-model-gateway/src/policies/cache_aware.rs` (and
//!   `sgl-router/src/policies/cache_aware.rs`) with the approximate radix
//!   tree of `sgl-model-gateway/src/policies/tree.rs`. Defaults are the
//!   gateway's command-line defaults (`cache_threshold` 0.3,
//!   `balance_abs_threshold` 64, `balance_rel_threshold` 1.5,
//!   `eviction_interval_secs` 120, `max_tree_size` 2^26 characters per
//!   worker); the library `CacheAwareConfig::default()` differs (0.5 / 32 /
//!   1.1 / 30 s / 10000), the CLI values are what a deployment gets. The
//!   eviction interval: 120 s is the gateway's `--eviction-interval`
//!   default (`sgl-model-gateway/src/main.rs` at `01f6c92a`), used here;
//!   the Python launcher's `RouterArgs.eviction_interval_secs` was 60 s in
//!   `sgl-router` / early `sgl-model-gateway/bindings/python/src/
//!   sglang_router/router_args.py` and is 120 s in newer ones.
//! * `prefix_hash`: `sgl-model-gateway/src/policies/prefix_hash.rs` over the
//!   worker hash ring of `sgl-model-gateway/src/core/worker_registry.rs`
//!   (150 virtual nodes per worker).
//!
//! Written from reading that code; the data structures are our own (an
//! arena tree instead of `Arc`/`DashMap` nodes). Differences, all minor:
//! matching is on bytes rather than Unicode characters (identical for the
//! ASCII text of generated workloads), hashes are xxh3 instead of blake3 for
//! ring positions, and eviction runs at the first request after each
//! interval of virtual time instead of on a background thread.

use xxhash_rust::xxh3::xxh3_64;

use super::{first_min, host_address, num, Choice, Outcome, Policy, SpecError, View};
use crate::input::RouteInput;

// ---------------------------------------------------------------------------
// Approximate radix tree (tree.rs)
// ---------------------------------------------------------------------------

const ROOT: u32 = 0;
const DEAD: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    text: Box<[u8]>,
    /// Children by first byte.
    children: Vec<(u8, u32)>,
    parent: u32,
    /// Tenants (workers) that inserted through this node, with their last
    /// access epoch (0 for intermediate nodes, as in tree.rs).
    tenants: Vec<(u16, u64)>,
    /// Cached tenant for prefix matches (tree.rs `last_tenant`).
    last_tenant: Option<u16>,
}

/// Multi-tenant radix tree over request text with per-tenant LRU leaf
/// eviction.
#[derive(Debug, Clone)]
pub struct Tree {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Characters attributed to each tenant (tree.rs `tenant_char_count`).
    tenant_chars: Vec<u64>,
    epoch: u64,
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Tree {
    /// Empty tree for `tenants` workers.
    pub fn new(tenants: usize) -> Self {
        Tree {
            nodes: vec![Node {
                text: Box::new([]),
                children: Vec::new(),
                parent: DEAD,
                tenants: Vec::new(),
                last_tenant: None,
            }],
            free: Vec::new(),
            tenant_chars: vec![0; tenants],
            epoch: 0,
        }
    }

    fn node(&self, i: u32) -> Option<&Node> {
        self.nodes.get(i as usize)
    }

    fn node_mut(&mut self, i: u32) -> Option<&mut Node> {
        self.nodes.get_mut(i as usize)
    }

    fn child(&self, i: u32, b: u8) -> Option<u32> {
        self.node(i)?
            .children
            .iter()
            .find(|(c, _)| *c == b)
            .map(|&(_, n)| n)
    }

    fn has(&self, i: u32, t: u16) -> bool {
        self.node(i)
            .is_some_and(|n| n.tenants.iter().any(|x| x.0 == t))
    }

    fn set_ts(&mut self, i: u32, t: u16, ts: u64) {
        if let Some(n) = self.node_mut(i) {
            match n.tenants.iter_mut().find(|x| x.0 == t) {
                Some(x) => x.1 = ts,
                None => n.tenants.push((t, ts)),
            }
        }
    }

    fn add_chars(&mut self, t: u16, n: usize) {
        if let Some(c) = self.tenant_chars.get_mut(t as usize) {
            *c += n as u64;
        }
    }

    fn alloc(&mut self, n: Node) -> u32 {
        match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.nodes.get_mut(i as usize) {
                    *slot = n;
                }
                i
            }
            None => {
                self.nodes.push(n);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn next_epoch(&mut self) -> u64 {
        let e = self.epoch;
        self.epoch += 1;
        e
    }

    /// Characters attributed to tenant `t`.
    pub fn tenant_chars(&self, t: u16) -> u64 {
        self.tenant_chars.get(t as usize).copied().unwrap_or(0)
    }

    /// Insert `text` for tenant `t` (tree.rs `insert`).
    pub fn insert(&mut self, text: &[u8], t: u16) {
        if !self.has(ROOT, t) {
            self.set_ts(ROOT, t, 0);
        }
        let mut cur = ROOT;
        let mut pos = 0;
        while let Some(&b) = text.get(pos) {
            let rem = text.get(pos..).unwrap_or(&[]);
            let Some(c) = self.child(cur, b) else {
                let e = self.next_epoch();
                let n = self.alloc(Node {
                    text: rem.into(),
                    children: Vec::new(),
                    parent: cur,
                    tenants: vec![(t, e)],
                    last_tenant: Some(t),
                });
                if let Some(p) = self.node_mut(cur) {
                    p.children.push((b, n));
                }
                self.add_chars(t, rem.len());
                return;
            };
            let (shared, clen) = match self.node(c) {
                Some(cn) => (common_prefix(rem, &cn.text), cn.text.len()),
                None => return,
            };
            if shared < clen {
                // Split c into head (new node n) and tail (c).
                let Some(cn) = self.node(c) else { return };
                let head: Box<[u8]> = cn.text.get(..shared).unwrap_or(&[]).into();
                let tail: Box<[u8]> = cn.text.get(shared..).unwrap_or(&[]).into();
                let first_tail = tail.first().copied().unwrap_or(0);
                let tenants = cn.tenants.clone();
                let last = cn.last_tenant;
                let n = self.alloc(Node {
                    text: head,
                    children: vec![(first_tail, c)],
                    parent: cur,
                    tenants,
                    last_tenant: last,
                });
                if let Some(cn) = self.node_mut(c) {
                    cn.text = tail;
                    cn.parent = n;
                }
                if let Some(p) = self.node_mut(cur) {
                    if let Some(e) = p.children.iter_mut().find(|(x, _)| *x == b) {
                        e.1 = n;
                    }
                }
                if !self.has(n, t) {
                    self.add_chars(t, shared);
                    self.set_ts(n, t, 0);
                }
                cur = n;
            } else {
                if !self.has(c, t) {
                    self.add_chars(t, clen);
                    self.set_ts(c, t, 0);
                }
                cur = c;
            }
            pos += shared;
        }
        let e = self.next_epoch();
        self.set_ts(cur, t, e);
    }

    /// Longest match of `text` and a tenant owning the deepest matched node
    /// (tree.rs `prefix_match_with_counts`): (matched bytes, tenant).
    pub fn prefix_match(&mut self, text: &[u8]) -> (usize, Option<u16>) {
        let mut cur = ROOT;
        let mut pos = 0;
        let mut matched = 0;
        while let Some(&b) = text.get(pos) {
            let Some(c) = self.child(cur, b) else { break };
            let rem = text.get(pos..).unwrap_or(&[]);
            let Some(cn) = self.node(c) else { break };
            let shared = common_prefix(rem, &cn.text);
            let full = shared == cn.text.len();
            matched += shared;
            cur = c;
            if !full {
                break;
            }
            pos += shared;
        }
        let tenant = match self.node(cur) {
            Some(n) => match n.last_tenant {
                Some(t) if n.tenants.iter().any(|x| x.0 == t) => Some(t),
                _ => n.tenants.first().map(|x| x.0),
            },
            None => None,
        };
        if let Some(n) = self.node_mut(cur) {
            if tenant.is_some() {
                n.last_tenant = tenant;
            }
        }
        // tree.rs refreshes the timestamp on one match in eight.
        let e = self.next_epoch();
        if e & 7 == 0 {
            if let Some(t) = tenant {
                if self.has(cur, t) {
                    self.set_ts(cur, t, e);
                }
            }
        }
        (matched, tenant)
    }

    fn is_leaf_for(&self, i: u32, t: u16) -> bool {
        self.has(i, t)
            && self
                .node(i)
                .is_some_and(|n| !n.children.iter().any(|&(_, c)| self.has(c, t)))
    }

    /// Evict least recently used leaves of every tenant above `max_chars`
    /// (tree.rs `evict_tenant_by_size`).
    pub fn evict(&mut self, max_chars: u64) {
        if self.tenant_chars.iter().all(|&c| c <= max_chars) {
            return;
        }
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut heap: BinaryHeap<Reverse<(u64, u32, u16)>> = BinaryHeap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.parent == DEAD && i as u32 != ROOT {
                continue;
            }
            for &(t, ts) in &n.tenants {
                if self.is_leaf_for(i as u32, t) {
                    heap.push(Reverse((ts, i as u32, t)));
                }
            }
        }
        while let Some(Reverse((_, i, t))) = heap.pop() {
            if self.tenant_chars(t) <= max_chars || !self.is_leaf_for(i, t) {
                continue;
            }
            let (len, parent) = match self.node(i) {
                Some(n) => (n.text.len() as u64, n.parent),
                None => continue,
            };
            if let Some(c) = self.tenant_chars.get_mut(t as usize) {
                *c = c.saturating_sub(len);
            }
            let mut remove = false;
            if let Some(n) = self.node_mut(i) {
                n.tenants.retain(|x| x.0 != t);
                remove = i != ROOT && n.children.is_empty() && n.tenants.is_empty();
            }
            if remove {
                let first = self.node(i).and_then(|n| n.text.first().copied());
                if let (Some(p), Some(fb)) = (self.node_mut(parent), first) {
                    p.children.retain(|&(b, c)| !(b == fb && c == i));
                }
                if let Some(n) = self.node_mut(i) {
                    n.parent = DEAD;
                    n.text = Box::new([]);
                    n.tenants = Vec::new();
                    n.children = Vec::new();
                }
                self.free.push(i);
            }
            if i != ROOT && self.is_leaf_for(parent, t) {
                let ts = self
                    .node(parent)
                    .and_then(|n| n.tenants.iter().find(|x| x.0 == t).map(|x| x.1))
                    .unwrap_or(0);
                heap.push(Reverse((ts, parent, t)));
            }
        }
    }

    /// Live nodes (tests, diagnostics).
    pub fn live_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }
}

// ---------------------------------------------------------------------------
// cache_aware
// ---------------------------------------------------------------------------

/// `cache_threshold`, `abs` (balance_abs_threshold), `rel`
/// (balance_rel_threshold), `eviction_s`, `max_tree` (characters per
/// worker).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareParams {
    pub cache_threshold: f64,
    pub balance_abs: u64,
    pub balance_rel: f64,
    pub eviction_s: f64,
    pub max_tree: u64,
}

impl Default for CacheAwareParams {
    fn default() -> Self {
        CacheAwareParams {
            cache_threshold: 0.3,
            balance_abs: 64,
            balance_rel: 1.5,
            eviction_s: 120.0,
            max_tree: 1 << 26,
        }
    }
}

impl CacheAwareParams {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "cache_threshold" => p.cache_threshold = num(k, v)?,
                "abs" | "balance_abs_threshold" => p.balance_abs = num(k, v)? as u64,
                "rel" | "balance_rel_threshold" => p.balance_rel = num(k, v)?,
                "eviction_s" => p.eviction_s = num(k, v)?,
                "max_tree" => p.max_tree = num(k, v)? as u64,
                _ => {
                    return Err(SpecError(format!(
                        "sglang-cache-aware: unknown option {k:?}"
                    )))
                }
            }
        }
        Ok(p)
    }
}

/// SGLang `cache_aware`: the worker with the longest approximate-tree match
/// if the match covers more than `cache_threshold` of the text, else the
/// least loaded; pure shortest-queue while the load is imbalanced
/// (`max - min > abs` and `max > rel * min`). Load = this router's
/// in-flight requests per worker.
pub struct CacheAware {
    p: CacheAwareParams,
    tree: Tree,
    next_evict: f64,
}

impl CacheAware {
    pub fn new(p: CacheAwareParams, hosts: usize) -> Self {
        let next_evict = p.eviction_s;
        CacheAware {
            p,
            tree: Tree::new(hosts),
            next_evict,
        }
    }
}

impl Policy for CacheAware {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        if self.p.eviction_s > 0.0 && view.now >= self.next_evict {
            self.tree.evict(self.p.max_tree);
            while self.next_evict <= view.now {
                self.next_evict += self.p.eviction_s;
            }
        }
        let loads = view.inflight;
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let text = input.routing_text();
        let imbalanced = max.saturating_sub(min) > self.p.balance_abs
            && (max as f64) > (min as f64) * self.p.balance_rel;
        if imbalanced {
            let h = first_min(loads);
            self.tree.insert(text, h as u16);
            return Choice {
                host: h,
                outcome: Outcome::Spill,
            };
        }
        let (matched, tenant) = self.tree.prefix_match(text);
        let rate = if text.is_empty() {
            0.0
        } else {
            matched as f64 / text.len() as f64
        };
        let (h, outcome) = match tenant {
            Some(t) if rate > self.p.cache_threshold && (t as usize) < loads.len() => {
                (t as usize, Outcome::Affinity)
            }
            _ => (first_min(loads), Outcome::Balance),
        };
        self.tree.insert(text, h as u16);
        Choice { host: h, outcome }
    }
}

// ---------------------------------------------------------------------------
// prefix_hash
// ---------------------------------------------------------------------------

/// `tokens` (prefix tokens hashed; 4 bytes of text a token here),
/// `load_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixHashParams {
    pub prefix_tokens: usize,
    pub load_factor: f64,
}

impl Default for PrefixHashParams {
    fn default() -> Self {
        PrefixHashParams {
            prefix_tokens: 256,
            load_factor: 1.25,
        }
    }
}

impl PrefixHashParams {
    pub(crate) fn parse(opts: &[(String, String)]) -> Result<Self, SpecError> {
        let mut p = Self::default();
        for (k, v) in opts {
            match k.as_str() {
                "tokens" | "prefix_token_count" => p.prefix_tokens = num(k, v)? as usize,
                "load_factor" => p.load_factor = num(k, v)?,
                _ => {
                    return Err(SpecError(format!(
                        "sglang-prefix-hash: unknown option {k:?}"
                    )))
                }
            }
        }
        Ok(p)
    }
}

/// Virtual nodes per worker on the gateway's ring (worker_registry.rs).
pub const SGLANG_VNODES: u64 = 150;

/// SGLang `prefix_hash`: hash the first `prefix_tokens` tokens, take the
/// ring owner if its load is at most `load_factor` times the average
/// (counting the new request), else the least loaded worker under that
/// bound, else the owner anyway.
pub struct PrefixHash {
    p: PrefixHashParams,
    ring: Vec<(u64, u32)>,
    n: usize,
}

impl PrefixHash {
    pub fn new(p: PrefixHashParams, hosts: usize) -> Self {
        let mut ring = Vec::with_capacity(hosts * SGLANG_VNODES as usize);
        for h in 0..hosts {
            let url = format!("http://{}", host_address(h));
            for v in 0..SGLANG_VNODES {
                let mut b = url.clone().into_bytes();
                b.push(b'#');
                b.extend_from_slice(&v.to_le_bytes());
                ring.push((xxh3_64(&b), h as u32));
            }
        }
        ring.sort_unstable();
        PrefixHash { p, ring, n: hosts }
    }

    fn load_ok(&self, load: u64, total: u64) -> bool {
        if total == 0 || self.n == 0 {
            return true;
        }
        let avg = (total + 1) as f64 / self.n as f64;
        (load as f64) <= avg * self.p.load_factor
    }
}

impl Policy for PrefixHash {
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice {
        let loads = view.inflight;
        let text = input.routing_text();
        if text.is_empty() || self.ring.is_empty() {
            return Choice {
                host: first_min(loads),
                outcome: Outcome::Fallback,
            };
        }
        let prefix = text
            .get(..text.len().min(self.p.prefix_tokens * 4))
            .unwrap_or(text);
        let key = format!("{:016x}", xxh3_64(prefix));
        let pos = xxh3_64(key.as_bytes());
        let start = self.ring.partition_point(|&(p, _)| p < pos) % self.ring.len();
        let initial = self.ring.get(start).map(|&(_, h)| h as usize).unwrap_or(0);
        let total: u64 = loads.iter().sum();
        let load = |h: usize| loads.get(h).copied().unwrap_or(0);
        if self.load_ok(load(initial), total) {
            return Choice {
                host: initial,
                outcome: Outcome::Affinity,
            };
        }
        let mut best: Option<usize> = None;
        for h in 0..self.n {
            if self.load_ok(load(h), total) && best.is_none_or(|b| load(h) < load(b)) {
                best = Some(h);
            }
        }
        Choice {
            host: best.unwrap_or(initial),
            outcome: Outcome::Spill,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_matches_and_splits() {
        let mut t = Tree::new(3);
        t.insert(b"hello world", 0);
        t.insert(b"hello there", 1);
        assert_eq!(t.prefix_match(b"hello world again"), (11, Some(0)));
        assert_eq!(t.prefix_match(b"hello th").0, 8);
        assert_eq!(t.prefix_match(b"hello th").1, Some(1));
        // No match: the root's tenant comes back (as in tree.rs), with 0
        // matched characters.
        assert_eq!(t.prefix_match(b"xyz").0, 0);
        assert_eq!(t.tenant_chars(0), 11);
        assert_eq!(t.tenant_chars(1), 11);
        // Shared head "hello " counted for both.
        t.insert(b"hello world", 2);
        assert_eq!(t.tenant_chars(2), 11);
    }

    #[test]
    fn eviction_trims_lru_leaves() {
        let mut t = Tree::new(1);
        t.insert(b"aaaa1111", 0);
        t.insert(b"aaaa2222", 0);
        t.insert(b"bbbb3333", 0);
        assert_eq!(t.tenant_chars(0), 20);
        t.evict(12);
        assert!(t.tenant_chars(0) <= 12);
        // The most recent insert survives.
        assert_eq!(t.prefix_match(b"bbbb3333").0, 8);
        assert_eq!(t.prefix_match(b"aaaa1111").0, 4);
    }
}
