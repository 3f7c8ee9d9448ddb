//! Routing policies: this project's router (driving `prefix-router-core`)
//! and re-implementations of the peers' algorithms, each in its own module
//! with the public source it follows cited in its doc comment.
//!
//! Every policy instance is one router process ("proxy"): in multi-proxy
//! runs the engine builds K instances, each with its own in-flight counts and
//! learned state (trees, indexes, active-sequence tables), while replica
//! reports (queue depth, KV utilization) and KV-cache events are shared.
//! Where the peer itself keeps one state for every gateway, so do its K
//! instances ([`PolicySpec::build_fleet`]): GIE's endpoint picker (one per
//! InferencePool, serving every gateway replica), Higress's Redis store and
//! the KV-event stream every Dynamo router subscribes to.

pub mod baselines;
pub mod dynamo;
pub mod gie;
pub mod higress;
pub mod kubeai;
pub mod prefix_router;
pub mod prefix_router_cost;
pub mod sglang;

use std::fmt;

use prefix_router_replica::Replica;

use crate::input::RouteInput;
use crate::rng::seed_str;

/// A replica's load report as a router receives it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Requests waiting (vLLM `num_requests_waiting`).
    pub waiting: u32,
    /// Requests running (vLLM `num_requests_running`).
    pub running: u32,
    /// KV-cache usage 0..=1 (vLLM `kv_cache_usage_perc`).
    pub kv_usage: f64,
    /// When the router received it (seconds, virtual clock).
    pub at: f64,
    /// The receiving proxy's own requests in flight at the replica when
    /// it received the report (ORCA: when the replica wrote it; a sample:
    /// when it arrived, as the filter's scrape records it). `None`: a
    /// sample as every other reader gets it, read as this proxy's count
    /// at decision time.
    pub own: Option<u32>,
    /// The same for its requests without a first token (`None`: as `own`).
    pub own_pending: Option<u32>,
}

/// What a policy may look at when routing.
pub struct View<'a> {
    /// Virtual time, seconds.
    pub now: f64,
    /// This proxy's own in-flight requests per replica (routed, not done).
    pub inflight: &'a [u64],
    /// This proxy's own requests per replica without a first token yet
    /// (the filter: without a response byte).
    pub pending: &'a [u64],
    /// Latest report this proxy has from each replica (the samples, shared
    /// by all proxies, or with ORCA its own responses' reports; `None`
    /// before the first report or when reports are off).
    pub reports: &'a [Option<Snapshot>],
    /// The replicas, for KV-event-driven routers (Dynamo) that track the
    /// real cache contents: only read the cache, as KV events would.
    pub replicas: &'a [Replica],
}

impl View<'_> {
    /// `now` in whole milliseconds (the core's clock unit).
    pub fn now_ms(&self) -> u64 {
        (self.now * 1000.0).max(0.0) as u64
    }
}

/// Why a replica was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Cache affinity decided it (the key's owner, the best match).
    Affinity,
    /// Affinity was overridden by load (spill, load-balancing branch).
    Spill,
    /// The policy could not decide (parse error, no key) and fell back.
    Fallback,
    /// A load-only decision (round robin, least loaded, no useful match).
    Balance,
}

/// A routing decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub host: usize,
    pub outcome: Outcome,
}

/// A routing policy instance (one proxy).
pub trait Policy: Send {
    /// Choose a replica for `input`.
    fn route(&mut self, input: &RouteInput<'_>, view: &View<'_>) -> Choice;
    /// The request produced its first token on `host`.
    fn on_first_token(&mut self, _id: u64, _host: usize) {}
    /// [`Policy::on_first_token`] with the time it happened (virtual
    /// seconds); by default just that.
    fn on_first_token_at(&mut self, id: u64, host: usize, _t: f64) {
        self.on_first_token(id, host);
    }
    /// The request finished on `host`.
    fn on_done(&mut self, _id: u64, _host: usize) {}
    /// [`Policy::on_done`] with the time it happened (virtual seconds); by
    /// default just that.
    fn on_done_at(&mut self, id: u64, host: usize, _t: f64) {
        self.on_done(id, host);
    }
    /// Prompt tokens this policy's prefix index credited its chosen
    /// replicas with so far (`None`: the policy has no such index).
    fn credited_tokens(&self) -> Option<u64> {
        None
    }
    /// The prefill rate this policy learned online, tokens/s (`None`: it
    /// does not learn one).
    fn learned_prefill_tps(&self) -> Option<f64> {
        None
    }
    /// Index gossip: the delay after which another proxy receives what
    /// this one hands out (`None`: no gossip).
    fn gossip_delay_s(&self) -> Option<f64> {
        None
    }
    /// Index gossip: a batch of what this proxy learned since the last
    /// call (`None`: nothing).
    fn gossip_out(&mut self) -> Option<Vec<u8>> {
        None
    }
    /// Index gossip: a batch another proxy handed out, arriving at `t`
    /// (virtual seconds).
    fn gossip_in(&mut self, _batch: &[u8], _t: f64) {}
    /// Reads replica reports as the filter does with ORCA: with
    /// `SimConfig::orca_reports` (the default), only those on its own
    /// responses.
    fn reads_orca(&self) -> bool {
        false
    }
}

/// Which algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    PrefixRouter(prefix_router::Params),
    PrefixRouterCost(prefix_router_cost::Params),
    RoundRobin,
    Random,
    LeastLoaded,
    PowerOfTwo,
    ChFirstChunk,
    SglangCacheAware(sglang::CacheAwareParams),
    SglangPrefixHash(sglang::PrefixHashParams),
    Gie(gie::Params),
    KubeAi(kubeai::Params),
    Dynamo(dynamo::Params),
    Higress(higress::Params),
}

/// A policy as named on the command line: `NAME[:key=value,...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySpec {
    /// Label in tables and JSON (the spec as written).
    pub label: String,
    pub kind: Kind,
}

/// A bad policy spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

/// The policy label of the filter's default configuration: the one place
/// the simulator names it (plain-run and suite JSON `default_policy`, the
/// suite's scoreboard): `prefix-router`, the core with the filter's
/// default config (`cost.mode: spill`).
pub const DEFAULT_POLICY: &str = "prefix-router";

/// Names accepted by [`PolicySpec::parse`].
pub const NAMES: &[&str] = &[
    "prefix-router",
    "prefix-router-cost",
    "round-robin",
    "random",
    "least-loaded",
    "p2c",
    "ch-first-chunk",
    "sglang-cache-aware",
    "sglang-prefix-hash",
    "gie",
    "kubeai",
    "dynamo",
    "higress",
];

/// What `--policy all` runs, in table order.
pub const ALL: &[&str] = &[
    "prefix-router-cost",
    "prefix-router",
    "prefix-router:mode=prefix",
    "prefix-router:floor=0",
    "prefix-router:c=2",
    "round-robin",
    "random",
    "least-loaded",
    "p2c",
    "ch-first-chunk",
    "sglang-cache-aware",
    "sglang-prefix-hash",
    "gie",
    "kubeai",
    "dynamo",
    "higress",
];

/// Parse `key=value,...` into pairs.
pub(crate) fn options(rest: &str) -> Result<Vec<(String, String)>, SpecError> {
    rest.split(',')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| SpecError(format!("policy option {kv:?} is not key=value")))
        })
        .collect()
}

pub(crate) fn num(k: &str, v: &str) -> Result<f64, SpecError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| {
            SpecError(format!(
                "policy option {k}={v:?}: not a non-negative number"
            ))
        })
}

impl PolicySpec {
    /// Parse `NAME[:key=value,...]`.
    pub fn parse(s: &str) -> Result<PolicySpec, SpecError> {
        let (name, rest) = s.split_once(':').unwrap_or((s, ""));
        let opts = options(rest)?;
        let none = |kind: Kind| -> Result<Kind, SpecError> {
            match opts.first() {
                Some((k, _)) => Err(SpecError(format!("policy {name} takes no option ({k:?})"))),
                None => Ok(kind),
            }
        };
        let kind = match name {
            "prefix-router" => Kind::PrefixRouter(prefix_router::Params::parse(&opts)?),
            "prefix-router-cost" => {
                Kind::PrefixRouterCost(prefix_router_cost::Params::parse(&opts)?)
            }
            "round-robin" => none(Kind::RoundRobin)?,
            "random" => none(Kind::Random)?,
            "least-loaded" => none(Kind::LeastLoaded)?,
            "p2c" => none(Kind::PowerOfTwo)?,
            "ch-first-chunk" => none(Kind::ChFirstChunk)?,
            "sglang-cache-aware" => Kind::SglangCacheAware(sglang::CacheAwareParams::parse(&opts)?),
            "sglang-prefix-hash" => Kind::SglangPrefixHash(sglang::PrefixHashParams::parse(&opts)?),
            "gie" => Kind::Gie(gie::Params::parse(&opts)?),
            "kubeai" => Kind::KubeAi(kubeai::Params::parse(&opts)?),
            "dynamo" => Kind::Dynamo(dynamo::Params::parse(&opts)?),
            "higress" => Kind::Higress(higress::Params::parse(&opts)?),
            _ => {
                return Err(SpecError(format!(
                    "unknown policy {name:?}; one of {} or all",
                    NAMES.join(", ")
                )))
            }
        };
        Ok(PolicySpec {
            label: s.to_string(),
            kind,
        })
    }

    /// Expand a `--policy` value (`all` or one spec).
    pub fn expand(s: &str) -> Result<Vec<PolicySpec>, SpecError> {
        if s == "all" {
            ALL.iter().map(|p| PolicySpec::parse(p)).collect()
        } else {
            Ok(vec![PolicySpec::parse(s)?])
        }
    }

    /// Is this the project's router?
    pub fn is_project(&self) -> bool {
        matches!(self.kind, Kind::PrefixRouter(_) | Kind::PrefixRouterCost(_))
    }

    /// Build instance `proxy` for `hosts` replicas with `cache_tokens` of
    /// KV cache each.
    pub fn build(
        &self,
        hosts: usize,
        seed: u64,
        proxy: usize,
        cache_tokens: Option<u64>,
    ) -> Result<Box<dyn Policy>, SpecError> {
        let seed = seed_str(seed, &format!("policy:{}:{proxy}", self.label));
        Ok(match &self.kind {
            Kind::PrefixRouter(p) => Box::new(prefix_router::PrefixRouter::new(p, hosts)?),
            Kind::PrefixRouterCost(p) => Box::new(prefix_router_cost::PrefixRouterCost::new(
                p,
                hosts,
                cache_tokens,
            )?),
            Kind::RoundRobin => Box::new(baselines::RoundRobin::new(hosts, proxy)),
            Kind::Random => Box::new(baselines::Random::new(hosts, seed)),
            Kind::LeastLoaded => Box::new(baselines::LeastLoaded::new(hosts, seed)),
            Kind::PowerOfTwo => Box::new(baselines::PowerOfTwo::new(hosts, seed)),
            Kind::ChFirstChunk => Box::new(baselines::ChFirstChunk::new(hosts)?),
            Kind::SglangCacheAware(p) => Box::new(sglang::CacheAware::new(p.clone(), hosts)),
            Kind::SglangPrefixHash(p) => Box::new(sglang::PrefixHash::new(p.clone(), hosts)),
            Kind::Gie(p) => Box::new(gie::Gie::new(p.clone(), hosts, seed, cache_tokens)),
            Kind::KubeAi(p) => Box::new(kubeai::KubeAi::new(p.clone(), hosts)),
            Kind::Dynamo(p) => Box::new(dynamo::Dynamo::new(
                p.clone(),
                hosts,
                seed,
                dynamo::KvEvents::shared(hosts),
            )),
            Kind::Higress(p) => Box::new(higress::Higress::new(
                p.clone(),
                hosts,
                proxy,
                seed,
                higress::Store::shared(hosts),
            )),
        })
    }

    /// Build the `proxies` instances of one run. Instances are independent
    /// ([`PolicySpec::build`]) except GIE's, which are one endpoint picker
    /// (the EPP of the InferencePool, which every gateway replica calls),
    /// Higress's, which share one store (the Redis every gateway talks to),
    /// Dynamo's, which receive one KV-event stream (each keeps its own
    /// active sequences), and `prefix-router-cost` with `load_gossip_ms`,
    /// whose proxies share a board of their pending prefill (the filter's
    /// load gossip).
    pub fn build_fleet(
        &self,
        hosts: usize,
        seed: u64,
        proxies: usize,
        cache_tokens: Option<u64>,
    ) -> Result<Vec<Box<dyn Policy>>, SpecError> {
        if let Kind::Gie(p) = &self.kind {
            let s = seed_str(seed, &format!("policy:{}:0", self.label));
            let picker = gie::Gie::new(p.clone(), hosts, s, cache_tokens);
            if proxies <= 1 {
                return Ok(vec![Box::new(picker)]);
            }
            let shared = std::sync::Arc::new(std::sync::Mutex::new(picker));
            return Ok((0..proxies)
                .map(|_| Box::new(gie::SharedGie(shared.clone())) as Box<dyn Policy>)
                .collect());
        }
        if let Kind::Dynamo(p) = &self.kind {
            let events = dynamo::KvEvents::shared(hosts);
            return Ok((0..proxies)
                .map(|proxy| {
                    let s = seed_str(seed, &format!("policy:{}:{proxy}", self.label));
                    Box::new(dynamo::Dynamo::new(p.clone(), hosts, s, events.clone()))
                        as Box<dyn Policy>
                })
                .collect());
        }
        if let Kind::Higress(p) = &self.kind {
            let store = higress::Store::shared(hosts);
            return Ok((0..proxies)
                .map(|proxy| {
                    let s = seed_str(seed, &format!("policy:{}:{proxy}", self.label));
                    Box::new(higress::Higress::new(
                        p.clone(),
                        hosts,
                        proxy,
                        s,
                        store.clone(),
                    )) as Box<dyn Policy>
                })
                .collect());
        }
        if let Kind::PrefixRouterCost(p) = &self.kind {
            if p.load_gossip_ms.is_some() && proxies > 1 {
                let board: prefix_router_cost::PendingBoard =
                    std::sync::Arc::new(std::sync::Mutex::new(vec![
                        std::collections::VecDeque::new(
                        );
                        proxies
                    ]));
                return (0..proxies)
                    .map(|slot| {
                        let mut r =
                            prefix_router_cost::PrefixRouterCost::new(p, hosts, cache_tokens)?;
                        r.join_board(board.clone(), slot);
                        Ok(Box::new(r) as Box<dyn Policy>)
                    })
                    .collect();
            }
        }
        (0..proxies)
            .map(|proxy| self.build(hosts, seed, proxy, cache_tokens))
            .collect()
    }
}

impl PolicySpec {
    /// What this policy reads when it routes, in one line (the simulator's
    /// header prints it; README "What the router sees" says the same).
    pub fn sees(&self) -> String {
        match &self.kind {
            Kind::PrefixRouter(_) => {
                "its own in-flight and pending (no first token yet) counts; replica reports (waiting, running) per its `reports` option".into()
            }
            Kind::PrefixRouterCost(_) => "its own in-flight counts, pending prefill and learned prefix index (per proxy unless gossip is set); replica reports (waiting, running)".into(),
            Kind::RoundRobin | Kind::Random => "nothing (load-blind, per proxy)".into(),
            Kind::LeastLoaded | Kind::PowerOfTwo => "its own in-flight counts".into(),
            Kind::ChFirstChunk => "the request's first 64-byte chunk only".into(),
            Kind::SglangCacheAware(_) => {
                "its own approximate radix tree of the text it routed; its own in-flight counts".into()
            }
            Kind::SglangPrefixHash(_) => {
                "a hash of the first prompt tokens; its own in-flight counts".into()
            }
            Kind::Gie(_) => "one endpoint picker for every proxy: its LRU index of the prompts it routed (cache tokens / 16 entries per replica); replica reports (waiting, KV usage)".into(),
            Kind::KubeAi(_) => {
                "the first characters of the first user message; its own in-flight counts".into()
            }
            Kind::Dynamo(p) => format!(
                "the replicas' cache contents through KV events (prompt blocks after prefill, {:.0} ms delay; evictions at once); its own active sequences",
                p.kv_delay_s * 1000.0
            ),
            Kind::Higress(p) => format!(
                "chat: chain keys and a fleet-wide in-flight count per replica, in one store all proxies share (Redis); completions {}",
                if p.blocks > 0 {
                    "keyed as fixed segments (not Higress)"
                } else {
                    "(e.g. Mooncake): round robin, no cache affinity"
                }
            ),
        }
    }
}

/// The simulator header's "sees" lines: what each distinct policy among
/// `labels` reads (labels that do not parse are skipped), then when replica
/// reports reach the routers.
pub fn sees_lines<'a>(
    labels: impl IntoIterator<Item = &'a str>,
    report_interval_s: f64,
    report_delay_s: f64,
    orca: bool,
) -> String {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = String::new();
    for l in labels {
        if seen.contains(&l) {
            continue;
        }
        seen.push(l);
        if let Ok(spec) = PolicySpec::parse(l) {
            let head = if out.is_empty() { "sees" } else { "" };
            out.push_str(&format!("{head:<10}{l}: {}\n", spec.sees()));
        }
    }
    let reports = if report_interval_s > 0.0 && report_delay_s > 0.0 {
        format!(
            "replica reports reach every proxy {:.0} ms after each sample (--report-delay-ms)",
            report_delay_s * 1000.0
        )
    } else if report_interval_s > 0.0 {
        "replica reports reach every proxy the moment they are sampled (no delay unless --report-delay-ms is set)".to_string()
    } else {
        "no replica reports (--report-interval-ms 0)".to_string()
    };
    let reports = if orca {
        format!("{reports}; prefix-router and prefix-router-cost instead read ORCA on their own responses (at each first token, each proxy its own; --scrape-ms: and one sample a period; --sampled-reports: every sample instead)")
    } else {
        reports
    };
    out.push_str(&format!(
        "{:<10}{reports}\n",
        if out.is_empty() { "sees" } else { "" }
    ));
    out
}

/// [`sees_lines`] for the policies and the report settings of `rep`.
pub fn sees_header(rep: &crate::report::Report) -> String {
    sees_lines(
        rep.runs
            .iter()
            .flat_map(|r| r.results.iter().map(|x| x.policy.as_str())),
        rep.config.report_interval_s,
        rep.config.report_delay_s,
        rep.config.orca_reports,
    )
}

/// The address of replica `i` as the filter config and peers name it.
pub fn host_address(i: usize) -> String {
    format!("10.0.{}.{}:8000", i / 250, i % 250 + 1)
}

/// Index of the first minimum of `loads` (ties: lowest index).
pub(crate) fn first_min(loads: &[u64]) -> usize {
    let mut best = 0;
    for (i, &l) in loads.iter().enumerate() {
        if l < loads.get(best).copied().unwrap_or(u64::MAX) {
            best = i;
        }
    }
    best
}
