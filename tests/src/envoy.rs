//! Envoy: render a config from the committed templates (envoy/*.yaml) and run it.
//!
//! The committed configs are the reference; the harness only rewrites the parts tagged with
//! `# lab:` comments:
//! * a line tagged `# lab:admin-port` / `# lab:listener-port`: its `port_value`,
//! * a line tagged `# lab:wasm-path`: its `filename` (absolute path of the .wasm),
//! * the lines between `# lab:endpoints-begin` and `# lab:endpoints-end`: one endpoint per backend,
//! * the lines between `# lab:filter-config-begin` and `# lab:filter-config-end`: the filter's
//!   `configuration` (a `google.protobuf.StringValue` holding the filter JSON).
//! * a line tagged `# lab:admin-cluster-port`: the admin port (cluster `envoy_admin`, for the
//!   filter's `membership`), if the template has one;
//! * with [`EnvoyOptions::eds`]: the line tagged `# lab:llm-discovery` becomes EDS from a watched
//!   file (`path_config_source`, plus an active health check of `/health` if asked) and the
//!   `lab:llm-static` region (the static `load_assignment`) goes; [`Envoy::set_eds`] rewrites the
//!   file under the running Envoy.

use crate::process::{free_ports, port_accepts, wait_until, ChildGuard};
use crate::{http, paths, prom, Backend, LabError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Which committed config to use as the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyMode {
    /// `envoy/envoy.yaml`: header strip + prefix-router wasm filter + override_host LB.
    PrefixRouter,
    /// `envoy/envoy-round-robin.yaml`: no filter, plain round robin.
    RoundRobin,
}

impl EnvoyMode {
    pub fn template_path(self) -> PathBuf {
        let name = match self {
            EnvoyMode::PrefixRouter => "envoy.yaml",
            EnvoyMode::RoundRobin => "envoy-round-robin.yaml",
        };
        paths::repo_root().join("envoy").join(name)
    }

    pub fn label(self) -> &'static str {
        match self {
            EnvoyMode::PrefixRouter => "prefix-router",
            EnvoyMode::RoundRobin => "round-robin",
        }
    }
}

/// The filter JSON to put into the rendered config (ignored in [`EnvoyMode::RoundRobin`]).
#[derive(Debug, Clone, Default)]
pub enum FilterConfig {
    /// The JSON of the committed envoy.yaml, with `hosts` replaced by the lab's backends.
    #[default]
    Default,
    /// [`FilterConfig::Default`], then deep-merged with this object (objects merge key by key,
    /// anything else replaces). E.g. `{"hosts": []}` or `{"load": {"report_ttl_ms": 1000}}`.
    Patched(Value),
    /// Exactly this text (may be invalid on purpose).
    Raw(String),
    /// This text, a space, then the first backend's `ip:port` (the testbed's
    /// `skeleton` filter steers every request there).
    RawFirstHost(String),
}

#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    pub mode: EnvoyMode,
    pub filter: FilterConfig,
    /// Envoy worker threads (`--concurrency`).
    pub concurrency: u32,
    /// `--log-level`.
    pub log_level: String,
    /// How long to wait for admin `/ready` = LIVE and the listener.
    pub ready_timeout: Duration,
    /// Load this .wasm instead of prefix_router.wasm (e.g. the testbed filter).
    pub wasm: Option<PathBuf>,
    /// Listen on this port (default: a free one).
    pub listener_port: Option<u16>,
    /// `ip:port` of the peer Envoys (cluster `prefix_router_peers`, for index gossip);
    /// empty: the template's.
    pub peers: Vec<String>,
    /// The wasm filter's `failure_policy` (e.g. `FAIL_RELOAD`); `None`: the template's.
    pub failure_policy: Option<String>,
    /// Cluster `llm` from EDS in a watched file instead of the static endpoints.
    pub eds: Option<EdsOptions>,
}

/// Cluster `llm` by EDS from a file the lab rewrites ([`Envoy::set_eds`]).
#[derive(Debug, Clone, Default)]
pub struct EdsOptions {
    /// The endpoints at start (`ip:port`); `None`: every backend.
    pub initial: Option<Vec<String>>,
    /// Envoy actively health-checks `GET /health` every 250 ms (one failure marks a host
    /// unhealthy, one success healthy again).
    pub health_check: bool,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            mode: EnvoyMode::PrefixRouter,
            filter: FilterConfig::Default,
            concurrency: 2,
            log_level: "info".to_string(),
            ready_timeout: Duration::from_secs(30),
            wasm: None,
            listener_port: None,
            peers: Vec::new(),
            failure_policy: None,
            eds: None,
        }
    }
}

const TAG_ADMIN_PORT: &str = "# lab:admin-port";
const TAG_LISTENER_PORT: &str = "# lab:listener-port";
const TAG_WASM_PATH: &str = "# lab:wasm-path";
const TAG_FAILURE_POLICY: &str = "# lab:failure-policy";
const TAG_ENDPOINTS: &str = "endpoints";
const TAG_FILTER: &str = "filter-config";
const TAG_PEERS: &str = "peers";
const TAG_ADMIN_CLUSTER_PORT: &str = "# lab:admin-cluster-port";
const TAG_LLM_DISCOVERY: &str = "# lab:llm-discovery";
const TAG_LLM_STATIC: &str = "llm-static";

/// The EDS file's text: cluster `llm` with these `ip:port` endpoints, each with an EDS health
/// status (`None`: unset).
pub fn eds_yaml(version: u64, endpoints: &[(String, Option<&str>)]) -> Result<String> {
    let mut out = format!(
        "version_info: \"{version}\"\nresources:\n- \"@type\": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n  cluster_name: llm\n  endpoints:\n  - lb_endpoints:\n"
    );
    for (ep, health) in endpoints {
        let (host, port) = ep
            .rsplit_once(':')
            .ok_or_else(|| LabError(format!("endpoint {ep} is not ip:port")))?;
        out.push_str(&format!(
            "    - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}\n"
        ));
        if let Some(h) = health {
            out.push_str(&format!("      health_status: {h}\n"));
        }
    }
    Ok(out)
}

/// Everything that differs between the committed config and a rendered one.
#[derive(Debug, Clone)]
pub struct RenderParams<'a> {
    pub admin_port: u16,
    pub listener_port: u16,
    /// `ip:port` of each cluster endpoint.
    pub endpoints: &'a [String],
    pub wasm_path: Option<&'a Path>,
    /// Filter JSON text (only used when the template has a filter-config region).
    pub filter_json: Option<&'a str>,
    /// `ip:port` of each peer Envoy (the `lab:peers` region, if any; empty: unchanged).
    pub peers: &'a [String],
    /// The wasm filter's failure policy (the line tagged `lab:failure-policy`; `None`:
    /// unchanged).
    pub failure_policy: Option<&'a str>,
    /// Cluster `llm` by EDS from this file, with an active health check if `true`.
    pub eds: Option<(&'a Path, bool)>,
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Replaces the `port_value: N` on the line carrying `tag`.
fn replace_port(lines: &mut [String], tag: &str, port: u16) -> Result<()> {
    let line = lines
        .iter_mut()
        .find(|l| l.contains(tag))
        .ok_or_else(|| LabError(format!("template has no line tagged `{tag}`")))?;
    let start = line
        .find("port_value:")
        .ok_or_else(|| LabError(format!("line tagged `{tag}` has no port_value: {line}")))?;
    let end = line[start..]
        .find('#')
        .map(|i| start + i)
        .unwrap_or(line.len());
    *line = format!(
        "{}port_value: {port} {}",
        &line[..start],
        line[end..].trim_end()
    );
    Ok(())
}

/// Returns (begin, end) line indices of the `# lab:<tag>-begin` / `# lab:<tag>-end` region.
fn region(lines: &[String], tag: &str) -> Option<(usize, usize)> {
    let b = format!("# lab:{tag}-begin");
    let e = format!("# lab:{tag}-end");
    let begin = lines.iter().position(|l| l.trim() == b)?;
    let end = lines[begin..].iter().position(|l| l.trim() == e)? + begin;
    Some((begin, end))
}

/// `- endpoint:` lines for `eps`, indented like the region's first line.
fn endpoint_lines(first: &str, eps: &[String]) -> Result<Vec<String>> {
    let pad = " ".repeat(indent_of(first));
    let mut out = Vec::new();
    for ep in eps {
        let (host, port) = ep
            .rsplit_once(':')
            .ok_or_else(|| LabError(format!("endpoint {ep} is not ip:port")))?;
        out.push(format!("{pad}- endpoint:"));
        out.push(format!("{pad}    address:"));
        out.push(format!(
            "{pad}      socket_address: {{address: {host}, port_value: {port}}}"
        ));
    }
    Ok(out)
}

/// Renders a committed template with new ports, endpoints, .wasm path and filter JSON.
pub fn render(template: &str, p: &RenderParams<'_>) -> Result<String> {
    let mut lines: Vec<String> = template.lines().map(str::to_string).collect();
    replace_port(&mut lines, TAG_ADMIN_PORT, p.admin_port)?;
    replace_port(&mut lines, TAG_LISTENER_PORT, p.listener_port)?;
    if lines.iter().any(|l| l.contains(TAG_ADMIN_CLUSTER_PORT)) {
        replace_port(&mut lines, TAG_ADMIN_CLUSTER_PORT, p.admin_port)?;
    }

    if let Some(wasm) = p.wasm_path {
        if let Some(line) = lines.iter_mut().find(|l| l.contains(TAG_WASM_PATH)) {
            let start = line
                .find("filename:")
                .ok_or_else(|| LabError(format!("wasm-path line has no filename: {line}")))?;
            *line = format!(
                "{}filename: \"{}\" {TAG_WASM_PATH}",
                &line[..start],
                wasm.display()
            );
        }
    }

    if let Some(policy) = p.failure_policy {
        let line = lines
            .iter_mut()
            .find(|l| l.contains(TAG_FAILURE_POLICY))
            .ok_or_else(|| LabError("template has no lab:failure-policy line".to_string()))?;
        let start = line
            .find("failure_policy:")
            .ok_or_else(|| LabError(format!("failure-policy line has no key: {line}")))?;
        *line = format!(
            "{}failure_policy: {policy} {TAG_FAILURE_POLICY}",
            &line[..start]
        );
    }

    let (eb, ee) = region(&lines, TAG_ENDPOINTS)
        .ok_or_else(|| LabError("template has no lab:endpoints region".to_string()))?;
    let eps = endpoint_lines(&lines[eb], p.endpoints)?;
    lines.splice(eb + 1..ee, eps);
    if let (false, Some((pb, pe))) = (p.peers.is_empty(), region(&lines, TAG_PEERS)) {
        let eps = endpoint_lines(&lines[pb], p.peers)?;
        lines.splice(pb + 1..pe, eps);
    }

    if let Some((file, hc)) = p.eds {
        let (sb, se) = region(&lines, TAG_LLM_STATIC)
            .ok_or_else(|| LabError("template has no lab:llm-static region".to_string()))?;
        lines.drain(sb..=se);
        let i = lines
            .iter()
            .position(|l| l.contains(TAG_LLM_DISCOVERY))
            .ok_or_else(|| LabError("template has no lab:llm-discovery line".to_string()))?;
        let pad = " ".repeat(indent_of(&lines[i]));
        let mut block = vec![
            format!("{pad}type: EDS"),
            format!("{pad}eds_cluster_config:"),
            format!("{pad}  eds_config:"),
            format!("{pad}    resource_api_version: V3"),
            format!(
                "{pad}    path_config_source: {{path: \"{}\"}}",
                file.display()
            ),
        ];
        if hc {
            block.extend([
                format!("{pad}health_checks:"),
                format!("{pad}- timeout: 1s"),
                format!("{pad}  interval: 0.25s"),
                // Without traffic Envoy checks every 60 s by default.
                format!("{pad}  no_traffic_interval: 0.25s"),
                format!("{pad}  unhealthy_threshold: 1"),
                format!("{pad}  healthy_threshold: 1"),
                format!("{pad}  http_health_check: {{path: /health}}"),
            ]);
        }
        lines.splice(i..=i, block);
    }

    if let (Some(json), Some((fb, fe))) = (p.filter_json, region(&lines, TAG_FILTER)) {
        let pad = " ".repeat(indent_of(&lines[fb]));
        let mut block = vec![
            format!("{pad}configuration:"),
            format!("{pad}  \"@type\": type.googleapis.com/google.protobuf.StringValue"),
            // `|-`: no trailing newline, so the plugin sees exactly the given text.
            format!("{pad}  value: |-"),
        ];
        for l in json.lines() {
            block.push(format!("{pad}    {l}"));
        }
        lines.splice(fb + 1..fe, block);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}

/// The filter JSON embedded in a template's `lab:filter-config` region.
pub fn template_filter_json(template: &str) -> Result<Value> {
    let lines: Vec<String> = template.lines().map(str::to_string).collect();
    let (fb, fe) = region(&lines, TAG_FILTER)
        .ok_or_else(|| LabError("template has no lab:filter-config region".to_string()))?;
    let value_line = lines[fb..fe]
        .iter()
        .position(|l| matches!(l.trim(), "value: |" | "value: |-"))
        .ok_or_else(|| LabError("filter-config region has no `value: |` block".to_string()))?
        + fb;
    let text: Vec<&str> = lines[value_line + 1..fe].iter().map(|l| l.trim()).collect();
    Ok(serde_json::from_str(&text.join("\n"))?)
}

/// Deep merge: objects merge key by key; anything else in `patch` replaces.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// The `hosts` array for a set of backends.
pub fn hosts_json(backends: &[Backend]) -> Value {
    Value::Array(
        backends
            .iter()
            .map(|b| {
                let mut m = Map::new();
                m.insert("address".into(), Value::String(b.address()));
                m.insert("name".into(), Value::String(b.name.clone()));
                m.insert("weight".into(), Value::from(1));
                Value::Object(m)
            })
            .collect(),
    )
}

/// The filter JSON text that `cfg` stands for, given the template and the backends.
pub fn filter_json_text(
    template: &str,
    cfg: &FilterConfig,
    backends: &[Backend],
) -> Result<String> {
    let patched = |patch: Option<&Value>| -> Result<String> {
        let mut v = template_filter_json(template)?;
        if let Value::Object(m) = &mut v {
            m.insert("hosts".into(), hosts_json(backends));
        }
        if let Some(p) = patch {
            merge(&mut v, p);
        }
        Ok(serde_json::to_string_pretty(&v)?)
    };
    match cfg {
        FilterConfig::Default => patched(None),
        FilterConfig::Patched(p) => patched(Some(p)),
        FilterConfig::Raw(s) => Ok(s.clone()),
        FilterConfig::RawFirstHost(s) => Ok(format!(
            "{s} {}",
            backends.first().map(Backend::address).unwrap_or_default()
        )),
    }
}

/// A running Envoy.
#[derive(Debug)]
pub struct Envoy {
    pub mode: EnvoyMode,
    pub admin_port: u16,
    pub listener_port: u16,
    /// The EDS file of cluster `llm` ([`EnvoyOptions::eds`]).
    pub eds_path: Option<PathBuf>,
    eds_version: std::cell::Cell<u64>,
    pub config_path: PathBuf,
    child: ChildGuard,
    agent: ureq::Agent,
}

impl Envoy {
    /// Renders the config for `backends` into `dir` and spawns Envoy, without waiting.
    pub fn spawn(backends: &[Backend], opts: &EnvoyOptions, dir: &Path) -> Result<Envoy> {
        let bin = paths::envoy_bin()?;
        let template_path = opts.mode.template_path();
        let template = std::fs::read_to_string(&template_path).map_err(|e| {
            LabError(format!(
                "cannot read Envoy template {}: {e}",
                template_path.display()
            ))
        })?;
        let wasm = match opts.mode {
            EnvoyMode::PrefixRouter => match &opts.wasm {
                Some(w) => Some(w.clone()),
                None => Some(paths::filter_wasm()?),
            },
            EnvoyMode::RoundRobin => None,
        };
        let filter_json = match opts.mode {
            EnvoyMode::PrefixRouter => Some(filter_json_text(&template, &opts.filter, backends)?),
            EnvoyMode::RoundRobin => None,
        };
        // The listener port may be preset (peers must know it before it starts): the admin
        // port must then differ from it and from the peers' listeners.
        let reserved: Vec<u16> = opts
            .peers
            .iter()
            .filter_map(|p| p.rsplit_once(':').and_then(|(_, port)| port.parse().ok()))
            .chain(opts.listener_port)
            .collect();
        let mut ports = free_ports(2)?;
        for _ in 0..20 {
            if !reserved.contains(&ports[0]) && !reserved.contains(&ports[1]) {
                break;
            }
            ports = free_ports(2)?;
        }
        if let Some(p) = opts.listener_port {
            ports[1] = p;
        }
        let endpoints: Vec<String> = backends.iter().map(Backend::address).collect();
        let eds_path = match &opts.eds {
            Some(e) => {
                let path = dir.join(format!("eds-{}.yaml", ports[1]));
                let initial = e.initial.clone().unwrap_or_else(|| endpoints.clone());
                let eps: Vec<(String, Option<&str>)> =
                    initial.into_iter().map(|a| (a, None)).collect();
                std::fs::write(&path, eds_yaml(1, &eps)?)?;
                Some(path)
            }
            None => None,
        };
        let rendered = render(
            &template,
            &RenderParams {
                admin_port: ports[0],
                listener_port: ports[1],
                endpoints: &endpoints,
                wasm_path: wasm.as_deref(),
                filter_json: filter_json.as_deref(),
                peers: &opts.peers,
                failure_policy: opts.failure_policy.as_deref(),
                eds: eds_path
                    .as_deref()
                    .zip(opts.eds.as_ref().map(|e| e.health_check)),
            },
        )?;
        let config_path = dir.join(format!("envoy-{}-{}.yaml", opts.mode.label(), ports[1]));
        std::fs::write(&config_path, rendered)?;
        let mut cmd = Command::new(&bin);
        cmd.current_dir(paths::repo_root())
            .arg("-c")
            .arg(&config_path)
            .arg("--disable-hot-restart")
            .arg("--concurrency")
            .arg(opts.concurrency.to_string())
            .arg("--log-level")
            .arg(&opts.log_level);
        let log = dir.join(format!("envoy-{}-{}.log", opts.mode.label(), ports[1]));
        let child = ChildGuard::spawn("envoy", cmd, &log)?;
        Ok(Envoy {
            mode: opts.mode,
            admin_port: ports[0],
            listener_port: ports[1],
            eds_path,
            eds_version: std::cell::Cell::new(1),
            config_path,
            child,
            agent: http::agent(Duration::from_secs(10)),
        })
    }

    /// Waits until admin `GET /ready` answers `LIVE` and the listener accepts connections.
    /// Fails early, with the log, if Envoy exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let ready_url = self.admin_url("/ready");
        let agent = self.agent.clone();
        let listener = self.listener_port;
        let ok = wait_until(timeout, || {
            if let Some(status) = self.child.try_wait() {
                return Err(LabError(format!(
                    "Envoy exited during startup ({status}); config {}, log {}:\n{}",
                    self.config_path.display(),
                    self.child.log_path().display(),
                    self.child.log_tail(6000)
                )));
            }
            let live = matches!(http::get(&agent, &ready_url),
                                Ok(r) if r.status == 200 && r.body.trim() == "LIVE");
            Ok(live && port_accepts(listener))
        })?;
        if ok {
            Ok(())
        } else {
            Err(LabError(format!(
                "Envoy not ready (admin /ready LIVE + listener {listener}) within {timeout:?}; \
                 config {}, log:\n{}",
                self.config_path.display(),
                self.child.log_tail(6000)
            )))
        }
    }

    /// Spawns and waits until ready; retries with new ports if one was taken meanwhile.
    pub fn start(backends: &[Backend], opts: &EnvoyOptions, dir: &Path) -> Result<Envoy> {
        let mut attempt = 0;
        loop {
            let mut e = Envoy::spawn(backends, opts, dir)?;
            match e.wait_ready(opts.ready_timeout) {
                Ok(()) => return Ok(e),
                Err(err) => {
                    attempt += 1;
                    let port_clash = e.log().contains("ddress already in use");
                    if !port_clash || attempt >= 3 {
                        return Err(err);
                    }
                }
            }
        }
    }

    /// Rewrites cluster `llm`'s EDS file (atomically: a new file renamed over it, which is
    /// what Envoy's file watch sees) with these endpoints and EDS health statuses.
    pub fn set_eds(&self, endpoints: &[(String, Option<&str>)]) -> Result<()> {
        let path = self
            .eds_path
            .as_ref()
            .ok_or_else(|| LabError("this Envoy does not read EDS from a file".to_string()))?;
        let v = self.eds_version.get() + 1;
        self.eds_version.set(v);
        let tmp = path.with_extension(format!("tmp{v}"));
        std::fs::write(&tmp, eds_yaml(v, endpoints)?)?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    /// Cluster `llm`'s hosts as Envoy's admin lists them: `(ip:port, healthy)`.
    pub fn cluster_hosts(&self, cluster: &str) -> Result<Vec<(String, bool)>> {
        let r = http::get(&self.agent, &self.admin_url("/clusters?format=json"))?;
        let v: Value = serde_json::from_str(&r.body)?;
        let mut out = Vec::new();
        for c in v["cluster_statuses"].as_array().into_iter().flatten() {
            if c["name"] != cluster {
                continue;
            }
            for h in c["host_statuses"].as_array().into_iter().flatten() {
                let sa = &h["address"]["socket_address"];
                let addr = format!(
                    "{}:{}",
                    sa["address"].as_str().unwrap_or_default(),
                    sa["port_value"].as_u64().unwrap_or_default()
                );
                let hs = &h["health_status"];
                let healthy = hs["failed_active_health_check"] != true
                    && matches!(hs["eds_health_status"].as_str(), None | Some("HEALTHY"));
                out.push((addr, healthy));
            }
        }
        Ok(out)
    }

    /// URL on the listener, e.g. `url("/v1/chat/completions")`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.listener_port)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    /// Admin `/stats/prometheus`, parsed.
    pub fn prometheus(&self) -> Result<Vec<prom::Sample>> {
        let r = http::get(&self.agent, &self.admin_url("/stats/prometheus"))?;
        if r.status != 200 {
            return Err(LabError(format!(
                "Envoy /stats/prometheus answered {}",
                r.status
            )));
        }
        Ok(prom::parse(&r.body))
    }

    /// Admin `/stats` (plain text, `name: value` lines), e.g. `wasmcustom.prefix_router...`.
    pub fn stats_text(&self) -> Result<String> {
        Ok(http::get(&self.agent, &self.admin_url("/stats"))?.body)
    }

    /// Envoy's stdout + stderr (its log and the access log) so far.
    pub fn log(&self) -> String {
        self.child.log()
    }

    pub fn log_path(&self) -> &Path {
        self.child.log_path()
    }

    /// Envoy's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// Stops (`SIGSTOP`) or resumes (`SIGCONT`) the Envoy process: a stand-in for a worker
    /// too busy to read its sockets for a while.
    pub fn pause(&self, stop: bool) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| LabError("Envoy is not running".to_string()))?;
        let sig = if stop { "-STOP" } else { "-CONT" };
        let st = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(LabError(format!("kill {sig} {pid}: {st}")))
        }
    }

    /// `Some(status)` if Envoy has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait()
    }

    pub fn stop(&mut self) {
        self.child.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(mode: EnvoyMode) -> String {
        std::fs::read_to_string(mode.template_path()).unwrap_or_default()
    }

    #[test]
    fn committed_templates_carry_the_lab_tags() {
        for mode in [EnvoyMode::PrefixRouter, EnvoyMode::RoundRobin] {
            let t = committed(mode);
            assert!(t.contains(TAG_ADMIN_PORT), "{mode:?}");
            assert!(t.contains(TAG_LISTENER_PORT), "{mode:?}");
            let lines: Vec<String> = t.lines().map(str::to_string).collect();
            assert!(region(&lines, TAG_ENDPOINTS).is_some(), "{mode:?}");
        }
        let t = committed(EnvoyMode::PrefixRouter);
        assert!(t.contains(TAG_WASM_PATH));
        let v = template_filter_json(&t).unwrap_or(Value::Null);
        assert_eq!(v["max_body_bytes"], 1048576);
        assert_eq!(v["destination_header"], "x-gateway-destination-endpoint");
        assert_eq!(v["hosts"].as_array().map(Vec::len), Some(4));
    }

    #[test]
    fn render_eds_replaces_the_static_endpoints() {
        let t = committed(EnvoyMode::PrefixRouter);
        let out = render(
            &t,
            &RenderParams {
                admin_port: 30001,
                listener_port: 30002,
                endpoints: &["127.0.0.1:31001".to_string()],
                wasm_path: None,
                filter_json: None,
                peers: &[],
                failure_policy: None,
                eds: Some((Path::new("/tmp/eds.yaml"), true)),
            },
        )
        .unwrap_or_default();
        assert!(out.contains("type: EDS"), "{out}");
        assert!(out.contains("path_config_source: {path: \"/tmp/eds.yaml\"}"));
        assert!(out.contains("http_health_check: {path: /health}"));
        assert!(!out.contains("port_value: 31001"));
        assert!(!out.contains("type: STATIC # lab:llm-discovery"));
        let y = eds_yaml(3, &[("127.0.0.1:1".into(), Some("UNHEALTHY"))]).unwrap_or_default();
        assert!(y.contains("version_info: \"3\"") && y.contains("health_status: UNHEALTHY"));
    }

    #[test]
    fn render_replaces_ports_endpoints_wasm_and_filter_json() {
        let t = committed(EnvoyMode::PrefixRouter);
        let eps = vec!["127.0.0.1:31001".to_string(), "127.0.0.1:31002".to_string()];
        let json = "{\n  \"hosts\": [{\"address\": \"127.0.0.1:31001\"}],\n  \"vnodes\": 7\n}";
        let out = render(
            &t,
            &RenderParams {
                admin_port: 30001,
                listener_port: 30002,
                endpoints: &eps,
                wasm_path: Some(Path::new("/abs/prefix_router.wasm")),
                filter_json: Some(json),
                peers: &["127.0.0.1:32001".to_string()],
                failure_policy: Some("FAIL_RELOAD"),
                eds: None,
            },
        )
        .unwrap_or_default();
        assert!(out.contains("port_value: 30001 # lab:admin-cluster-port"));
        assert!(out.contains("{address: 127.0.0.1, port_value: 32001}"));
        assert!(out.contains("failure_policy: FAIL_RELOAD # lab:failure-policy"));
        assert!(!out.contains("port_value: 10001"));
        assert!(out.contains("port_value: 30001 # lab:admin-port"));
        assert!(out.contains("port_value: 30002 # lab:listener-port"));
        assert!(out.contains("filename: \"/abs/prefix_router.wasm\""));
        assert!(out.contains("{address: 127.0.0.1, port_value: 31002}"));
        assert!(!out.contains("port_value: 18001"));
        assert!(!out.contains("port_value: 10000"));
        assert!(out.contains("\"vnodes\": 7"));
        assert!(!out.contains("\"vnodes\": 100"));
        // The rendered filter JSON reads back.
        let back = template_filter_json(&out).unwrap_or(Value::Null);
        assert_eq!(back["vnodes"], 7);
    }

    #[test]
    fn merge_is_deep() {
        let mut base = serde_json::json!({"a": 1, "load": {"x": 1, "y": 2}});
        merge(&mut base, &serde_json::json!({"load": {"y": 3}, "b": []}));
        assert_eq!(
            base,
            serde_json::json!({"a": 1, "load": {"x": 1, "y": 3}, "b": []})
        );
    }
}
