//! [`CostModel`]: how long prefill and decode take, and how big a replica is.
//!
//! ## Defaults: an 8B model (Llama-3.1-8B, BF16) on one H100-SXM 80GB
//!
//! | field | default | reasoning |
//! |---|---|---|
//! | `prefill_tokens_per_s` | 16,000 | Prefill is compute-bound at ~2 FLOP/param/token = 16 GFLOP/token for 8B. H100 dense BF16 peak is ~989 TFLOP/s; vLLM prefill typically reaches ~25-30% MFU for 8B at moderate prompt lengths, i.e. ~250 TFLOP/s -> ~16k tokens/s (a 2k-token prompt prefills in ~125 ms, in line with commonly reported vLLM TTFTs for 8B on H100). |
//! | `prefill_overhead_s` | 0.005 | A forward pass reads all weights once: 16 GB at ~3.35 TB/s HBM = ~4.8 ms, so even a fully cached prompt (which still recomputes one token) costs a step. |
//! | `attention_coeff` | 0.0 (off) | Optional quadratic attention term. Attention adds ~4·L·d = 4·32·4096 ≈ 0.52 MFLOP per (token × context position), i.e. 0.52e6/16e9 ≈ **3.3e-5** extra "linear-token equivalents" per context position. Set it to 3.3e-5 to model long-context prefill. |
//! | `decode_step_s` | 0.015 | Time per decode step (one output token per running request). Decode is memory-bound: ≥4.8 ms/step for the weights alone, ~10-20 ms per output token at moderate batch (tens of sequences) in vLLM on H100. 15 ms is the middle of that range. |
//! | `decode_step_per_seq_s` | 0.0 (off) | Optional growth of the step time per decoding sequence (e.g. 1e-4 = +0.1 ms per sequence). |
//! | `kv_read_s_per_token` | 0.0 (off) | Optional memory-bound batch cost: every step reads the KV of every decoding sequence, so a decode step, and each prefill chunk's step, take this much longer per context token decoding. Llama-3.1-8B holds 128 KiB of KV per token; at H100's ~3.35 TB/s that is **3.9e-8** s per token (a full 400k-token cache adds ~16 ms a step). Set with a lower `decode_step_s` (~5 ms: the weights alone), so that a step costs ~5-20 ms with the batch's context, not a flat 15 ms. |
//! | `prefill_chunk_tokens` | 8,192 | Chunked prefill's token budget per step (vLLM's `max_num_batched_tokens` for online serving on large GPUs): a prefill of `u` uncached tokens takes `ceil(u / chunk)` steps, each also reading the decoding sequences' KV. Read only with `kv_read_s_per_token > 0`. |
//! | `max_running` | 64 | Max requests in the running batch. vLLM's default `max_num_seqs` is 256 (1024 on ≥70 GiB GPUs in recent v1), but then its step time grows with batch; with a flat 15 ms step, a cap of 64 keeps decode throughput (~4,300 tokens/s) realistic and makes overload show up as queueing (`num_requests_waiting`), which is what the router reacts to. |
//! | `block_tokens` | 16 | vLLM's default `--block-size`. |
//! | `cache_capacity_tokens` | 400,000 | Llama-3.1-8B KV per token = 2 (K,V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB. With `gpu_memory_utilization` 0.9 of 80 GB (~72 GB), minus ~16 GB weights and ~4-6 GB activations/CUDA graphs, ~50-52 GB remain -> ~400k tokens (vLLM logs ~400-460k "GPU KV cache size" tokens for this setup). |
//!
//! ## Scheduling model (used by [`crate::Replica`])
//!
//! * Prefill of a request's **uncached** tokens takes
//!   `prefill_overhead_s + (u + attention_coeff·(u·c + u²/2)) / prefill_tokens_per_s`
//!   where `u` = uncached tokens and `c` = cached tokens (context already
//!   present). Prefills are compute-bound, so they are serialized through a
//!   single FIFO "prefill server".
//! * The first output token is produced by the prefill; each further token
//!   takes one decode step of
//!   `decode_step_s + decode_step_per_seq_s · n + kv_read_s_per_token · C`
//!   where `n` = requests in the decode phase and `C` their context tokens
//!   (each counted at its prompt plus half its output: its mean context over
//!   its decode). Decode runs concurrently with prefill (a simplification of
//!   vLLM's chunked prefill, which mixes both in one step); with
//!   `kv_read_s_per_token > 0` a prefill pays the mix's cost instead: each of
//!   its `ceil(u / prefill_chunk_tokens)` chunks adds
//!   `kv_read_s_per_token · C` (the decoding context when it starts), so a
//!   replica holding a large batch prefills slower, as in vLLM.

use crate::prompt::DEFAULT_BLOCK_TOKENS;

/// Timing and size parameters of a replica. See the module docs for the
/// defaults and where they come from.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Prefill throughput for uncached tokens, tokens/s.
    pub prefill_tokens_per_s: f64,
    /// Fixed time per prefill (one forward pass), seconds.
    pub prefill_overhead_s: f64,
    /// Quadratic attention coefficient (0 = off); see module docs.
    pub attention_coeff: f64,
    /// Decode step time (per output token), seconds.
    pub decode_step_s: f64,
    /// Extra decode step time per decoding sequence, seconds (0 = off).
    pub decode_step_per_seq_s: f64,
    /// Extra step time per context token of the decoding sequences,
    /// seconds (0 = off); see module docs.
    pub kv_read_s_per_token: f64,
    /// Chunked prefill's tokens per step (read only with
    /// `kv_read_s_per_token > 0`).
    pub prefill_chunk_tokens: u64,
    /// Max requests in the running batch (prefilling + decoding).
    pub max_running: usize,
    /// Tokens per KV block.
    pub block_tokens: u32,
    /// KV cache capacity, tokens.
    pub cache_capacity_tokens: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            prefill_tokens_per_s: 16_000.0,
            prefill_overhead_s: 0.005,
            attention_coeff: 0.0,
            decode_step_s: 0.015,
            decode_step_per_seq_s: 0.0,
            kv_read_s_per_token: 0.0,
            prefill_chunk_tokens: 8192,
            max_running: 64,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            cache_capacity_tokens: 400_000,
        }
    }
}

impl CostModel {
    /// Suggested `attention_coeff` for Llama-3.1-8B (see module docs).
    pub const LLAMA_8B_ATTENTION_COEFF: f64 = 3.3e-5;

    /// Prefill duration (seconds) for `uncached` new tokens on top of
    /// `cached` tokens of context.
    pub fn prefill_time(&self, uncached: u64, cached: u64) -> f64 {
        let u = uncached as f64;
        let c = cached as f64;
        let work = u + self.attention_coeff * (u * c + u * u / 2.0);
        let tput = if self.prefill_tokens_per_s > 0.0 {
            self.prefill_tokens_per_s
        } else {
            f64::INFINITY
        };
        (self.prefill_overhead_s.max(0.0) + work / tput).max(0.0)
    }

    /// Suggested `kv_read_s_per_token` for Llama-3.1-8B on an H100 (see
    /// module docs).
    pub const LLAMA_8B_H100_KV_READ_S: f64 = 3.9e-8;

    /// Decode step duration (seconds) with `batch` sequences decoding and
    /// no context cost (as with `kv_read_s_per_token` 0).
    pub fn decode_step_time(&self, batch: usize) -> f64 {
        self.decode_step_time_ctx(batch, 0)
    }

    /// Decode step duration (seconds) with `batch` sequences decoding over
    /// `context` tokens of KV.
    pub fn decode_step_time_ctx(&self, batch: usize, context: u64) -> f64 {
        (self.decode_step_s
            + self.decode_step_per_seq_s * batch as f64
            + self.kv_read_s_per_token * context as f64)
            .max(0.0)
    }

    /// What a prefill of `uncached` tokens adds, beside
    /// [`Self::prefill_time`], for reading `context` tokens of decoding KV
    /// in each of its chunks' steps (0 with `kv_read_s_per_token` 0).
    pub fn prefill_mix_time(&self, uncached: u64, context: u64) -> f64 {
        if self.kv_read_s_per_token <= 0.0 || context == 0 {
            return 0.0;
        }
        let chunks = uncached.max(1).div_ceil(self.prefill_chunk_tokens.max(1));
        (chunks as f64 * self.kv_read_s_per_token * context as f64).max(0.0)
    }

    /// The memory-bound batch cost with Llama-3.1-8B on an H100 (module
    /// docs): a 5 ms step for the weights plus
    /// [`Self::LLAMA_8B_H100_KV_READ_S`] per context token decoding, in
    /// decode steps and in each prefill chunk's step.
    pub fn with_batch_cost(self) -> Self {
        Self {
            decode_step_s: Self::WEIGHTS_STEP_S,
            kv_read_s_per_token: Self::LLAMA_8B_H100_KV_READ_S,
            ..self
        }
    }

    /// A step's floor: Llama-3.1-8B's 16 GB of weights read once at
    /// ~3.35 TB/s, rounded up.
    pub const WEIGHTS_STEP_S: f64 = 0.005;

    /// Multiply every duration by `factor` (e.g. 0.1 = ten times faster).
    pub fn scaled(mut self, factor: f64) -> Self {
        if factor > 0.0 && factor.is_finite() {
            self.prefill_tokens_per_s /= factor;
            self.prefill_overhead_s *= factor;
            self.decode_step_s *= factor;
            self.decode_step_per_seq_s *= factor;
            self.kv_read_s_per_token *= factor;
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_is_linear_by_default() {
        let m = CostModel {
            prefill_overhead_s: 0.0,
            ..CostModel::default()
        };
        assert!((m.prefill_time(16_000, 0) - 1.0).abs() < 1e-12);
        assert!((m.prefill_time(16_000, 100_000) - 1.0).abs() < 1e-12);
        let q = CostModel {
            attention_coeff: CostModel::LLAMA_8B_ATTENTION_COEFF,
            ..m.clone()
        };
        assert!(q.prefill_time(16_000, 100_000) > 3.0);
        let s = m.clone().scaled(0.1);
        assert!((s.prefill_time(16_000, 0) - 0.1).abs() < 1e-12);
        assert!((s.decode_step_time(5) - 0.0015).abs() < 1e-12);
    }

    #[test]
    fn the_batch_context_slows_decode_steps_and_prefill_chunks() {
        let off = CostModel::default();
        assert_eq!(off.decode_step_time_ctx(8, 300_000), off.decode_step_s);
        assert_eq!(off.prefill_mix_time(20_000, 300_000), 0.0);
        let m = CostModel {
            decode_step_s: 0.005,
            kv_read_s_per_token: 1e-8,
            prefill_chunk_tokens: 8192,
            ..CostModel::default()
        };
        assert!((m.decode_step_time_ctx(8, 1_000_000) - 0.015).abs() < 1e-12);
        // 20,000 tokens in 3 chunks, each reading 1M tokens of KV (10 ms).
        assert!((m.prefill_mix_time(20_000, 1_000_000) - 0.03).abs() < 1e-12);
        // A cached prompt still takes one step.
        assert!((m.prefill_mix_time(0, 1_000_000) - 0.01).abs() < 1e-12);
        assert_eq!(m.prefill_mix_time(20_000, 0), 0.0);
    }
}
