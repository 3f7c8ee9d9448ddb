//! Filter configuration, in two phases.
//!
//! 1. [`RawConfig`]: serde structs mirroring the filter JSON, with
//!    `deny_unknown_fields` and the documented defaults below.
//! 2. [`Config`]: the validated, immutable form the router runs on, built by
//!    [`Config::from_json`] / [`RawConfig::compile`]. Every error is a
//!    [`ConfigError`] naming the field, the value and the reason, e.g.
//!    ``field `capacity_factor` = 0.5: must be >= 1``; JSON type errors too
//!    (``field `vnodes` = -5: must be an integer 0..=4294967295``: the field's
//!    path is found from where serde_json stopped, `error_path`).
//!
//! Every field, its type, default, allowed values and meaning are the doc
//! comments of the `Raw*` structs below: `docs/config.md` is generated from
//! them (`PREFIX_ROUTER_BLESS=1 cargo test -p prefix-router-core --test
//! config_reference`; the test fails when it is stale).

use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;

use crate::extract::Api;

/// A validation error: which field, what value, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the field, e.g. `hosts[1].address`.
    pub field: String,
    /// The offending value as written (or a summary).
    pub value: String,
    /// Why it is rejected.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid prefix-router config: field `{}` = {}: {}",
            self.field, self.value, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl AsRef<str>, value: impl fmt::Display, reason: impl AsRef<str>) -> ConfigError {
    // One body for every type of value (each type's copy of it cost the
    // .wasm about 250 bytes); the copies left only borrow their arguments.
    #[inline(never)]
    fn of(field: &str, value: &dyn fmt::Display, reason: &str) -> ConfigError {
        ConfigError {
            field: field.to_owned(),
            value: value.to_string(),
            reason: reason.to_owned(),
        }
    }
    of(field.as_ref(), &value, reason.as_ref())
}

/// A list of metric names (`given`, else the preset): names without labels;
/// `[]` is allowed and `empty` says what it means.
fn metric_names(
    field: &str,
    given: Option<&Vec<String>>,
    preset: Vec<String>,
    empty: &str,
) -> Result<Vec<String>, ConfigError> {
    let names = given.cloned().unwrap_or(preset);
    if names.iter().any(|m| m.is_empty() || m.contains([' ', '{'])) {
        return Err(err(
            field,
            format!("{names:?}"),
            format!("metric names without labels ([] {empty})"),
        ));
    }
    Ok(names)
}

/// The replicas, one object each: the model servers requests are routed
/// to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    /// The replica's `ip:port` exactly as Envoy knows the endpoint (the
    /// filter names it in the destination header). Each endpoint once,
    /// however written: `127.0.0.1:80` and `[::ffff:127.0.0.1]:80` are one.
    /// Allowed: `ip:port`, port 1..=65535, not an unspecified address (`0.0.0.0`, `::`).
    pub address: String,
    /// Stable ring identity: keep it when the address changes and the
    /// replica keeps its keys. Null: the address. Names must differ in
    /// their letters or digits, which name the per-host metrics.
    /// Allowed: a non-empty string.
    #[serde(default)]
    pub name: Option<String>,
    /// Relative capacity: the host's share of ring points and of the bound.
    /// Null: 1.
    /// Allowed: > 0 and <= 1000.
    #[serde(default)]
    pub weight: Option<f64>,
}

/// How the routing key is chosen: which part of a request decides its
/// place on the ring.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    /// `conversation`: the key is the prompt through the first user
    /// message (a conversation's turns share it); `prefix`: the first
    /// `key.prefix_bytes` bytes of the prompt.
    /// Allowed: `"conversation"`, `"prefix"`.
    #[serde(default = "d_mode")]
    pub mode: String,
    /// Key length in `prefix` mode, and for `/v1/completions` in either
    /// mode; also caps the group key ([`crate::spill`]).
    /// Allowed: 1..=8388608.
    #[serde(default = "d_prefix_bytes")]
    pub prefix_bytes: u64,
    /// A request header whose value, when present and non-empty, is the key
    /// (sticky sessions). Null: none.
    /// Allowed: an HTTP header name other than `destination_header`.
    #[serde(default)]
    pub session_header: Option<String>,
    /// Use the body's `user` field, when present, as the key.
    #[serde(default)]
    pub use_user_field: bool,
    /// Mix vLLM's `cache_salt` field into the key's seed (requests with
    /// different salts never share a replica's cache).
    #[serde(default = "d_true")]
    pub use_cache_salt: bool,
}

impl Default for RawKey {
    fn default() -> Self {
        RawKey {
            mode: d_mode(),
            prefix_bytes: d_prefix_bytes(),
            session_header: None,
            use_user_field: false,
            use_cache_salt: true,
        }
    }
}

/// Where replicas' load reports come from, and how long they count
/// ([`crate::load`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLoad {
    /// Value of the `endpoint-load-metrics-format` header added to a routed
    /// request, asking the replica (vLLM) for an ORCA load report in its
    /// response; a worker asks each host at most once per 20 ms. Null: do
    /// not ask.
    /// Allowed: `"TEXT"`, `"JSON"` (any case), null.
    #[serde(default = "d_orca_format")]
    pub orca_format: Option<String>,
    /// ORCA named metrics summed into the reported queue depth (waiting
    /// requests).
    /// Allowed: metric names (no `,`, `=` or space); at least one unless `load.orca_format` is null.
    #[serde(default = "d_orca_metrics")]
    pub orca_metrics: Vec<String>,
    /// ORCA named metrics summed into the reported running count. The bound
    /// counts a host's load as this Envoy's in-flight requests plus the
    /// fresh report's waiting + running requests beyond this Envoy's own at
    /// the time of the report (the fleet's load when several proxies share
    /// the replicas). `[]`: none.
    /// Allowed: metric names (no `,`, `=` or space).
    #[serde(default = "d_orca_running_metrics")]
    pub orca_running_metrics: Vec<String>,
    /// A plain response header carrying the queue depth. Null: none.
    /// Allowed: an HTTP header name.
    #[serde(default = "d_queue_header")]
    pub queue_header: Option<String>,
    /// Reports older than this stop counting, ms.
    /// Allowed: 1..=3600000.
    #[serde(default = "d_ttl")]
    pub report_ttl_ms: u64,
    /// A report's waiting count weighs `1 - age / report_fade_ms` as the
    /// queue a request would wait in, so a busy queue fades as its
    /// requests are admitted instead of pricing a replica out, and marking
    /// it hot, for the whole TTL while it sends no fresh report. In the
    /// bound's load the report's waiting and running requests hold until
    /// `report_ttl_ms` (admitted requests stay in the replica). 0: full
    /// weight until `report_ttl_ms` ([`crate::load::Freshness`]).
    /// Allowed: 0..=3600000.
    #[serde(default = "d_fade")]
    pub report_fade_ms: u64,
}

impl Default for RawLoad {
    fn default() -> Self {
        RawLoad {
            orca_format: d_orca_format(),
            orca_metrics: d_orca_metrics(),
            orca_running_metrics: d_orca_running_metrics(),
            queue_header: d_queue_header(),
            report_ttl_ms: d_ttl(),
            report_fade_ms: d_fade(),
        }
    }
}

/// Passive health: hosts whose requests keep failing are taken out of
/// rotation for a while ([`crate::health`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    /// Consecutive failed tries (connect failure, reset, 5xx, a stream cut
    /// short, a try Envoy retried on another host:
    /// [`crate::health::verdicts`]) that eject a host. 0: off.
    /// Allowed: 0..=1000.
    #[serde(default = "d_failures")]
    pub failure_threshold: u32,
    /// How long an ejected host stays out, ms.
    /// Allowed: 1..=3600000.
    #[serde(default = "d_cooldown")]
    pub cooldown_ms: u64,
    /// Consecutive tries whose connection failed or was lost (refused,
    /// closed mid-response, or retried elsewhere by a retry policy that,
    /// like `envoy/envoy.yaml`'s, retries only tries the host got nothing
    /// of) that eject it sooner: a killed replica is down, not busy. 0: off
    /// (they count as ordinary failures).
    /// Allowed: 0..=1000.
    #[serde(default = "d_unreachable")]
    pub unreachable_threshold: u32,
}

impl Default for RawHealth {
    fn default() -> Self {
        RawHealth {
            failure_threshold: d_failures(),
            cooldown_ms: d_cooldown(),
            unreachable_threshold: d_unreachable(),
        }
    }
}

fn d_unreachable() -> u32 {
    2
}

/// The routing rule and its parameters: the priced spill
/// ([`crate::spill`]) or the index rule ([`crate::cost`], with its prefix
/// index, [`crate::index`] / [`crate::shared_index`]). Five knobs; every
/// other value of the rules is a documented constant (docs/design.md,
/// "Constants") or learned: the index rule learns the prefill rate from
/// streamed responses (gauge `prefix_router.cost.prefill_tps`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    /// The routing rule. `spill`: the priced spill ([`crate::spill`]): the
    /// group key's ring walk (the group owner, then its successors); the
    /// first candidate keeps a
    /// request unless the wait saved (replica-reported queues x
    /// `service_s`) pays re-prefilling the prompt there and the delay that
    /// adds to the requests queued there; a conversation's later turns
    /// read nothing a proxy learns but a preamble's share of its traffic,
    /// so every proxy places them alike; what else a proxy learns (which
    /// preambles converse) moves first turns only. `index`: the index rule
    /// ([`crate::cost`]): estimated TTFT over the owner and its successors
    /// under the bound, with this proxy's learned prefix index (and
    /// `gossip`). `off`: plain bounded loads.
    /// Allowed: `"spill"`, `"index"`, `"off"`.
    #[serde(default = "d_cost_mode")]
    pub mode: String,
    /// A replica's prefill throughput, tokens per second. `index`, Envoy
    /// filter: the starting value; the rate is then learned online from
    /// streamed responses (uncached prompt tokens / time to first byte, for
    /// requests routed with no known work ahead of them and at least 512
    /// uncached tokens; a moving average of the logarithm with weight 0.2,
    /// kept within 8x of this value, shared by the workers; gauge
    /// `prefix_router.cost.prefill_tps`).
    /// Allowed: > 0 and <= 1000000000.
    #[serde(default = "d_prefill_tps")]
    pub prefill_tokens_per_s: f64,
    /// Prompt bytes per token.
    /// Allowed: > 0 and <= 64.
    #[serde(default = "d_bytes_per_token")]
    pub bytes_per_token: f64,
    /// Seconds a request in a replica's reported queue waits before its
    /// prefill starts. `spill`: the wait saved by leaving the owner is the
    /// queue difference x this; set it to what your replicas do, about the
    /// prefill of a queued request. `spill` reads it only times
    /// `prefill_tokens_per_s`: a queued request is priced at that many
    /// prefill tokens (8,000 by default) against the prompt's own. `index`:
    /// others' waiting requests (the
    /// host's fresh reported queue beyond this proxy's own requests there)
    /// each add this to a candidate's estimated wait.
    /// Allowed: 0..=3600.
    #[serde(default = "d_service_s")]
    pub service_s: f64,
    /// `index`: a replica's KV cache in tokens: the index forgets a host's
    /// prefixes once about this many newer uncached tokens went through it
    /// (a capacity clock per host, [`crate::index::CapacityClock`]). 0: no
    /// per-host bound.
    /// Allowed: 0..=1099511627776 (2^40).
    #[serde(default = "d_host_tokens")]
    pub host_tokens: u64,
}

impl Default for RawCost {
    fn default() -> Self {
        RawCost {
            mode: d_cost_mode(),
            prefill_tokens_per_s: d_prefill_tps(),
            bytes_per_token: d_bytes_per_token(),
            service_s: d_service_s(),
            host_tokens: d_host_tokens(),
        }
    }
}

fn d_cost_mode() -> String {
    "spill".into()
}
fn d_prefill_tps() -> f64 {
    crate::cost::CostParams::default().prefill_tokens_per_s
}
fn d_bytes_per_token() -> f64 {
    crate::cost::CostParams::default().bytes_per_token
}
fn d_service_s() -> f64 {
    crate::cost::CostParams::default().service_s
}
fn d_host_tokens() -> u64 {
    crate::index::IndexConfig::default().host_tokens
}

/// Validated cost-rule settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostConfig {
    /// `cost.mode`: the routing rule.
    pub mode: CostMode,
    /// `cost.mode = index`: the index rule, and with it the prefix index,
    /// is on.
    pub enabled: bool,
    /// The decision rule's parameters.
    pub params: crate::cost::CostParams,
    /// The prefix index's bounds.
    pub index: crate::index::IndexConfig,
    /// The shared-data index's shape (the Envoy filter).
    pub shared: crate::shared_index::SharedIndexConfig,
    /// Learn the prefill rate from streamed responses' time to first byte
    /// ([`crate::cost::learn_prefill_rate`]): on with the index rule.
    pub learn_prefill: bool,
}

/// The routing rule (`cost.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CostMode {
    /// The priced spill ([`crate::spill`], the default): the group key's
    /// ring walk, its owner left only when the replicas' reported queues
    /// say the wait saved outweighs the miss.
    #[default]
    Spill,
    /// The index rule ([`crate::cost`]): estimated TTFT over the owner and
    /// its successors under the bound, with this proxy's learned prefix
    /// index.
    Index,
    /// Plain bounded loads ([`crate::ring::Ring::place`]).
    Off,
}

/// The value of a string field that must be one of `options` (its name
/// and value); otherwise an error naming the field, the value and the
/// names allowed (`must be "a" or "b"`).
fn one_of<T: Copy>(field: &str, value: &str, options: &[(&str, T)]) -> Result<T, ConfigError> {
    if let Some(&(_, v)) = options.iter().find(|(name, _)| *name == value) {
        return Ok(v);
    }
    let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
    let reason = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("must be {} or {last}", rest.join(", "))
        }
        Some((last, _)) => format!("must be {last}"),
        None => "has no allowed value".to_string(),
    };
    Err(err(field, format!("{value:?}"), reason))
}

fn compile_cost(c: &RawCost, chunk_bytes: u32) -> Result<CostConfig, ConfigError> {
    let mode = one_of(
        "cost.mode",
        &c.mode,
        &[
            ("spill", CostMode::Spill),
            ("index", CostMode::Index),
            ("off", CostMode::Off),
        ],
    )?;
    let enabled = mode == CostMode::Index;
    let pos = |f: &str, v: f64, max: f64| -> Result<f64, ConfigError> {
        if v.is_finite() && v > 0.0 && v <= max {
            Ok(v)
        } else {
            Err(err(f, v, format!("must be > 0 and <= {max}")))
        }
    };
    let prefill_tokens_per_s = pos("cost.prefill_tokens_per_s", c.prefill_tokens_per_s, 1e9)?;
    let bytes_per_token = pos("cost.bytes_per_token", c.bytes_per_token, 64.0)?;
    if !(c.service_s.is_finite() && (0.0..=3600.0).contains(&c.service_s)) {
        return Err(err(
            "cost.service_s",
            c.service_s,
            "must be >= 0 and <= 3600 (seconds)",
        ));
    }
    if c.host_tokens > 1 << 40 {
        return Err(err("cost.host_tokens", c.host_tokens, "must be <= 2^40"));
    }
    // Everything else is a constant of the rules (docs/design.md, "Constants").
    let index = crate::index::IndexConfig {
        chunk_bytes,
        host_tokens: c.host_tokens,
        bytes_per_token,
        ..crate::index::IndexConfig::default()
    };
    let shared = crate::shared_index::SharedIndexConfig::default();
    Ok(CostConfig {
        mode,
        enabled,
        params: crate::cost::CostParams {
            prefill_tokens_per_s,
            bytes_per_token,
            service_s: c.service_s,
            ..crate::cost::CostParams::default()
        },
        index,
        shared: crate::shared_index::SharedIndexConfig {
            stride_bytes: index.stride_bytes(),
            dense_boundaries: index.dense_boundaries,
            max_age_ms: index.max_age_ms,
            ..shared
        },
        learn_prefill: enabled,
    })
}

/// Active scrape of each replica's Prometheus `/metrics` for its queue
/// depth ([`crate::scrape`]). Null: off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScrape {
    /// The Envoy cluster holding the replicas (the scrape goes through it).
    /// The filter cannot list Envoy's clusters at configure time, so a
    /// cluster Envoy does not have shows at the first scrape: Envoy refuses
    /// the call, the filter logs an error naming `scrape.cluster` and
    /// counts `prefix_router.scrape.unknown_cluster`.
    /// Allowed: a non-empty string.
    pub cluster: String,
    /// Scrape period, ms.
    /// Allowed: 100..=600000.
    #[serde(default = "d_scrape_interval")]
    pub interval_ms: u64,
    /// Scrape timeout, ms.
    /// Allowed: 1..=`scrape.interval_ms`.
    #[serde(default = "d_scrape_timeout")]
    pub timeout_ms: u64,
    /// The metrics path.
    /// Allowed: a path starting with `/`.
    #[serde(default = "d_scrape_path")]
    pub path: String,
    /// Default metric names. `vllm`: queue `vllm:num_requests_waiting`,
    /// running `vllm:num_requests_running`, restart
    /// `vllm:prefix_cache_queries_total` (or `vllm:prefix_cache_queries`),
    /// hits `vllm:prefix_cache_hits_total` (or `vllm:prefix_cache_hits`). `sglang`: queue
    /// `sglang:num_queue_reqs`, running `sglang:num_running_reqs`, restart
    /// `sglang:prompt_tokens_total`, hits `sglang:cached_tokens_total`.
    /// Null: `vllm`.
    /// Allowed: `"vllm"`, `"sglang"`, null.
    #[serde(default)]
    pub preset: Option<String>,
    /// Metric names summed into the queue depth. Null: the preset's.
    /// Allowed: at least one metric name, without labels.
    #[serde(default)]
    pub queue_metrics: Option<Vec<String>>,
    /// Metric names summed into the running count. Null: the preset's;
    /// `[]`: none.
    /// Allowed: metric names without labels.
    #[serde(default)]
    pub running_metrics: Option<Vec<String>>,
    /// Counters that go down only when the replica restarts (the first
    /// present name is used): a decrease drops the host's prefix-index
    /// entries. Null: the preset's; `[]`: off.
    /// Allowed: metric names without labels.
    #[serde(default)]
    pub restart_metrics: Option<Vec<String>>,
    /// Prefix-cache hit counters in tokens (the first present name is
    /// used), for flush detection: with `cost.mode = "index"`, hits below
    /// 10 % of what the index credited the host with, over scrape intervals
    /// adding up to at least 4,096 credited tokens, mean its cache was
    /// flushed, and its entries are dropped. Null: the preset's; `[]`: off.
    /// Allowed: metric names without labels.
    #[serde(default)]
    pub hit_metrics: Option<Vec<String>>,
}

/// Index gossip between Envoys ([`crate::gossip`]; needs
/// `cost.mode = "index"`). Every `interval_ms` each VM sends what its
/// responses taught it (host, uncached tokens, the prompt's chain hashes)
/// in one POST to each peer. Peers must use the same `chunk_bytes` and
/// filter version (a fingerprint in each batch, which also covers the
/// index's stride and boundary constants; mismatches are rejected).
/// Expose `path` only where peers reach it: anyone who can POST there can
/// steer the index (never past the bound). Null: off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGossip {
    /// Peer Envoy listener addresses. Not `gossip.name`.
    /// Allowed: at most 64 `host:port` (port 1..=65535), each once.
    #[serde(default)]
    pub peers: Vec<String>,
    /// An Envoy cluster of the peers with the `override_host` policy on
    /// `destination_header`, as for the replicas.
    /// Allowed: a non-empty string when `peers` is not empty.
    #[serde(default)]
    pub cluster: String,
    /// The path batches are POSTed to.
    /// Allowed: a path alone (starts with `/`, no `?` or `#`), not one of `paths`.
    #[serde(default = "d_gossip_path")]
    pub path: String,
    /// Sending period, ms.
    /// Allowed: 10..=60000.
    #[serde(default = "d_gossip_interval")]
    pub interval_ms: u64,
    /// Timeout of a POST to a peer, ms.
    /// Allowed: 1..=60000.
    #[serde(default = "d_gossip_timeout")]
    pub timeout_ms: u64,
    /// Answer POSTs to `path` here (204) and record their observations in
    /// this Envoy's own index; they are never forwarded. With no `peers`,
    /// it must be true.
    #[serde(default = "d_true")]
    pub accept: bool,
    /// Most bytes in a batch; older observations are dropped first.
    /// Allowed: 1024..=16777216.
    #[serde(default = "d_gossip_batch")]
    pub max_batch_bytes: u64,
    /// This Envoy's own address as its peers list it in their `peers`:
    /// turns on load gossip. Every batch then also carries this Envoy's
    /// pending prefill tokens per replica, sent when they change or every
    /// five intervals even with no observation, and each peer adds to its
    /// own pending tokens, per replica, the larger of the report's others
    /// and what its listed peers sent within the last
    /// `max(10 x interval_ms, 1000)` ms ([`crate::gossip::Loads`]). Null:
    /// off.
    /// Allowed: 1-255 bytes without control characters, not one of `peers`.
    #[serde(default)]
    pub name: Option<String>,
}

fn d_gossip_path() -> String {
    "/.prefix-router/gossip".into()
}
fn d_gossip_interval() -> u64 {
    100
}
fn d_gossip_timeout() -> u64 {
    1000
}
fn d_gossip_batch() -> u64 {
    262_144
}

/// Validated index gossip settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GossipConfig {
    pub peers: Vec<String>,
    pub cluster: String,
    pub path: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub accept: bool,
    pub max_batch_bytes: usize,
    /// [`crate::gossip::fingerprint`] of this config's index settings.
    pub fingerprint: u64,
    /// `gossip.name`: with it, batches carry this Envoy's pending prefill
    /// per replica ([`crate::gossip::Loads`]) and peers count it.
    pub name: Option<String>,
}

/// Most gossip peers.
pub const MAX_GOSSIP_PEERS: usize = 64;

/// A peer's `host:port` as one key for every way of writing it: an IP
/// endpoint as [`endpoint`] sees it, a name in lower case, the port as a
/// number; `None` if it is not `host:port` with a port 1..=65535.
fn peer_key(p: &str) -> Option<String> {
    if let Ok(a) = p.parse::<SocketAddr>() {
        return (a.port() > 0).then(|| endpoint(&a).to_string());
    }
    let (h, port) = p.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|x| *x > 0)?;
    (!h.is_empty()).then(|| format!("{}:{port}", h.to_ascii_lowercase()))
}

fn compile_gossip(
    g: &RawGossip,
    cost: &CostConfig,
    paths: &[(String, Api)],
) -> Result<GossipConfig, ConfigError> {
    if !cost.enabled {
        return Err(err(
            "gossip",
            "set",
            "needs cost.mode \"index\" (it shares the index rule's prefix index)",
        ));
    }
    if g.peers.len() > MAX_GOSSIP_PEERS {
        return Err(err(
            "gossip.peers",
            g.peers.len(),
            format!("at most {MAX_GOSSIP_PEERS} peers"),
        ));
    }
    let mut keys: Vec<String> = Vec::with_capacity(g.peers.len());
    for (i, p) in g.peers.iter().enumerate() {
        let Some(k) = peer_key(p) else {
            return Err(err(
                format!("gossip.peers[{i}]"),
                format!("{p:?}"),
                "must be host:port (port 1..=65535)",
            ));
        };
        if let Some(j) = keys.iter().position(|o| *o == k) {
            return Err(err(
                format!("gossip.peers[{i}]"),
                format!("{p:?}"),
                format!(
                    "the same peer as gossip.peers[{j}] {:?}: it would get every batch twice",
                    g.peers.get(j).map_or("", String::as_str)
                ),
            ));
        }
        keys.push(k);
    }
    if !g.peers.is_empty() && g.cluster.is_empty() {
        return Err(err(
            "gossip.cluster",
            "\"\"",
            "name the Envoy cluster of the peers (needed to send to gossip.peers)",
        ));
    }
    if !g.path.starts_with('/') {
        return Err(err(
            "gossip.path",
            format!("{:?}", g.path),
            "must start with '/'",
        ));
    }
    if g.path.contains(['?', '#']) {
        return Err(err(
            "gossip.path",
            format!("{:?}", g.path),
            "must be a path alone, without '?' or '#' (requests are matched on their path)",
        ));
    }
    let trimmed = g.path.trim_end_matches('/');
    if let Some(i) = paths.iter().position(|(p, _)| p == trimmed) {
        return Err(err(
            "gossip.path",
            format!("{:?}", g.path),
            format!(
                "is the routed API path paths[{i}]: its requests would be taken as gossip batches (400), not routed; use a path no client calls"
            ),
        ));
    }
    if !(10..=60_000).contains(&g.interval_ms) {
        return Err(err(
            "gossip.interval_ms",
            g.interval_ms,
            "must be 10..=60000",
        ));
    }
    if !(1..=60_000).contains(&g.timeout_ms) {
        return Err(err("gossip.timeout_ms", g.timeout_ms, "must be 1..=60000"));
    }
    if !(1024..=16 * 1024 * 1024).contains(&g.max_batch_bytes) {
        return Err(err(
            "gossip.max_batch_bytes",
            g.max_batch_bytes,
            "must be 1024..=16777216",
        ));
    }
    if let Some(n) = &g.name {
        if n.is_empty() || n.len() > 255 || n.chars().any(char::is_control) {
            return Err(err(
                "gossip.name",
                format!("{n:?}"),
                "must be 1-255 bytes without control characters: this Envoy's address as its peers list it in gossip.peers",
            ));
        }
        if let Some(j) = peer_key(n).and_then(|k| keys.iter().position(|o| *o == k)) {
            return Err(err(
                "gossip.name",
                format!("{n:?}"),
                format!("is gossip.peers[{j}]: this Envoy would send its batches to itself"),
            ));
        }
    }
    if g.peers.is_empty() && !g.accept {
        return Err(err(
            "gossip",
            "no peers, accept false",
            "sends nothing and accepts nothing: give peers or set accept",
        ));
    }
    Ok(GossipConfig {
        peers: g.peers.clone(),
        cluster: g.cluster.clone(),
        path: g.path.clone(),
        interval_ms: g.interval_ms,
        timeout_ms: g.timeout_ms,
        accept: g.accept,
        max_batch_bytes: usize::try_from(g.max_batch_bytes).unwrap_or(usize::MAX),
        fingerprint: crate::gossip::fingerprint(&cost.index),
        name: g.name.clone(),
    })
}

/// The filter's configuration: one JSON object, Envoy's wasm filter
/// `configuration` value. Every field but `hosts` (optional with
/// `membership`) has a default; unknown fields are refused, and
/// `on_configure` rejects a config that does not validate, with an error
/// naming the field, the value and the reason.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The replicas: the model servers requests are routed to. Required
    /// unless `membership` is set (then a seed: names hosts by address and
    /// routes until the first poll answers).
    /// Allowed: at most 4096 hosts.
    #[serde(default)]
    pub hosts: Vec<RawHost>,
    /// Bounded-load factor c: no host above `ceil(c x (total + 1) x w / W)`
    /// requests (1: perfect balance).
    /// Allowed: 1..=100.
    #[serde(default = "d_capacity")]
    pub capacity_factor: f64,
    /// Capacity floor of an average host: a host is never full below this
    /// many requests times its relative weight (weights are scaled to
    /// average 1; 0: pure bounded loads).
    /// Allowed: 0..=1000000.
    #[serde(default = "d_min_capacity")]
    pub min_capacity: f64,
    /// Ring points of an average host (weights are relative: their mean is
    /// scaled to the nearest power of two, 1 for equal weights).
    /// More points spread the keys more evenly: with 400, the busiest of 8
    /// hosts owns about 1.07x an even share of the keys (1.12x with 100);
    /// each point costs 16 bytes of memory per worker VM.
    /// Allowed: 1..=10000, at most 2000000 ring points in all.
    #[serde(default = "d_vnodes")]
    pub vnodes: u32,
    /// Chunk size of the chained prefix hash, bytes (a 16-token KV block at
    /// about 4 bytes per token).
    /// Allowed: 16..=65536.
    #[serde(default = "d_chunk")]
    pub chunk_bytes: u32,
    /// Larger bodies are not buffered: fallback `body_too_large`. At most
    /// 8 MiB ([`MAX_BODY_BYTES`]: a worker VM's memory never shrinks).
    /// Envoy's request buffer limit must hold this plus one socket read
    /// (the listener's `per_connection_buffer_limit_bytes`), or uploads
    /// just over it get 413: the filter cannot read Envoy's limits;
    /// `./build.sh validate` checks the committed configs.
    /// Allowed: 1..=8388608.
    #[serde(default = "d_max_body")]
    pub max_body_bytes: u64,
    /// The request paths handled; the API is recognized by the path's
    /// ending. Other paths pass through to Envoy's load balancing.
    /// Allowed: at least one; each starts with `/` and ends with `/chat/completions`, `/completions`, `/responses` or `/messages`.
    #[serde(default = "d_paths")]
    pub paths: Vec<String>,
    /// The request header Envoy's `override_host` load-balancing policy
    /// reads the chosen endpoint from.
    /// Allowed: an HTTP header name that is not a pseudo-header, hop-by-hop (`connection`, `te`, `trailer`, `upgrade`, `keep-alive`, `proxy-*`), framing (`content-length`, `transfer-encoding`), `host`, `content-type`/`-encoding`, `x-envoy-*` or an ORCA header.
    #[serde(default = "d_dest")]
    pub destination_header: String,
    /// A response header exposing the decision, for debugging (e.g.
    /// `outcome=spill;host=10.0.0.2:8000;source=prompt;skipped=1;...`).
    /// Null: none.
    /// Allowed: an HTTP header name, with the same exclusions as `destination_header`.
    #[serde(default)]
    pub decision_header: Option<String>,
    /// How the routing key is chosen.
    #[serde(default)]
    pub key: RawKey,
    /// Load reports.
    #[serde(default)]
    pub load: RawLoad,
    /// Passive health.
    #[serde(default)]
    pub health: RawHealth,
    /// Active scrape of the replicas' metrics. Null: off.
    #[serde(default)]
    pub scrape: Option<RawScrape>,
    /// The routing rule.
    #[serde(default)]
    pub cost: RawCost,
    /// Index gossip between Envoys. Null: off.
    #[serde(default)]
    pub gossip: Option<RawGossip>,
    /// Hosts from an Envoy cluster instead of (or seeded by) `hosts`
    /// ([`crate::membership`]); absent: `hosts` alone.
    #[serde(default)]
    pub membership: Option<RawMembership>,
    /// Ring successors named after the chosen host in the destination
    /// header, for Envoy's retries ([`crate::membership`], "Failover").
    #[serde(default)]
    pub failover: RawFailover,
}

fn d_mode() -> String {
    "conversation".into()
}
fn d_prefix_bytes() -> u64 {
    4096
}
fn d_true() -> bool {
    true
}
fn d_orca_format() -> Option<String> {
    Some("TEXT".into())
}
fn d_orca_metrics() -> Vec<String> {
    vec!["num_requests_waiting".into()]
}
fn d_orca_running_metrics() -> Vec<String> {
    vec!["num_requests_running".into()]
}
fn d_queue_header() -> Option<String> {
    Some("x-queue-depth".into())
}
fn d_ttl() -> u64 {
    10_000
}
fn d_fade() -> u64 {
    2_000
}
fn d_failures() -> u32 {
    5
}
fn d_cooldown() -> u64 {
    10_000
}
fn d_scrape_interval() -> u64 {
    1_000
}
fn d_scrape_timeout() -> u64 {
    500
}
fn d_scrape_path() -> String {
    "/metrics".into()
}
fn d_capacity() -> f64 {
    1.25
}
fn d_min_capacity() -> f64 {
    8.0
}
fn d_vnodes() -> u32 {
    400
}
fn d_chunk() -> u32 {
    64
}
fn d_max_body() -> u64 {
    1 << 20
}
/// `field` (`name` as given, `lower` lowercased) must not name an ORCA
/// load-report header.
fn not_orca(field: &str, name: &str, lower: &str) -> Result<(), ConfigError> {
    if matches!(
        lower,
        "endpoint-load-metrics-format" | "endpoint-load-metrics"
    ) {
        return Err(err(
            field,
            format!("{name:?}"),
            "names an ORCA load-report header, which the filter sets and reads itself",
        ));
    }
    Ok(())
}

fn d_paths() -> Vec<String> {
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
fn d_dest() -> String {
    "x-gateway-destination-endpoint".into()
}

/// A validated replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub address: String,
    pub name: String,
    /// Relative capacity; 0 only for a free slot of the membership table
    /// (no ring points, never chosen).
    pub weight: f64,
    /// Whether Envoy would send it traffic (always true for static hosts;
    /// from Envoy's health flags with `membership`). An unhealthy host is
    /// not eligible: its keys go to their ring successors.
    pub healthy: bool,
}

/// Key mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// Prefix through the end of the first user message.
    Conversation,
    /// First `prefix_bytes` bytes of the canonical stream.
    Prefix,
}

/// Validated key settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyConfig {
    pub mode: KeyMode,
    pub prefix_bytes: u64,
    pub session_header: Option<String>,
    pub use_user_field: bool,
    pub use_cache_salt: bool,
}

/// Format asked of replicas for ORCA reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrcaFormat {
    Text,
    Json,
}

impl OrcaFormat {
    /// Header value for `endpoint-load-metrics-format`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrcaFormat::Text => "TEXT",
            OrcaFormat::Json => "JSON",
        }
    }
}

/// Validated load-report settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    pub orca_format: Option<OrcaFormat>,
    pub orca_metrics: Vec<String>,
    /// ORCA named metrics summed into the reported running count (empty:
    /// none).
    pub orca_running_metrics: Vec<String>,
    pub queue_header: Option<String>,
    pub report_ttl_ms: u64,
    /// A report's waiting count counts linearly less as it ages, 0 at this
    /// age (0: fully until `report_ttl_ms`), [`crate::load::Freshness`].
    pub report_fade_ms: u64,
}

impl LoadConfig {
    /// How reports count as they age.
    pub fn freshness(&self) -> crate::load::Freshness {
        crate::load::Freshness {
            ttl_ms: self.report_ttl_ms,
            fade_ms: self.report_fade_ms,
        }
    }
}

/// Validated active-scrape settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeConfig {
    pub cluster: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
    pub path: String,
    pub queue_metrics: Vec<String>,
    /// Summed into the running count (empty: none).
    pub running_metrics: Vec<String>,
    /// Counters whose decrease means a restart (first present is used;
    /// empty: detection off).
    pub restart_metrics: Vec<String>,
    /// Prefix-cache hit counters, tokens (first present is used; empty:
    /// flush detection off; [`crate::scrape::flush_suspected`]).
    pub hit_metrics: Vec<String>,
}

/// The validated, immutable configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hosts: Vec<Host>,
    pub capacity_factor: f64,
    /// Capacity floor of an average host (weights scaled to average 1).
    pub min_capacity: f64,
    pub vnodes: u32,
    pub chunk_bytes: usize,
    pub max_body_bytes: u64,
    /// Handled paths and their API.
    pub paths: Vec<(String, Api)>,
    pub destination_header: String,
    pub decision_header: Option<String>,
    pub key: KeyConfig,
    pub load: LoadConfig,
    pub health: crate::health::HealthConfig,
    pub scrape: Option<ScrapeConfig>,
    pub cost: CostConfig,
    pub gossip: Option<GossipConfig>,
    /// `membership`: hosts from an Envoy cluster.
    pub membership: Option<MembershipConfig>,
    /// `failover.hosts`: ring successors after the chosen host in the
    /// destination header.
    pub failover_hosts: usize,
}

/// Upper bounds that keep a typo from exhausting a proxy's memory.
pub const MAX_HOSTS: usize = 4096;
pub const MAX_VNODES: u32 = 10_000;
pub const MAX_RING_POINTS: u64 = 2_000_000;
/// Most `max_body_bytes` (8 MiB). The VM copies a buffered body into its
/// linear memory, which never shrinks: a worker VM keeps the footprint of
/// the largest body it ever read (the copy plus extraction's working set) for
/// the rest of its life, one VM per worker. At the 1 MiB default a worker VM
/// stays within 4 MiB (README "Memory, measured"); 64 MiB (the bound before)
/// let one 12.9 MB body ask for a 512 MiB allocation and kill the VM
/// (issue 21). Measured in Envoy 1.40 (one worker): an 8 MiB plain prompt
/// grows the VM to 17 MB. The worst case is extraction's: with the tree
/// extractor an 8 MiB body of 2.7 M empty `{}` messages grew it to 542 MB
/// in 3.3 s (it survived); the cap assumes the streaming extractor (issue
/// 21, memory bounded by a small multiple of the body). Prompts that large
/// are rare (8 MiB is ~2 M tokens, beyond any served context window);
/// larger bodies still pass as fallbacks.
pub const MAX_BODY_BYTES: u64 = 8 << 20;

/// Why a header name cannot be the one the filter sets on requests
/// (`destination_header`) or adds to responses (`decision_header`), if it
/// cannot: pseudo-headers, the authority, message framing, hop-by-hop
/// headers, the body's media type and encoding, and Envoy's own headers.
fn reserved_header(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    if n.starts_with(':') {
        return Some("a pseudo-header");
    }
    match n.as_str() {
        "host" => Some("the request's authority (Host, :authority in HTTP/2)"),
        "content-length" | "transfer-encoding" => Some("message framing"),
        "connection" | "keep-alive" | "te" | "trailer" | "upgrade" => {
            Some("a hop-by-hop header, which proxies consume or drop")
        }
        "content-type" | "content-encoding" => {
            Some("the body's media type or encoding, which the filter and the replica read")
        }
        _ if n.starts_with("proxy-") => Some("a hop-by-hop header (proxy-*)"),
        _ if n.starts_with("x-envoy-") => Some("one of Envoy's own headers (x-envoy-*)"),
        _ => None,
    }
}

/// A header the filter writes: a valid name, not [`reserved_header`];
/// `does` says what the filter does with it, `example` is a good name.
fn own_header(field: &str, v: &str, does: &str, example: &str) -> Result<String, ConfigError> {
    if let Some(what) = reserved_header(v) {
        return Err(err(
            field,
            format!("{v:?}"),
            format!("names {what}; the filter {does}: use a header of its own (e.g. {example})"),
        ));
    }
    header_name(field, v)
}

/// The endpoint an address names, for finding one written twice: an
/// IPv4-mapped IPv6 address (`[::ffff:127.0.0.1]:80`) is the IPv4 endpoint
/// (`127.0.0.1:80`); case and zero padding are gone once parsed.
fn endpoint(a: &SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(std::net::IpAddr::V4(v4), v6.port()),
            None => SocketAddr::new(std::net::IpAddr::V6(*v6.ip()), v6.port()),
        },
        v4 => *v4,
    }
}

/// A host's name as it appears in metric names
/// (`prefix_router.host.<name>.routed`): ASCII letters and digits kept,
/// anything else `_`.
pub fn metric_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn header_name(field: &str, v: &str) -> Result<String, ConfigError> {
    let ok = !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b));
    if !ok {
        return Err(err(field, format!("{v:?}"), "not a valid HTTP header name"));
    }
    Ok(v.to_ascii_lowercase())
}

impl Config {
    /// Parse and validate filter JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let raw = RawConfig::deserialize(&mut de).map_err(|e| {
            let duplicate = e.to_string().starts_with("duplicate field ");
            let path = error_path(bytes, &e, duplicate);
            json_error(&path_text(&path), e)
        })?;
        de.end().map_err(|e| {
            err(
                "<json>",
                "(text after the object)",
                format!("not one JSON object: {e}"),
            )
        })?;
        raw.compile()
    }
}

/// One step of a JSON path: an object's member, an array's element, or a
/// member whose key could not be read (a syntax error where a key belongs).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
    Unknown,
}

/// The path of the value a serde_json error of deserializing [`RawConfig`]
/// from `bytes` is about, as `serde_path_to_error` would report it (the
/// config tests compare the two on mutated configs): the text is walked up to
/// where serde_json stopped, keeping the stack of open objects (with the
/// member being read) and arrays (with the element's index).
///
/// A data error (type, value, unknown or missing member) names the value
/// serde_json had just read or was about to read: the member whose key it
/// just read (unknown field), the object or array it just closed (missing
/// field, too short), or the value it stopped at. A duplicate field names the
/// object (`duplicate`). A syntax error names the value being parsed, or,
/// between values, the array (`[1,]`) or the object with an unread key
/// (`{"a": 1 x`: `.?`).
///
/// serde's derived visitors raise their errors at exactly those points. The
/// walk runs only on a failed configure; deserializing through
/// `serde_path_to_error` instead built every visitor against its tracking
/// wrappers: 24 KB more .wasm.
fn error_path(bytes: &[u8], e: &serde_json::Error, duplicate: bool) -> Vec<Seg> {
    enum Frame {
        Obj(Option<String>),
        Arr(usize),
    }
    #[derive(PartialEq)]
    enum Last {
        Start,
        Open,
        Key,
        Colon,
        Comma,
        Value,
    }
    // serde_json's line (1-based) and column (bytes read on that line).
    let line_start = if e.line() <= 1 {
        0
    } else {
        bytes
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(e.line() - 2)
            .map_or(bytes.len(), |(i, _)| i + 1)
    };
    let end = line_start.saturating_add(e.column()).min(bytes.len());
    let syntax = !matches!(e.classify(), serde_json::error::Category::Data);
    let mut stack: Vec<Frame> = Vec::new();
    let mut last = Last::Start;
    let mut i = 0;
    loop {
        while i < end && matches!(bytes.get(i), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            i += 1;
        }
        let Some(&c) = bytes.get(i).filter(|_| i < end) else {
            break;
        };
        let in_obj = matches!(stack.last(), Some(Frame::Obj(_)));
        let want_value = match last {
            Last::Start | Last::Colon => true,
            Last::Open | Last::Comma => !in_obj,
            Last::Key | Last::Value => false,
        };
        match c {
            b'{' | b'[' if want_value => {
                stack.push(if c == b'{' {
                    Frame::Obj(None)
                } else {
                    Frame::Arr(0)
                });
                last = Last::Open;
                i += 1;
            }
            b'"' if want_value || (in_obj && matches!(last, Last::Open | Last::Comma)) => {
                let Some(j) = string_end(bytes, i).filter(|&j| j <= end) else {
                    break;
                };
                if want_value {
                    last = Last::Value;
                } else {
                    let key = bytes.get(i + 1..j - 1).unwrap_or_default();
                    let key = serde_json::from_slice::<String>(bytes.get(i..j).unwrap_or_default())
                        .unwrap_or_else(|_| String::from_utf8_lossy(key).into_owned());
                    if let Some(Frame::Obj(k)) = stack.last_mut() {
                        *k = Some(key);
                    }
                    last = Last::Key;
                }
                i = j;
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' if want_value => {
                let Some(j) = scalar_end(bytes, i).filter(|&j| j <= end) else {
                    break;
                };
                last = Last::Value;
                i = j;
            }
            b':' if last == Last::Key => {
                last = Last::Colon;
                i += 1;
            }
            b',' if last == Last::Value && !stack.is_empty() => {
                match stack.last_mut() {
                    Some(Frame::Obj(k)) => *k = None,
                    Some(Frame::Arr(n)) => *n += 1,
                    None => {}
                }
                last = Last::Comma;
                i += 1;
            }
            b'}' if in_obj && matches!(last, Last::Open | Last::Value) => {
                stack.pop();
                last = Last::Value;
                i += 1;
            }
            b']' if !in_obj && !stack.is_empty() && matches!(last, Last::Open | Last::Value) => {
                stack.pop();
                last = Last::Value;
                i += 1;
            }
            _ => break,
        }
    }
    let mut path: Vec<Seg> = stack
        .iter()
        .map(|f| match f {
            Frame::Obj(Some(k)) => Seg::Key(k.clone()),
            Frame::Obj(None) => Seg::Unknown,
            Frame::Arr(n) => Seg::Index(*n),
        })
        .collect();
    let in_obj = matches!(stack.last(), Some(Frame::Obj(_)));
    // Whether the error is the container's (between its values) rather than
    // its current member's or element's.
    let containers = if syntax {
        match last {
            Last::Value => {
                // After a value: the object reads its next key (unread: `.?`),
                // the array its next separator.
                if in_obj {
                    if let Some(p) = path.last_mut() {
                        *p = Seg::Unknown;
                    }
                    false
                } else {
                    true
                }
            }
            Last::Key => true,
            Last::Open | Last::Comma if !in_obj => {
                // `[` or `,` then `]` or the end: the array's own error.
                matches!(bytes.get(i), None | Some(b']'))
            }
            _ => false,
        }
    } else {
        duplicate && last == Last::Key
    };
    if containers {
        path.pop();
    }
    path
}

/// The end (exclusive) of the JSON string starting at `bytes[i]` (`"`), or
/// `None` if it is not a whole, valid one (no end, a control character, a bad
/// escape, not UTF-8).
fn string_end(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        match *bytes.get(j)? {
            b'"' => {
                std::str::from_utf8(bytes.get(i + 1..j)?).ok()?;
                return Some(j + 1);
            }
            b'\\' => match *bytes.get(j + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => j += 2,
                b'u' => {
                    // A surrogate must be a high one followed by `\\u` and a low one.
                    let unit = hex4(bytes.get(j + 2..j + 6)?)?;
                    j += 6;
                    if (0xDC00..0xE000).contains(&unit) {
                        return None;
                    }
                    if (0xD800..0xDC00).contains(&unit) {
                        if bytes.get(j..j + 2)? != b"\\u" {
                            return None;
                        }
                        let low = hex4(bytes.get(j + 2..j + 6)?)?;
                        if !(0xDC00..0xE000).contains(&low) {
                            return None;
                        }
                        j += 6;
                    }
                }
                _ => return None,
            },
            0..=0x1f => return None,
            _ => j += 1,
        }
    }
}

/// Four hex digits as a UTF-16 code unit.
fn hex4(b: &[u8]) -> Option<u32> {
    u32::from_str_radix(std::str::from_utf8(b).ok()?, 16)
        .ok()
        .filter(|_| b.iter().all(u8::is_ascii_hexdigit))
}

/// The end (exclusive) of the number or literal starting at `bytes[i]`, or
/// `None` if it is not a whole one (`1.`, `01`, `-`, `tru`).
fn scalar_end(bytes: &[u8], i: usize) -> Option<usize> {
    let at = |j: usize| bytes.get(j).copied();
    let digits = |mut j: usize| {
        let s = j;
        while at(j).is_some_and(|b| b.is_ascii_digit()) {
            j += 1;
        }
        (j > s).then_some(j)
    };
    for lit in [&b"true"[..], b"false", b"null"] {
        if at(i) == lit.first().copied() {
            return bytes
                .get(i..i + lit.len())
                .filter(|w| *w == lit)
                .map(|_| i + lit.len());
        }
    }
    let mut j = i;
    if at(j) == Some(b'-') {
        j += 1;
    }
    j = if at(j) == Some(b'0') {
        if at(j + 1).is_some_and(|b| b.is_ascii_digit()) {
            return None;
        }
        j + 1
    } else {
        digits(j)?
    };
    if at(j) == Some(b'.') {
        j = digits(j + 1)?;
    }
    if matches!(at(j), Some(b'e' | b'E')) {
        j += 1;
        if matches!(at(j), Some(b'+' | b'-')) {
            j += 1;
        }
        j = digits(j)?;
    }
    // serde_json refuses a number beyond f64's range (`1e400`).
    std::str::from_utf8(bytes.get(i..j)?)
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())?;
    Some(j)
}

/// A JSON or type error as a [`ConfigError`] naming the field's path (e.g.
/// `hosts[0].weight`, not the offending value as serde's message would
/// suggest), the value as written and what was expected.
fn json_error(path: &str, inner: serde_json::Error) -> ConfigError {
    let path = path.to_string();
    let at = format!(" at line {} column {}", inner.line(), inner.column());
    let full = inner.to_string();
    let msg = full.strip_suffix(&at).unwrap_or(&full);
    // The path names the field itself, except for a missing or duplicate
    // field, where it names the object holding it (`.` = the top level).
    let field = |member: Option<&str>| -> String {
        match (path.as_str(), member) {
            (".", Some(n)) => n.to_string(),
            (".", None) => "<config>".to_string(),
            (p, Some(n)) => format!("{p}.{n}"),
            (p, None) => p.to_string(),
        }
    };
    // The first `name` in backticks.
    let ticked = |m: &str| m.split('`').nth(1).map(str::to_string);
    if !matches!(inner.classify(), serde_json::error::Category::Data) {
        return err(field(None), "(not JSON)", format!("{msg}{at}"));
    }
    if let Some(rest) = msg.strip_prefix("unknown field ") {
        // The path ends with the unknown key itself.
        let allowed = rest.rsplit_once("`, expected ").map_or("", |(_, a)| a);
        return err(
            field(None),
            "(set)",
            format!("unknown field; expected {allowed}"),
        );
    }
    if let Some(rest) = msg.strip_prefix("missing field ") {
        return err(field(ticked(rest).as_deref()), "(missing)", "required");
    }
    if let Some(rest) = msg.strip_prefix("duplicate field ") {
        return err(
            field(ticked(rest).as_deref()),
            "(given twice)",
            "set at most once",
        );
    }
    let typed = msg
        .strip_prefix("invalid type: ")
        .or_else(|| msg.strip_prefix("invalid value: "))
        .and_then(|r| r.rsplit_once(", expected "));
    if let Some((unexpected, expected)) = typed {
        return err(
            field(None),
            written_value(unexpected),
            format!("must be {}", expected_kind(expected)),
        );
    }
    if let Some((_, expected)) = msg
        .strip_prefix("invalid length ")
        .and_then(|r| r.split_once(", expected "))
    {
        return err(
            field(None),
            "[...]",
            format!("must be {}", expected_kind(expected)),
        );
    }
    err(field(None), "(see reason)", msg)
}

/// A JSON path as the config's fields are named (`hosts[0].weight`; `.` for
/// the top level). A key that is not a plain name is quoted (`cost."a b"`,
/// `""`), so every path names a field, whatever the JSON's keys.
fn path_text(p: &[Seg]) -> String {
    let mut out = String::new();
    for seg in p {
        match seg {
            Seg::Index(index) => out.push_str(&format!("[{index}]")),
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let plain =
                    !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if plain {
                    out.push_str(key);
                } else {
                    out.push_str(&format!("{key:?}"));
                }
            }
            Seg::Unknown => out.push_str(".?"),
        }
    }
    if out.is_empty() {
        ".".to_string()
    } else {
        out
    }
}

/// serde's description of a JSON value (`integer `-5``, `string "x"`,
/// `map`) as the value was written (`-5`, `"x"`, `{...}`).
fn written_value(unexpected: &str) -> String {
    if let Some(v) = unexpected.split('`').nth(1) {
        return v.to_string();
    }
    if let Some(v) = unexpected.strip_prefix("string ") {
        return v.to_string();
    }
    match unexpected {
        "map" => "{...}".to_string(),
        "sequence" => "[...]".to_string(),
        other => other.to_string(),
    }
}

/// serde's name of an expected type in words.
fn expected_kind(expected: &str) -> String {
    match expected {
        "u16" => "an integer 0..=65535".to_string(),
        "u32" => "an integer 0..=4294967295".to_string(),
        "u64" => "an integer 0..=18446744073709551615".to_string(),
        "f64" => "a number".to_string(),
        "a sequence" => "an array".to_string(),
        e if e.starts_with("struct ") => "an object".to_string(),
        e => e.to_string(),
    }
}

impl RawConfig {
    /// Validate into a [`Config`].
    pub fn compile(&self) -> Result<Config, ConfigError> {
        let membership = match &self.membership {
            None => None,
            Some(m) => Some(m.compile()?),
        };
        let failover_hosts = self.failover.compile()?;
        if let Some(p) = membership.as_ref().and_then(|m| m.peers_cluster.as_ref()) {
            if self.gossip.is_none() {
                return Err(err(
                    "membership.peers_cluster",
                    format!("{p:?}"),
                    "names the gossip peers' cluster: needs `gossip`",
                ));
            }
        }
        if self.hosts.is_empty() && membership.is_none() {
            return Err(err(
                "hosts",
                "[]",
                "at least one host is required (or `membership` to take them from an Envoy cluster)",
            ));
        }
        if self.hosts.len() > MAX_HOSTS {
            return Err(err(
                "hosts",
                format!("{} hosts", self.hosts.len()),
                format!("at most {MAX_HOSTS}"),
            ));
        }
        let mut hosts = Vec::with_capacity(self.hosts.len());
        let mut endpoints: Vec<SocketAddr> = Vec::with_capacity(self.hosts.len());
        for (i, h) in self.hosts.iter().enumerate() {
            let f = |s: &str| format!("hosts[{i}].{s}");
            let addr: SocketAddr = h.address.parse().map_err(|_| {
                err(
                    f("address"),
                    format!("{:?}", h.address),
                    "must be ip:port as Envoy knows the endpoint (e.g. 10.0.0.5:8000 or [::1]:8000; IPv4 without leading zeros)",
                )
            })?;
            if addr.port() == 0 {
                return Err(err(
                    f("address"),
                    format!("{:?}", h.address),
                    "port 0 is no replica's port",
                ));
            }
            if addr.ip().is_unspecified() {
                return Err(err(
                    f("address"),
                    format!("{:?}", h.address),
                    "an unspecified address (0.0.0.0, ::) is no replica's address",
                ));
            }
            let ep = endpoint(&addr);
            if let Some(j) = endpoints.iter().position(|e| *e == ep) {
                return Err(err(
                    f("address"),
                    format!("{:?}", h.address),
                    format!(
                        "the same endpoint as hosts[{j}].address {:?}",
                        self.hosts.get(j).map_or("", |o| o.address.as_str())
                    ),
                ));
            }
            endpoints.push(ep);
            let address = addr.to_string();
            let name = h.name.clone().unwrap_or_else(|| address.clone());
            if name.is_empty() {
                return Err(err(f("name"), "\"\"", "must not be empty"));
            }
            let weight = h.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight > 0.0 && weight <= 1000.0) {
                return Err(err(f("weight"), weight, "must be > 0 and <= 1000"));
            }
            if hosts.iter().any(|o: &Host| o.name == name) {
                return Err(err(f("name"), format!("{name:?}"), "duplicate name"));
            }
            let metric = metric_name(&name);
            if let Some(j) = hosts
                .iter()
                .position(|o: &Host| metric_name(&o.name) == metric)
            {
                return Err(err(
                    f("name"),
                    format!("{name:?}"),
                    format!(
                        "gives the metric prefix_router.host.{metric}.routed, as hosts[{j}] does: names must differ in their letters or digits"
                    ),
                ));
            }
            hosts.push(Host {
                address,
                name,
                weight,
                healthy: true,
            });
        }
        let c = self.capacity_factor;
        if !(c.is_finite() && (1.0..=100.0).contains(&c)) {
            return Err(err(
                "capacity_factor",
                c,
                "must be >= 1 (1 = perfect balance) and <= 100",
            ));
        }
        let m = self.min_capacity;
        if !(m.is_finite() && (0.0..=1_000_000.0).contains(&m)) {
            return Err(err(
                "min_capacity",
                m,
                "must be >= 0 (0 = pure bounded loads) and <= 1000000",
            ));
        }
        if self.vnodes == 0 || self.vnodes > MAX_VNODES {
            return Err(err(
                "vnodes",
                self.vnodes,
                format!("must be 1..={MAX_VNODES}"),
            ));
        }
        let raw: Vec<f64> = hosts.iter().map(|h| h.weight).collect();
        let points: f64 = crate::ring::points_per_host(&raw, self.vnodes)
            .into_iter()
            .map(f64::from)
            .sum();
        if points > MAX_RING_POINTS as f64 {
            return Err(err(
                "vnodes",
                self.vnodes,
                format!(
                    "ring would have {points} points (weights included); at most {MAX_RING_POINTS}"
                ),
            ));
        }
        if !(16..=65536).contains(&self.chunk_bytes) {
            return Err(err("chunk_bytes", self.chunk_bytes, "must be 16..=65536"));
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > MAX_BODY_BYTES {
            return Err(err(
                "max_body_bytes",
                self.max_body_bytes,
                format!(
                    "must be 1..={MAX_BODY_BYTES} (8 MiB): a worker VM's memory never shrinks; larger bodies pass as fallbacks"
                ),
            ));
        }
        if self.paths.is_empty() {
            return Err(err("paths", "[]", "at least one path is required"));
        }
        let mut paths = Vec::new();
        for (i, p) in self.paths.iter().enumerate() {
            if !p.starts_with('/') {
                return Err(err(
                    format!("paths[{i}]"),
                    format!("{p:?}"),
                    "must start with '/'",
                ));
            }
            let api = Api::from_path(p).ok_or_else(|| {
                err(
                    format!("paths[{i}]"),
                    format!("{p:?}"),
                    "must end with /chat/completions, /completions, /responses or /messages",
                )
            })?;
            paths.push((p.trim_end_matches('/').to_string(), api));
        }
        let destination_header = own_header(
            "destination_header",
            &self.destination_header,
            "removes it from every request and sets it on the requests it routes",
            "x-gateway-destination-endpoint",
        )?;
        not_orca(
            "destination_header",
            &self.destination_header,
            &destination_header,
        )?;
        let decision_header = match &self.decision_header {
            Some(raw) => {
                let h = own_header(
                    "decision_header",
                    raw,
                    "adds it to every response it decided",
                    "x-prefix-router-decision",
                )?;
                not_orca("decision_header", raw, &h)?;
                Some(h)
            }
            None => None,
        };
        let mode = one_of(
            "key.mode",
            &self.key.mode,
            &[
                ("conversation", KeyMode::Conversation),
                ("prefix", KeyMode::Prefix),
            ],
        )?;
        if self.key.prefix_bytes == 0 || self.key.prefix_bytes > MAX_BODY_BYTES {
            return Err(err(
                "key.prefix_bytes",
                self.key.prefix_bytes,
                format!("must be 1..={MAX_BODY_BYTES}"),
            ));
        }
        let session_header = match &self.key.session_header {
            Some(h) => Some(header_name("key.session_header", h)?),
            None => None,
        };
        if session_header.as_deref() == Some(destination_header.as_str()) {
            return Err(err(
                "key.session_header",
                format!("{:?}", self.key.session_header.as_deref().unwrap_or("")),
                "is destination_header, which the filter removes from every request before it reads the session",
            ));
        }
        let orca_format = match self.load.orca_format.as_deref() {
            None => None,
            Some(s) if s.eq_ignore_ascii_case("text") => Some(OrcaFormat::Text),
            Some(s) if s.eq_ignore_ascii_case("json") => Some(OrcaFormat::Json),
            Some(s) => {
                return Err(err(
                    "load.orca_format",
                    format!("{s:?}"),
                    "must be \"TEXT\", \"JSON\" or null",
                ))
            }
        };
        if orca_format.is_some() && self.load.orca_metrics.is_empty() {
            return Err(err(
                "load.orca_metrics",
                "[]",
                "name at least one ORCA named metric (e.g. num_requests_waiting) or set load.orca_format to null",
            ));
        }
        for (field, list) in [
            ("load.orca_metrics", &self.load.orca_metrics),
            ("load.orca_running_metrics", &self.load.orca_running_metrics),
        ] {
            for (i, m) in list.iter().enumerate() {
                if m.is_empty() || m.contains([',', '=', ' ']) {
                    return Err(err(
                        format!("{field}[{i}]"),
                        format!("{m:?}"),
                        "not a metric name",
                    ));
                }
            }
        }
        let queue_header = match &self.load.queue_header {
            Some(h) => Some(header_name("load.queue_header", h)?),
            None => None,
        };
        if self.load.report_ttl_ms == 0 || self.load.report_ttl_ms > 3_600_000 {
            return Err(err(
                "load.report_ttl_ms",
                self.load.report_ttl_ms,
                "must be 1..=3600000",
            ));
        }
        if self.load.report_fade_ms > 3_600_000 {
            return Err(err(
                "load.report_fade_ms",
                self.load.report_fade_ms,
                "must be 0 (off) ..= 3600000",
            ));
        }
        if self.health.failure_threshold > 1000 {
            return Err(err(
                "health.failure_threshold",
                self.health.failure_threshold,
                "must be 0 (off) ..= 1000",
            ));
        }
        if self.health.unreachable_threshold > 1000 {
            return Err(err(
                "health.unreachable_threshold",
                self.health.unreachable_threshold,
                "must be 0 (off) ..= 1000",
            ));
        }
        if self.health.cooldown_ms == 0 || self.health.cooldown_ms > 3_600_000 {
            return Err(err(
                "health.cooldown_ms",
                self.health.cooldown_ms,
                "must be 1..=3600000",
            ));
        }
        let scrape = match &self.scrape {
            None => None,
            Some(sc) => Some(compile_scrape(sc)?),
        };
        let cost = compile_cost(&self.cost, self.chunk_bytes)?;
        let gossip = match &self.gossip {
            None => None,
            Some(g) => Some(compile_gossip(g, &cost, &paths)?),
        };
        Ok(Config {
            hosts,
            capacity_factor: c,
            min_capacity: m,
            vnodes: self.vnodes,
            chunk_bytes: self.chunk_bytes as usize,
            max_body_bytes: self.max_body_bytes,
            paths,
            destination_header,
            decision_header,
            key: KeyConfig {
                mode,
                prefix_bytes: self.key.prefix_bytes,
                session_header,
                use_user_field: self.key.use_user_field,
                use_cache_salt: self.key.use_cache_salt,
            },
            load: LoadConfig {
                orca_format,
                orca_metrics: self.load.orca_metrics.clone(),
                orca_running_metrics: self.load.orca_running_metrics.clone(),
                queue_header,
                report_ttl_ms: self.load.report_ttl_ms,
                report_fade_ms: self.load.report_fade_ms,
            },
            health: crate::health::HealthConfig {
                failure_threshold: self.health.failure_threshold,
                cooldown_ms: self.health.cooldown_ms,
                unreachable_threshold: self.health.unreachable_threshold,
            },
            scrape,
            cost,
            gossip,
            membership,
            failover_hosts,
        })
    }
}

fn compile_scrape(sc: &RawScrape) -> Result<ScrapeConfig, ConfigError> {
    if sc.cluster.is_empty() {
        return Err(err(
            "scrape.cluster",
            "\"\"",
            "name the Envoy cluster of the replicas",
        ));
    }
    if !(100..=600_000).contains(&sc.interval_ms) {
        return Err(err(
            "scrape.interval_ms",
            sc.interval_ms,
            "must be 100..=600000",
        ));
    }
    if sc.timeout_ms == 0 || sc.timeout_ms > sc.interval_ms {
        return Err(err(
            "scrape.timeout_ms",
            sc.timeout_ms,
            "must be >= 1 and <= scrape.interval_ms",
        ));
    }
    if !sc.path.starts_with('/') {
        return Err(err(
            "scrape.path",
            format!("{:?}", sc.path),
            "must start with '/'",
        ));
    }
    type Names = Vec<String>;
    let (preset, running_preset, restart_preset, hit_preset): (Names, Names, Names, Names) =
        match sc.preset.as_deref() {
            None | Some("vllm") => (
                vec!["vllm:num_requests_waiting".into()],
                vec!["vllm:num_requests_running".into()],
                vec![
                    "vllm:prefix_cache_queries_total".into(),
                    "vllm:prefix_cache_queries".into(),
                ],
                vec![
                    "vllm:prefix_cache_hits_total".into(),
                    "vllm:prefix_cache_hits".into(),
                ],
            ),
            // Recent SGLang counts cached prompt tokens per cache source
            // (device, host, storage): all of them are summed. Without the
            // counter (older versions) flush detection judges nothing.
            Some("sglang") => (
                vec!["sglang:num_queue_reqs".into()],
                vec!["sglang:num_running_reqs".into()],
                vec!["sglang:prompt_tokens_total".into()],
                vec!["sglang:cached_tokens_total".into()],
            ),
            Some(other) => {
                return Err(err(
                    "scrape.preset",
                    format!("{other:?}"),
                    "must be \"vllm\" or \"sglang\" (or give scrape.queue_metrics)",
                ))
            }
        };
    let queue_metrics = sc.queue_metrics.clone().unwrap_or(preset);
    if queue_metrics.is_empty()
        || queue_metrics
            .iter()
            .any(|m| m.is_empty() || m.contains([' ', '{']))
    {
        return Err(err(
            "scrape.queue_metrics",
            format!("{queue_metrics:?}"),
            "name at least one metric, without labels",
        ));
    }
    let running_metrics = metric_names(
        "scrape.running_metrics",
        sc.running_metrics.as_ref(),
        running_preset,
        "reads no running count",
    )?;
    let restart_metrics = metric_names(
        "scrape.restart_metrics",
        sc.restart_metrics.as_ref(),
        restart_preset,
        "turns restart detection off",
    )?;
    let hit_metrics = metric_names(
        "scrape.hit_metrics",
        sc.hit_metrics.as_ref(),
        hit_preset,
        "turns flush detection off",
    )?;
    Ok(ScrapeConfig {
        cluster: sc.cluster.clone(),
        interval_ms: sc.interval_ms,
        timeout_ms: sc.timeout_ms,
        path: sc.path.clone(),
        queue_metrics,
        running_metrics,
        restart_metrics,
        hit_metrics,
    })
}

impl Config {
    /// The API of a request path (query string ignored), if handled.
    pub fn api_for_path(&self, path: &str) -> Option<Api> {
        let p = path.split(['?', '#']).next().unwrap_or("");
        let p = p.trim_end_matches('/');
        self.paths.iter().find(|(h, _)| h == p).map(|(_, a)| *a)
    }

    /// Index of the host with this address (as `ip:port`).
    pub fn host_index(&self, address: &str) -> Option<usize> {
        self.hosts
            .iter()
            .position(|h| h.weight > 0.0 && h.address == address)
    }

    /// A config with these host addresses and defaults elsewhere (tests,
    /// simulator).
    pub fn with_hosts(addresses: &[&str]) -> Result<Config, ConfigError> {
        RawConfig {
            hosts: addresses
                .iter()
                .map(|a| RawHost {
                    address: a.to_string(),
                    name: None,
                    weight: None,
                })
                .collect(),
            ..RawConfig::default_without_hosts()
        }
        .compile()
    }
}

impl RawConfig {
    /// Defaults for everything, no hosts.
    pub fn default_without_hosts() -> RawConfig {
        RawConfig {
            hosts: vec![],
            capacity_factor: d_capacity(),
            min_capacity: d_min_capacity(),
            vnodes: d_vnodes(),
            chunk_bytes: d_chunk(),
            max_body_bytes: d_max_body(),
            paths: d_paths(),
            destination_header: d_dest(),
            decision_header: None,
            key: RawKey::default(),
            load: RawLoad::default(),
            health: RawHealth::default(),
            scrape: None,
            gossip: None,
            cost: RawCost::default(),
            membership: None,
            failover: Default::default(),
        }
    }
}

/// `membership` in the filter JSON: where the host list comes from.
/// Absent: the static `hosts` list alone, as before.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMembership {
    /// The Envoy cluster whose hosts are the replicas: the cluster the
    /// routes send LLM requests to (e.g. `"llm"`). Its hosts, as Envoy's
    /// admin lists them, become the filter's hosts; `hosts` becomes a seed
    /// (used until the first poll answers) and names hosts by address.
    pub cluster: String,
    /// A cluster of this Envoy whose only endpoint is its own admin
    /// listener (e.g. STATIC 127.0.0.1:9901). The filter GETs
    /// `admin_path` through it; route nothing else to it.
    #[serde(default = "d_admin_cluster")]
    pub admin_cluster: String,
    /// The admin path polled (default `/clusters?format=json`).
    #[serde(default = "d_admin_path")]
    pub admin_path: String,
    /// Poll period in ms (default 1000, 100..=600000): how long a host that
    /// came or went takes to reach the ring at most.
    #[serde(default = "d_interval")]
    pub interval_ms: u64,
    /// Timeout of one poll in ms (default 500, or `interval_ms` if that is
    /// shorter; at most `interval_ms`).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The Envoy cluster of the peer Envoys (e.g. `prefix_router_peers`, a
    /// STRICT_DNS cluster of the gateway's headless Service): its healthy
    /// hosts become `gossip.peers` at every poll, less this Envoy itself
    /// (the peer equal to `gossip.name`). Needs `gossip`; absent: the
    /// peers are `gossip.peers` as written.
    #[serde(default)]
    pub peers_cluster: Option<String>,
}

fn d_admin_cluster() -> String {
    "envoy_admin".into()
}
fn d_admin_path() -> String {
    "/clusters?format=json".into()
}
fn d_interval() -> u64 {
    1000
}

/// Validated `membership`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipConfig {
    /// The replicas' cluster.
    pub cluster: String,
    /// The loopback cluster to Envoy's admin listener.
    pub admin_cluster: String,
    /// The admin path polled.
    pub admin_path: String,
    /// Poll period, ms.
    pub interval_ms: u64,
    /// Poll timeout, ms.
    pub timeout_ms: u64,
    /// The peer Envoys' cluster (gossip peers from Envoy).
    pub peers_cluster: Option<String>,
}

impl RawMembership {
    /// Validate.
    pub fn compile(&self) -> Result<MembershipConfig, ConfigError> {
        let peers = self.peers_cluster.as_ref();
        for (f, v) in [
            ("membership.cluster", &self.cluster),
            ("membership.admin_cluster", &self.admin_cluster),
        ]
        .into_iter()
        .chain(peers.map(|p| ("membership.peers_cluster", p)))
        {
            if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
                return Err(err(
                    f,
                    format!("{v:?}"),
                    "must name an Envoy cluster (1-256 characters, no control characters)",
                ));
            }
        }
        if self.cluster == self.admin_cluster {
            return Err(err(
                "membership.admin_cluster",
                format!("{:?}", self.admin_cluster),
                "must differ from membership.cluster (it reaches Envoy's admin, not the replicas)",
            ));
        }
        let p = &self.admin_path;
        if !p.starts_with('/') || p.len() > 1024 || p.chars().any(|c| c.is_control() || c == ' ') {
            return Err(err(
                "membership.admin_path",
                format!("{p:?}"),
                "must be a path starting with / (no spaces or control characters)",
            ));
        }
        if !(100..=600_000).contains(&self.interval_ms) {
            return Err(err(
                "membership.interval_ms",
                self.interval_ms,
                "must be 100..=600000",
            ));
        }
        let timeout_ms = self.timeout_ms.unwrap_or(self.interval_ms.min(500));
        if timeout_ms == 0 || timeout_ms > self.interval_ms {
            return Err(err(
                "membership.timeout_ms",
                timeout_ms,
                "must be > 0 and at most membership.interval_ms",
            ));
        }
        Ok(MembershipConfig {
            cluster: self.cluster.clone(),
            admin_cluster: self.admin_cluster.clone(),
            admin_path: self.admin_path.clone(),
            interval_ms: self.interval_ms,
            timeout_ms,
            peers_cluster: self.peers_cluster.clone(),
        })
    }
}

/// `failover` in the filter JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFailover {
    /// Ring successors written after the chosen host in the destination
    /// header, comma-separated (default 2, at most 8; 0: the chosen host
    /// alone). Envoy's override_host sends a retry to the next one, so match
    /// the route's `retry_policy.num_retries`.
    #[serde(default = "d_failover_hosts")]
    pub hosts: u32,
}

impl Default for RawFailover {
    fn default() -> Self {
        RawFailover {
            hosts: d_failover_hosts(),
        }
    }
}

fn d_failover_hosts() -> u32 {
    2
}

/// Most `failover.hosts`.
pub const MAX_FAILOVER_HOSTS: u32 = 8;

impl RawFailover {
    /// Validate: the number of failover hosts.
    pub fn compile(&self) -> Result<usize, ConfigError> {
        if self.hosts > MAX_FAILOVER_HOSTS {
            return Err(err(
                "failover.hosts",
                self.hosts,
                "must be at most 8 (Envoy retries at most num_retries times)",
            ));
        }
        Ok(self.hosts as usize)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bad(json: &str) -> ConfigError {
        Config::from_json(json.as_bytes()).unwrap_err()
    }

    /// `serde_path_to_error`'s path of deserializing `RawConfig` from `b`, and
    /// [`error_path`]'s, when serde_json fails (`None` when it does not).
    fn both_paths(b: &[u8]) -> Option<(String, String)> {
        let mut de = serde_json::Deserializer::from_slice(b);
        let reference = serde_path_to_error::deserialize::<_, RawConfig>(&mut de);
        let plain = RawConfig::deserialize(&mut serde_json::Deserializer::from_slice(b));
        match (reference, plain) {
            (Ok(_), Ok(_)) => None,
            (Err(r), Err(e)) => {
                assert_eq!(r.inner().to_string(), e.to_string());
                let segs: Vec<Seg> = r
                    .path()
                    .iter()
                    .map(|s| match s {
                        serde_path_to_error::Segment::Seq { index } => Seg::Index(*index),
                        serde_path_to_error::Segment::Map { key }
                        | serde_path_to_error::Segment::Enum { variant: key } => {
                            Seg::Key(key.clone())
                        }
                        serde_path_to_error::Segment::Unknown => Seg::Unknown,
                    })
                    .collect();
                let dup = e.to_string().starts_with("duplicate field ");
                Some((path_text(&segs), path_text(&error_path(b, &e, dup))))
            }
            (r, p) => panic!("{:?} vs {:?}", r.err(), p.err()),
        }
    }

    #[test]
    fn error_paths_agree_with_serde_path_to_error_on_mutated_configs() {
        // The examples and the config fuzz target's seeds (compiled in: the wasm32 run has no
        // file system), and a host given as an array.
        let seeds: [&[u8]; 8] = [
            br#"{"hosts":[["127.0.0.1:1","a",1]],"key":{"mode":"text"},"paths":["/v1/completions"]}"#,
            include_bytes!("../../../examples/filter-full.json"),
            include_bytes!("../../../examples/filter-cost.json"),
            include_bytes!("../../../examples/filter-sglang.json"),
            include_bytes!("../../../examples/filter-minimal.json"),
            include_bytes!("../../../fuzz/seeds/config/bad-gossip.json"),
            include_bytes!("../../../fuzz/seeds/config/bad-vnodes.json"),
            include_bytes!("../../../fuzz/seeds/config/empty-key-regression.json"),
        ];
        let tokens = [
            ",",
            "]",
            "}",
            "{",
            "[",
            ":",
            "\"x\"",
            "1",
            "-",
            "1.",
            "01",
            "1e",
            "null",
            "true",
            "tru",
            "\"a\":1",
            " ",
            "\"\\u00e9\"",
            "x",
            "\"\\q\"",
            "\n",
            "\"",
            "-5",
            "1.5",
            "5000000000",
            "[]",
            "{}",
            "[1]",
            "{\"a\":1}",
            "[\"x\",2]",
            "\"vnodes\":3,",
            "\"mode\":\"x\",",
            "\"zzz\":1,",
            "\"hosts\":[],",
            "\"weight\":\"w\",",
            "\"\\ud800\"",
            "\"\\udc00x\"",
            "\"\\ud83d\\ude00\"",
            "\\u00",
            "\"\\u12\"",
            "\u{e9}",
            "\"k\\u00e9y\":2,",
            "1E+2",
            "-0",
            "0.5e-3",
            "[[",
            "]]",
            "\t",
            "\"a\"",
        ];
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = |n: usize| {
            rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % n.max(1) as u64) as usize
        };
        let (mut failed, mut checked) = (0, 0);
        for seed in seeds {
            for _ in 0..2000 {
                let mut b = seed.to_vec();
                for _ in 0..1 + next(3) {
                    let at = next(b.len() + 1);
                    match next(5) {
                        0 => b.truncate(at),
                        4 => b.insert(at, 0xff),
                        1 => {
                            if at < b.len() {
                                b.remove(at);
                            }
                        }
                        _ => {
                            let t = tokens[next(tokens.len())].as_bytes();
                            b.splice(at..at, t.iter().copied());
                        }
                    }
                }
                if let Some((want, got)) = both_paths(&b) {
                    checked += 1;
                    if want != got {
                        failed += 1;
                        if failed <= 10 {
                            let e = RawConfig::deserialize(
                                &mut serde_json::Deserializer::from_slice(&b),
                            )
                            .err()
                            .map(|e| e.to_string());
                            eprintln!("{e:?}\n  want {want:?} got {got:?}");
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
        assert_eq!(failed, 0, "of {checked}");
    }

    #[test]
    fn gossip_config() {
        let h = r#""hosts":[{"address":"127.0.0.1:1"}]"#;
        let ok = Config::from_json(
            format!(r#"{{{h},"cost":{{"mode":"index"}},"gossip":{{"peers":["127.0.0.1:9000","envoy-b.svc:10000"],"cluster":"peers"}}}}"#)
                .as_bytes(),
        )
        .unwrap();
        let g = ok.gossip.unwrap();
        assert_eq!(g.peers.len(), 2);
        assert_eq!(
            (
                g.path.as_str(),
                g.interval_ms,
                g.timeout_ms,
                g.accept,
                g.max_batch_bytes
            ),
            ("/.prefix-router/gossip", 100, 1000, true, 262_144)
        );
        assert_eq!(g.fingerprint, crate::gossip::fingerprint(&ok.cost.index));
        assert_eq!(g.name, None);
        let named = Config::from_json(
            format!(r#"{{{h},"cost":{{"mode":"index"}},"gossip":{{"peers":["b:1"],"cluster":"p","name":"a:1"}}}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(named.gossip.unwrap().name.as_deref(), Some("a:1"));
        // Accept only.
        assert!(Config::from_json(
            format!(r#"{{{h},"cost":{{"mode":"index"}},"gossip":{{}}}}"#).as_bytes()
        )
        .unwrap()
        .gossip
        .is_some());
        let cases = [
            (r#""gossip":{"peers":["127.0.0.1:9000"]}"#, "gossip.cluster"),
            (
                r#""gossip":{"peers":["nope"],"cluster":"c"}"#,
                "gossip.peers[0]",
            ),
            (
                r#""gossip":{"peers":["h:0"],"cluster":"c"}"#,
                "gossip.peers[0]",
            ),
            (r#""gossip":{"path":"x"}"#, "gossip.path"),
            (r#""gossip":{"interval_ms":5}"#, "gossip.interval_ms"),
            (r#""gossip":{"timeout_ms":0}"#, "gossip.timeout_ms"),
            (r#""gossip":{"name":""}"#, "gossip.name"),
            (
                r#""gossip":{"max_batch_bytes":10}"#,
                "gossip.max_batch_bytes",
            ),
            (r#""gossip":{"accept":false}"#, "gossip"),
        ];
        for (j, field) in cases {
            let e = bad(&format!(r#"{{{h},"cost":{{"mode":"index"}},{j}}}"#));
            assert_eq!(e.field, field, "{j}: {e}");
        }
        // Gossip shares the index rule's index: not with spill (the default) or off.
        for mode in ["spill", "off"] {
            let e = bad(&format!(
                r#"{{{h},"cost":{{"mode":"{mode}"}},"gossip":{{}}}}"#
            ));
            assert_eq!(e.field, "gossip", "{e}");
        }
        let e = bad(&format!(r#"{{{h},"gossip":{{"peer":[]}}}}"#));
        assert!(e.to_string().contains("peer"), "{e}");
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::from_json(br#"{"hosts":[{"address":"127.0.0.1:8000"}]}"#).unwrap();
        assert_eq!(c.capacity_factor, 1.25);
        assert_eq!(c.min_capacity, 8.0);
        assert_eq!(c.cost.params, crate::cost::CostParams::default());
        assert_eq!(c.load.report_fade_ms, 2000);
        assert_eq!(c.vnodes, 400);
        assert_eq!(c.chunk_bytes, 64);
        assert_eq!(c.hosts[0].name, "127.0.0.1:8000");
        assert_eq!(c.key.mode, KeyMode::Conversation);
        assert_eq!(c.load.orca_format, Some(OrcaFormat::Text));
        assert_eq!(c.destination_header, "x-gateway-destination-endpoint");
        assert_eq!(
            c.api_for_path("/v1/chat/completions?x=1"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(c.api_for_path("/v1/embeddings"), None);
    }

    #[test]
    fn errors_name_field_value_reason() {
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"capacity_factor":0.5}"#);
        assert_eq!(e.field, "capacity_factor");
        assert_eq!(e.value, "0.5");
        assert!(e.to_string().contains("capacity_factor"));
        let e = bad(r#"{"hosts":[]}"#);
        assert_eq!(e.field, "hosts");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"bogus":1}"#);
        assert_eq!(e.field, "bogus");
        assert!(e.reason.contains("unknown field"));
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1","port":3}]}"#);
        assert_eq!(e.field, "hosts[0].port");
        let e = bad(r#"{}"#);
        assert_eq!(e.field, "hosts");
        let e = bad(r#"{"hosts":[{"address":"localhost:80"}]}"#);
        assert_eq!(e.field, "hosts[0].address");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"},{"address":"127.0.0.1:1"}]}"#);
        assert_eq!(e.field, "hosts[1].address");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1","weight":0}]}"#);
        assert_eq!(e.field, "hosts[0].weight");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"key":{"mode":"x"}}"#);
        assert_eq!(e.field, "key.mode");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"paths":["/v1/embeddings"]}"#);
        assert_eq!(e.field, "paths[0]");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"destination_header":"bad header"}"#);
        assert_eq!(e.field, "destination_header");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"load":{"orca_format":"BIN"}}"#);
        assert_eq!(e.field, "load.orca_format");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"load":{"report_fade_ms":3600001}}"#);
        assert_eq!(e.field, "load.report_fade_ms");
        assert!(e.to_string().contains("3600001"), "{e}");
        let off = Config::from_json(
            br#"{"hosts":[{"address":"127.0.0.1:1"}],"load":{"report_fade_ms":0}}"#,
        )
        .unwrap();
        assert_eq!(off.load.freshness(), crate::load::Freshness::ttl(10_000));
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"min_capacity":-1}"#);
        assert_eq!(e.field, "min_capacity");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"vnodes":0}"#);
        assert_eq!(e.field, "vnodes");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"health":{"cooldown_ms":0}}"#);
        assert_eq!(e.field, "health.cooldown_ms");
        let e =
            bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"health":{"unreachable_threshold":1001}}"#);
        assert_eq!(e.field, "health.unreachable_threshold");
        let e = bad(
            r#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm","preset":"tgi"}}"#,
        );
        assert_eq!(e.field, "scrape.preset");
        let e = bad(
            r#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm","interval_ms":1000,"timeout_ms":2000}}"#,
        );
        assert_eq!(e.field, "scrape.timeout_ms");
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"interval_ms":1000}}"#);
        assert_eq!(e.field, "scrape.cluster");
        let ok = Config::from_json(br#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm","preset":"sglang"}}"#).unwrap();
        let sc = ok.scrape.unwrap();
        assert_eq!(sc.queue_metrics, vec!["sglang:num_queue_reqs".to_string()]);
        assert_eq!(
            sc.running_metrics,
            vec!["sglang:num_running_reqs".to_string()]
        );
        let vllm = Config::from_json(
            br#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm"}}"#,
        )
        .unwrap();
        assert_eq!(
            vllm.scrape.unwrap().running_metrics,
            vec!["vllm:num_requests_running".to_string()]
        );
        assert_eq!(
            vllm.load.orca_running_metrics,
            vec!["num_requests_running".to_string()]
        );
        let off = Config::from_json(
            br#"{"hosts":[{"address":"127.0.0.1:1"}],"load":{"orca_running_metrics":[]},"scrape":{"cluster":"llm","running_metrics":[]}}"#,
        )
        .unwrap();
        assert!(off.load.orca_running_metrics.is_empty());
        assert!(off.scrape.unwrap().running_metrics.is_empty());
        let e = bad(
            r#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm","running_metrics":["a b"]}}"#,
        );
        assert_eq!(e.field, "scrape.running_metrics");
        // Flush detection: each preset reads its hit counter, `[]` turns it
        // off, labels are refused.
        assert_eq!(
            sc.hit_metrics,
            vec!["sglang:cached_tokens_total".to_string()]
        );
        let e = bad(
            r#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm","hit_metrics":["h{a=\"b\"}"]}}"#,
        );
        assert_eq!(e.field, "scrape.hit_metrics");
        let off = Config::from_json(
            br#"{"hosts":[{"address":"127.0.0.1:1"}],"scrape":{"cluster":"llm","hit_metrics":[]}}"#,
        )
        .unwrap();
        assert!(off.scrape.unwrap().hit_metrics.is_empty());
        let e =
            bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"load":{"orca_running_metrics":["x=1"]}}"#);
        assert_eq!(e.field, "load.orca_running_metrics[0]");
        let e = bad("not json");
        assert!(e.to_string().contains("invalid prefix-router config"));
    }

    #[test]
    fn cost_section() {
        let c = Config::from_json(br#"{"hosts":[{"address":"127.0.0.1:1"}]}"#).unwrap();
        assert_eq!(c.cost.mode, CostMode::Spill);
        assert!(!c.cost.enabled);
        assert_eq!(c.cost.params, crate::cost::CostParams::default());
        assert_eq!(c.cost.index, crate::index::IndexConfig::default());
        assert_eq!(
            c.cost.shared,
            crate::shared_index::SharedIndexConfig::default()
        );
        let c = Config::from_json(
            br#"{"hosts":[{"address":"127.0.0.1:1"}],"chunk_bytes":128,"cost":{"mode":"index","service_s":0.25,"host_tokens":1000,"prefill_tokens_per_s":8000}}"#,
        )
        .unwrap();
        assert!(c.cost.enabled);
        assert!(
            c.cost.learn_prefill,
            "the index rule learns the prefill rate"
        );
        assert_eq!(c.cost.params.service_s, 0.25);
        assert_eq!(c.cost.params.prefill_tokens_per_s, 8000.0);
        assert_eq!(c.cost.index.host_tokens, 1000);
        // 16 chunks of 128 bytes: the index's stride follows chunk_bytes.
        assert_eq!(c.cost.index.stride_bytes(), 2048);
        assert_eq!(c.cost.shared.stride_bytes, 2048);
        assert_eq!(c.cost.params.candidates, 6);
        for (json, field) in [
            (r#"{"mode":"maybe"}"#, "cost.mode"),
            (r#"{"prefill_tokens_per_s":0}"#, "cost.prefill_tokens_per_s"),
            (
                r#"{"prefill_tokens_per_s":2e9}"#,
                "cost.prefill_tokens_per_s",
            ),
            (r#"{"bytes_per_token":-1}"#, "cost.bytes_per_token"),
            (r#"{"service_s":-0.1}"#, "cost.service_s"),
            (r#"{"service_s":1e9}"#, "cost.service_s"),
            (r#"{"host_tokens":2000000000000}"#, "cost.host_tokens"),
            // Knobs removed in favour of constants are unknown fields.
            (r#"{"ties":"load"}"#, "cost.ties"),
            (r#"{"hot_rule":"mean"}"#, "cost.hot_rule"),
            (r#"{"learn_prefill":true}"#, "cost.learn_prefill"),
        ] {
            let e = bad(&format!(
                r#"{{"hosts":[{{"address":"127.0.0.1:1"}}],"cost":{json}}}"#
            ));
            assert_eq!(e.field, field, "{json}");
            assert!(!e.reason.is_empty());
        }
        // A value out of a fixed set names the field, the value and every
        // value allowed.
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"cost":{"mode":"fast"}}"#);
        assert_eq!(
            (e.field.as_str(), e.value.as_str(), e.reason.as_str()),
            (
                "cost.mode",
                "\"fast\"",
                "must be \"spill\", \"index\" or \"off\""
            )
        );
        assert_eq!(
            one_of("f", "c", &[("a", 1), ("b", 2), ("d", 3)])
                .unwrap_err()
                .reason,
            "must be \"a\", \"b\" or \"d\""
        );
        let e = bad(r#"{"hosts":[{"address":"127.0.0.1:1"}],"cost":{"candidate":2}}"#);
        assert_eq!(e.field, "cost.candidate");
        assert!(e.reason.contains("unknown field"), "{e}");
    }

    /// The full text of the error a config gives.
    fn text(json: &str) -> String {
        bad(json).to_string()
    }

    const H: &str = r#""hosts":[{"address":"127.0.0.1:8001"}]"#;

    #[test]
    fn type_errors_name_the_field_and_the_value() {
        let p = "invalid prefix-router config: field";
        for (json, want) in [
            (
                format!(r#"{{{H},"vnodes":-5}}"#),
                format!("{p} `vnodes` = -5: must be an integer 0..=4294967295"),
            ),
            (
                format!(r#"{{{H},"vnodes":"x"}}"#),
                format!(r#"{p} `vnodes` = "x": must be an integer 0..=4294967295"#),
            ),
            (
                format!(r#"{{{H},"vnodes":1.5}}"#),
                format!("{p} `vnodes` = 1.5: must be an integer 0..=4294967295"),
            ),
            (
                format!(r#"{{{H},"cost":{{"host_tokens":-1}}}}"#),
                format!("{p} `cost.host_tokens` = -1: must be an integer 0..=18446744073709551615"),
            ),
            (
                r#"{"hosts":[{"address":"127.0.0.1:1","weight":"2"}]}"#.to_string(),
                format!(r#"{p} `hosts[0].weight` = "2": must be a number"#),
            ),
            (
                r#"{"hosts":[{"address":5}]}"#.to_string(),
                format!("{p} `hosts[0].address` = 5: must be a string"),
            ),
            (
                format!(r#"{{{H},"key":{{"use_user_field":1}}}}"#),
                format!("{p} `key.use_user_field` = 1: must be a boolean"),
            ),
            (
                format!(r#"{{{H},"paths":{{}}}}"#),
                format!("{p} `paths` = {{...}}: must be an array"),
            ),
            (
                format!(r#"{{{H},"max_body_bytes":null}}"#),
                format!("{p} `max_body_bytes` = null: must be an integer 0..=18446744073709551615"),
            ),
            (
                r#""x""#.to_string(),
                format!(r#"{p} `<config>` = "x": must be an object"#),
            ),
            (
                format!(r#"{{{H},"scrape":{{"interval_ms":1000}}}}"#),
                format!("{p} `scrape.cluster` = (missing): required"),
            ),
            (
                "{}".to_string(),
                format!("{p} `hosts` = []: at least one host is required (or `membership` to take them from an Envoy cluster)"),
            ),
            (
                format!(r#"{{{H},"vnodes":1,"vnodes":2}}"#),
                format!("{p} `vnodes` = (given twice): set at most once"),
            ),
            (
                format!(r#"{{{H},"health":{{"cooldown":1}}}}"#),
                format!("{p} `health.cooldown` = (set): unknown field; expected one of `failure_threshold`, `cooldown_ms`, `unreachable_threshold`"),
            ),
            (
                r#"{"hosts": ["#.to_string(),
                format!("{p} `hosts` = (not JSON): EOF while parsing a list at line 1 column 11"),
            ),
            (
                format!(r#"{{{H}}} x"#),
                format!("{p} `<json>` = (text after the object): not one JSON object: trailing characters at line 1 column 42"),
            ),
        ] {
            assert_eq!(text(&json), want, "{json}");
        }
        // Keys that are not plain names are quoted, so the field is never
        // empty (found by the config fuzz target).
        for (json, field) in [
            (r#"{"":1}"#.to_string(), r#""""#),
            (r#"{"hosts":[{"":1}]}"#.to_string(), r#"hosts[0]."""#),
            (format!(r#"{{{H},"cost":{{"x`y":1}}}}"#), r#"cost."x`y""#),
            (format!(r#"{{{H},"a.b":1}}"#), r#""a.b""#),
        ] {
            assert_eq!(bad(&json).field, field, "{json}");
        }
        let e = bad(&format!(r#"{{{H},"bogus":1}}"#));
        assert_eq!((e.field.as_str(), e.value.as_str()), ("bogus", "(set)"));
        assert!(
            e.reason
                .starts_with("unknown field; expected one of `hosts`, "),
            "{e}"
        );
    }

    #[test]
    fn one_endpoint_written_twice_port_0_and_metric_names() {
        let p = "invalid prefix-router config: field";
        for (hosts, want) in [
            (
                r#"[{"address":"127.0.0.1:8000"},{"address":"[::ffff:127.0.0.1]:8000"}]"#,
                format!(
                    r#"{p} `hosts[1].address` = "[::ffff:127.0.0.1]:8000": the same endpoint as hosts[0].address "127.0.0.1:8000""#
                ),
            ),
            (
                r#"[{"address":"[::FFFF:7f00:1]:8000"},{"address":"127.0.0.1:08000"}]"#,
                format!(
                    r#"{p} `hosts[1].address` = "127.0.0.1:08000": the same endpoint as hosts[0].address "[::FFFF:7f00:1]:8000""#
                ),
            ),
            (
                r#"[{"address":"[fe80:0000::0001]:80"},{"address":"[FE80::1]:80"}]"#,
                format!(
                    r#"{p} `hosts[1].address` = "[FE80::1]:80": the same endpoint as hosts[0].address "[fe80:0000::0001]:80""#
                ),
            ),
            (
                r#"[{"address":"127.0.0.1:1"},{"address":"127.0.0.1:1"}]"#,
                format!(
                    r#"{p} `hosts[1].address` = "127.0.0.1:1": the same endpoint as hosts[0].address "127.0.0.1:1""#
                ),
            ),
            (
                r#"[{"address":"127.0.0.1:0"}]"#,
                format!(r#"{p} `hosts[0].address` = "127.0.0.1:0": port 0 is no replica's port"#),
            ),
            (
                r#"[{"address":"[::]:80"}]"#,
                format!(
                    r#"{p} `hosts[0].address` = "[::]:80": an unspecified address (0.0.0.0, ::) is no replica's address"#
                ),
            ),
            (
                r#"[{"address":"127.000.0.1:80"}]"#,
                format!(
                    r#"{p} `hosts[0].address` = "127.000.0.1:80": must be ip:port as Envoy knows the endpoint (e.g. 10.0.0.5:8000 or [::1]:8000; IPv4 without leading zeros)"#
                ),
            ),
            (
                r#"[{"address":"127.0.0.1:1","name":"r-1"},{"address":"127.0.0.1:2","name":"r_1"}]"#,
                format!(
                    r#"{p} `hosts[1].name` = "r_1": gives the metric prefix_router.host.r_1.routed, as hosts[0] does: names must differ in their letters or digits"#
                ),
            ),
        ] {
            assert_eq!(text(&format!(r#"{{"hosts":{hosts}}}"#)), want, "{hosts}");
        }
        // Distinct endpoints that look alike stay accepted, as written
        // (canonical form: what Envoy prints for the endpoint).
        let c = Config::from_json(
            br#"{"hosts":[{"address":"127.0.0.1:8000"},{"address":"127.0.0.2:8000"},{"address":"[::1]:8000"},{"address":"[0000::0001]:8001"}]}"#,
        )
        .unwrap();
        assert_eq!(c.hosts[3].address, "[::1]:8001");
    }

    #[test]
    fn headers_the_filter_writes_are_its_own() {
        let p = "invalid prefix-router config: field";
        let dest = "the filter removes it from every request and sets it on the requests it routes: use a header of its own (e.g. x-gateway-destination-endpoint)";
        let dec = "the filter adds it to every response it decided: use a header of its own (e.g. x-prefix-router-decision)";
        for (field, name, what) in [
            (
                "destination_header",
                "host",
                "the request's authority (Host, :authority in HTTP/2)",
            ),
            ("destination_header", ":authority", "a pseudo-header"),
            ("destination_header", "Content-Length", "message framing"),
            ("destination_header", "transfer-encoding", "message framing"),
            (
                "destination_header",
                "connection",
                "a hop-by-hop header, which proxies consume or drop",
            ),
            (
                "destination_header",
                "te",
                "a hop-by-hop header, which proxies consume or drop",
            ),
            (
                "destination_header",
                "upgrade",
                "a hop-by-hop header, which proxies consume or drop",
            ),
            (
                "destination_header",
                "keep-alive",
                "a hop-by-hop header, which proxies consume or drop",
            ),
            (
                "destination_header",
                "proxy-authorization",
                "a hop-by-hop header (proxy-*)",
            ),
            (
                "destination_header",
                "content-type",
                "the body's media type or encoding, which the filter and the replica read",
            ),
            (
                "destination_header",
                "x-envoy-original-path",
                "one of Envoy's own headers (x-envoy-*)",
            ),
            ("decision_header", "content-length", "message framing"),
            ("decision_header", ":status", "a pseudo-header"),
            ("decision_header", "Transfer-Encoding", "message framing"),
            (
                "decision_header",
                "proxy-connection",
                "a hop-by-hop header (proxy-*)",
            ),
        ] {
            let does = if field == "destination_header" {
                dest
            } else {
                dec
            };
            assert_eq!(
                text(&format!(r#"{{{H},"{field}":"{name}"}}"#)),
                format!(r#"{p} `{field}` = "{name}": names {what}; {does}"#)
            );
        }
        for (field, name) in [
            ("destination_header", "endpoint-load-metrics-format"),
            ("decision_header", "Endpoint-Load-Metrics"),
        ] {
            assert_eq!(
                text(&format!(r#"{{{H},"{field}":"{name}"}}"#)),
                format!(
                    r#"{p} `{field}` = "{name}": names an ORCA load-report header, which the filter sets and reads itself"#
                )
            );
        }
        assert_eq!(
            text(&format!(
                r#"{{{H},"destination_header":"x-route","key":{{"session_header":"X-Route"}}}}"#
            )),
            format!(
                r#"{p} `key.session_header` = "X-Route": is destination_header, which the filter removes from every request before it reads the session"#
            )
        );
        // Headers of its own stay accepted.
        let c = Config::from_json(
            format!(r#"{{{H},"destination_header":"x-dest","decision_header":"x-host-decision"}}"#)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(c.decision_header.as_deref(), Some("x-host-decision"));
    }

    #[test]
    fn gossip_path_peers_and_name_are_checked() {
        let p = "invalid prefix-router config: field";
        for (gossip, want) in [
            (
                r#"{"path":"/v1/chat/completions"}"#,
                format!(
                    r#"{p} `gossip.path` = "/v1/chat/completions": is the routed API path paths[0]: its requests would be taken as gossip batches (400), not routed; use a path no client calls"#
                ),
            ),
            (
                r#"{"path":"/v1/messages/"}"#,
                format!(
                    r#"{p} `gossip.path` = "/v1/messages/": is the routed API path paths[3]: its requests would be taken as gossip batches (400), not routed; use a path no client calls"#
                ),
            ),
            (
                r#"{"path":"/gossip?x=1"}"#,
                format!(
                    r#"{p} `gossip.path` = "/gossip?x=1": must be a path alone, without '?' or '#' (requests are matched on their path)"#
                ),
            ),
            (
                r#"{"peers":["10.0.0.1:9000","[::ffff:10.0.0.1]:9000"],"cluster":"c"}"#,
                format!(
                    r#"{p} `gossip.peers[1]` = "[::ffff:10.0.0.1]:9000": the same peer as gossip.peers[0] "10.0.0.1:9000": it would get every batch twice"#
                ),
            ),
            (
                r#"{"peers":["envoy-b.svc:70000"],"cluster":"c"}"#,
                format!(
                    r#"{p} `gossip.peers[0]` = "envoy-b.svc:70000": must be host:port (port 1..=65535)"#
                ),
            ),
            (
                r#"{"peers":["Envoy-B.svc:1000","envoy-b.svc:01000"],"cluster":"c"}"#,
                format!(
                    r#"{p} `gossip.peers[1]` = "envoy-b.svc:01000": the same peer as gossip.peers[0] "Envoy-B.svc:1000": it would get every batch twice"#
                ),
            ),
            (
                r#"{"peers":["10.0.0.2:9000"],"cluster":"c","name":"10.0.0.2:9000"}"#,
                format!(
                    r#"{p} `gossip.name` = "10.0.0.2:9000": is gossip.peers[0]: this Envoy would send its batches to itself"#
                ),
            ),
        ] {
            assert_eq!(
                text(&format!(
                    r#"{{{H},"cost":{{"mode":"index"}},"gossip":{gossip}}}"#
                )),
                want,
                "{gossip}"
            );
        }
        // A path of its own, and a routed path moved away, are fine.
        assert!(Config::from_json(
            format!(
                r#"{{{H},"paths":["/v1/completions"],"cost":{{"mode":"index"}},"gossip":{{"path":"/v1/chat/completions"}}}}"#
            )
            .as_bytes()
        )
        .is_ok());
    }

    #[test]
    fn max_body_bytes_is_capped_at_8_mib() {
        assert_eq!(MAX_BODY_BYTES, 8 * 1024 * 1024);
        assert!(
            Config::from_json(format!(r#"{{{H},"max_body_bytes":8388608}}"#).as_bytes()).is_ok()
        );
        assert_eq!(
            text(&format!(r#"{{{H},"max_body_bytes":8388609}}"#)),
            "invalid prefix-router config: field `max_body_bytes` = 8388609: must be 1..=8388608 (8 MiB): a worker VM's memory never shrinks; larger bodies pass as fallbacks"
        );
    }

    #[test]
    fn ipv6_and_nulls() {
        let c = Config::from_json(
            br#"{"hosts":[{"address":"[::1]:8000","weight":2.5,"name":"a"}],"load":{"orca_format":null,"queue_header":null},"decision_header":"X-Decision"}"#,
        )
        .unwrap();
        assert_eq!(c.hosts[0].address, "[::1]:8000");
        assert_eq!(c.load.orca_format, None);
        assert_eq!(c.decision_header.as_deref(), Some("x-decision"));
    }
}

#[cfg(test)]
mod example_files {
    use super::*;
    use crate::extract::Api;

    /// The configs shipped in `examples/` stay valid.
    #[test]
    fn shipped_examples_compile() {
        for (name, json) in [
            (
                "filter-minimal.json",
                include_str!("../../../examples/filter-minimal.json"),
            ),
            (
                "filter-full.json",
                include_str!("../../../examples/filter-full.json"),
            ),
            (
                "filter-sglang.json",
                include_str!("../../../examples/filter-sglang.json"),
            ),
            (
                "filter-cost.json",
                include_str!("../../../examples/filter-cost.json"),
            ),
        ] {
            let c = Config::from_json(json.as_bytes());
            assert!(c.is_ok(), "{name}: {c:?}");
        }
        let full = Config::from_json(include_bytes!("../../../examples/filter-full.json")).unwrap();
        assert_eq!(full.hosts[2].weight, 2.0);
        // filter-full.json spells out the defaults: it must equal the defaults.
        let mut defaults = RawConfig::default_without_hosts();
        defaults.hosts = serde_json::from_value(serde_json::json!([
            {"address": "10.0.0.11:8000", "name": "vllm-a"},
            {"address": "10.0.0.12:8000", "name": "vllm-b"},
            {"address": "10.0.0.13:8000", "name": "vllm-c-h200", "weight": 2}
        ]))
        .unwrap();
        defaults.decision_header = Some("x-prefix-router-decision".into());
        defaults.key.session_header = Some("x-session-id".into());
        assert_eq!(defaults.compile().unwrap(), full);
        assert_eq!(full.api_for_path("/v1/messages"), Some(Api::Messages));
        let cost = Config::from_json(include_bytes!("../../../examples/filter-cost.json")).unwrap();
        assert!(cost.cost.enabled);
        assert_eq!(cost.cost.params.candidates, 6);
        let scrape = cost
            .scrape
            .as_ref()
            .expect("filter-cost.json has a scrape section");
        assert_eq!(scrape.cluster, "llm");
        assert!(!scrape.restart_metrics.is_empty());
        let g = cost
            .gossip
            .as_ref()
            .expect("filter-cost.json has a gossip section");
        assert_eq!(
            (g.peers.len(), g.cluster.as_str(), g.interval_ms),
            (2, "prefix_router_peers", 100)
        );
        assert_eq!(
            scrape.hit_metrics,
            vec![
                "vllm:prefix_cache_hits_total".to_string(),
                "vllm:prefix_cache_hits".to_string()
            ]
        );
    }
}
