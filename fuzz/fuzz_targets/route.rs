//! Extraction + key + placement through the public router API, as the
//! filter calls it: `Router::decide` by the default rule (the priced
//! spill), and by the index rule (`cost.mode = "index"`) over a shared-data
//! prefix index (which the response path then updates with `observe`). The
//! first bytes pick the API, a session header and the hosts' loads; the
//! rest is the body.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prefix_router_core::load::{HostLoad, Report};
use prefix_router_core::store::MemStore;
use prefix_router_core::shared_index::SharedLookup;
use prefix_router_core::{Config, Decision, Request, Router};

const PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];

const HOSTS: &str = r#""hosts":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"},
    {"address":"10.0.0.3:8000","weight":2},{"address":"[::1]:8000"}],
    "key":{"use_user_field":true}"#;

fn make(extra: &str) -> Router {
    let cfg = Config::from_json(format!("{{{HOSTS}{extra}}}").as_bytes())
        .unwrap_or_else(|e| panic!("fuzz config: {e}"));
    Router::new(cfg)
}

/// The default rule (the priced spill).
fn router() -> &'static Router {
    static R: OnceLock<Router> = OnceLock::new();
    R.get_or_init(|| make(""))
}

/// The index rule.
fn index_router() -> &'static Router {
    static R: OnceLock<Router> = OnceLock::new();
    R.get_or_init(|| make(r#","cost":{"mode":"index"}"#))
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
    let session = (head & 4 != 0).then_some(&b"session-\xff-from-a-header"[..]);
    let now = 1_000_000;
    let loads: Vec<HostLoad> = (0..cfg.hosts.len())
        .map(|i| {
            let b = load_seed.rotate_left(i as u32 * 2);
            HostLoad {
                inflight: u64::from(b & 15),
                pending_requests: u64::from(b & 3),
                report: (b & 16 != 0).then_some(Report {
                    queue: f64::from(b >> 5),
                    running: f64::from(b & 7),
                    own: 0,
                    own_pending: u64::from(b & 1),
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
    let ri = index_router();
    let req = Request::new(api, body, &loads, now).with_session(session);
    let view = SharedLookup::new(&store, ri.config().cost.shared);
    let first = ri.decide(&req.with_index(&view));
    if let Decision::Routed { host, .. } = first.decision {
        assert!(host < cfg.hosts.len());
        let chain = &first.chain.hashes;
        let _ = ri.config().cost.shared.observe(&store, host, chain, now);
        // The second turn's lookup finds what the first recorded.
        let view = SharedLookup::new(&store, ri.config().cost.shared);
        let again = Request { now_ms: now + 1, ..req };
        let _ = ri.decide(&again.with_index(&view));
    }
    let _ = first.decision.describe(ri.config());
    let d = r.decide(&req).decision;
    if let Decision::Routed { host, .. } = d {
        assert!(host < cfg.hosts.len());
    }
    let _ = d.describe(cfg);
});
