//! `prefix-router-lab gossip-cost`: what receiving index gossip costs an Envoy.
//!
//! One Envoy with `gossip.accept` in front of 4 backend simulators. One client thread
//! POSTs gossip batches of `observations` observations of `hashes` chain hashes each
//! (random hashes, fixed seed, naming the lab's replicas), alternating two kinds, so that
//! machine noise hits both alike:
//! - `apply`: the filter's fingerprint: decoded and every observation recorded in the
//!   shared index (204),
//! - `reject`: the same size with another fingerprint: decoded, refused (400), nothing
//!   recorded; what the HTTP round trip, the body and the decoding cost.
//!
//! `apply - reject` is the cost of recording the observations: what a receiving Envoy
//! spends per peer observation (in the worker thread that took the POST).

use std::time::{Duration, Instant};

use prefix_router_core::gossip::{self, Observation};
use prefix_router_core::Config;
use serde_json::json;

use crate::backend::BackendOptions;
use crate::envoy::{filter_json_text, EnvoyMode, EnvoyOptions, FilterConfig};
use crate::lab::{Lab, LabOptions};
use crate::{http, prom, LabError, Result};

/// Options of the run.
#[derive(Debug, Clone)]
pub struct GossipCostOptions {
    /// Batches of each kind.
    pub batches: usize,
    pub observations: usize,
    pub hashes: usize,
}

impl Default for GossipCostOptions {
    fn default() -> Self {
        GossipCostOptions {
            batches: 200,
            observations: 50,
            hashes: 40,
        }
    }
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `p`-quantile of `v` (ms) through [`crate::report::quantile_us`].
fn pct(v: &[f64], p: f64) -> f64 {
    let us: Vec<f64> = v.iter().map(|ms| ms * 1e3).collect();
    crate::report::quantile_us(&us, p).map_or(f64::NAN, |x| x / 1e3)
}

/// Run it; returns the report.
pub fn run(opts: &GossipCostOptions) -> Result<String> {
    // Gossip shares the index rule's prefix index: the filter refuses it without cost.mode index.
    let patch = json!({"cost": {"mode": "index"}, "gossip": {"accept": true}});
    let lab = Lab::start(&LabOptions {
        label: "gossip-cost".to_string(),
        backends: 4,
        backend: BackendOptions {
            instant: true,
            ..BackendOptions::default()
        },
        envoy: Some(EnvoyOptions {
            mode: EnvoyMode::PrefixRouter,
            filter: FilterConfig::Patched(patch.clone()),
            ..EnvoyOptions::default()
        }),
    })?;
    let envoy = lab.envoy()?;
    let template = std::fs::read_to_string(EnvoyMode::PrefixRouter.template_path())?;
    let text = filter_json_text(&template, &FilterConfig::Patched(patch), &lab.backends)?;
    let cfg = Config::from_json(text.as_bytes()).map_err(|e| LabError(e.to_string()))?;
    let fp = cfg
        .gossip
        .as_ref()
        .map(|g| g.fingerprint)
        .ok_or_else(|| LabError("no gossip section".to_string()))?;
    let hosts: Vec<String> = lab.backends.iter().map(|b| b.address()).collect();
    let mut seed = 42u64;
    let mut batch = |fingerprint: u64| {
        let obs: Vec<Observation> = (0..opts.observations)
            .map(|i| Observation {
                host: hosts[i % hosts.len()].clone(),
                tokens: 2000,
                hashes: (0..opts.hashes).map(|_| splitmix(&mut seed)).collect(),
            })
            .collect();
        gossip::encode(fingerprint, &obs)
    };
    let agent = http::agent(Duration::from_secs(10));
    let url = envoy.url("/.prefix-router/gossip");
    let (mut apply, mut reject) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    // A few of each first (connections, VM warm-up), not measured.
    for i in 0..(opts.batches + 5) * 2 {
        let good = i % 2 == 0;
        let b = batch(if good { fp } else { fp ^ 1 });
        bytes = b.len();
        let t = Instant::now();
        let r = http::post_bytes(&agent, &url, &b)?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let want = if good { 204 } else { 400 };
        if r.status != want {
            return Err(LabError(format!(
                "batch {i}: status {} ({})",
                r.status, r.body
            )));
        }
        if i >= 10 {
            if good {
                apply.push(ms);
            } else {
                reject.push(ms);
            }
        }
    }
    let samples = envoy.prometheus()?;
    let applied = prom::sum_matching(&samples, &["prefix_router", "gossip", "applied"]);
    let rejected = prom::sum_matching(&samples, &["prefix_router", "gossip", "rejected"]);
    let (a50, a90, r50, r90) = (
        pct(&apply, 0.5),
        pct(&apply, 0.9),
        pct(&reject, 0.5),
        pct(&reject, 0.9),
    );
    let n = opts.observations as f64;
    Ok(format!(
        "gossip-cost: {} batches of each kind, {} observations x {} hashes ({} bytes a batch)\n\
         apply  (204): p50 {a50:.3} ms  p90 {a90:.3} ms\n\
         reject (400): p50 {r50:.3} ms  p90 {r90:.3} ms\n\
         recording one observation: {:.1} us at p50 ({:.1} us at p90)\n\
         counters: applied {applied}, rejected {rejected}",
        opts.batches,
        opts.observations,
        opts.hashes,
        bytes,
        (a50 - r50) * 1000.0 / n,
        (a90 - r90) * 1000.0 / n,
    ))
}
