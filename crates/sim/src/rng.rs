//! The simulator's only randomness: `rand` with a seeded PCG generator.
//!
//! No `thread_rng`, no `RandomState`: every random choice (arrivals, think
//! times, synthetic text, random policies, tie breaks) comes from an [`Rng`]
//! seeded from `--seed` and a fixed per-use salt, so a run is a pure function
//! of its inputs.
//!
//! **Byte-identical output for a seed.** The generator is
//! [`rand_pcg::Pcg64Mcg`] (PCG XSL 128/64 MCG: its output stream is fixed by
//! the PCG definition), seeded with [`rand::SeedableRng::seed_from_u64`]
//! (documented by `rand_core` as portable). What else would vary is kept out:
//!
//! * integer draws go through [`Draw::below`] on `u64` (never a `usize`
//!   range, whose sampling rand may do differently by pointer width);
//! * floats are [`Draw::unit`] (rand's `StandardUniform` for `f64`: the top
//!   53 bits of one `u64`), exponentials and Zipf draws are computed here
//!   from it by inverse CDF (no `rand_distr`);
//! * shuffles are rand's `SliceRandom::shuffle`, which draws `u32` indices
//!   for slices shorter than `u32::MAX` on every platform.
//!
//! rand's integer-range and shuffle algorithms may change between its minor
//! versions, and its `unbiased` feature (off: rand is used without default
//! features and nothing in the workspace turns it on) changes them too, so
//! `rand` and `rand_pcg` are pinned (`=x.y.z` in Cargo.toml);
//! `tests/determinism.rs` holds golden hashes of raw draws and of generated
//! workloads and fails if an update moves them.
//!
//! Seeds of sub-streams are derived with xxh3-64 under an explicit seed
//! ([`seed2`], [`seed_str`]), like every other hash in the project.

use rand::RngExt as _;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use rand::seq::SliceRandom;

/// The simulator's generator.
pub type Rng = rand_pcg::Pcg64Mcg;

/// A generator with this seed.
pub fn rng(seed: u64) -> Rng {
    <Rng as rand::SeedableRng>::seed_from_u64(seed)
}

/// Combine two values into a well-mixed seed (order matters).
#[inline]
pub fn seed2(a: u64, b: u64) -> u64 {
    xxh3_64_with_seed(&b.to_le_bytes(), a)
}

/// A seed derived from a string label.
pub fn seed_str(base: u64, label: &str) -> u64 {
    xxh3_64_with_seed(label.as_bytes(), base)
}

/// The draws the simulator makes, on any rand generator.
pub trait Draw: rand::Rng {
    /// Uniform in `0..n` (`n > 0`; returns 0, drawing nothing, for `n == 0`).
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.random_range(0..n)
        }
    }

    /// Uniform in `[0, 1)` with 53 bits.
    #[inline]
    fn unit(&mut self) -> f64 {
        self.random::<f64>()
    }

    /// Exponential with this mean (`mean <= 0` gives 0, drawing nothing).
    fn exp(&mut self, mean: f64) -> f64 {
        if mean <= 0.0 {
            return 0.0;
        }
        -mean * (1.0 - self.unit()).ln()
    }
}

impl<R: rand::Rng + ?Sized> Draw for R {}

/// Zipf(s) over `0..n` by inverse CDF (binary search in the precomputed
/// cumulative weights `1/(k+1)^s`).
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// Zipf over `n >= 1` items with exponent `s >= 0` (0 = uniform).
    pub fn new(n: usize, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n.max(1));
        let mut acc = 0.0;
        for k in 0..n.max(1) {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    /// Draw an index.
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let u = rng.unit();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng as _;

    #[test]
    fn deterministic_and_uniformish() {
        let mut a = rng(7);
        let mut b = rng(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = rng(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)));
        let m: f64 = (0..100_000).map(|_| r.exp(2.0)).sum::<f64>() / 100_000.0;
        assert!((m - 2.0).abs() < 0.05);
        assert_eq!(r.below(0), 0);
        assert_ne!(seed2(1, 2), seed2(2, 1));
        assert_ne!(seed_str(1, "a"), seed_str(1, "b"));
    }

    #[test]
    fn zipf_skews_to_head() {
        let z = Zipf::new(100, 1.1);
        let mut r = rng(3);
        let mut head = 0;
        for _ in 0..10_000 {
            if z.sample(&mut r) == 0 {
                head += 1;
            }
        }
        assert!(head > 1_500, "{head}");
    }
}
