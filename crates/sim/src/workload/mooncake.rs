//! Mooncake JSONL traces (kvcache-ai/Mooncake `FAST25-release/traces`): one
//! object a line, `timestamp` (ms from start), `input_length` and
//! `output_length` (tokens), `hash_ids` (one id per 512-token block; equal ids
//! at equal positions mean an identical prefix through that block).
//!
//! Each request becomes a `/v1/completions` body whose prompt is the
//! concatenation of its blocks' bytes ([`crate::text::mooncake_text`]: 2048
//! deterministic bytes per id, the last block cut to the trace's length), so
//! a byte-level chunker sees exactly the sharing the trace records; the
//! replica's prompt is built from the ids directly
//! ([`prefix_router_replica::Prompt::from_block_ids`]), which gives the same
//! sharing at 16-token granularity.

use serde::Deserialize;

use super::{block_prompt, Kind, Request, Session, Workload, WorkloadError};

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// One parsed trace line.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Seconds from trace start.
    pub t: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub ids: Vec<u64>,
}

/// Parse one line (1-based `line` for the error).
pub fn parse_line(s: &str, line: usize) -> Result<Entry, WorkloadError> {
    let l: Line = serde_json::from_str(s).map_err(|e| {
        WorkloadError::at(
            line,
            format!("not a Mooncake trace line ({e}); expected {{\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"}}"),
        )
    })?;
    if !(l.timestamp.is_finite() && l.timestamp >= 0.0) {
        return Err(WorkloadError::at(
            line,
            format!("timestamp {} must be >= 0", l.timestamp),
        ));
    }
    if l.input_length == 0 {
        return Err(WorkloadError::at(line, "input_length must be > 0"));
    }
    if l.input_length > 10_000_000 {
        return Err(WorkloadError::at(
            line,
            format!(
                "input_length {} is implausible (> 10M tokens)",
                l.input_length
            ),
        ));
    }
    let need = l.input_length.div_ceil(512) as usize;
    if l.hash_ids.len() + 1 < need {
        return Err(WorkloadError::at(
            line,
            format!(
                "{} hash_ids cannot cover input_length {} (one id per 512 tokens: need {need})",
                l.hash_ids.len(),
                l.input_length
            ),
        ));
    }
    Ok(Entry {
        t: l.timestamp / 1000.0,
        input_tokens: l.input_length,
        output_tokens: l.output_length.max(1),
        ids: l.hash_ids,
    })
}

/// Parse a whole trace (blank lines skipped).
pub fn parse(
    bytes: &[u8],
    name: &str,
    limit: usize,
    seed: u64,
    block_tokens: u32,
) -> Result<Workload, WorkloadError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| WorkloadError::new(format!("not UTF-8: {e}")))?;
    let mut entries = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        entries.push(parse_line(l, i + 1)?);
        if limit > 0 && entries.len() >= limit {
            break;
        }
    }
    if entries.is_empty() {
        return Err(WorkloadError::new("the trace has no requests"));
    }
    // Stable sort by time (the published traces are already sorted).
    entries.sort_by(|a, b| a.t.total_cmp(&b.t));
    let t0 = entries.first().map(|e| e.t).unwrap_or(0.0);
    let mut requests = Vec::with_capacity(entries.len());
    let mut sessions = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        let prompt = block_prompt(e.input_tokens, &e.ids, block_tokens);
        requests.push(Request {
            kind: Kind::Blocks {
                tokens: e.input_tokens,
                ids: e.ids.into_boxed_slice(),
            },
            output_tokens: e.output_tokens,
            prompt,
            remember: None,
            session: i as u32,
            turn: 0,
        });
        sessions.push(Session {
            start: e.t - t0,
            requests: vec![i as u32],
            think: vec![0.0],
        });
    }
    Ok(Workload::new(
        format!("mooncake:{name}"),
        seed,
        block_tokens,
        requests,
        sessions,
        Vec::new(),
    ))
}
