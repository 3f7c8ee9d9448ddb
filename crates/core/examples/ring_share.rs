//! Prints each host's share of the ring (fraction of the 2^64 key space it
//! owns) for the given host names: `cargo run -p prefix-router-core --example
//! ring_share -- [--vnodes N] name1 name2 ...`.
#![allow(clippy::indexing_slicing)]

use prefix_router_core::ring::Ring;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut vnodes = 100u32;
    if args.first().map(String::as_str) == Some("--vnodes") && args.len() > 1 {
        vnodes = args[1].parse().unwrap_or(100);
        args.drain(..2);
    }
    let ring = Ring::new(args.iter().map(|n| (n.as_str(), 1.0)), vnodes);
    let samples = 1u64 << 20;
    let mut count = vec![0u64; args.len()];
    for i in 0..samples {
        let key = i.wrapping_mul(u64::MAX / samples);
        if let Some(h) = ring.owner(key) {
            count[h] += 1;
        }
    }
    for (n, c) in args.iter().zip(count) {
        println!("{n}: {:.1}%", 100.0 * c as f64 / samples as f64);
    }
}
