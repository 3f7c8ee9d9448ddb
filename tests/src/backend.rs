//! Backend simulators (`prefix-router-backend`), one process per replica.

use crate::process::{free_port, wait_until, ChildGuard};
use crate::{http, paths, prom, LabError, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Command-line knobs of `prefix-router-backend` (see crates/backend-sim).
#[derive(Debug, Clone)]
pub struct BackendOptions {
    pub model: String,
    pub max_running: u32,
    /// KV-cache capacity in tokens.
    pub cache_tokens: u64,
    pub prefill_tokens_per_s: f64,
    pub decode_ms_per_token: f64,
    /// Multiplies every simulated duration (0.1 = ten times faster than "real").
    pub time_scale: f64,
    /// `--instant`: answer generations at once (overhead measurements).
    pub instant: bool,
    /// `--early-stream-head`: a streamed response's head goes out before its
    /// first token, with no load headers (vLLM's and SGLang's servers).
    pub early_stream_head: bool,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            model: "sim-llm".to_string(),
            max_running: 8,
            cache_tokens: 8192,
            prefill_tokens_per_s: 8000.0,
            decode_ms_per_token: 10.0,
            time_scale: 0.5,
            instant: false,
            early_stream_head: false,
        }
    }
}

/// A running backend simulator.
#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub port: u16,
    child: ChildGuard,
    agent: ureq::Agent,
}

impl Backend {
    /// Starts `name` on a free loopback port and waits until `GET /health` answers 200.
    /// Retries on another port if the chosen one was taken in the meantime.
    pub fn start(name: &str, opts: &BackendOptions, dir: &Path) -> Result<Backend> {
        let mut last_err = LabError(String::new());
        for attempt in 0..3 {
            match Self::start_on(name, opts, dir, free_port()?, attempt) {
                Ok(b) => return Ok(b),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    /// Starts `name` on `port` (log `backend-<name>-<attempt>.log`).
    fn start_on(
        name: &str,
        opts: &BackendOptions,
        dir: &Path,
        port: u16,
        attempt: usize,
    ) -> Result<Backend> {
        let bin = paths::backend_bin()?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--name")
            .arg(name)
            .arg("--model")
            .arg(&opts.model)
            .arg("--max-running")
            .arg(opts.max_running.to_string())
            .arg("--cache-tokens")
            .arg(opts.cache_tokens.to_string())
            .arg("--prefill-tokens-per-s")
            .arg(opts.prefill_tokens_per_s.to_string())
            .arg("--decode-ms-per-token")
            .arg(opts.decode_ms_per_token.to_string())
            .arg("--time-scale")
            .arg(opts.time_scale.to_string());
        if opts.early_stream_head {
            cmd.arg("--early-stream-head");
        }
        if opts.instant {
            cmd.arg("--instant");
        }
        let log = dir.join(format!("backend-{name}-{attempt}.log"));
        let child = ChildGuard::spawn(&format!("backend {name}"), cmd, &log)?;
        let mut b = Backend {
            name: name.to_string(),
            port,
            child,
            agent: http::agent(Duration::from_secs(10)),
        };
        b.wait_healthy(Duration::from_secs(20))?;
        Ok(b)
    }

    /// A replica restart: kill the process and start a fresh one (empty cache, counters
    /// at zero) on the same port. `generation` names the new log file.
    pub fn restart(&mut self, opts: &BackendOptions, dir: &Path, generation: usize) -> Result<()> {
        self.child.kill();
        let mut last_err = LabError(String::new());
        // The port may linger for a moment after the kill.
        for attempt in 0..20 {
            match Self::start_on(
                &self.name,
                opts,
                dir,
                self.port,
                100 + generation * 20 + attempt,
            ) {
                Ok(b) => {
                    *self = b;
                    return Ok(());
                }
                Err(e) => {
                    last_err = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Err(last_err)
    }

    fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let url = self.url("/health");
        let agent = self.agent.clone();
        let ok = wait_until(timeout, || {
            if let Some(status) = self.child.try_wait() {
                return Err(LabError(format!(
                    "backend {} exited during startup ({status}); log {}:\n{}",
                    self.name,
                    self.child.log_path().display(),
                    self.child.log_tail(4000)
                )));
            }
            Ok(matches!(http::get(&agent, &url), Ok(r) if r.status == 200))
        })?;
        if ok {
            Ok(())
        } else {
            Err(LabError(format!(
                "backend {} did not answer GET /health with 200 within {timeout:?}; log:\n{}",
                self.name,
                self.child.log_tail(4000)
            )))
        }
    }

    /// `127.0.0.1:port`, the form Envoy and the filter use.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The backend's `/metrics`, parsed.
    pub fn metrics(&self) -> Result<Vec<prom::Sample>> {
        let r = http::get(&self.agent, &self.url("/metrics"))?;
        if r.status != 200 {
            return Err(LabError(format!(
                "backend {}: GET /metrics answered {}",
                self.name, r.status
            )));
        }
        Ok(prom::parse(&r.body))
    }

    /// `POST /admin/queue {"extra_waiting": n}`: fake a reported queue of `n` waiting requests.
    pub fn set_extra_waiting(&self, n: u64) -> Result<()> {
        self.post_queue(serde_json::json!({ "extra_waiting": n }))
    }

    /// `POST /admin/queue {"extra_running": n}`: fake `n` more running requests in the
    /// replica's reports (other clients' work), leaving the waiting count alone.
    pub fn set_extra_running(&self, n: u64) -> Result<()> {
        self.post_queue(serde_json::json!({ "extra_running": n }))
    }

    fn post_queue(&self, body: serde_json::Value) -> Result<()> {
        let r = http::post(
            &self.agent,
            &self.url("/admin/queue"),
            &[],
            &body.to_string(),
        )?;
        if !(200..300).contains(&r.status) {
            return Err(LabError(format!(
                "backend {}: POST /admin/queue answered {}: {}",
                self.name, r.status, r.body
            )));
        }
        Ok(())
    }

    /// `POST /reset_prefix_cache` (vLLM's): drop the cache, keep the counters.
    pub fn flush_prefix_cache(&self) -> Result<()> {
        self.post_ok("/reset_prefix_cache", "")
    }

    /// `POST /admin/reset`: forget cache and counters.
    pub fn reset(&self) -> Result<()> {
        self.post_ok("/admin/reset", "{}")
    }

    /// POST `body` to `path`; an error unless the answer is 2xx.
    fn post_ok(&self, path: &str, body: &str) -> Result<()> {
        let r = http::post(&self.agent, &self.url(path), &[], body)?;
        if !(200..300).contains(&r.status) {
            return Err(LabError(format!(
                "backend {}: POST {path} answered {}",
                self.name, r.status
            )));
        }
        Ok(())
    }

    pub fn log(&self) -> String {
        self.child.log()
    }

    /// Kill the process (a replica crash); the port stops accepting.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().is_none()
    }
}

/// Prefix-cache counters of one backend at one moment (tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheCounters {
    pub queries: f64,
    pub hits: f64,
}

impl CacheCounters {
    pub fn read(b: &Backend) -> Result<CacheCounters> {
        let m = b.metrics()?;
        let queries = prom::sum(&m, "vllm:prefix_cache_queries").ok_or_else(|| {
            LabError(format!(
                "backend {}: /metrics has no vllm:prefix_cache_queries",
                b.name
            ))
        })?;
        let hits = prom::sum(&m, "vllm:prefix_cache_hits").ok_or_else(|| {
            LabError(format!(
                "backend {}: /metrics has no vllm:prefix_cache_hits",
                b.name
            ))
        })?;
        Ok(CacheCounters { queries, hits })
    }

    pub fn delta(self, before: CacheCounters) -> CacheCounters {
        CacheCounters {
            queries: self.queries - before.queries,
            hits: self.hits - before.hits,
        }
    }
}
