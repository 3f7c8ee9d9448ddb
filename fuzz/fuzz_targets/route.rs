//! Extraction + key + placement through the public router API, as the
//! filter calls it: `Router::key_with_chain` then `place_cost_with` over a
//! shared-data prefix index (which the response path then updates with
//! `observe`), and `Router::decide` (the ring alone). The first bytes pick
//! the API, a session header and the hosts' loads; the rest is the body.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prefix_router_core::load::{HostLoad, Report};
use prefix_router_core::store::MemStore;
use prefix_router_core::shared_index::SharedLookup;
use prefix_router_core::{Config, Decision, Router};

const PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];

fn router() -> &'static Router {
    static R: OnceLock<Router> = OnceLock::new();
    R.get_or_init(|| {
        let cfg = Config::from_json(
            br#"{"hosts":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},
                 {"address":"10.0.0.3:8000","weight":2},{"address":"[::1]:8000"}],
                 "key":{"use_user_field":true}}"#,
        )
        .unwrap_or_else(|e| panic!("fuzz config: {e}"));
        Router::new(cfg)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let Some((&load_seed, body)) = rest.split_first() else {
        return;
    };
    let r = router();
    let cfg = r.config();
    let Some(api) = cfg.api_for_path(PATHS[usize::from(head & 3)]) else {
        return;
    };
    let session = (head & 4 != 0).then_some("session-from-a-header");
    let now = 1_000_000;
    let loads: Vec<HostLoad> = (0..cfg.hosts.len())
        .map(|i| {
            let b = load_seed.rotate_left(i as u32 * 2);
            HostLoad {
                inflight: u64::from(b & 15),
                report: (b & 16 != 0).then_some(Report {
                    queue: f64::from(b >> 5),
                    running: f64::from(b & 7),
                    own: 0,
                    at_ms: now - 500,
                }),
                ejected: b == 0xff,
                pending_prefill_tokens: u64::from(b) * 100,
                peer_pending_tokens: 0,
                recent: f64::from(b & 31),
            }
        })
        .collect();
    let store = MemStore::default();
    match r.key_with_chain(api, body, session) {
        Ok((key, chain)) => {
            let view = SharedLookup::new(&store, cfg.cost.shared);
            let d = r.place_cost_with(key, &chain, &loads, &view, now, &cfg.cost.params);
            if let Decision::Routed { host, .. } = d {
                assert!(host < cfg.hosts.len());
                let _ = cfg.cost.shared.observe(&store, host, &chain.hashes, now);
                // The second turn's lookup finds what the first recorded.
                let view = SharedLookup::new(&store, cfg.cost.shared);
                let _ = r.place_cost_with(key, &chain, &loads, &view, now + 1, &cfg.cost.params);
            }
            let _ = d.describe(cfg);
        }
        Err(_) => {}
    }
    let d = r.decide(api, body, session, &loads, now);
    if let Decision::Routed { host, .. } = d {
        assert!(host < cfg.hosts.len());
    }
});
