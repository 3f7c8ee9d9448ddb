//! The gossip codec: `gossip::decode_batch` never panics, and a batch it
//! accepts encodes back to one that decodes to the same batch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::gossip;

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = gossip::decode_batch(data) {
        let again = gossip::encode_batch(b.fingerprint, &b.observations, b.loads.as_ref());
        match gossip::decode_batch(&again) {
            Ok(b2) => assert_eq!(b, b2),
            Err(e) => panic!("re-encoded batch rejected: {e}"),
        }
    }
});
