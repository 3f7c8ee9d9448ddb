//! Azure LLM inference traces (Azure/AzurePublicDataset, Splitwise ISCA'24):
//! CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps like
//! `2023-11-16 18:15:46.6805900`. Arrival times and lengths only, no prefix
//! information: every prompt is unique text, so prefix-aware routing can
//! only lose (a useful control).

use super::{unique_prompt, Kind, Request, Session, Workload, WorkloadError};
use crate::rng::seed2;

/// Seconds since 1970 of `YYYY-MM-DD HH:MM:SS[.fff]` (UTC, proleptic
/// Gregorian).
pub fn parse_datetime(s: &str) -> Option<f64> {
    let s = s.trim().trim_matches('"');
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    let mut t = time.trim_end_matches('Z').split(':');
    let hh: f64 = t.next()?.parse().ok()?;
    let mm: f64 = t.next()?.parse().ok()?;
    let ss: f64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + hh * 3600.0 + mm * 60.0 + ss)
}

/// Parse the CSV.
pub fn parse(
    bytes: &[u8],
    name: &str,
    limit: usize,
    seed: u64,
    block_tokens: u32,
) -> Result<Workload, WorkloadError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| WorkloadError::new(format!("not UTF-8: {e}")))?;
    let mut rows: Vec<(f64, u64, u64)> = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        if l.trim().is_empty() || (line == 1 && l.contains("ContextTokens")) {
            continue;
        }
        let mut f = l.split(',');
        let (Some(ts), Some(ctx), Some(gen)) = (f.next(), f.next(), f.next()) else {
            return Err(WorkloadError::at(
                line,
                "expected TIMESTAMP,ContextTokens,GeneratedTokens",
            ));
        };
        let t = parse_datetime(ts)
            .ok_or_else(|| WorkloadError::at(line, format!("bad timestamp {ts:?}")))?;
        let ctx: u64 = ctx
            .trim()
            .parse()
            .map_err(|_| WorkloadError::at(line, format!("bad ContextTokens {ctx:?}")))?;
        let gen: u64 = gen
            .trim()
            .parse()
            .map_err(|_| WorkloadError::at(line, format!("bad GeneratedTokens {gen:?}")))?;
        rows.push((t, ctx.max(1), gen.max(1)));
        if limit > 0 && rows.len() >= limit {
            break;
        }
    }
    if rows.is_empty() {
        return Err(WorkloadError::new("the trace has no requests"));
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let t0 = rows.first().map(|r| r.0).unwrap_or(0.0);
    let mut requests = Vec::with_capacity(rows.len());
    let mut sessions = Vec::with_capacity(rows.len());
    for (i, (t, ctx, gen)) in rows.into_iter().enumerate() {
        let key = seed2(seed ^ 0x0061_7a75_7265, i as u64);
        requests.push(Request {
            kind: Kind::Unique { tokens: ctx, key },
            output_tokens: gen,
            prompt: unique_prompt(ctx, key, block_tokens),
            remember: None,
            session: i as u32,
            turn: 0,
        });
        sessions.push(Session {
            start: t - t0,
            requests: vec![i as u32],
            think: vec![0.0],
        });
    }
    Ok(Workload::new(
        format!("azure:{name}"),
        seed,
        block_tokens,
        requests,
        sessions,
        Vec::new(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime() {
        let a = parse_datetime("2023-11-16 18:15:46.6805900").unwrap_or(0.0);
        let b = parse_datetime("2023-11-16 18:15:50.9951690").unwrap_or(0.0);
        assert!((b - a - 4.314579).abs() < 1e-6);
        assert_eq!(parse_datetime("1970-01-01 00:00:00"), Some(0.0));
        assert_eq!(parse_datetime("1970-01-02 00:00:01"), Some(86_401.0));
        assert!(parse_datetime("garbage").is_none());
    }
}
