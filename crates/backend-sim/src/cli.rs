//! Command-line flags of `prefix-router-backend`.
//!
//! The replica defaults (8B model on one H100; see
//! `prefix_router_replica::cost` for sources) apply unless overridden. Flags
//! take `--flag VALUE` or `--flag=VALUE`.

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
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Run(Box<Config>),
    Help,
    Version,
}

/// `--help` text.
pub fn help() -> String {
    let d = Config::default();
    let c = &d.cost;
    format!(
        "prefix-router-backend: OpenAI-compatible model-server simulator (vLLM stand-in)

USAGE:
    prefix-router-backend [FLAGS]

FLAGS:
    --listen ADDR                 listen address [default: {listen}]; port 0 picks a free
                                  port (the bound address is printed on stdout)
    --name NAME                   replica name, sent in every response as x-backend-name
                                  [default: {name}]
    --model NAME                  served model name [default: {model}]
    --max-running N               max requests in the running batch [default: {mr}]
    --cache-tokens N              KV-cache capacity in tokens [default: {cache}]
    --block-tokens N              tokens per KV block [default: {bt}]
    --prefill-tokens-per-s X      prefill throughput for uncached tokens [default: {pf}]
    --prefill-overhead-ms X       fixed time per prefill [default: {po}]
    --decode-ms-per-token X       decode step time, ms per output token [default: {dm}]
    --decode-ms-per-seq X         extra decode step time per decoding sequence [default: {ds}]
    --attention-coeff X           quadratic prefill attention term, 0 = off [default: {ac}]
    --max-model-len N             max prompt + output tokens per request [default: {mml}]
    --time-scale X                multiply all simulated durations (0.1 = 10x faster)
    --instant                     answer generations at once with a fixed reply, bypassing
                                  the replica model (proxy overhead measurements only)
                                  [default: {ts}]
    -h, --help                    print this help
    -V, --version                 print the version

ENDPOINTS:
    POST /v1/chat/completions, POST /v1/completions   (\"stream\": true for SSE)
    GET /v1/models, GET /health, GET /metrics (Prometheus, vLLM metric names)
    POST /admin/queue {{\"extra_waiting\": N, \"extra_running\": M}}
                                               add N to the reported waiting count, M to the
                                               reported running count (either or both)
    POST /admin/reset                          clear the prefix cache and all counters
    POST /reset_prefix_cache                   clear the prefix cache, keep the counters (as vLLM)

RESPONSE HEADERS:
    x-backend-name, x-cached-tokens, x-queue-depth; endpoint-load-metrics (ORCA) when the
    request has endpoint-load-metrics-format: TEXT or JSON
",
        listen = d.listen,
        name = d.name,
        model = d.model,
        mr = c.max_running,
        cache = c.cache_capacity_tokens,
        bt = c.block_tokens,
        pf = c.prefill_tokens_per_s,
        po = c.prefill_overhead_s * 1000.0,
        dm = c.decode_step_s * 1000.0,
        ds = c.decode_step_per_seq_s * 1000.0,
        ac = c.attention_coeff,
        mml = d.max_model_len,
        ts = d.time_scale,
    )
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .parse::<T>()
        .map_err(|_| format!("invalid value for {flag}: {v:?}"))
}

fn nonneg(flag: &str, v: &str) -> Result<f64, String> {
    let x: f64 = num(flag, v)?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("{flag} must be a finite number >= 0, got {v:?}"))
    }
}

fn positive(flag: &str, v: &str) -> Result<f64, String> {
    let x = nonneg(flag, v)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err(format!("{flag} must be > 0, got {v:?}"))
    }
}

/// Parse the arguments (without the program name).
pub fn parse<I, S>(args: I) -> Result<Command, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut cfg = Config::default();
    let mut it = args.into_iter().map(Into::into);
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        if arg == "-V" || arg == "--version" {
            return Ok(Command::Version);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "--listen" => cfg.listen = value()?,
            "--name" => cfg.name = value()?,
            "--model" => cfg.model = value()?,
            "--max-running" => {
                let n: usize = num(&flag, &value()?)?;
                if n == 0 {
                    return Err("--max-running must be >= 1".to_string());
                }
                cfg.cost.max_running = n;
            }
            "--cache-tokens" => cfg.cost.cache_capacity_tokens = num(&flag, &value()?)?,
            "--block-tokens" => {
                let n: u32 = num(&flag, &value()?)?;
                if n == 0 {
                    return Err("--block-tokens must be >= 1".to_string());
                }
                cfg.cost.block_tokens = n;
            }
            "--prefill-tokens-per-s" => cfg.cost.prefill_tokens_per_s = positive(&flag, &value()?)?,
            "--prefill-overhead-ms" => {
                cfg.cost.prefill_overhead_s = nonneg(&flag, &value()?)? / 1000.0
            }
            "--decode-ms-per-token" => cfg.cost.decode_step_s = nonneg(&flag, &value()?)? / 1000.0,
            "--decode-ms-per-seq" => {
                cfg.cost.decode_step_per_seq_s = nonneg(&flag, &value()?)? / 1000.0
            }
            "--attention-coeff" => cfg.cost.attention_coeff = nonneg(&flag, &value()?)?,
            "--max-model-len" => cfg.max_model_len = num(&flag, &value()?)?,
            "--time-scale" => cfg.time_scale = positive(&flag, &value()?)?,
            "--instant" => cfg.instant = true,
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    Ok(Command::Run(Box::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Config {
        match parse(args.iter().copied()) {
            Ok(Command::Run(c)) => *c,
            other => panic!("unexpected {other:?}"),
        }
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
        ]);
        assert_eq!(c.listen, "127.0.0.1:0");
        assert_eq!(c.name, "r1");
        assert_eq!(c.model, "m");
        assert_eq!(c.cost.max_running, 8);
        assert_eq!(c.cost.cache_capacity_tokens, 8192);
        assert_eq!(c.cost.prefill_tokens_per_s, 20000.0);
        assert!((c.cost.decode_step_s - 0.01).abs() < 1e-12);
        assert_eq!(c.time_scale, 0.2);
        let d = run(&[]);
        assert_eq!(d.model, "sim-model");
        assert_eq!(d.time_scale, 1.0);
    }

    #[test]
    fn rejects_bad_flags() {
        for bad in [
            &["--time-scale", "0"][..],
            &["--time-scale", "x"],
            &["--max-running", "0"],
            &["--max-running", "-1"],
            &["--bogus"],
            &["--listen"],
            &["--decode-ms-per-token", "NaN"],
        ] {
            assert!(parse(bad.iter().copied()).is_err(), "{bad:?}");
        }
        assert!(matches!(parse(["--help"]), Ok(Command::Help)));
        assert!(help().contains("--time-scale"));
    }
}
