//! The filter JSON: `Config::from_json` never panics, and an accepted config
//! builds its router (when the ring is small enough to build per input).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::{Config, Router};

fuzz_target!(|data: &[u8]| {
    match Config::from_json(data) {
        Ok(cfg) => {
            let points: f64 = cfg
                .hosts
                .iter()
                .map(|h| f64::from(cfg.vnodes) * h.weight)
                .sum();
            if points <= 20_000.0 {
                let _ = Router::new(cfg);
            }
        }
        Err(e) => {
            // Every error names a field and says why.
            assert!(!e.field.is_empty() && !e.reason.is_empty(), "{e:?}");
            let _ = e.to_string();
        }
    }
});
