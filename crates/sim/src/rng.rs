//! The simulator's only randomness: a seeded splitmix64 generator.
//!
//! No `thread_rng`, no `RandomState`: every random choice (arrivals, think
//! times, synthetic text, random policies, tie breaks) comes from a [`Rng`]
//! seeded from `--seed` and a fixed per-use salt, so a run is a pure function
//! of its inputs.

/// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): 64-bit state, one multiply-xorshift finalizer
/// per output. Fast, and good enough for simulation (passes BigCrush).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finalizer: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Combine two values into a well-mixed seed (order matters).
#[inline]
pub fn seed2(a: u64, b: u64) -> u64 {
    mix64(a.wrapping_add(GOLDEN).wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ mix64(b ^ GOLDEN))
}

/// A seed derived from a string label (FNV-1a, then mixed).
pub fn seed_str(base: u64, label: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    seed2(base, h)
}

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    #[inline]
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`; returns 0 for `n == 0`). Lemire's
    /// multiply-shift with rejection: unbiased.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Exponential with this mean (`mean <= 0` gives 0).
    pub fn exp(&mut self, mean: f64) -> f64 {
        if mean <= 0.0 {
            return 0.0;
        }
        -mean * (1.0 - self.f64()).ln()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

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
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.f64();
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_uniformish() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)));
        let m: f64 = (0..100_000).map(|_| r.exp(2.0)).sum::<f64>() / 100_000.0;
        assert!((m - 2.0).abs() < 0.05);
    }

    #[test]
    fn zipf_skews_to_head() {
        let z = Zipf::new(100, 1.1);
        let mut r = Rng::new(3);
        let mut head = 0;
        for _ in 0..10_000 {
            if z.sample(&mut r) == 0 {
                head += 1;
            }
        }
        assert!(head > 1_500, "{head}");
    }
}
