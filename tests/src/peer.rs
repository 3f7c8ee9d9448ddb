//! A real peer router in front of the lab's backends: SGLang's model gateway
//! (`sglang-router` from PyPI, pinned by `./build.sh peers`), so the demo can run the same
//! workload through it side by side with the filter.
//!
//! It is started as `python -m sglang_router.launch_router --policy P --worker-urls ...` on a
//! free loopback port and is ready once its `/workers` lists every backend as healthy (it
//! checks them with `GET /health`, which the backend simulator answers). Its Prometheus
//! exporter is moved to another free port so parallel labs do not collide.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{free_ports, wait_until, ChildGuard};
use crate::{http, paths, LabError, Result};

/// The policies `--sglang` accepts (sglang-router 0.3.2's `--policy` choices that need no
/// tokenizer or manual routing key).
pub const SGLANG_POLICIES: &[&str] = &["cache_aware", "round_robin", "power_of_two", "random"];

/// The Python that has `sglang_router`: `$SGLANG_ROUTER_PYTHON`, else
/// `<repo>/.venv-peers/bin/python`.
pub fn sglang_python() -> Result<PathBuf> {
    let var = "SGLANG_ROUTER_PYTHON";
    if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let p = paths::repo_root().join(".venv-peers/bin/python");
    if p.exists() {
        Ok(p)
    } else {
        Err(LabError(format!(
            "sglang-router not found: run `./build.sh peers` (installs sglang-router into \
             .venv-peers) or set ${var} to a Python that has it (tried {})",
            p.display()
        )))
    }
}

/// A running sglang-router; stopped on drop.
#[derive(Debug)]
pub struct SglangRouter {
    pub policy: String,
    port: u16,
    child: ChildGuard,
}

impl SglangRouter {
    /// Starts it with `policy` in front of `workers` (`ip:port` each) and waits until every
    /// worker is healthy in its view (at most 60 s).
    pub fn start(policy: &str, workers: &[String], dir: &Path) -> Result<SglangRouter> {
        if !SGLANG_POLICIES.contains(&policy) {
            return Err(LabError(format!(
                "sglang-router policy {policy:?}: expected one of {}",
                SGLANG_POLICIES.join(", ")
            )));
        }
        let python = sglang_python()?;
        let ports = free_ports(2)?;
        let (port, prom_port) = (ports[0], ports[1]);
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &prom_port.to_string()])
            .args(["--policy", policy])
            .args(["--log-level", "warn"])
            .arg("--worker-urls")
            .args(workers.iter().map(|w| format!("http://{w}")));
        let log = dir.join(format!("sglang-router-{policy}.log"));
        let mut child = ChildGuard::spawn(&format!("sglang-router ({policy})"), cmd, &log)?;
        let agent = http::agent(Duration::from_secs(2));
        let url = format!("http://127.0.0.1:{port}/workers");
        let ready = wait_until(Duration::from_secs(60), || {
            if let Some(status) = child.try_wait() {
                return Err(LabError(format!(
                    "sglang-router exited ({status}); log {}:\n{}",
                    log.display(),
                    child.log_tail(4000)
                )));
            }
            let Ok(r) = http::get(&agent, &url) else {
                return Ok(false);
            };
            let healthy = serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v.get("workers").and_then(|w| w.as_array()).cloned())
                .map(|ws| {
                    ws.iter()
                        .filter(|w| w.get("is_healthy").and_then(|h| h.as_bool()) == Some(true))
                        .count()
                })
                .unwrap_or(0);
            Ok(r.status == 200 && healthy == workers.len())
        })?;
        if !ready {
            return Err(LabError(format!(
                "sglang-router not ready with {} healthy workers after 60 s; log {}:\n{}",
                workers.len(),
                log.display(),
                child.log_tail(4000)
            )));
        }
        Ok(SglangRouter {
            policy: policy.to_string(),
            port,
            child,
        })
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Stops it now (also done on drop).
    pub fn stop(&mut self) {
        self.child.kill();
    }
}
