//! Small sync HTTP helpers on top of `ureq` (plain HTTP, loopback only).

use crate::Result;
use std::time::Duration;

/// An agent that returns 4xx/5xx responses as `Ok` (the lab wants to see them), with a
/// generous per-call timeout.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .timeout_connect(Some(Duration::from_secs(5)))
        .max_idle_connections_per_host(64)
        .build()
        .into()
}

/// A fully read response.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn backend(&self) -> Option<&str> {
        self.header("x-backend-name")
    }

    pub fn decision(&self) -> Option<&str> {
        self.header("x-prefix-router-decision")
    }
}

/// All response headers as (lowercase name, value) pairs.
pub fn response_headers<B>(resp: &ureq::http::Response<B>) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn finish(mut resp: ureq::http::Response<ureq::Body>) -> Result<Reply> {
    let status = resp.status().as_u16();
    let headers = response_headers(&resp);
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024 * 1024)
        .read_to_string()?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

pub fn get(agent: &ureq::Agent, url: &str) -> Result<Reply> {
    get_with(agent, url, &[])
}

/// GET with extra request headers.
pub fn get_with(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)]) -> Result<Reply> {
    let mut req = agent.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    finish(req.call()?)
}

/// POST raw bytes as `application/octet-stream`.
pub fn post_bytes(agent: &ureq::Agent, url: &str, body: &[u8]) -> Result<Reply> {
    post_raw(agent, url, "application/octet-stream", body)
}

/// POST raw bytes as `application/json` (bodies built as bytes).
pub fn post_json_bytes(agent: &ureq::Agent, url: &str, body: &[u8]) -> Result<Reply> {
    post_raw(agent, url, "application/json", body)
}

fn post_raw(agent: &ureq::Agent, url: &str, content_type: &str, body: &[u8]) -> Result<Reply> {
    finish(
        agent
            .post(url)
            .header("content-type", content_type)
            .send(body)?,
    )
}

/// POST `body` with the given extra headers (content-type defaults to application/json).
pub fn post(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)], body: &str) -> Result<Reply> {
    let mut req = agent.post(url);
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    finish(req.send(body)?)
}
