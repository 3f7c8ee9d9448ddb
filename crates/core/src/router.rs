//! The decision: from a request to a host and a reason.
//!
//! [`Router::classify`] runs on request headers (method, path, content type,
//! length) and says whether the body is worth buffering; [`Router::decide`],
//! the one way to ask for a decision, runs on the complete body with each
//! host's current load ([`Request`]) and returns a [`Decision`] that
//! metrics, logs and the debug header are driven from. Neither has a clock
//! or randomness: `now_ms` comes in as an argument.
//!
//! The configured rule (`cost.mode`) picks the placement: the priced spill
//! ([`crate::spill`], the default), the index rule ([`crate::cost`]), which
//! also reads a [`PrefixLookup`] (the simulator's [`PrefixIndex`] or the
//! filter's shared-data index, [`crate::shared_index`]) that the caller
//! owns and feeds from the host that actually served, or plain bounded
//! loads ([`Ring::place`]).

use std::fmt::Write as _;

use crate::config::Config;
use crate::cost;
use crate::cost::CostParams;
use crate::extract::{Api, ExtractError, Scan};
use crate::hash;
use crate::index::{PrefixIndex, PrefixLookup};
use crate::key::KeySink;
use crate::load::{HostLoad, LoadTrend};
use crate::ring::{Bound, Ring};

/// Why a request was left to Envoy's own load balancing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FallbackCause {
    /// Path not in `paths`.
    Path,
    /// Not a POST.
    Method,
    /// Content type present and not JSON.
    ContentType,
    /// Headers ended the request: no body.
    NoBody,
    /// Body larger than `max_body_bytes`.
    BodyTooLarge,
    /// Body is not the JSON this API expects.
    ParseError,
    /// Valid body without a prompt.
    EmptyPrompt,
    /// Body whose elements are too dense for its size: extraction stopped
    /// at its work budget (`extract::budget`).
    TooComplex,
    /// A host call failed (body read, shared data); see the log.
    HostError,
}

impl FallbackCause {
    /// All causes (for defining metrics up front).
    pub const ALL: [FallbackCause; 9] = [
        FallbackCause::Path,
        FallbackCause::Method,
        FallbackCause::ContentType,
        FallbackCause::NoBody,
        FallbackCause::BodyTooLarge,
        FallbackCause::ParseError,
        FallbackCause::EmptyPrompt,
        FallbackCause::TooComplex,
        FallbackCause::HostError,
    ];

    /// Stable name used in metrics, logs and the decision header.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackCause::Path => "path",
            FallbackCause::Method => "method",
            FallbackCause::ContentType => "content_type",
            FallbackCause::NoBody => "no_body",
            FallbackCause::BodyTooLarge => "body_too_large",
            FallbackCause::ParseError => "parse_error",
            FallbackCause::EmptyPrompt => "empty_prompt",
            FallbackCause::TooComplex => "too_complex",
            FallbackCause::HostError => "host_error",
        }
    }
}

/// Where the key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeySource {
    /// The prompt prefix.
    Prompt,
    /// The configured session header.
    Session,
    /// The body's `user` field.
    User,
    /// A body over extraction's work budget: its `messages` (Responses:
    /// `input` items) as written through the first user message
    /// ([`crate::hash::raw_key`]).
    Raw,
}

impl KeySource {
    /// All sources.
    pub const ALL: [KeySource; 4] = [
        KeySource::Prompt,
        KeySource::Session,
        KeySource::User,
        KeySource::Raw,
    ];

    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Prompt => "prompt",
            KeySource::Session => "session",
            KeySource::User => "user",
            KeySource::Raw => "raw",
        }
    }
}

/// The routing key of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Position on the ring.
    pub hash: u64,
    /// Where it came from.
    pub source: KeySource,
    /// Prompt bytes hashed to get it (0 for session keys).
    pub bytes_hashed: u64,
    /// Length of the whole canonical prompt, bytes (0 when a session key
    /// was taken without reading the prompt).
    pub prompt_bytes: u64,
    /// The group key: the key region capped at `key.prefix_bytes` (equal to
    /// `hash` when the key region is no longer, and for session keys).
    pub group: u64,
    /// A prompt key that ends at the first user message (`key.mode:
    /// conversation` on an API with messages): a prompt going on past it
    /// is a later turn of that conversation. False for keys capped at
    /// `key.prefix_bytes`, whose longer prompts are not turns of one
    /// conversation, and for session and user keys.
    pub anchored: bool,
    /// The group region lies wholly in the preamble before the first user
    /// message (an application's system prompt or tools): a later turn is
    /// placed by its conversation's key, not the group ([`crate::spill`]).
    pub preamble_group: bool,
}

/// The key of a body over extraction's work budget (`too_complex`): its
/// `messages` (Responses: `input` items) as written, from the `[` through
/// the first user message, if the checking pass got past that within the
/// budget (else the fallback).
/// The bytes as written, not the canonical stream, so a conversation
/// whose body outgrows the budget moves once, then stays; no model seed
/// (the model may come after the messages). Anchored (a later turn) when
/// another message follows; the prompt's length is the body's.
fn raw_key(scan: &Scan<'_>, body: &[u8]) -> Result<(Key, PromptChain), FallbackCause> {
    let (head, more) = scan.raw_head().ok_or(FallbackCause::TooComplex)?;
    let hash = hash::raw_key(head);
    let key = Key {
        hash,
        source: KeySource::Raw,
        bytes_hashed: head.len() as u64,
        prompt_bytes: body.len() as u64,
        group: hash,
        anchored: more,
        preamble_group: false,
    };
    Ok((key, PromptChain::default()))
}

/// What the router decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send to `host` (index into the config's hosts).
    Routed {
        /// Chosen host.
        host: usize,
        /// Hosts skipped on the ring walk because they were at capacity
        /// (0: the key's owner took it, a "ring hit").
        skipped: u32,
        /// The key.
        key: Key,
        /// Cost rule only: prefix bytes the prefix index believed the
        /// chosen host holds (`None` when the plain ring decided).
        cached: Option<u64>,
        /// Cost rule only: a later candidate won on its estimate (a cached
        /// prefix there, or a shorter queue) over the first host under the
        /// bound; `false` when the bound alone explains the choice.
        moved: bool,
        /// Cost rule only: hosts passed over because they were hot (their
        /// recent load above `hot_factor` x the mean) and at their hot
        /// bound ([`crate::cost::HotRule`]: the fleet's mean, or their keep
        /// bound for a prompt they hold; with `half_floor` half the
        /// `min_capacity` floor, or the pure bound if higher), though under
        /// their capacity.
        hot_skipped: u32,
        /// The priced spill's account of its choice (`None` for the other
        /// rules).
        spill: Option<SpillNote>,
    },
    /// Leave it to Envoy's load balancing.
    Fallback(FallbackCause),
}

/// How the priced spill ([`crate::spill`]) reached a decision: what the
/// decision header and the debug log show after the outcome, e.g.
/// `turn=first;why=priced;owner=10.0.0.1:8000;wait_ms=1500/0;held_ms=125`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillNote {
    /// A later turn of a conversation (it never leaves `o` by the bound
    /// alone unless every candidate is over its bound); `false`: a first
    /// turn.
    pub later: bool,
    /// Which step decided ([`crate::spill::Why`]).
    pub why: crate::spill::Why,
    /// The first candidate `o`, where every proxy presumes the prompt is
    /// held.
    pub owner: usize,
    /// `W_o` and the chosen host's `W`, milliseconds (`None`: no fresh
    /// report for `o`).
    pub wait_ms: Option<(u32, u32)>,
    /// `o` had a fresh load report (a first turn without one weighs only
    /// this proxy's own requests there; a later turn stays).
    pub reported: bool,
    /// `held_s`, milliseconds: re-prefilling the prompt elsewhere.
    pub held_ms: u32,
    /// Under an application preamble ([`Key::preamble_group`]), which walk
    /// its rule gave: `cold` (the group's: a preamble with little of the
    /// traffic, [`crate::spill::Preambles::cold`]), `owner` (the group's: a
    /// first turn under a preamble not seen to converse) or `key` (the
    /// key's).
    pub preamble: Option<&'static str>,
}

impl Decision {
    /// The group of a request under an application preamble
    /// ([`Key::preamble_group`]) and whether it is a later turn, for
    /// [`crate::spill::Preambles::observe`].
    pub fn preamble_turn(&self) -> Option<(u64, bool)> {
        match self {
            Decision::Routed {
                key,
                spill: Some(n),
                ..
            } if key.preamble_group => Some((key.group, n.later)),
            _ => None,
        }
    }

    /// `hit` (the key's ring owner), `moved` (the cost rule preferred a
    /// later candidate), `spill` (hosts before it on the walk were at
    /// their bound) or `fallback`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Decision::Routed { moved: true, .. } => "moved",
            Decision::Routed { skipped: 0, .. } => "hit",
            Decision::Routed { .. } => "spill",
            Decision::Fallback(_) => "fallback",
        }
    }

    /// The decision header / log value, e.g.
    /// `outcome=spill;host=10.0.0.2:8000;source=prompt;skipped=1;key=00ab…;bytes=812`
    /// (`outcome=` is [`Decision::outcome`]).
    pub fn describe(&self, cfg: &Config) -> String {
        let mut s = String::with_capacity(96);
        match self {
            Decision::Routed {
                host,
                skipped,
                key,
                cached,
                hot_skipped,
                spill,
                ..
            } => {
                let addr = cfg
                    .hosts
                    .get(*host)
                    .map(|h| h.address.as_str())
                    .unwrap_or("?");
                let _ = write!(
                    s,
                    "outcome={};host={};source={};skipped={};key={:016x};bytes={}",
                    self.outcome(),
                    addr,
                    key.source.as_str(),
                    skipped,
                    key.hash,
                    key.bytes_hashed
                );
                if let Some(c) = cached {
                    let _ = write!(s, ";cached={c}");
                }
                if *hot_skipped > 0 {
                    let _ = write!(s, ";hot_skipped={hot_skipped}");
                }
                if let Some(n) = spill {
                    let turn = if n.later { "later" } else { "first" };
                    let _ = write!(s, ";turn={turn};why={}", n.why.as_str());
                    if n.owner != *host {
                        let o = cfg.hosts.get(n.owner).map_or("?", |h| h.address.as_str());
                        let _ = write!(s, ";owner={o}");
                    }
                    if let Some((w_o, w)) = n.wait_ms {
                        let _ = write!(s, ";wait_ms={w_o}/{w}");
                    } else {
                        s.push_str(";report=none");
                    }
                    let _ = write!(s, ";held_ms={}", n.held_ms);
                    if let Some(p) = n.preamble {
                        let _ = write!(s, ";preamble={p}");
                    }
                }
            }
            Decision::Fallback(c) => {
                let _ = write!(s, "outcome=fallback;cause={}", c.as_str());
            }
        }
        s
    }
}

/// The whole canonical prompt as the cost rule and the prefix index see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PromptChain {
    /// Chain hashes every `stride_chunks` chunks (`h_s, h_2s, ...`).
    pub hashes: Vec<u64>,
    /// Length of the canonical prompt stream, bytes.
    pub bytes: u64,
}

/// Request facts known at header time.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestHead<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub content_type: Option<&'a str>,
    pub content_length: Option<u64>,
}

/// A request to decide ([`Router::decide`]) and the state it is decided
/// against. Build it with [`Request::new`] and the `with_*` methods.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    /// The API its path names ([`Router::classify`]).
    pub api: Api,
    /// The complete request body.
    pub body: &'a [u8],
    /// The session header's value (`key.session_header`), if any, as the
    /// bytes the client sent (any bytes: it is only hashed).
    pub session: Option<&'a [u8]>,
    /// Each configured host's load, indexed like the config's hosts
    /// (missing hosts: idle). Unused when [`Request::source`] is given.
    pub loads: &'a [HostLoad],
    /// The hosts' loads read on demand, only for the hosts the decision
    /// looks at ([`LoadSource`]); `None`: [`Request::loads`].
    pub source: Option<&'a dyn LoadSource>,
    /// Now, in ms, on the clock the loads' report times use.
    pub now_ms: u64,
    /// `cost.mode = "index"` only: what each host holds of the prompt
    /// (`None`: nothing is known, as with an empty index).
    pub index: Option<&'a dyn PrefixLookup>,
    /// `cost.mode = "index"` only: cost parameters to use instead of the
    /// config's (e.g. with a learned prefill rate,
    /// [`CostParams::with_prefill_rate`]).
    pub params: Option<&'a CostParams>,
    /// A key computed beforehand ([`Router::key`], e.g. by a router with
    /// another key config), placed instead of the body's. With
    /// `cost.mode = "index"` the body is still read for the prompt's chain.
    pub key: Option<Key>,
    /// `cost.mode = "spill"`: the application preambles this proxy has
    /// seen carry later turns ([`crate::spill::Preambles`]; `None`: none).
    pub preambles: Option<&'a crate::spill::Preambles>,
}

impl<'a> Request<'a> {
    /// A request with no session, index, parameters or key given.
    pub fn new(api: Api, body: &'a [u8], loads: &'a [HostLoad], now_ms: u64) -> Request<'a> {
        Request {
            api,
            body,
            session: None,
            loads,
            source: None,
            now_ms,
            index: None,
            params: None,
            key: None,
            preambles: None,
        }
    }

    /// With the session header's value ([`Request::session`]).
    pub fn with_session(self, session: Option<&'a [u8]>) -> Request<'a> {
        Request { session, ..self }
    }

    /// With the hosts' loads read on demand ([`Request::source`]).
    pub fn with_source(self, source: &'a dyn LoadSource) -> Request<'a> {
        Request {
            source: Some(source),
            ..self
        }
    }

    /// With a prefix index ([`Request::index`]).
    pub fn with_index(self, index: &'a dyn PrefixLookup) -> Request<'a> {
        Request {
            index: Some(index),
            ..self
        }
    }

    /// With other cost parameters ([`Request::params`]).
    pub fn with_params(self, params: &'a CostParams) -> Request<'a> {
        Request {
            params: Some(params),
            ..self
        }
    }

    /// With the preambles this proxy saw converse ([`Request::preambles`]).
    pub fn with_preambles(self, preambles: &'a crate::spill::Preambles) -> Request<'a> {
        Request {
            preambles: Some(preambles),
            ..self
        }
    }

    /// With a key computed beforehand ([`Request::key`]).
    pub fn with_key(self, key: Key) -> Request<'a> {
        Request {
            key: Some(key),
            ..self
        }
    }
}

/// What [`Router::decide`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// Where the request goes and why.
    pub decision: Decision,
    /// `cost.mode = "index"`: the whole prompt's strided chain, to record
    /// with the host that actually serves the request
    /// ([`PrefixIndex::observe`],
    /// [`crate::shared_index::SharedIndexConfig::observe`]); empty with the
    /// other rules and on a fallback before the prompt was read.
    pub chain: PromptChain,
}

/// The index rule's lookup when the caller gave none: nothing is known.
struct NoIndex;

impl PrefixLookup for NoIndex {
    fn lookup(&self, _hashes: &[u64], hosts: &[usize], _now_ms: u64) -> Vec<u64> {
        vec![0; hosts.len()]
    }
}

/// The routing core: config plus ring.
#[derive(Debug, Clone)]
pub struct Router {
    cfg: Config,
    ring: Ring,
}

impl Router {
    /// Build the ring for a validated config.
    pub fn new(cfg: Config) -> Router {
        let ring = Ring::new(
            cfg.hosts.iter().map(|h| (h.name.as_str(), h.weight)),
            cfg.vnodes,
        );
        Router { cfg, ring }
    }

    /// The config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// On request headers: is this a request to route, and for which API?
    pub fn classify(&self, head: &RequestHead<'_>) -> Result<Api, FallbackCause> {
        let api = self
            .cfg
            .api_for_path(head.path)
            .ok_or(FallbackCause::Path)?;
        if !head.method.eq_ignore_ascii_case("POST") {
            return Err(FallbackCause::Method);
        }
        if let Some(ct) = head.content_type {
            if !ct.to_ascii_lowercase().contains("json") {
                return Err(FallbackCause::ContentType);
            }
        }
        if let Some(n) = head.content_length {
            if n > self.cfg.max_body_bytes {
                return Err(FallbackCause::BodyTooLarge);
            }
            if n == 0 {
                return Err(FallbackCause::NoBody);
            }
        }
        Ok(api)
    }

    /// The routing key of a complete body.
    pub fn key(&self, api: Api, body: &[u8], session: Option<&[u8]>) -> Result<Key, FallbackCause> {
        self.key_impl(api, body, session, None).map(|(k, _)| k)
    }

    /// The routing key (exactly [`Router::key`]'s) and the whole prompt's
    /// strided chain for the cost rule, hashed in one pass. With a session
    /// key the prompt is still read for its chain (a body without a prompt
    /// then gives an empty chain, not a fallback).
    fn key_with_chain(
        &self,
        api: Api,
        body: &[u8],
        session: Option<&[u8]>,
    ) -> Result<(Key, PromptChain), FallbackCause> {
        self.key_impl(api, body, session, Some(self.cfg.cost.index.stride_chunks))
    }

    fn key_impl(
        &self,
        api: Api,
        body: &[u8],
        session: Option<&[u8]>,
        stride: Option<u32>,
    ) -> Result<(Key, PromptChain), FallbackCause> {
        if body.len() as u64 > self.cfg.max_body_bytes {
            return Err(FallbackCause::BodyTooLarge);
        }
        let k = &self.cfg.key;
        // The model seed is needed before hashing, but the model field may
        // come after the messages: one checking pass ([`Scan`]) finds
        // `model` and `cache_salt` and where every field starts, then the
        // prompt streams into the key sink seeded from them.
        let scan = Scan::new(body);
        let meta = match scan.meta() {
            Ok(m) => m,
            Err(ExtractError::TooComplex(_)) => return raw_key(&scan, body),
            Err(_) => return Err(FallbackCause::ParseError),
        };
        let salt = if k.use_cache_salt {
            meta.cache_salt.as_deref()
        } else {
            None
        };
        let seed = hash::model_seed(meta.model.as_bytes(), salt.map(str::as_bytes));
        let session_key = session.filter(|s| !s.is_empty()).map(|s| Key {
            hash: hash::session_key(seed, s),
            source: KeySource::Session,
            bytes_hashed: 0,
            prompt_bytes: 0,
            group: hash::session_key(seed, s),
            anchored: false,
            preamble_group: false,
        });
        let mut sink = match stride {
            None => {
                // A session key still reads the prompt: its length prices
                // the spill (`Key::prompt_bytes`).
                KeySink::new(
                    seed,
                    self.cfg.chunk_bytes,
                    k.mode,
                    k.prefix_bytes,
                    api.structured(),
                )
            }
            Some(s) => KeySink::with_chain(
                seed,
                self.cfg.chunk_bytes,
                k.mode,
                k.prefix_bytes,
                api.structured(),
                s,
            ),
        };
        let m = match (scan.extract(api, &mut sink), session_key) {
            (Ok(m), _) => m,
            (Err(_), Some(key)) => return Ok((key, PromptChain::default())),
            (Err(ExtractError::Parse(_)), None) => return Err(FallbackCause::ParseError),
            (Err(ExtractError::EmptyPrompt), None) => return Err(FallbackCause::EmptyPrompt),
            (Err(ExtractError::TooComplex(_)), None) => return raw_key(&scan, body),
        };
        let chain = PromptChain {
            hashes: match stride {
                Some(_) => {
                    crate::index::thin(sink.chain_history(), self.cfg.cost.index.dense_boundaries)
                }
                None => Vec::new(),
            },
            bytes: sink.stream_bytes(),
        };
        if let Some(key) = session_key {
            return Ok((
                Key {
                    prompt_bytes: sink.seen_bytes(),
                    ..key
                },
                chain,
            ));
        }
        if k.use_user_field {
            if let Some(u) = m.user.as_deref().filter(|u| !u.is_empty()) {
                return Ok((
                    Key {
                        hash: hash::session_key(seed, u.as_bytes()),
                        source: KeySource::User,
                        bytes_hashed: 0,
                        prompt_bytes: sink.seen_bytes(),
                        group: hash::session_key(seed, u.as_bytes()),
                        anchored: false,
                        preamble_group: false,
                    },
                    chain,
                ));
            }
        }
        Ok((
            Key {
                hash: sink.key(),
                source: KeySource::Prompt,
                bytes_hashed: sink.bytes_hashed(),
                prompt_bytes: sink.seen_bytes(),
                group: sink.group(),
                anchored: sink.anchored(),
                preamble_group: sink.group_in_preamble(),
            },
            chain,
        ))
    }

    /// The share of the traffic under which an application preamble's
    /// conversations live where it is held ([`crate::spill::Preambles::cold`]):
    /// the bound's slack on one host, `(capacity_factor - 1) / hosts`.
    pub fn preamble_limit(&self) -> f64 {
        // `as` is exact for any host count.
        (self.cfg.capacity_factor - 1.0) / self.cfg.hosts.len().max(1) as f64
    }

    /// Count a decision in this proxy's [`crate::spill::Preambles`]
    /// (routed requests only).
    pub fn observed(&self, p: &mut crate::spill::Preambles, d: &Decision) {
        if matches!(d, Decision::Routed { .. }) {
            p.observe(d.preamble_turn());
        }
    }

    /// The load bound of this config.
    pub fn bound(&self) -> Bound {
        Bound {
            factor: self.cfg.capacity_factor,
            min_capacity: self.cfg.min_capacity,
        }
    }

    /// Each configured host's effective load at `now_ms` (missing: 0).
    fn effective(&self, loads: &[HostLoad], now_ms: u64) -> Vec<u64> {
        let fresh = self.cfg.load.freshness();
        (0..self.cfg.hosts.len())
            .map(|i| loads.get(i).map_or(0, |l| l.effective(now_ms, fresh)))
            .collect()
    }

    /// Whether the config lets host `h` be chosen at all (healthy in
    /// Envoy's eyes, not a free slot).
    fn configured_eligible(&self, h: usize) -> bool {
        self.cfg
            .hosts
            .get(h)
            .is_some_and(|c| c.healthy && c.weight > 0.0)
    }

    /// Whether a decision reads every host's load whatever the key: the
    /// index rule's hot-host rule compares each host's recent load with the
    /// fleet's mean (`cost.mode = "index"` with `cost.hot_window_s > 0`).
    /// Otherwise a decision reads only the hosts on the key's walk up to
    /// the chosen one and its failover hosts ([`LoadSource`]).
    pub fn reads_every_host(&self) -> bool {
        self.cfg.cost.enabled && self.cfg.cost.params.hot_window_s > 0.0
    }

    /// Fold the effective loads of `loads` at `now_ms` into `trend`
    /// (time constant `hot_window_s`) and write each host's recent
    /// load into `loads[i].recent`, for the cost rule's hot-host rule.
    /// Does nothing with the rule off (`cost.mode = off` or
    /// `hot_window_s = 0`).
    pub fn track_recent(&self, trend: &mut LoadTrend, loads: &mut [HostLoad], now_ms: u64) {
        let tau = self.cfg.cost.params.hot_window_s;
        if !self.cfg.cost.enabled || tau <= 0.0 {
            return;
        }
        let eff = self.effective(loads, now_ms);
        trend.observe(now_ms, tau, &eff);
        for (l, &r) in loads.iter_mut().zip(trend.recent()) {
            l.recent = r;
        }
    }

    /// An empty prefix index with this config's bounds (one per proxy).
    pub fn new_index(&self) -> PrefixIndex {
        PrefixIndex::new(self.cfg.cost.index)
    }

    /// Decide where `req` goes: the one way to ask for a decision.
    ///
    /// Keys the body ([`Router::key`]; a [`Request::key`] given instead is
    /// placed as is) and places the key by the configured rule:
    /// - `cost.mode = "spill"` (the default): the priced spill
    ///   ([`crate::spill`]) over the group owner and the key's ring walk;
    /// - `cost.mode = "index"`: the index rule ([`crate::cost`]) over the
    ///   key's owner and its successors, reading [`Request::index`] with
    ///   the whole prompt's strided chain, returned in
    ///   [`Decided::chain`] for the caller to record with the host that
    ///   actually serves the request;
    /// - `cost.mode = "off"`: plain bounded loads ([`Ring::place`]).
    ///
    /// Ejected hosts are skipped unless every host is ejected. The
    /// [`Decision`] says where and why (outcome, ring position, key,
    /// fallback cause).
    pub fn decide(&self, req: &Request<'_>) -> Decided {
        let keyed = if self.cfg.cost.enabled {
            // The index rule reads the whole prompt's chain, even with a
            // key given.
            self.key_with_chain(req.api, req.body, req.session)
                .map(|(k, chain)| (req.key.unwrap_or(k), chain))
        } else {
            match req.key {
                Some(k) => Ok(k),
                None => self.key(req.api, req.body, req.session),
            }
            .map(|k| (k, PromptChain::default()))
        };
        let (key, chain) = match keyed {
            Ok(kc) => kc,
            Err(c) => {
                return Decided {
                    decision: Decision::Fallback(c),
                    chain: PromptChain::default(),
                }
            }
        };
        let slices = SliceLoads(req.loads, self.cfg.hosts.len());
        let src: &dyn LoadSource = req.source.unwrap_or(&slices);
        let view = |all_eligible| View::new(self, src, req.now_ms, all_eligible);
        let place = |v: &View<'_>| {
            if self.cfg.cost.enabled {
                let params = req.params.unwrap_or(&self.cfg.cost.params);
                // One instantiation of the rule, over `dyn PrefixLookup`.
                let index: &dyn PrefixLookup = req.index.unwrap_or(&NoIndex);
                self.place_cost(key, &chain, v, index, req.now_ms, params)
            } else if self.cfg.cost.mode == crate::config::CostMode::Spill {
                let converses = req.preambles.is_some_and(|p| p.converses(key.group));
                let cold = key.preamble_group
                    && req
                        .preambles
                        .is_some_and(|p| p.cold(key.group, self.preamble_limit()));
                self.place_spill(key, converses, cold, v)
            } else {
                self.place_ring(key, v)
            }
        };
        // Ejected hosts are skipped unless every host is: a rule finds no
        // eligible host only after walking them all, and then decides
        // again with every host eligible.
        let decision = match place(&view(false)) {
            Some(d) => d,
            None => place(&view(true)).unwrap_or(Decision::Fallback(FallbackCause::HostError)),
        };
        Decided { decision, chain }
    }

    /// The index rule ([`crate::cost`]) with cost parameters `params`.
    /// `skipped` is the chosen host's position on the key's walk (0: the
    /// owner, a "hit"). `None`: no host is eligible.
    fn place_cost<I: PrefixLookup + ?Sized>(
        &self,
        key: Key,
        prompt: &PromptChain,
        v: &View<'_>,
        index: &I,
        now_ms: u64,
        params: &CostParams,
    ) -> Option<Decision> {
        // The hot-host rule (every host's recent load); nothing to collect
        // with it off.
        let hot = if params.hot_window_s > 0.0 {
            let n = self.cfg.hosts.len();
            let recent: Vec<f64> = (0..n).map(|h| v.load(h).recent).collect();
            let eligible: Vec<bool> = (0..n).map(|h| v.eligible(h)).collect();
            cost::hot_hosts(&self.ring, &recent, &eligible, params)
        } else {
            Vec::new()
        };
        let fresh = self.cfg.load.freshness();
        // This proxy's own in-flight counts: only the mean hot rule (its
        // keep bound) and `inflight_s` (the stay rule leaves its term out)
        // read them.
        let own_read = params.hot_rule == cost::HotRule::Mean || params.inflight_s > 0.0;
        let hosts = cost::Hosts {
            total: v.total(),
            load: &|h| v.effective(h),
            own: &|h| own_read.then(|| v.load(h).inflight),
            pending: &|h| v.load(h).pending_ahead(now_ms, fresh, params),
            eligible: &|h| v.eligible(h),
            hot: &|h| hot.get(h).copied().unwrap_or(false),
        };
        let p = cost::place_by(
            &self.ring,
            key.hash,
            &hosts,
            &self.bound(),
            &prompt.hashes,
            prompt.bytes,
            index,
            now_ms,
            params,
        )?;
        Some(Decision::Routed {
            host: p.host,
            skipped: p.rank,
            key,
            cached: Some(p.cached_bytes),
            moved: p.moved,
            hot_skipped: p.hot_skipped,
            spill: None,
        })
    }

    /// The priced spill ([`crate::spill`]). `converses`: the key's group
    /// is an application preamble this proxy saw carry later turns.
    fn place_spill(&self, key: Key, converses: bool, cold: bool, v: &View<'_>) -> Option<Decision> {
        let fresh = self.cfg.load.freshness();
        // A later turn: a session or user key, or a conversation key whose
        // prompt goes on past the first user message.
        let first_turn = matches!(key.source, KeySource::Prompt | KeySource::Raw)
            && (!key.anchored || key.prompt_bytes <= key.bytes_hashed);
        // A first turn weighs this proxy's own part of a queue live; a
        // later turn only the replica's report, which every proxy that
        // heard it weighs alike.
        let queue = |h: usize| {
            let l = v.load(h);
            if first_turn {
                l.fresh_queue(v.now_ms, fresh)
            } else {
                l.reported_queue(v.now_ms, fresh)
            }
        };
        let hosts = crate::spill::Hosts {
            total: v.total(),
            load: &|h| v.effective(h),
            queue: &queue,
            own: &|h| v.load(h).pending_requests as f64,
            eligible: &|h| v.eligible(h),
        };
        let p = &self.cfg.cost.params;
        // Every proxy presumes the first candidate holds the prompt, or
        // will after this request (a conversation's next turn comes back
        // to it): leaving costs re-prefilling it.
        let held_s = key.prompt_bytes as f64 / p.bytes_per_token / p.prefill_tokens_per_s;
        // Under an application preamble, the key's walk unless the
        // preamble is cold, or this is a first turn under one not seen to
        // converse (then the group's owner).
        let by_key = key.preamble_group && !cold && (converses || !first_turn);
        let x = crate::spill::Rule {
            held_s,
            service_s: p.service_s,
            // An application preamble (system prompt, tools) is shared by
            // all its conversations: a later turn goes where its own
            // conversation goes, and so does a first turn once the
            // preamble is seen to converse; other first turns go where
            // the preamble is held.
            group: (!by_key).then_some(key.group),
            first_turn,
        };
        let pl = crate::spill::place_by(&self.ring, key.hash, &self.bound(), &hosts, &x)?;
        Some(Decision::Routed {
            host: pl.host,
            skipped: pl.rank,
            key,
            cached: None,
            // `moved`: the queue priced it away; a move over the bound
            // is a spill, as in plain bounded loads.
            moved: pl.why == crate::spill::Why::Priced,
            hot_skipped: 0,
            spill: Some(SpillNote {
                later: !first_turn,
                why: pl.why,
                owner: pl.owner,
                wait_ms: pl.wait_ms,
                reported: v.load(pl.owner).reported_queue(v.now_ms, fresh).is_some(),
                held_ms: crate::spill::ms(held_s),
                preamble: key.preamble_group.then_some(match (cold, by_key) {
                    (true, _) => "cold",
                    (false, true) => "key",
                    (false, false) => "owner",
                }),
            }),
        })
    }

    /// Failover hosts for a request routed to `chosen` with key `key`: up
    /// to `cfg.failover_hosts` hosts after it on the key's ring walk,
    /// skipping the chosen host and the ineligible ones (ejected by passive
    /// health, unhealthy in Envoy's eyes, free slots). The walk depends only
    /// on the host table, so every proxy names the same successors.
    pub fn failover(&self, key: u64, chosen: usize, loads: &[HostLoad], now_ms: u64) -> Vec<usize> {
        self.failover_from(
            key,
            chosen,
            &SliceLoads(loads, self.cfg.hosts.len()),
            now_ms,
        )
    }

    /// [`Router::failover`] reading the hosts' loads on demand: only the
    /// hosts on the walk up to the last failover host.
    pub fn failover_from(
        &self,
        key: u64,
        chosen: usize,
        src: &dyn LoadSource,
        now_ms: u64,
    ) -> Vec<usize> {
        let n = self.cfg.failover_hosts;
        if n == 0 {
            return Vec::new();
        }
        let pick = |v: &View<'_>| -> Vec<usize> {
            self.ring
                .walk(key)
                .filter(|&h| h != chosen && v.eligible(h))
                .take(n)
                .collect()
        };
        let v = View::new(self, src, now_ms, false);
        let out = pick(&v);
        // Fewer than `n` found means the walk saw every host: if none of
        // them (the chosen one included) was eligible, every host is.
        if out.is_empty() && !v.eligible(chosen) {
            return pick(&View::new(self, src, now_ms, true));
        }
        out
    }

    /// The destination header's value: the chosen host's address, then the
    /// failover hosts' ([`Router::failover`]), comma-separated, as Envoy's
    /// override_host reads it (the first for the first try, the next for
    /// each retry).
    pub fn destination(&self, chosen: usize, failover: &[usize]) -> Option<String> {
        let first = self.cfg.hosts.get(chosen)?;
        let mut v = first.address.clone();
        for h in failover.iter().filter_map(|&i| self.cfg.hosts.get(i)) {
            v.push(',');
            v.push_str(&h.address);
        }
        Some(v)
    }

    /// Plain bounded loads ([`Ring::place`]).
    fn place_ring(&self, key: Key, v: &View<'_>) -> Option<Decision> {
        let p = self.ring.place_by(
            key.hash,
            v.total(),
            &self.bound(),
            &|h| v.effective(h),
            &|h| v.eligible(h),
        )?;
        Some(Decision::Routed {
            host: p.host,
            skipped: p.skipped,
            key,
            cached: None,
            moved: false,
            hot_skipped: 0,
            spill: None,
        })
    }
}

/// Where a decision reads the hosts' loads: host by host, only for the
/// hosts it looks at (the key's walk up to the chosen host, the spill's
/// candidates, the failover hosts), and the fleet's total load the bound
/// divides. The filter reads one shared-data record per host asked about
/// ([`crate::host_state`]); a slice of every host's load is one too
/// ([`Request::loads`]). A decision may ask about a host more than once:
/// an implementation that reads on demand keeps what it read.
pub trait LoadSource {
    /// Host `h`'s load (indexed like the config's hosts; missing: idle).
    fn load(&self, h: usize) -> HostLoad;
    /// The fleet's load `L` at `now_ms`: the sum over every configured
    /// host of [`HostLoad::effective`].
    fn total(&self, now_ms: u64, fresh: crate::load::Freshness) -> u64;
}

/// Every host's load in a slice ([`Request::loads`]), over the first
/// `.1` hosts (the configured ones).
struct SliceLoads<'a>(&'a [HostLoad], usize);

impl LoadSource for SliceLoads<'_> {
    fn load(&self, h: usize) -> HostLoad {
        self.0.get(h).copied().unwrap_or_default()
    }
    fn total(&self, now_ms: u64, fresh: crate::load::Freshness) -> u64 {
        self.0
            .iter()
            .take(self.1)
            .map(|l| l.effective(now_ms, fresh))
            .sum()
    }
}

/// One decision's reading of a [`LoadSource`]: effective loads and
/// eligibility host by host, the total once.
struct View<'a> {
    router: &'a Router,
    src: &'a dyn LoadSource,
    now_ms: u64,
    fresh: crate::load::Freshness,
    /// Every host is ejected: all count as eligible.
    all_eligible: bool,
    total: std::cell::Cell<Option<u64>>,
}

impl<'a> View<'a> {
    fn new(router: &'a Router, src: &'a dyn LoadSource, now_ms: u64, all: bool) -> View<'a> {
        View {
            router,
            src,
            now_ms,
            fresh: router.cfg.load.freshness(),
            all_eligible: all,
            total: std::cell::Cell::new(None),
        }
    }

    fn load(&self, h: usize) -> HostLoad {
        if h < self.router.cfg.hosts.len() {
            self.src.load(h)
        } else {
            HostLoad::default()
        }
    }

    fn effective(&self, h: usize) -> u64 {
        self.load(h).effective(self.now_ms, self.fresh)
    }

    fn eligible(&self, h: usize) -> bool {
        self.all_eligible || (self.router.configured_eligible(h) && !self.load(h).ejected)
    }

    fn total(&self) -> u64 {
        match self.total.get() {
            Some(t) => t,
            None => {
                let t = self.src.total(self.now_ms, self.fresh);
                self.total.set(Some(t));
                t
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::extract::extract;
    use crate::load::Report;

    /// [`Router::decide`] with no index: the decision.
    fn decide(
        r: &Router,
        api: Api,
        body: &[u8],
        session: Option<&str>,
        loads: &[HostLoad],
        now_ms: u64,
    ) -> Decision {
        r.decide(&Request::new(api, body, loads, now_ms).with_session(session.map(str::as_bytes)))
            .decision
    }

    /// [`Router::decide`] with a prefix index.
    fn decide_ix(
        r: &Router,
        api: Api,
        body: &[u8],
        session: Option<&str>,
        loads: &[HostLoad],
        ix: &PrefixIndex,
        now_ms: u64,
    ) -> (Decision, PromptChain) {
        let d = r.decide(
            &Request::new(api, body, loads, now_ms)
                .with_session(session.map(str::as_bytes))
                .with_index(ix),
        );
        (d.decision, d.chain)
    }

    fn router(n: usize) -> Router {
        let addrs: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 18001 + i)).collect();
        let refs: Vec<&str> = addrs.iter().map(|s| s.as_str()).collect();
        Router::new(Config::with_hosts(&refs).unwrap())
    }

    fn chat(first: &str, turns: usize) -> String {
        let mut m = vec![
            r#"{"role":"system","content":"sys"}"#.to_string(),
            format!(r#"{{"role":"user","content":"{first}"}}"#),
        ];
        for t in 1..turns {
            m.push(format!(r#"{{"role":"assistant","content":"a{t}"}}"#));
            m.push(format!(r#"{{"role":"user","content":"u{t}"}}"#));
        }
        format!(
            r#"{{"model":"m","stream":true,"messages":[{}]}}"#,
            m.join(",")
        )
    }

    #[test]
    fn classify() {
        let r = router(2);
        let h = |m, p, ct, cl| RequestHead {
            method: m,
            path: p,
            content_type: ct,
            content_length: cl,
        };
        assert_eq!(
            r.classify(&h(
                "POST",
                "/v1/chat/completions",
                Some("application/json"),
                Some(10)
            )),
            Ok(Api::ChatCompletions)
        );
        assert_eq!(
            r.classify(&h("GET", "/v1/chat/completions", None, None)),
            Err(FallbackCause::Method)
        );
        assert_eq!(
            r.classify(&h("POST", "/v1/embeddings", None, None)),
            Err(FallbackCause::Path)
        );
        assert_eq!(
            r.classify(&h("POST", "/v1/completions", Some("text/plain"), None)),
            Err(FallbackCause::ContentType)
        );
        assert_eq!(
            r.classify(&h("POST", "/v1/completions", None, Some(10 << 20))),
            Err(FallbackCause::BodyTooLarge)
        );
    }

    #[test]
    fn turns_route_together_when_idle() {
        let r = router(4);
        let loads = vec![HostLoad::default(); 4];
        let d1 = decide(
            &r,
            Api::ChatCompletions,
            chat("hello", 1).as_bytes(),
            None,
            &loads,
            0,
        );
        let d5 = decide(
            &r,
            Api::ChatCompletions,
            chat("hello", 5).as_bytes(),
            None,
            &loads,
            0,
        );
        let host = |d: &Decision| match d {
            Decision::Routed { host, .. } => Some(*host),
            Decision::Fallback(_) => None,
        };
        assert_eq!(host(&d1), host(&d5));
        assert_eq!(d1.outcome(), "hit");
    }

    fn cost_router(n: usize, mode: &str) -> Router {
        cost_router_with(n, &format!(r#""mode":"{mode}""#))
    }

    /// `n` hosts, `cost` = `{<fields>}`, the index's stride one chunk.
    fn cost_router_with(n: usize, fields: &str) -> Router {
        let hosts: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"address":"127.0.0.1:{}"}}"#, 18001 + i))
            .collect();
        let json = format!(r#"{{"hosts":[{}],"cost":{{{fields}}}}}"#, hosts.join(","));
        let mut cfg = Config::from_json(json.as_bytes()).unwrap();
        cfg.cost.index.stride_chunks = 1;
        cfg.cost.shared.stride_bytes = cfg.cost.index.stride_bytes();
        Router::new(cfg)
    }

    #[test]
    fn a_later_turn_weighs_the_replicas_report_not_this_proxys_pending_requests() {
        // The owner is over its bound with 20 requests of this proxy in
        // flight, all still pending; every replica's fresh report shows an
        // empty queue (they were all prefilling when it was taken).
        let r = router(4);
        let idle = vec![HostLoad::default(); 4];
        let host = |d: Decision| match d {
            Decision::Routed { host, .. } => host,
            d => panic!("{d:?}"),
        };
        let o = host(decide(
            &r,
            Api::ChatCompletions,
            chat("hi", 1).as_bytes(),
            None,
            &idle,
            0,
        ));
        let report = |own: u64| {
            Some(crate::load::Report {
                queue: 0.0,
                running: own as f64,
                own,
                own_pending: own,
                at_ms: 1_000,
            })
        };
        let mut loads = vec![
            HostLoad {
                report: report(0),
                ..HostLoad::default()
            };
            4
        ];
        loads[o] = HostLoad {
            inflight: 20,
            pending_requests: 20,
            report: report(20),
            ..HostLoad::default()
        };
        let at = |turns: usize| {
            host(decide(
                &r,
                Api::ChatCompletions,
                chat("hi", turns).as_bytes(),
                None,
                &loads,
                1_000,
            ))
        };
        // A first turn weighs this proxy's 20 pending there and leaves.
        assert_ne!(at(1), o);
        // A later turn weighs the report, which every proxy that heard it
        // weighs alike: no queue, it stays.
        assert_eq!(at(2), o);
        assert_eq!(at(5), o);
    }

    #[test]
    fn with_no_report_a_first_turn_prices_this_proxys_own_waiting_requests() {
        // No replica reports (vLLM sends no ORCA on streams). The owner is
        // under its bound (8) with 5 of this proxy's requests still
        // waiting for their first byte; the others are idle.
        let r = router(4);
        let idle = vec![HostLoad::default(); 4];
        let routed = |d: Decision| match d {
            Decision::Routed { host, spill, .. } => (host, spill.map(|s| s.why)),
            d => panic!("{d:?}"),
        };
        let (o, _) = routed(decide(
            &r,
            Api::ChatCompletions,
            chat("hi", 1).as_bytes(),
            None,
            &idle,
            0,
        ));
        let mut loads = idle.clone();
        loads[o] = HostLoad {
            inflight: 5,
            pending_requests: 5,
            ..HostLoad::default()
        };
        let at = |loads: &[HostLoad], turns: usize| {
            routed(decide(
                &r,
                Api::ChatCompletions,
                chat("hi", turns).as_bytes(),
                None,
                loads,
                0,
            ))
        };
        // A first turn: 5 waiting (0.25 s) outweigh re-prefilling "hi".
        let (h, why) = at(&loads, 1);
        assert_ne!(h, o);
        assert_eq!(why, Some(crate::spill::Why::Priced));
        // A later turn: nothing every proxy sees says to move it.
        assert_eq!(at(&loads, 3), (o, Some(crate::spill::Why::Owner)));
        // Answered (no response byte pending), the same 5 in flight keep it.
        loads[o].pending_requests = 0;
        assert_eq!(at(&loads, 1).0, o);
        // Over its bound the bound decides, as in plain bounded loads.
        loads[o].inflight = 12;
        assert_eq!(at(&loads, 1).1, Some(crate::spill::Why::Bound));
        assert_eq!(at(&loads, 3).0, o);
    }

    /// A chat under `system`: `turns` user turns, answers between them.
    fn app_chat(system: &str, user: &str, turns: usize) -> String {
        let mut m = vec![format!(r#"{{"role":"system","content":"{system}"}}"#)];
        for t in 0..turns {
            m.push(format!(r#"{{"role":"user","content":"{user} turn {t}"}}"#));
            m.push(format!(r#"{{"role":"assistant","content":"answer {t}"}}"#));
        }
        m.pop();
        format!(r#"{{"model":"m","messages":[{}]}}"#, m.join(","))
    }

    #[test]
    fn a_later_turn_under_an_application_preamble_goes_where_its_conversation_goes() {
        // 8 hosts, a 5 KB system prompt (longer than key.prefix_bytes, 4 KiB)
        // shared by 40 conversations: their first turns go to the
        // preamble's owner (the group), their later turns to each
        // conversation's own key owner, the same at every turn.
        let r = router(8);
        let app = "You are the assistant of an application. ".repeat(125);
        let body = app_chat;
        let idle = vec![HostLoad::default(); 8];
        let place = |b: String| match decide(&r, Api::ChatCompletions, b.as_bytes(), None, &idle, 0)
        {
            Decision::Routed { host, key, .. } => (host, key),
            d => panic!("{d:?}"),
        };
        let owner = |k: u64| r.ring.walk(k).next().unwrap();
        let mut firsts = std::collections::BTreeSet::new();
        let mut later = std::collections::BTreeSet::new();
        for i in 0..40 {
            let user = format!("user {i}");
            let (h1, k1) = place(body(&app, &user, 1));
            assert!(k1.preamble_group);
            assert_eq!(h1, owner(k1.group), "first turn: the group owner");
            firsts.insert(h1);
            let (h2, k2) = place(body(&app, &user, 2));
            let (h3, _) = place(body(&app, &user, 3));
            assert_eq!(k2.hash, k1.hash);
            assert_eq!(h2, owner(k1.hash), "later turn: its key owner");
            assert_eq!(h3, h2);
            later.insert(h2);
        }
        assert_eq!(firsts.len(), 1);
        assert!(later.len() >= 6, "later turns spread: {later:?}");
        // A short system prompt: the group holds the user's text, and a
        // later turn stays with it.
        let doc = "my document ".repeat(500);
        let (h1, k1) = place(body("Be brief.", &doc, 1));
        let (h2, _) = place(body("Be brief.", &doc, 2));
        assert!(!k1.preamble_group);
        assert_eq!((h1, h2), (owner(k1.group), h1));
    }

    #[test]
    fn a_first_turn_under_a_preamble_seen_to_converse_opens_where_its_later_turns_go() {
        // 8 hosts, 5 KB system prompts (application preambles). Until a
        // later turn under a preamble is seen, first turns under it meet
        // at its owner (they may be single prompts sharing it); once one
        // is, a first turn takes its own key's walk, where its later turns
        // go. A preamble not seen yet follows the majority of first turns
        // under unseen preambles: single prompts keep their owner, and
        // once most of them opened conversations, first turns take their
        // key's walk.
        let r = router(8);
        let system = |app: &str| format!("You are the assistant of {app}. ").repeat(160);
        let body = app_chat;
        let idle = vec![HostLoad::default(); 8];
        let place = |b: String, seen: &mut crate::spill::Preambles| {
            let req =
                Request::new(Api::ChatCompletions, b.as_bytes(), &idle, 0).with_preambles(seen);
            let d = r.decide(&req).decision;
            r.observed(seen, &d);
            match d {
                Decision::Routed { host, key, .. } => (host, key),
                d => panic!("{d:?}"),
            }
        };
        let owner = |k: u64| r.ring.walk(k).next().unwrap();
        // Users whose own key owner is not the preamble's: a move shows.
        let users = |app: &str| -> Vec<String> {
            (0..60)
                .map(|i| format!("user {i}"))
                .filter(|u| {
                    let (_, k) = place(body(app, u, 1), &mut crate::spill::Preambles::default());
                    owner(k.hash) != owner(k.group)
                })
                .take(4)
                .collect()
        };
        let (a, b) = (system("app A"), system("app B"));
        let (ua, ub) = (users(&a), users(&b));
        assert_eq!((ua.len(), ub.len()), (4, 4));
        let mut seen = crate::spill::Preambles::default();
        // Single prompts under B: at B's owner.
        for u in &ub {
            let (h, k) = place(body(&b, u, 1), &mut seen);
            assert_eq!(
                h,
                owner(k.group),
                "{u}: a single prompt meets at its preamble's owner"
            );
        }
        // A conversation under A opens at A's owner. Its second turn, A's
        // second request at this fresh proxy, finds A still cold (hot from
        // its second request counted), stays there, and shows A converses.
        let (h, k) = place(body(&a, &ua[0], 1), &mut seen);
        assert_eq!(h, owner(k.group));
        assert_eq!(place(body(&a, &ua[0], 2), &mut seen).0, owner(k.group));
        assert!(seen.converses(k.group));
        // A is hot now: its third turn takes its key's walk.
        assert_eq!(place(body(&a, &ua[0], 3), &mut seen).0, owner(k.hash));
        for u in &ua[1..] {
            let (h1, k1) = place(body(&a, u, 1), &mut seen);
            let (h2, _) = place(body(&a, u, 2), &mut seen);
            assert_eq!(
                (h1, h2),
                (owner(k1.hash), h1),
                "{u}: opens where it goes on"
            );
        }
        // B is not seen to converse, and 1 of 5 first turns under unseen
        // preambles opened a conversation: B's prompts keep B's owner.
        let (h, k) = place(body(&b, &ub[0], 1), &mut seen);
        assert_eq!(h, owner(k.group), "another preamble: its owner");
        // A later turn does not read whether its preamble was seen to
        // converse, only whether it is hot: the same host at a proxy that
        // saw A's first turns only.
        let mut firsts = crate::spill::Preambles::default();
        place(body(&a, &ua[1], 1), &mut firsts);
        place(body(&a, &ua[2], 1), &mut firsts);
        assert!(!firsts.converses(k.group));
        let (h3, _) = place(body(&a, &ua[2], 3), &mut firsts);
        assert_eq!(h3, place(body(&a, &ua[2], 3), &mut seen).0);

        // Documents, each in its own system prompt, each asked about in one
        // conversation: a preamble with one request is cold, so both turns
        // stay at the document's owner; each opened a conversation.
        let mut seen = crate::spill::Preambles::default();
        for d in 0..5 {
            let doc = system(&format!("document {d}"));
            let (h1, k) = place(body(&doc, "a reader", 1), &mut seen);
            assert_eq!(h1, owner(k.group), "a new preamble is cold");
            assert_eq!(place(body(&doc, "a reader", 2), &mut seen).0, h1);
        }
        // So a first turn under a busy application not seen to converse
        // yet (hot from its second request) follows that majority: it
        // opens at its key's owner, where its later turns go.
        let c = system("app C");
        let uc = users(&c);
        place(body(&c, &uc[0], 1), &mut seen);
        let (_, kc) = place(body(&c, &uc[1], 1), &mut seen);
        let (h, k) = place(body(&c, &uc[2], 1), &mut seen);
        assert_ne!(owner(k.hash), owner(kc.group));
        assert_eq!(h, owner(k.hash), "the majority: its key's owner");
        assert_eq!(place(body(&c, &uc[2], 2), &mut seen).0, h);
        // Once shares can be measured, each document carries under the
        // bound's slack of one host (1/32 of the traffic at 8 hosts and
        // 1.25): it is cold, and its conversation lives at its owner.
        let docs: Vec<String> = (5..60).map(|d| system(&format!("document {d}"))).collect();
        for (i, doc) in docs.iter().enumerate() {
            let (h1, k) = place(body(doc, "a reader", 1), &mut seen);
            let (h2, _) = place(body(doc, "a reader", 2), &mut seen);
            if i >= 20 {
                assert_eq!((h1, h2), (owner(k.group), owner(k.group)), "document {i}");
            }
        }
    }

    /// A body over the work budget is keyed by its `messages` as written
    /// through the first user message: a conversation's turns that are all
    /// over it share that key (a later turn when a message follows); the
    /// budget running out before the first user message ends, or a body
    /// with no user message, still falls back.
    #[test]
    fn a_body_over_the_budget_is_keyed_by_its_raw_messages_head() {
        let r = cost_router(4, "spill");
        // JSON in strings: `\"` every few bytes, over the budget.
        let tool = r#"{\"a\": \"b\", \"c\": [1, 2], \"d\": {\"e\": \"f\"}}"#.repeat(60);
        let body = |turns: usize| {
            let mut m = vec![
                r#"{"role":"system","content":"sys"}"#.to_string(),
                r#"{"role":"user","content":"find it"}"#.to_string(),
            ];
            for t in 0..turns {
                m.push(format!(r#"{{"role":"tool","content":"{t}{tool}"}}"#));
            }
            format!(r#"{{"messages":[{}],"model":"m"}}"#, m.join(","))
        };
        let (a, b) = (body(40), body(60));
        for x in [&a, &b] {
            let e = extract(Api::ChatCompletions, x.as_bytes(), &mut Vec::new());
            assert!(matches!(e, Err(ExtractError::TooComplex(_))), "{e:?}");
        }
        let head = r#"[{"role":"system","content":"sys"},{"role":"user","content":"find it"}"#;
        let ka = r.key(Api::ChatCompletions, a.as_bytes(), None).unwrap();
        let kb = r.key(Api::ChatCompletions, b.as_bytes(), None).unwrap();
        assert_eq!(ka.hash, hash::raw_key(head.as_bytes()));
        assert_eq!(
            (ka.hash, ka.group, ka.source),
            (kb.hash, kb.hash, KeySource::Raw)
        );
        assert!(
            ka.anchored && ka.prompt_bytes == a.len() as u64 && ka.prompt_bytes > ka.bytes_hashed
        );
        // Written as Python's `json.dumps` does by default (`", "`, `": "`).
        let spaced = b.replace(r#"":"#, r#"": "#).replace(r#"},{"#, r#"}, {"#);
        let ks = r
            .key(Api::ChatCompletions, spaced.as_bytes(), None)
            .unwrap();
        let head = head.replace(r#"":"#, r#"": "#).replace(r#"},{"#, r#"}, {"#);
        assert_eq!(
            (ks.hash, ks.anchored),
            (hash::raw_key(head.as_bytes()), true)
        );
        // A first turn: nothing after its user message but fields.
        let first = format!(
            r#"{{"messages":[{{"role":"user","content":"q"}}],"tools":[{{"x":"{}"}}]}}"#,
            tool.repeat(40)
        );
        let k = r.key(Api::ChatCompletions, first.as_bytes(), None).unwrap();
        assert_eq!((k.source, k.anchored), (KeySource::Raw, false));
        // The budget runs out inside the first user message; no user message.
        for x in [
            format!(
                r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
                tool.repeat(40)
            ),
            format!(
                r#"{{"messages":[{{"role":"tool","content":"{}"}}]}}"#,
                tool.repeat(40)
            ),
        ] {
            assert_eq!(
                r.key(Api::ChatCompletions, x.as_bytes(), None),
                Err(FallbackCause::TooComplex)
            );
        }
    }

    /// A Responses agent (Codex-style: the whole history as `input` items,
    /// tool output in `function_call_output`) over the budget is keyed by
    /// its `input` head as a chat is by its `messages` head.
    #[test]
    fn a_responses_body_over_the_budget_is_keyed_by_its_raw_input_head() {
        let r = cost_router(4, "spill");
        let out = r#"fn main() {\n    println!(\"{}\", x);\n}\n"#.repeat(60);
        let head = r#"[{"type":"message","role":"developer","content":"d"},{"type":"message","role":"user","content":[{"type":"input_text","text":"fix it"}]}"#;
        let body = |turns: usize| {
            let items: Vec<String> = (0..turns)
                .map(|t| {
                    format!(
                        r#"{{"type":"function_call","call_id":"c{t}","name":"read","arguments":"{{\"path\":\"a.rs\"}}"}},{{"type":"function_call_output","call_id":"c{t}","output":"{out}"}}"#
                    )
                })
                .collect();
            format!(
                r#"{{"model":"m","instructions":"be brief","input":{head},{}],"stream":true}}"#,
                items.join(",")
            )
        };
        let (a, b) = (body(8), body(12));
        for x in [&a, &b] {
            let e = extract(Api::Responses, x.as_bytes(), &mut Vec::new());
            assert!(matches!(e, Err(ExtractError::TooComplex(_))), "{e:?}");
        }
        let ka = r.key(Api::Responses, a.as_bytes(), None).unwrap();
        let kb = r.key(Api::Responses, b.as_bytes(), None).unwrap();
        assert_eq!(ka.hash, hash::raw_key(head.as_bytes()));
        assert_eq!(
            (kb.hash, kb.source, kb.anchored),
            (ka.hash, KeySource::Raw, true)
        );
        // A string `input` has no items: over the budget it falls back.
        let long = out.repeat(20);
        let s = format!(r#"{{"model":"m","instructions":"{long}","input":"hi"}}"#);
        assert_eq!(
            r.key(Api::Responses, s.as_bytes(), None),
            Err(FallbackCause::TooComplex)
        );
    }

    #[test]
    fn key_with_chain_keeps_keys() {
        let r = cost_router(4, "index");
        let body = chat(&"long first message ".repeat(30), 3);
        for session in [None, Some("s1"), Some("")] {
            let k = r
                .key(
                    Api::ChatCompletions,
                    body.as_bytes(),
                    session.map(str::as_bytes),
                )
                .unwrap();
            let (k2, chain) = r
                .key_with_chain(
                    Api::ChatCompletions,
                    body.as_bytes(),
                    session.map(str::as_bytes),
                )
                .unwrap();
            assert_eq!(k, k2);
            let mut v = Vec::new();
            extract(Api::ChatCompletions, body.as_bytes(), &mut v).unwrap();
            assert_eq!(chain.bytes, v.len() as u64);
            assert_eq!(chain.hashes.len(), v.len() / 64);
        }
        // A session key survives a body without a prompt.
        let empty = r#"{"model":"m","messages":[]}"#;
        assert!(r.key(Api::ChatCompletions, empty.as_bytes(), None).is_err());
        let (k, c) = r
            .key_with_chain(Api::ChatCompletions, empty.as_bytes(), Some(&b"s"[..]))
            .unwrap();
        assert_eq!(k.source, KeySource::Session);
        assert_eq!(c, PromptChain::default());
    }

    /// Independent proxies whose configs list the same replicas in another
    /// order decide alike: every decision names the same address, under
    /// the same loads (given by address) and reports.
    #[test]
    fn proxies_listing_hosts_in_another_order_decide_alike() {
        let addrs: Vec<String> = (0..7).map(|i| format!("10.0.0.{}:8000", i + 1)).collect();
        let fwd: Vec<&str> = addrs.iter().map(|s| s.as_str()).collect();
        let mut other = fwd.clone();
        other.reverse();
        other.rotate_left(3);
        let a = Router::new(Config::with_hosts(&fwd).unwrap());
        let b = Router::new(Config::with_hosts(&other).unwrap());
        // Load by address: in-flight counts and a report at 1,000 ms.
        let load_of = |addr: &str, round: u64| {
            let k = addrs.iter().position(|x| x == addr).unwrap() as u64;
            let inflight = (round * (k + 3)) % 13;
            HostLoad {
                inflight,
                report: k.is_multiple_of(2).then_some(Report {
                    queue: ((round + k) % 9) as f64,
                    running: ((round * k) % 7) as f64,
                    own: inflight,
                    own_pending: 0,
                    at_ms: 1_000,
                }),
                ..HostLoad::default()
            }
        };
        let loads = |r: &Router, round: u64| -> Vec<HostLoad> {
            r.config()
                .hosts
                .iter()
                .map(|h| load_of(&h.address, round))
                .collect()
        };
        let routed = |r: &Router, d: &Decision| match d {
            Decision::Routed { host, .. } => r.config().hosts[*host].address.clone(),
            Decision::Fallback(c) => panic!("fallback {c:?}"),
        };
        let mut moved = 0;
        for round in 0..12u64 {
            let (la, lb) = (loads(&a, round), loads(&b, round));
            for t in 0..40 {
                let body = chat(&format!("conversation {t}"), 1 + t % 4);
                let da = decide(&a, Api::ChatCompletions, body.as_bytes(), None, &la, 1_200);
                let db = decide(&b, Api::ChatCompletions, body.as_bytes(), None, &lb, 1_200);
                assert_eq!(routed(&a, &da), routed(&b, &db), "round {round}, {t}");
                moved += usize::from(da.outcome() != "hit");
            }
        }
        // The loads do move some requests off their owners: the check
        // covers the rule's moves, not only the ring.
        assert!(moved > 0, "{moved}");
    }

    #[test]
    fn cost_off_decides_by_the_ring() {
        let r = cost_router(5, "off");
        let ix = r.new_index();
        for load in 0..20u64 {
            let loads: Vec<HostLoad> = (0..5)
                .map(|i| HostLoad {
                    inflight: (load * (i + 3)) % 11,
                    ..HostLoad::default()
                })
                .collect();
            for t in 0..6 {
                let body = chat(&format!("conversation {t}"), 2);
                let d = decide(&r, Api::ChatCompletions, body.as_bytes(), None, &loads, 0);
                let (d2, chain) = decide_ix(
                    &r,
                    Api::ChatCompletions,
                    body.as_bytes(),
                    None,
                    &loads,
                    &ix,
                    0,
                );
                assert_eq!(d, d2);
                assert_eq!(chain, PromptChain::default());
                // Plain bounded loads, computed by the ring alone.
                let k = r.key(Api::ChatCompletions, body.as_bytes(), None).unwrap();
                let inflight: Vec<u64> = loads.iter().map(|l| l.inflight).collect();
                let want = r
                    .ring()
                    .place(k.hash, &inflight, &r.bound(), &[true; 5])
                    .unwrap();
                match d {
                    Decision::Routed { host, skipped, .. } => {
                        assert_eq!((host, skipped), (want.host, want.skipped))
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn only_a_key_ending_at_the_first_user_message_is_anchored() {
        let r = router(3);
        let k = r
            .key(Api::ChatCompletions, chat("x", 2).as_bytes(), None)
            .unwrap();
        assert!(k.anchored && k.prompt_bytes > k.bytes_hashed, "{k:?}");
        let prompt = format!(r#"{{"model":"m","prompt":"{}"}}"#, "p".repeat(9000));
        let k = r.key(Api::Completions, prompt.as_bytes(), None).unwrap();
        assert!(!k.anchored && k.prompt_bytes > k.bytes_hashed, "{k:?}");
        let k = r
            .key(
                Api::ChatCompletions,
                chat("x", 2).as_bytes(),
                Some(&b"s"[..]),
            )
            .unwrap();
        assert!(!k.anchored, "{k:?}");
    }

    #[test]
    fn a_given_key_is_placed_instead_of_the_bodys() {
        let r = router(5);
        let idle = vec![HostLoad::default(); 5];
        let (a, b) = (chat("first", 1), chat("second", 3));
        let kb = r.key(Api::ChatCompletions, b.as_bytes(), None).unwrap();
        let given =
            r.decide(&Request::new(Api::ChatCompletions, a.as_bytes(), &idle, 0).with_key(kb));
        let direct = decide(&r, Api::ChatCompletions, b.as_bytes(), None, &idle, 0);
        assert_eq!(given.decision, direct);
        // A given key is placed without reading the body.
        let junk = r.decide(&Request::new(Api::ChatCompletions, b"{oops", &idle, 0).with_key(kb));
        assert_eq!(junk.decision, direct);
        // The index rule without an index decides as with an empty one.
        let r = cost_router(5, "index");
        let ix = r.new_index();
        let long = chat(&"x".repeat(4000), 2);
        let none = r.decide(&Request::new(
            Api::ChatCompletions,
            long.as_bytes(),
            &idle,
            0,
        ));
        let (d, chain) = decide_ix(
            &r,
            Api::ChatCompletions,
            long.as_bytes(),
            None,
            &idle,
            &ix,
            0,
        );
        assert_eq!((none.decision, none.chain), (d, chain.clone()));
        assert!(!chain.hashes.is_empty());
    }

    #[test]
    fn cost_on_follows_the_cache_and_the_queue() {
        let r = cost_router(4, "index");
        let mut ix = r.new_index();
        let body = chat(&"x".repeat(4000), 3);
        let idle = vec![HostLoad::default(); 4];
        let (d, chain) = decide_ix(
            &r,
            Api::ChatCompletions,
            body.as_bytes(),
            None,
            &idle,
            &ix,
            0,
        );
        let Decision::Routed {
            host: owner,
            skipped: 0,
            key,
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        let walk: Vec<usize> = r.ring().walk(key.hash).collect();
        // The second host on the walk served it (say, a spill): the index
        // learns that, and an idle fleet now prefers it.
        ix.observe(walk[1], &chain.hashes, 1);
        let (d, _) = decide_ix(
            &r,
            Api::ChatCompletions,
            body.as_bytes(),
            None,
            &idle,
            &ix,
            2,
        );
        assert_eq!(d.outcome(), "moved");
        assert!(
            matches!(d, Decision::Routed { host, skipped: 1, moved: true, .. } if host == walk[1])
        );
        // A long queue there outweighs the ~1,000 cached tokens (0.07 s):
        // 3 requests' worth of prefill ahead.
        let mut busy = idle.clone();
        busy[walk[1]].inflight = 3;
        busy[walk[1]].pending_prefill_tokens = 3 * 2_000;
        let (d, _) = decide_ix(
            &r,
            Api::ChatCompletions,
            body.as_bytes(),
            None,
            &busy,
            &ix,
            2,
        );
        assert!(matches!(d, Decision::Routed { host, .. } if host == owner));
    }

    #[test]
    fn token_queue_sees_reported_queues() {
        // The owner's reported queue (work this router
        // did not send) is priced at service_s per request and moves a new
        // conversation; without the report the owner keeps it.
        let r = cost_router(4, "index");
        let ix = r.new_index();
        let body = chat(&"new conversation ".repeat(200), 1);
        let idle = vec![HostLoad::default(); 4];
        let (d, _) = decide_ix(
            &r,
            Api::ChatCompletions,
            body.as_bytes(),
            None,
            &idle,
            &ix,
            0,
        );
        let Decision::Routed {
            host: owner,
            skipped: 0,
            ..
        } = d
        else {
            panic!("{d:?}")
        };
        let mut reported = idle.clone();
        reported[owner].report = Some(Report {
            queue: 2.0,
            running: 0.0,
            own: 0,
            own_pending: 0,
            at_ms: 0,
        });
        let at = |now_ms: u64| {
            decide_ix(
                &r,
                Api::ChatCompletions,
                body.as_bytes(),
                None,
                &reported,
                &ix,
                now_ms,
            )
            .0
        };
        let d = at(1);
        assert!(
            matches!(d, Decision::Routed { host, skipped: 1, .. } if host != owner),
            "{d:?}"
        );
        // Its waiting count fades (load.report_fade_ms, 2 s): 1 s on, the
        // 2 waiting still count (rounded up), 2 s on nothing does.
        let fade = r.config().load.report_fade_ms;
        assert_eq!(fade, 2_000);
        let d = at(fade / 2);
        assert!(
            matches!(d, Decision::Routed { host, .. } if host != owner),
            "{d:?}"
        );
        let d = at(fade);
        assert!(
            matches!(d, Decision::Routed { host, skipped: 0, .. } if host == owner),
            "{d:?}"
        );
        // A stale report (past load.report_ttl_ms) no longer counts.
        let d = at(1 + r.config().load.report_ttl_ms + 1);
        assert!(matches!(d, Decision::Routed { host, skipped: 0, .. } if host == owner));
    }

    #[test]
    fn model_scopes_keys() {
        let r = router(4);
        let a = r
            .key(Api::ChatCompletions, chat("x", 1).as_bytes(), None)
            .unwrap();
        let other = chat("x", 1).replace(r#""model":"m""#, r#""model":"n""#);
        let b = r.key(Api::ChatCompletions, other.as_bytes(), None).unwrap();
        assert_ne!(a.hash, b.hash);
        // Field order does not matter: model after messages.
        let moved = r#"{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"x"}],"stream":true,"model":"m"}"#;
        assert_eq!(
            r.key(Api::ChatCompletions, moved.as_bytes(), None).unwrap(),
            a
        );
    }

    #[test]
    fn session_overrides_prompt() {
        let r = router(4);
        let a = r
            .key(
                Api::ChatCompletions,
                chat("x", 1).as_bytes(),
                Some(&b"s1"[..]),
            )
            .unwrap();
        let b = r
            .key(
                Api::ChatCompletions,
                chat("y", 3).as_bytes(),
                Some(&b"s1"[..]),
            )
            .unwrap();
        assert_eq!((a.hash, a.group), (b.hash, b.group));
        assert!(a.prompt_bytes < b.prompt_bytes);
        assert_eq!(a.source, KeySource::Session);
    }

    #[test]
    fn reported_queue_over_bound_spills() {
        let r = router(4);
        let body = chat("hello", 1);
        let idle = vec![HostLoad::default(); 4];
        let Decision::Routed { host, .. } =
            decide(&r, Api::ChatCompletions, body.as_bytes(), None, &idle, 0)
        else {
            panic!()
        };
        let mut loads = idle.clone();
        loads[host].report = Some(Report {
            queue: 100.0,
            running: 0.0,
            own: 0,
            own_pending: 0,
            at_ms: 0,
        });
        let d = decide(&r, Api::ChatCompletions, body.as_bytes(), None, &loads, 5);
        match d {
            Decision::Routed {
                host: h2, skipped, ..
            } => {
                assert_ne!(h2, host);
                assert_eq!(skipped, 1);
                assert_eq!(d.outcome(), "spill");
            }
            _ => panic!(),
        }
        // The report goes stale and the key comes back.
        let d = decide(
            &r,
            Api::ChatCompletions,
            body.as_bytes(),
            None,
            &loads,
            20_000,
        );
        assert!(matches!(d, Decision::Routed { host: h, skipped: 0, .. } if h == host));
    }

    #[test]
    fn ejected_owner_spills_to_the_same_successor_and_returns() {
        let r = router(4);
        let body = chat("hello", 1);
        let idle = vec![HostLoad::default(); 4];
        let Decision::Routed { host, .. } =
            decide(&r, Api::ChatCompletions, body.as_bytes(), None, &idle, 0)
        else {
            panic!()
        };
        let second = r
            .ring()
            .walk(
                r.key(Api::ChatCompletions, body.as_bytes(), None)
                    .unwrap()
                    .hash,
            )
            .nth(1)
            .unwrap();
        let mut loads = idle.clone();
        loads[host].ejected = true;
        assert!(matches!(
            decide(&r, Api::ChatCompletions, body.as_bytes(), None, &loads, 0),
            Decision::Routed { host: h, skipped: 1, .. } if h == second
        ));
        // All ejected: ejection is ignored.
        let all: Vec<HostLoad> = idle
            .iter()
            .map(|l| HostLoad {
                ejected: true,
                ..*l
            })
            .collect();
        assert!(matches!(
            decide(&r, Api::ChatCompletions, body.as_bytes(), None, &all, 0),
            Decision::Routed { host: h, skipped: 0, .. } if h == host
        ));
    }

    #[test]
    fn fallbacks() {
        let r = router(2);
        let l = vec![HostLoad::default(); 2];
        assert_eq!(
            decide(&r, Api::ChatCompletions, b"{oops", None, &l, 0),
            Decision::Fallback(FallbackCause::ParseError)
        );
        assert_eq!(
            decide(&r, Api::ChatCompletions, br#"{"messages":[]}"#, None, &l, 0),
            Decision::Fallback(FallbackCause::EmptyPrompt)
        );
        assert_eq!(
            Decision::Fallback(FallbackCause::ParseError).describe(r.config()),
            "outcome=fallback;cause=parse_error"
        );
        // Over the work budget: in the first pass (a message per 3 bytes)
        // and in the second (a non-text part per 2 bytes).
        let dense = |item: &str, wrap: &str| {
            let items = vec![item; 200_000].join(",");
            wrap.replace("@", &items).into_bytes()
        };
        for body in [
            dense("{}", r#"{"messages":[@]}"#),
            dense("0", r#"{"messages":[{"role":"user","content":[@]}]}"#),
        ] {
            assert_eq!(
                decide(&r, Api::ChatCompletions, &body, None, &l, 0),
                Decision::Fallback(FallbackCause::TooComplex)
            );
        }
    }

    #[test]
    fn track_recent_feeds_the_hot_rule() {
        let r = cost_router(3, "index");
        let mut trend = LoadTrend::new();
        let mut loads = vec![HostLoad::default(); 3];
        loads[0].inflight = 6;
        loads[1].inflight = 1;
        r.track_recent(&mut trend, &mut loads, 1_000);
        let recent: Vec<f64> = loads.iter().map(|l| l.recent).collect();
        assert_eq!(recent, vec![6.0, 1.0, 0.0]);
        // Off: the loads are left alone.
        let mut raw = crate::config::RawConfig::default_without_hosts();
        raw.hosts = (0..3)
            .map(|i| crate::config::RawHost {
                address: format!("127.0.0.1:{}", 18001 + i),
                name: None,
                weight: None,
            })
            .collect();
        let mut cfg = raw.compile().unwrap();
        cfg.cost.params.hot_window_s = 0.0;
        let off = Router::new(cfg);
        let mut fresh = vec![HostLoad::default(); 3];
        fresh[0].inflight = 6;
        off.track_recent(&mut LoadTrend::new(), &mut fresh, 1_000);
        assert!(fresh.iter().all(|l| l.recent == 0.0));
    }

    #[test]
    fn describe_routed() {
        let r = router(2);
        let d = Decision::Routed {
            host: 1,
            skipped: 0,
            key: Key {
                hash: 0xab,
                source: KeySource::Prompt,
                bytes_hashed: 12,
                prompt_bytes: 12,
                group: 0xab,
                anchored: true,
                preamble_group: false,
            },
            cached: None,
            moved: false,
            hot_skipped: 0,
            spill: None,
        };
        assert_eq!(
            d.describe(r.config()),
            "outcome=hit;host=127.0.0.1:18002;source=prompt;skipped=0;key=00000000000000ab;bytes=12"
        );
        let d = match d {
            Decision::Routed { host, key, .. } => Decision::Routed {
                host,
                skipped: 1,
                key,
                cached: Some(4096),
                moved: false,
                hot_skipped: 0,
                spill: None,
            },
            other => other,
        };
        assert_eq!(
            d.describe(r.config()),
            "outcome=spill;host=127.0.0.1:18002;source=prompt;skipped=1;key=00000000000000ab;bytes=12;cached=4096"
        );
        let d = match d {
            Decision::Routed { host, key, .. } => Decision::Routed {
                host,
                skipped: 1,
                key,
                cached: Some(4096),
                moved: true,
                hot_skipped: 2,
                spill: None,
            },
            other => other,
        };
        assert_eq!(
            d.describe(r.config()),
            "outcome=moved;host=127.0.0.1:18002;source=prompt;skipped=1;key=00000000000000ab;bytes=12;cached=4096;hot_skipped=2"
        );
        // The priced spill's account: the owner only when another host
        // was chosen; the waits, or that the owner had no fresh report.
        let with = |d: Decision, n: SpillNote| match d {
            Decision::Routed { host, key, .. } => Decision::Routed {
                host,
                skipped: 1,
                key,
                cached: None,
                moved: n.why == crate::spill::Why::Priced,
                hot_skipped: 0,
                spill: Some(n),
            },
            other => other,
        };
        let priced = SpillNote {
            later: false,
            why: crate::spill::Why::Priced,
            owner: 0,
            wait_ms: Some((1500, 0)),
            reported: true,
            held_ms: 125,
            preamble: None,
        };
        assert_eq!(
            with(d, priced).describe(r.config()),
            "outcome=moved;host=127.0.0.1:18002;source=prompt;skipped=1;key=00000000000000ab;bytes=12;turn=first;why=priced;owner=127.0.0.1:18001;wait_ms=1500/0;held_ms=125"
        );
        let stayed = SpillNote {
            later: true,
            why: crate::spill::Why::Owner,
            owner: 1,
            wait_ms: None,
            reported: false,
            held_ms: 40,
            preamble: None,
        };
        assert_eq!(
            with(d, stayed).describe(r.config()),
            "outcome=spill;host=127.0.0.1:18002;source=prompt;skipped=1;key=00000000000000ab;bytes=12;turn=later;why=owner;report=none;held_ms=40"
        );
        let cold = SpillNote {
            preamble: Some("cold"),
            ..stayed
        };
        assert!(with(d, cold)
            .describe(r.config())
            .ends_with(";report=none;held_ms=40;preamble=cold"));
    }

    #[test]
    fn the_spill_rule_explains_a_priced_move() {
        // A first turn whose owner reports a queue and whose successor
        // reports none: moved, and the note says by how much.
        let r = Router::new(
            Config::with_hosts(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]).unwrap(),
        );
        let body = br#"{"model":"m","messages":[{"role":"user","content":"explain this decision please"}]}"#;
        let probe = r
            .decide(&Request::new(Api::ChatCompletions, body, &[], 1_000))
            .decision;
        let Decision::Routed { host: owner, .. } = probe else {
            panic!("not routed: {probe:?}")
        };
        let mut loads = vec![HostLoad::default(); 3];
        for (h, l) in loads.iter_mut().enumerate() {
            let q = if h == owner { 4.0 } else { 0.0 };
            l.report = Some(crate::load::Report {
                queue: q,
                running: 0.0,
                own: 0,
                own_pending: 0,
                at_ms: 1_000,
            });
        }
        let d = r
            .decide(&Request::new(Api::ChatCompletions, body, &loads, 1_000))
            .decision;
        let Decision::Routed {
            host,
            spill: Some(n),
            ..
        } = d
        else {
            panic!("no spill note: {d:?}")
        };
        assert_ne!(host, owner);
        assert_eq!(n.owner, owner);
        assert!(!n.later);
        assert_eq!(n.why, crate::spill::Why::Priced);
        assert_eq!(n.wait_ms, Some((2000, 0)));
        let text = d.describe(r.config());
        assert!(text.starts_with("outcome=moved;"), "{text}");
        assert!(
            text.contains(";turn=first;why=priced;owner=10.0.0."),
            "{text}"
        );
        assert!(text.contains(";wait_ms=2000/0;held_ms="), "{text}");
    }

    /// A [`LoadSource`] over a slice that counts the hosts asked about.
    struct Counting<'a> {
        loads: &'a [HostLoad],
        asked: std::cell::RefCell<std::collections::BTreeSet<usize>>,
    }

    impl LoadSource for Counting<'_> {
        fn load(&self, h: usize) -> HostLoad {
            self.asked.borrow_mut().insert(h);
            self.loads.get(h).copied().unwrap_or_default()
        }
        fn total(&self, now_ms: u64, fresh: crate::load::Freshness) -> u64 {
            self.loads.iter().map(|l| l.effective(now_ms, fresh)).sum()
        }
    }

    #[test]
    fn on_demand_loads_decide_alike_and_ask_about_few_hosts() {
        let n = 256;
        for mode in ["spill", "off", "index"] {
            // The index rule without its hot-host rule (which reads every
            // host) and with it.
            let mut configs = vec![cost_router(n, mode)];
            if mode == "index" {
                let mut cfg = cost_router(n, mode).config().clone();
                cfg.cost.params.hot_window_s = 0.0;
                configs.push(Router::new(cfg));
            }
            for r in configs {
                let ix = r.new_index();
                let mut x = 0x9E37_79B9_7F4A_7C15u64;
                let mut rnd = |m: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % m
                };
                for case in 0..60 {
                    let loads: Vec<HostLoad> = (0..n)
                        .map(|_| HostLoad {
                            // A few hosts far over the bound: walks pass them.
                            inflight: if rnd(6) == 0 { 30 + rnd(20) } else { rnd(6) },
                            report: (rnd(3) == 0).then(|| Report {
                                queue: rnd(5) as f64,
                                running: rnd(4) as f64,
                                own: rnd(3),
                                own_pending: 0,
                                at_ms: 1_000,
                            }),
                            // Every host ejected in case 7: all count as eligible.
                            ejected: case == 7 || rnd(10) == 0,
                            ..HostLoad::default()
                        })
                        .collect();
                    let body = chat(
                        &format!("conversation {case} {}", "x".repeat(case * 50)),
                        1 + case % 3,
                    );
                    let req = Request::new(Api::ChatCompletions, body.as_bytes(), &loads, 1_500)
                        .with_index(&ix);
                    let want = r.decide(&req);
                    let src = Counting {
                        loads: &loads,
                        asked: Default::default(),
                    };
                    let got = r.decide(&req.with_source(&src));
                    assert_eq!(got, want, "{mode} case {case}");
                    let asked = src.asked.borrow().len();
                    if let Decision::Routed { host, key, .. } = want.decision {
                        let f = r.failover(key.hash, host, &loads, 1_500);
                        assert_eq!(r.failover_from(key.hash, host, &src, 1_500), f);
                    }
                    let reads_all = r.reads_every_host();
                    if case != 7 && !reads_all {
                        assert!(asked <= 24, "{mode} case {case}: asked about {asked} hosts");
                    }
                }
            }
        }
    }
}
