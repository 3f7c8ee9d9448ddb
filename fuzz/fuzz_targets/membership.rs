//! Envoy's admin `/clusters?format=json` as the membership poll reads it
//! (`membership::parse_admin_clusters`) and the host table merge
//! (`membership::Table::update`): never a panic; a merge keeps every member
//! it was given once (by address), never reuses a slot twice, and merging
//! the same answer again changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::membership::{parse_admin_clusters, Table};

fuzz_target!(|data: &[u8]| {
    let Ok(members) = parse_admin_clusters(data, "llm") else {
        return;
    };
    let (t1, _) = Table::default().update(&members, &[]);
    let mut seen: Vec<&str> = t1
        .slots
        .iter()
        .flatten()
        .map(|s| s.address.as_str())
        .collect();
    let n = seen.len();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), n, "an address in two slots");
    assert!(n <= members.len());
    let (t2, c2) = t1.update(&members, &[]);
    assert!(c2.is_empty(), "the same answer changed the table: {c2:?}");
    assert_eq!(t1, t2);
    // Half of them go: every remaining member keeps its slot.
    let half = &members[..members.len() / 2];
    let (t3, _) = t1.update(half, &[]);
    for (i, s) in t3.slots.iter().enumerate() {
        if let Some(s) = s {
            assert_eq!(t1.slots.get(i).cloned().flatten().as_ref(), Some(s));
        }
    }
    let back = Table::decode(Some(&t3.encode()));
    assert_eq!(back.as_ref(), Some(&t3));
});
