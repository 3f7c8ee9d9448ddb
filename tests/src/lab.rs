//! A lab: N backend simulators + (optionally) one Envoy in front of them.

use crate::backend::{Backend, BackendOptions, CacheCounters};
use crate::envoy::{Envoy, EnvoyOptions};
use crate::process::ScratchDir;
use crate::report::Report;
use crate::workload::{self, RunResult, Workload};
use crate::{LabError, Result};

#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Label of the scratch directory (`.lab/<label>-<pid>-<n>`).
    pub label: String,
    pub backends: usize,
    pub backend: BackendOptions,
    /// `None`: backends only (start Envoy later with [`Lab::start_envoy`]).
    pub envoy: Option<EnvoyOptions>,
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            label: "lab".to_string(),
            backends: 4,
            backend: BackendOptions::default(),
            envoy: Some(EnvoyOptions::default()),
        }
    }
}

/// Owns every process it started; dropping it stops them (Envoy first) and removes the
/// scratch directory (kept when panicking).
#[derive(Debug)]
pub struct Lab {
    pub envoy: Option<Envoy>,
    pub backends: Vec<Backend>,
    backend_opts: BackendOptions,
    restarts: usize,
    dir: ScratchDir,
}

impl Lab {
    pub fn start(opts: &LabOptions) -> Result<Lab> {
        let dir = ScratchDir::new(&opts.label)?;
        let mut backends = Vec::with_capacity(opts.backends);
        for i in 0..opts.backends {
            backends.push(Backend::start(
                &format!("r{}", i + 1),
                &opts.backend,
                dir.path(),
            )?);
        }
        let mut lab = Lab {
            envoy: None,
            backends,
            backend_opts: opts.backend.clone(),
            restarts: 0,
            dir,
        };
        if let Some(e) = &opts.envoy {
            lab.start_envoy(e)?;
        }
        Ok(lab)
    }

    /// Starts (or replaces) Envoy in front of the backends and waits until it is ready.
    pub fn start_envoy(&mut self, opts: &EnvoyOptions) -> Result<&Envoy> {
        self.stop_envoy();
        let e = Envoy::start(&self.backends, opts, self.dir.path())?;
        Ok(self.envoy.insert(e))
    }

    /// Spawns Envoy without waiting for it (to observe a failing startup).
    pub fn spawn_envoy(&mut self, opts: &EnvoyOptions) -> Result<&mut Envoy> {
        self.stop_envoy();
        let e = Envoy::spawn(&self.backends, opts, self.dir.path())?;
        Ok(self.envoy.insert(e))
    }

    pub fn stop_envoy(&mut self) {
        if let Some(mut e) = self.envoy.take() {
            e.stop();
        }
    }

    pub fn envoy(&self) -> Result<&Envoy> {
        self.envoy
            .as_ref()
            .ok_or_else(|| LabError("the lab has no Envoy running".to_string()))
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn replica_names(&self) -> Vec<String> {
        self.backends.iter().map(|b| b.name.clone()).collect()
    }

    pub fn backend(&self, name: &str) -> Result<&Backend> {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| LabError(format!("no backend named {name}")))
    }

    /// Backend name for an `ip:port` address.
    pub fn backend_mut(&mut self, name: &str) -> Result<&mut Backend> {
        self.backends
            .iter_mut()
            .find(|b| b.name == name)
            .ok_or_else(|| LabError(format!("no backend named {name}")))
    }

    /// Restart backend `name` on the same address with an empty cache (a replica restart).
    pub fn restart_backend(&mut self, name: &str) -> Result<()> {
        self.restarts += 1;
        let generation = self.restarts;
        let opts = self.backend_opts.clone();
        let dir = self.dir.path().to_path_buf();
        self.backend_mut(name)?.restart(&opts, &dir, generation)
    }

    pub fn backend_by_address(&self, address: &str) -> Option<&Backend> {
        self.backends.iter().find(|b| b.address() == address)
    }

    /// Prefix-cache counters summed over all backends.
    pub fn cache_counters(&self) -> Result<CacheCounters> {
        let mut acc = CacheCounters::default();
        for b in &self.backends {
            let c = CacheCounters::read(b)?;
            acc.queries += c.queries;
            acc.hits += c.hits;
        }
        Ok(acc)
    }

    /// Runs `workload` through Envoy and builds the report (hit rate from the backend counter
    /// deltas over the run; if a backend lacks the counters the hit rate is left out).
    pub fn run_workload(&self, workload: &Workload, label: &str) -> Result<(RunResult, Report)> {
        self.run_workload_observed(workload, label, &|_| {})
    }

    /// [`Lab::run_workload`], calling `observe` after every request (a progress display).
    pub fn run_workload_observed(
        &self,
        workload: &Workload,
        label: &str,
        observe: workload::Observer<'_>,
    ) -> Result<(RunResult, Report)> {
        let envoy = self.envoy()?;
        let (run, mut report) =
            self.run_workload_at_observed(workload, label, &[envoy.url("")], observe)?;
        // Why the cost rule's index dropped entries during the run (empty without it).
        if let Ok(samples) = envoy.prometheus() {
            report.forgets = ["capacity", "restart", "flushed", "ejected", "hosts_changed"]
                .iter()
                .filter(|k| {
                    !crate::prom::matching(&samples, &["prefix_router", "index", "forget", k])
                        .is_empty()
                })
                .map(|k| {
                    let v = crate::prom::sum_matching(
                        &samples,
                        &["prefix_router", "index", "forget", k],
                    );
                    (k.to_string(), v as u64)
                })
                .collect();
        }
        Ok((run, report))
    }

    /// Runs `workload` against `base_urls` (any routers in front of these backends: Envoys, a
    /// [`crate::peer::SglangRouter`]; with several, a conversation's turns alternate between
    /// them, [`workload::run_spread`]) and builds the report, as [`Lab::run_workload`] does
    /// minus the filter's own metrics.
    pub fn run_workload_at(
        &self,
        workload: &Workload,
        label: &str,
        base_urls: &[String],
    ) -> Result<(RunResult, Report)> {
        self.run_workload_at_observed(workload, label, base_urls, &|_| {})
    }

    /// [`Lab::run_workload_at`], calling `observe` after every request (a progress display).
    pub fn run_workload_at_observed(
        &self,
        workload: &Workload,
        label: &str,
        base_urls: &[String],
        observe: workload::Observer<'_>,
    ) -> Result<(RunResult, Report)> {
        let before = self.cache_counters();
        let run = workload::run_spread_observed(workload, base_urls, observe);
        let after = self.cache_counters();
        let cache = match (before, after) {
            (Ok(b), Ok(a)) => Some(a.delta(b)),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("lab: no prefix-cache hit rate: {e}");
                None
            }
        };
        let report = Report::new(label, &run, &self.replica_names(), cache);
        Ok((run, report))
    }

    /// `n` more Envoys in front of the backends (not the lab's own [`Lab::envoy`]; dropping
    /// them stops them), each on its own listener port with the others as its peers (cluster
    /// `prefix_router_peers`) and `filter`; with `gossip` and the filter, `filter` (unless
    /// raw text) is patched with a `gossip` section naming every other Envoy (interval 100 ms);
    /// with `load_gossip` too, each Envoy's section names it (`gossip.name`), so it also sends
    /// its pending prefill.
    pub fn start_envoys(
        &self,
        n: usize,
        mode: crate::EnvoyMode,
        filter: &crate::FilterConfig,
        gossip: bool,
        load_gossip: bool,
    ) -> Result<Vec<Envoy>> {
        let ports = crate::process::free_ports(n)?;
        let peer = |p: &u16| format!("127.0.0.1:{p}");
        let mut envoys = Vec::with_capacity(n);
        for (i, port) in ports.iter().enumerate() {
            let peers: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, p)| peer(p))
                .collect();
            // A raw filter text is used as it is (no gossip section added).
            let base = match filter {
                crate::FilterConfig::Default => Some(serde_json::json!({})),
                crate::FilterConfig::Patched(v) => Some(v.clone()),
                crate::FilterConfig::Raw(_) | crate::FilterConfig::RawFirstHost(_) => None,
            };
            let filter = match base {
                Some(mut patch) if gossip && mode == crate::EnvoyMode::PrefixRouter => {
                    if let Some(obj) = patch.as_object_mut() {
                        let mut g = serde_json::json!({
                            "peers": peers, "cluster": "prefix_router_peers", "interval_ms": 100
                        });
                        if load_gossip {
                            g["name"] = serde_json::json!(peer(port));
                        }
                        obj.insert("gossip".to_string(), g);
                    }
                    crate::FilterConfig::Patched(patch)
                }
                _ => filter.clone(),
            };
            let opts = EnvoyOptions {
                mode,
                filter,
                listener_port: Some(*port),
                peers: peers.clone(),
                ..EnvoyOptions::default()
            };
            envoys.push(Envoy::start(&self.backends, &opts, self.dir.path())?);
        }
        Ok(envoys)
    }

    /// Stops Envoy and the backends now (also done on drop).
    pub fn stop(&mut self) {
        self.stop_envoy();
        self.backends.clear();
    }
}
