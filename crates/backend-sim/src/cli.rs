//! Command-line flags of `prefix-router-backend` (clap, derive).
//!
//! The replica defaults (8B model on one H100; see
//! `prefix_router_replica::cost` for sources) apply unless overridden. Flags
//! take `--flag VALUE` or `--flag=VALUE`.

use clap::Parser;
use prefix_router_replica::CostModel;

/// Server configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Replica name, sent as `x-backend-name`.
    pub name: String,
    /// Served model name (`/v1/models`, responses, `model_name` label).
    pub model: String,
    /// Replica model parameters (simulated time).
    pub cost: CostModel,
    /// Multiplies every simulated duration (0.1 = ten times faster).
    pub time_scale: f64,
    /// Longest prompt + output accepted, tokens (like vLLM `--max-model-len`).
    pub max_model_len: u64,
    /// Answer generation requests at once with a fixed tiny completion,
    /// bypassing the replica model (for measuring proxy overhead only).
    pub instant: bool,
    /// Streamed responses send their head as soon as the request is taken,
    /// without load headers, as vLLM and SGLang do (their OpenAI servers
    /// return the SSE response before the first token, and vLLM attaches
    /// ORCA only to non-streamed responses). Off: the head comes with the
    /// first token and carries the load then.
    pub early_stream_head: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8000".to_string(),
            name: "backend".to_string(),
            model: "sim-model".to_string(),
            cost: CostModel::default(),
            time_scale: 1.0,
            max_model_len: 131_072,
            instant: false,
            early_stream_head: false,
        }
    }
}

const ABOUT: &str =
    "prefix-router-backend: OpenAI-compatible model-server simulator (vLLM stand-in)";

const AFTER: &str = "\
Endpoints:
  POST /v1/chat/completions, POST /v1/completions   (\"stream\": true for SSE)
  GET /v1/models, GET /health, GET /metrics (Prometheus, vLLM metric names)
  POST /admin/queue {\"extra_waiting\": N, \"extra_running\": M}
                          add N to the reported waiting count, M to the reported
                          running count (either or both)
  POST /admin/reset       clear the prefix cache and all counters
  POST /reset_prefix_cache
                          clear the prefix cache, keep the counters (as vLLM)

Response headers:
  x-backend-name, x-cached-tokens, x-queue-depth; endpoint-load-metrics (ORCA) when
  the request has endpoint-load-metrics-format: TEXT or JSON";

fn nonneg(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err("must be a finite number >= 0".to_string()),
    }
}

fn positive(v: &str) -> Result<f64, String> {
    match nonneg(v) {
        Ok(x) if x > 0.0 => Ok(x),
        _ => Err("must be a finite number > 0".to_string()),
    }
}

fn at_least_one(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number >= 1".to_string()),
    }
}

/// The command line.
#[derive(Debug, Clone, Parser)]
#[command(name = "prefix-router-backend", version, about = ABOUT, after_help = AFTER)]
pub struct Args {
    /// Listen address; port 0 picks a free port (the bound address is printed
    /// on stdout)
    #[arg(long, value_name = "ADDR", default_value_t = Config::default().listen)]
    pub listen: String,
    /// Replica name, sent in every response as x-backend-name
    #[arg(long, value_name = "NAME", default_value_t = Config::default().name)]
    pub name: String,
    /// Served model name
    #[arg(long, value_name = "NAME", default_value_t = Config::default().model)]
    pub model: String,
    /// Max requests in the running batch
    #[arg(long, value_name = "N", default_value_t = CostModel::default().max_running,
          value_parser = at_least_one)]
    pub max_running: usize,
    /// KV-cache capacity in tokens
    #[arg(long, value_name = "N", default_value_t = CostModel::default().cache_capacity_tokens)]
    pub cache_tokens: u64,
    /// Tokens per KV block
    #[arg(long, value_name = "N", default_value_t = CostModel::default().block_tokens,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub block_tokens: u32,
    /// Prefill throughput for uncached tokens
    #[arg(long, value_name = "X", default_value_t = CostModel::default().prefill_tokens_per_s,
          value_parser = positive)]
    pub prefill_tokens_per_s: f64,
    /// Fixed time per prefill, ms
    #[arg(long, value_name = "X", default_value_t = CostModel::default().prefill_overhead_s * 1000.0,
          value_parser = nonneg)]
    pub prefill_overhead_ms: f64,
    /// Decode step time, ms per output token
    #[arg(long, value_name = "X", default_value_t = CostModel::default().decode_step_s * 1000.0,
          value_parser = nonneg)]
    pub decode_ms_per_token: f64,
    /// Extra decode step time per decoding sequence, ms
    #[arg(long, value_name = "X", default_value_t = CostModel::default().decode_step_per_seq_s * 1000.0,
          value_parser = nonneg)]
    pub decode_ms_per_seq: f64,
    /// Quadratic prefill attention term, 0 = off
    #[arg(long, value_name = "X", default_value_t = CostModel::default().attention_coeff,
          value_parser = nonneg)]
    pub attention_coeff: f64,
    /// Max prompt + output tokens per request
    #[arg(long, value_name = "N", default_value_t = Config::default().max_model_len)]
    pub max_model_len: u64,
    /// Multiply all simulated durations (0.1 = 10x faster)
    #[arg(long, value_name = "X", default_value_t = Config::default().time_scale,
          value_parser = positive)]
    pub time_scale: f64,
    /// Answer generations at once with a fixed reply, bypassing the replica
    /// model (proxy overhead measurements only)
    #[arg(long)]
    pub instant: bool,
    /// Streamed responses: send the head at once, with no load headers (no
    /// ORCA, x-queue-depth or x-cached-tokens), as vLLM and SGLang do;
    /// default: the head comes with the first token and carries the load
    #[arg(long)]
    pub early_stream_head: bool,
}

impl Args {
    /// The server configuration these flags ask for.
    pub fn config(&self) -> Config {
        let cost = CostModel {
            max_running: self.max_running,
            cache_capacity_tokens: self.cache_tokens,
            block_tokens: self.block_tokens,
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            prefill_overhead_s: self.prefill_overhead_ms / 1000.0,
            decode_step_s: self.decode_ms_per_token / 1000.0,
            decode_step_per_seq_s: self.decode_ms_per_seq / 1000.0,
            attention_coeff: self.attention_coeff,
            ..CostModel::default()
        };
        Config {
            listen: self.listen.clone(),
            name: self.name.clone(),
            model: self.model.clone(),
            cost,
            time_scale: self.time_scale,
            max_model_len: self.max_model_len,
            instant: self.instant,
            early_stream_head: self.early_stream_head,
        }
    }
}

/// Parse the arguments (without the program name) into a configuration;
/// `--help` and `--version` come back as clap's errors of those kinds (print
/// them with [`clap::Error::exit`]).
pub fn parse<I, S>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let argv = std::iter::once(std::ffi::OsString::from("prefix-router-backend"))
        .chain(args.into_iter().map(Into::into));
    Args::try_parse_from(argv).map(|a| a.config())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn run(args: &[&str]) -> Config {
        parse(args.iter().copied()).unwrap()
    }

    #[test]
    fn parses_flags() {
        let c = run(&[
            "--listen",
            "127.0.0.1:0",
            "--name=r1",
            "--model",
            "m",
            "--max-running",
            "8",
            "--cache-tokens",
            "8192",
            "--prefill-tokens-per-s",
            "20000",
            "--decode-ms-per-token",
            "10",
            "--time-scale",
            "0.2",
            "--block-tokens",
            "32",
            "--prefill-overhead-ms",
            "3",
            "--decode-ms-per-seq",
            "0.5",
            "--attention-coeff",
            "0.001",
            "--max-model-len",
            "4096",
            "--instant",
        ]);
        assert_eq!(c.listen, "127.0.0.1:0");
        assert_eq!(c.name, "r1");
        assert_eq!(c.model, "m");
        assert_eq!(c.cost.max_running, 8);
        assert_eq!(c.cost.cache_capacity_tokens, 8192);
        assert_eq!(c.cost.prefill_tokens_per_s, 20000.0);
        assert!((c.cost.decode_step_s - 0.01).abs() < 1e-12);
        assert!((c.cost.prefill_overhead_s - 0.003).abs() < 1e-12);
        assert!((c.cost.decode_step_per_seq_s - 0.0005).abs() < 1e-12);
        assert_eq!(c.cost.attention_coeff, 0.001);
        assert_eq!(c.cost.block_tokens, 32);
        assert_eq!(c.max_model_len, 4096);
        assert_eq!(c.time_scale, 0.2);
        assert!(c.instant);
    }

    #[test]
    fn defaults_are_the_config_and_cost_model_defaults() {
        let c = run(&[]);
        let d = Config::default();
        assert_eq!(c.listen, d.listen);
        assert_eq!(c.name, d.name);
        assert_eq!(c.model, "sim-model");
        assert_eq!(c.time_scale, 1.0);
        assert_eq!(c.max_model_len, d.max_model_len);
        assert!(!c.instant);
        let (a, b) = (c.cost, CostModel::default());
        assert_eq!(a.max_running, b.max_running);
        assert_eq!(a.cache_capacity_tokens, b.cache_capacity_tokens);
        assert_eq!(a.block_tokens, b.block_tokens);
        assert_eq!(a.prefill_tokens_per_s, b.prefill_tokens_per_s);
        assert!((a.prefill_overhead_s - b.prefill_overhead_s).abs() < 1e-15);
        assert!((a.decode_step_s - b.decode_step_s).abs() < 1e-15);
        assert!((a.decode_step_per_seq_s - b.decode_step_per_seq_s).abs() < 1e-15);
        assert_eq!(a.attention_coeff, b.attention_coeff);
    }

    #[test]
    fn rejects_bad_flags() {
        for bad in [
            &["--time-scale", "0"][..],
            &["--time-scale", "x"],
            &["--max-running", "0"],
            &["--max-running", "-1"],
            &["--block-tokens", "0"],
            &["--bogus"],
            &["--listen"],
            &["--decode-ms-per-token", "NaN"],
            &["--prefill-tokens-per-s", "0"],
            &["--attention-coeff", "-1"],
        ] {
            assert!(parse(bad.iter().copied()).is_err(), "{bad:?}");
        }
        let help = parse(["--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(help.to_string().contains("--time-scale"));
        Args::command().debug_assert();
    }
}
