//! Cluster membership and failover.
//!
//! ## Membership from the Envoy cluster
//! Upstream Envoy 1.40 has no proxy-wasm call that lists a cluster's hosts.
//! With `membership` configured, the filter polls Envoy's own admin
//! `/clusters?format=json` through a loopback cluster
//! (`membership.admin_cluster`) every `membership.interval_ms`;
//! [`parse_admin_clusters`] reads the hosts of `membership.cluster` (address,
//! EDS hostname, weight, health flags) and [`sync`] merges them into the
//! host table kept in shared data, so every VM of the process routes over
//! the same table. The filter only makes the call and applies the result.
//!
//! ## The host table: stable slots
//! Hosts are named by their index in the config's `hosts` everywhere the
//! filter keeps state by index (the shared prefix index, per-host metrics),
//! so a host keeps its slot for as long as it is a member: a change frees
//! the slot of a host that left and gives a host that came the first free
//! slot (or a new one). A free slot is a host of weight 0: it has no ring
//! points and is never chosen. The ring identity of a host is its name: the
//! seed `hosts[].name` for that address, else the endpoint's EDS `hostname`,
//! else its address; a member whose address changed but whose name did not
//! keeps its slot and its ring points, so none of its keys move.
//!
//! Because ring points depend only on the name, a host that comes or goes
//! moves only the keys it gains or owned (about 1/N of them; measured by
//! `a_membership_change_moves_only_that_hosts_keys` below).
//!
//! ## Health
//! A member Envoy does not consider healthy (active health check failed,
//! outlier-ejected, EDS status UNHEALTHY / DRAINING / TIMEOUT, or waiting for
//! its first active check) stays in its slot, keeps its index entries, and
//! is not eligible: its keys go to their ring successors, and come back when
//! it recovers. A host EDS removed but Envoy still drains
//! (`pending_dynamic_removal`: with active health checks Envoy keeps a
//! removed host until it fails a check) counts as gone.
//!
//! ## Failover
//! [`crate::Router::failover`] lists the chosen host's ring successors; the
//! filter writes them after the chosen host in the destination header,
//! comma-separated. Envoy's override_host uses the first host and, on a
//! retry, the next one in the list (Envoy 1.40
//! `source/extensions/load_balancing_policies/override_host`), so a retry of
//! a try that reached no replica goes to the key's ring successor, the same
//! one from every proxy.

use std::net::{IpAddr, SocketAddr};

use crate::config::{Host, MAX_HOSTS};
pub use crate::config::{MembershipConfig, RawFailover, RawMembership, MAX_FAILOVER_HOSTS};
use crate::store::{cas_update, SharedStore, StoreError};

/// One host of the cluster as Envoy's admin lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// `ip:port` as override_host knows it (`[v6]:port` for IPv6).
    pub address: String,
    /// The endpoint's EDS `hostname` (`None` if unset or empty).
    pub hostname: Option<String>,
    /// Its load-balancing weight (1..=1000; larger weights are capped).
    pub weight: f64,
    /// Whether Envoy would send it traffic.
    pub healthy: bool,
}

/// Why an admin answer was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipError {
    /// Not the JSON of `/clusters?format=json`.
    Parse(String),
    /// The answer has no cluster of that name.
    NoCluster,
    /// The cluster lists no host with an IP address (e.g. while its first
    /// EDS answer is pending): the table is kept.
    NoHosts,
    /// More hosts than [`MAX_HOSTS`].
    TooManyHosts(usize),
}

impl std::fmt::Display for MembershipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipError::Parse(e) => write!(f, "not the admin's /clusters JSON: {e}"),
            MembershipError::NoCluster => write!(f, "the admin lists no cluster of that name"),
            MembershipError::NoHosts => {
                write!(
                    f,
                    "the cluster lists no host with an IP address (kept the hosts)"
                )
            }
            MembershipError::TooManyHosts(n) => {
                write!(f, "the cluster lists {n} hosts, more than {MAX_HOSTS}")
            }
        }
    }
}

/// Whether Envoy would send traffic to a host with these admin
/// `health_status` flags.
fn healthy(h: &serde_json::Value) -> bool {
    let flag = |n: &str| h.get(n).and_then(serde_json::Value::as_bool) == Some(true);
    let eds_ok = matches!(
        h.get("eds_health_status")
            .and_then(serde_json::Value::as_str),
        None | Some("UNKNOWN" | "HEALTHY" | "DEGRADED")
    );
    eds_ok
        && !flag("failed_active_health_check")
        && !flag("failed_outlier_check")
        && !flag("pending_active_hc")
        && !flag("excluded_via_immediate_hc_fail")
        && !flag("active_hc_timeout")
}

/// The hosts of `cluster` in an admin `/clusters?format=json` answer, in
/// the admin's order. Hosts without an IP socket address (pipes, internal
/// addresses) are skipped; a repeated address counts once (its first
/// listing).
pub fn parse_admin_clusters(body: &[u8], cluster: &str) -> Result<Vec<Member>, MembershipError> {
    use serde_json::Value;
    let all: Value =
        serde_json::from_slice(body).map_err(|e| MembershipError::Parse(e.to_string()))?;
    let statuses = match all.get("cluster_statuses") {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => {
            return Err(MembershipError::Parse(
                "cluster_statuses is not an array".into(),
            ))
        }
    };
    let c = statuses
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(cluster))
        .ok_or(MembershipError::NoCluster)?;
    let hosts = c
        .get("host_statuses")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut out: Vec<Member> = Vec::new();
    for h in hosts {
        let hs = h.get("health_status").unwrap_or(&Value::Null);
        // EDS removed it; Envoy keeps it while it drains (a host that still
        // passes its active health check stays until it fails one): gone.
        if hs.get("pending_dynamic_removal").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        let Some(sa) = h.get("address").and_then(|a| a.get("socket_address")) else {
            continue;
        };
        let Some(ip) = sa
            .get("address")
            .and_then(Value::as_str)
            .and_then(|a| a.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let Some(port) = sa
            .get("port_value")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        if port == 0 || ip.is_unspecified() {
            continue;
        }
        let address = SocketAddr::new(ip, port).to_string();
        if out.iter().any(|m| m.address == address) {
            continue;
        }
        if out.len() >= MAX_HOSTS {
            return Err(MembershipError::TooManyHosts(out.len() + 1));
        }
        let hostname = h
            .get("hostname")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty() && n.len() <= 256 && !n.chars().any(char::is_control))
            .map(str::to_string);
        let weight = h.get("weight").and_then(Value::as_u64).unwrap_or(1);
        out.push(Member {
            address,
            hostname,
            // `as` is exact up to 1000.
            weight: weight.clamp(1, 1000) as f64,
            healthy: healthy(hs),
        });
    }
    if out.is_empty() {
        return Err(MembershipError::NoHosts);
    }
    Ok(out)
}

/// The gossip peers in an admin answer: the healthy hosts of
/// `peers_cluster`, sorted, less `own` (this Envoy's `gossip.name`, which
/// must then be written as the cluster lists it, `ip:port`).
pub fn parse_peers(
    body: &[u8],
    peers_cluster: &str,
    own: Option<&str>,
) -> Result<Vec<String>, MembershipError> {
    let mut out: Vec<String> = parse_admin_clusters(body, peers_cluster)?
        .into_iter()
        .filter(|m| m.healthy && Some(m.address.as_str()) != own)
        .map(|m| m.address)
        .take(crate::config::MAX_GOSSIP_PEERS)
        .collect();
    out.sort();
    Ok(out)
}

/// One slot of the host table.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// `ip:port`.
    pub address: String,
    /// Ring identity.
    pub name: String,
    /// Weight (> 0).
    pub weight: f64,
    /// Whether Envoy would send it traffic.
    pub healthy: bool,
}

/// The host table: slot `i` is host index `i`; `None` is a free slot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Bumped at every change.
    pub version: u64,
    /// The slots.
    pub slots: Vec<Option<Slot>>,
}

/// What one update changed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Change {
    /// Slots of hosts that came.
    pub added: Vec<usize>,
    /// Slots of hosts that went, with the address each had.
    pub removed: Vec<(usize, String)>,
    /// Members whose health, weight or address changed.
    pub updated: Vec<usize>,
}

impl Change {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.updated.is_empty()
    }
}

impl Table {
    /// The table of a static `hosts` list (version 0).
    pub fn seed(hosts: &[Host]) -> Table {
        Table {
            version: 0,
            slots: hosts
                .iter()
                .filter(|h| h.weight > 0.0)
                .map(|h| {
                    Some(Slot {
                        address: h.address.clone(),
                        name: h.name.clone(),
                        weight: h.weight,
                        healthy: true,
                    })
                })
                .collect(),
        }
    }

    /// Present members.
    pub fn members(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// The table after Envoy listed `members`: a member keeps its slot
    /// (matched by name, then by address), a member that went frees its
    /// slot, a new one takes the first free slot. Names: the `seed` name of
    /// that address, else the EDS hostname, else the address; a name
    /// already taken falls back to the address.
    pub fn update(&self, members: &[Member], seed: &[Host]) -> (Table, Change) {
        let mut slots: Vec<Option<Slot>> = self.slots.clone();
        let mut change = Change::default();
        let mut kept = vec![false; slots.len()];
        let mut newcomers: Vec<Slot> = Vec::new();
        let mut names: Vec<String> = Vec::with_capacity(members.len());
        for m in members {
            let mut name = seed
                .iter()
                .find(|h| h.address == m.address)
                .map(|h| h.name.clone())
                .or_else(|| m.hostname.clone())
                .unwrap_or_else(|| m.address.clone());
            if names.contains(&name) {
                name = m.address.clone();
                if names.contains(&name) {
                    continue;
                }
            }
            names.push(name.clone());
            let want = Slot {
                address: m.address.clone(),
                name,
                weight: m.weight,
                healthy: m.healthy,
            };
            let found = slots
                .iter()
                .zip(&kept)
                .position(|(s, k)| !k && s.as_ref().is_some_and(|s| s.name == want.name))
                .or_else(|| {
                    slots.iter().zip(&kept).position(|(s, k)| {
                        !k && s.as_ref().is_some_and(|s| s.address == want.address)
                    })
                });
            match found {
                Some(i) => {
                    if let Some(k) = kept.get_mut(i) {
                        *k = true;
                    }
                    if let Some(s) = slots.get_mut(i) {
                        if s.as_ref() != Some(&want) {
                            // A new name at a known address is a new host.
                            if s.as_ref().is_some_and(|s| s.name != want.name) {
                                change.removed.push((
                                    i,
                                    s.as_ref().map(|s| s.address.clone()).unwrap_or_default(),
                                ));
                                change.added.push(i);
                            } else {
                                change.updated.push(i);
                            }
                            *s = Some(want);
                        }
                    }
                }
                None => newcomers.push(want),
            }
        }
        for (i, (s, k)) in slots.iter_mut().zip(&kept).enumerate() {
            if !k {
                if let Some(old) = s.take() {
                    change.removed.push((i, old.address));
                }
            }
        }
        for want in newcomers {
            match slots.iter().position(Option::is_none) {
                Some(i) => {
                    if let Some(s) = slots.get_mut(i) {
                        *s = Some(want);
                    }
                    change.added.push(i);
                }
                None => {
                    change.added.push(slots.len());
                    slots.push(Some(want));
                }
            }
        }
        // Trailing free slots are dropped (nothing refers to them).
        while slots.last().is_some_and(Option::is_none) {
            slots.pop();
        }
        let version = if change.is_empty() && slots == self.slots {
            self.version
        } else {
            self.version.wrapping_add(1).max(1)
        };
        (Table { version, slots }, change)
    }

    /// The config's `hosts` for this table: a free slot is a host with an
    /// empty address and name and weight 0 (no ring points, never chosen).
    pub fn hosts(&self) -> Vec<Host> {
        self.slots
            .iter()
            .map(|s| match s {
                Some(s) => Host {
                    address: s.address.clone(),
                    name: s.name.clone(),
                    weight: s.weight,
                    healthy: s.healthy,
                },
                None => Host {
                    address: String::new(),
                    name: String::new(),
                    weight: 0.0,
                    healthy: false,
                },
            })
            .collect()
    }

    /// Encoded for shared data: version (u64 LE), then per slot a tag
    /// byte (0 free, 1 healthy, 2 unhealthy) and, for a member, its weight
    /// (f64 LE) and its address and name (u16 LE length, bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.slots.len() * 48);
        out.extend_from_slice(&self.version.to_le_bytes());
        for s in &self.slots {
            match s {
                None => out.push(0),
                Some(s) => {
                    out.push(if s.healthy { 1 } else { 2 });
                    out.extend_from_slice(&s.weight.to_le_bytes());
                    for t in [&s.address, &s.name] {
                        let b = t.as_bytes();
                        let b = b.get(..usize::from(u16::MAX)).unwrap_or(b);
                        out.extend_from_slice(&(b.len() as u16).to_le_bytes());
                        out.extend_from_slice(b);
                    }
                }
            }
        }
        out
    }

    /// Decoded from shared data (`None`: absent or unreadable).
    pub fn decode(v: Option<&[u8]>) -> Option<Table> {
        let mut b = v?;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (h, t) = (b.get(..n)?, b.get(n..)?);
            b = t;
            Some(h)
        };
        let version = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let mut slots = Vec::new();
        while let Some(tag) = take(1) {
            match tag.first() {
                Some(0) => slots.push(None),
                Some(t @ (1 | 2)) => {
                    let healthy = *t == 1;
                    let weight = f64::from_le_bytes(take(8)?.try_into().ok()?);
                    let mut text = || -> Option<String> {
                        let n = u16::from_le_bytes(take(2)?.try_into().ok()?);
                        String::from_utf8(take(usize::from(n))?.to_vec()).ok()
                    };
                    let address = text()?;
                    let name = text()?;
                    slots.push(Some(Slot {
                        address,
                        name,
                        weight,
                        healthy,
                    }));
                }
                _ => return None,
            }
            if slots.len() > MAX_HOSTS {
                return None;
            }
        }
        Some(Table { version, slots })
    }
}

/// Shared-data key of the host table.
pub const TABLE_KEY: &str = "prefix_router/membership";

/// The shared host table as it is now (`None` before any poll stored one).
pub fn read_table<S: SharedStore + ?Sized>(store: &S) -> Result<Option<Table>, StoreError> {
    let (v, _) = store.get(TABLE_KEY)?;
    Ok(Table::decode(v.as_deref()))
}

/// Merge a poll's `members` into the shared table (starting from the
/// `seed` hosts when there is none yet), with compare-and-swap so VMs
/// polling at once agree. Returns the table as stored and what this call
/// changed (empty if another VM had already stored the same).
pub fn sync<S: SharedStore + ?Sized>(
    store: &S,
    members: &[Member],
    seed: &[Host],
) -> Result<(Table, Change), StoreError> {
    cas_update(store, TABLE_KEY, |v| {
        let cur = Table::decode(v).unwrap_or_else(|| Table::seed(seed));
        let (next, change) = cur.update(members, seed);
        if v.is_some() && next == cur {
            (None, (next, Change::default()))
        } else {
            (Some(next.encode()), (next, change))
        }
    })
}

/// With `membership` off: whether a host table left in shared data (by a
/// configuration with `membership` before) numbers hosts otherwise than the
/// static `hosts` (a slot's address differs from the host at that index):
/// then the shared prefix index, which names hosts by index, must forget
/// every host, and the table be cleared ([`clear_table`]).
pub fn table_disagrees(table: &Table, hosts: &[Host]) -> bool {
    let n = table.slots.len().max(hosts.len());
    (0..n).any(|i| {
        let slot = table.slots.get(i).and_then(Option::as_ref);
        let host = hosts.get(i).filter(|h| h.weight > 0.0);
        match (slot, host) {
            (None, None) => false,
            (Some(s), Some(h)) => s.address != h.address,
            _ => true,
        }
    })
}

/// Clear the shared host table (a later `membership` starts from its seed).
pub fn clear_table<S: SharedStore + ?Sized>(store: &S) -> Result<(), StoreError> {
    store.set(TABLE_KEY, &[], None)
}

/// Forget what the filter kept about a host that left: its load report and
/// its passive-health state (its in-flight count drains as its requests
/// end; its prefix-index entries are forgotten by slot,
/// [`crate::shared_index::forget_hosts`]).
pub fn drop_host_state<S: SharedStore + ?Sized>(
    store: &S,
    address: &str,
) -> Result<(), StoreError> {
    crate::host_state::drop_host_state(store, address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use crate::{Config, Router};

    fn admin(hosts: &[(&str, u16, Option<&str>, u64, &str)]) -> Vec<u8> {
        let hs: Vec<serde_json::Value> = hosts
            .iter()
            .map(|(ip, port, name, w, health)| {
                let mut h = serde_json::json!({
                    "address": {"socket_address": {"address": ip, "port_value": port}},
                    "stats": [{"name": "cx_total"}],
                    "health_status": serde_json::from_str::<serde_json::Value>(health).unwrap(),
                    "weight": w,
                    "locality": {}
                });
                if let Some(n) = name {
                    h["hostname"] = serde_json::json!(n);
                }
                h
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({"cluster_statuses": [
            {"name": "other", "host_statuses": [{"address": {"socket_address": {"address": "10.9.9.9", "port_value": 1}}}]},
            {"name": "llm", "added_via_api": true, "host_statuses": hs}
        ]}))
        .unwrap()
    }

    const OK: &str = r#"{"eds_health_status": "HEALTHY"}"#;

    #[test]
    fn parses_the_admin_answer_of_envoy_1_40() {
        // Shape as Envoy 1.40 answers (EDS cluster, active health check).
        let body = admin(&[
            ("127.0.0.1", 18001, Some("r1"), 1, OK),
            ("127.0.0.1", 18002, None, 3, OK),
            (
                "127.0.0.1",
                18003,
                None,
                1,
                r#"{"failed_active_health_check": true, "eds_health_status": "HEALTHY"}"#,
            ),
            (
                "127.0.0.1",
                18004,
                None,
                1,
                r#"{"eds_health_status": "DRAINING"}"#,
            ),
            ("::1", 18005, Some(""), 5000, "{}"),
            (
                "127.0.0.1",
                18006,
                None,
                1,
                r#"{"pending_dynamic_removal": true, "eds_health_status": "HEALTHY"}"#,
            ),
            ("127.0.0.1", 18001, None, 1, OK),
        ]);
        let m = parse_admin_clusters(&body, "llm").unwrap();
        let got: Vec<(&str, Option<&str>, f64, bool)> = m
            .iter()
            .map(|m| {
                (
                    m.address.as_str(),
                    m.hostname.as_deref(),
                    m.weight,
                    m.healthy,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("127.0.0.1:18001", Some("r1"), 1.0, true),
                ("127.0.0.1:18002", None, 3.0, true),
                ("127.0.0.1:18003", None, 1.0, false),
                ("127.0.0.1:18004", None, 1.0, false),
                ("[::1]:18005", None, 1000.0, true),
            ]
        );
        assert_eq!(
            parse_admin_clusters(&body, "nope"),
            Err(MembershipError::NoCluster)
        );
        assert_eq!(
            parse_admin_clusters(&admin(&[]), "llm"),
            Err(MembershipError::NoHosts)
        );
        assert!(matches!(
            parse_admin_clusters(b"{\"cluster_statuses\": 3}", "llm"),
            Err(MembershipError::Parse(_))
        ));
    }

    fn member(port: u16) -> Member {
        Member {
            address: format!("127.0.0.1:{port}"),
            hostname: None,
            weight: 1.0,
            healthy: true,
        }
    }

    #[test]
    fn slots_are_stable_and_reused() {
        let t0 = Table::default();
        let (t1, c1) = t0.update(&[member(1), member(2), member(3)], &[]);
        assert_eq!(c1.added, vec![0, 1, 2]);
        assert_eq!(t1.version, 1);
        // 2 goes: its slot is freed, the others keep theirs.
        let (t2, c2) = t1.update(&[member(1), member(3)], &[]);
        assert_eq!(c2.removed, vec![(1, "127.0.0.1:2".to_string())]);
        assert!(t2.slots[1].is_none());
        assert_eq!(t2.slots[2].as_ref().unwrap().address, "127.0.0.1:3");
        // 4 comes: it takes the free slot.
        let (t3, c3) = t2.update(&[member(1), member(3), member(4)], &[]);
        assert_eq!(c3.added, vec![1]);
        assert_eq!(t3.slots[1].as_ref().unwrap().address, "127.0.0.1:4");
        // The same list again: no change, same version.
        let (t4, c4) = t3.update(&[member(4), member(1), member(3)], &[]);
        assert!(c4.is_empty());
        assert_eq!(t4, t3);
        // Health flips are an update in place.
        let mut sick = member(3);
        sick.healthy = false;
        let (t5, c5) = t4.update(&[member(1), sick, member(4)], &[]);
        assert_eq!(c5.updated, vec![2]);
        assert!(!t5.slots[2].as_ref().unwrap().healthy);
        assert_eq!(t5.version, t4.version + 1);
    }

    #[test]
    fn a_hostname_keeps_its_slot_across_an_address_change() {
        let named = |port: u16, n: &str| Member {
            hostname: Some(n.to_string()),
            ..member(port)
        };
        let (t1, _) = Table::default().update(&[named(1, "a"), named(2, "b")], &[]);
        let (t2, c2) = t1.update(&[named(1, "a"), named(9, "b")], &[]);
        assert_eq!(c2.updated, vec![1]);
        assert!(c2.removed.is_empty() && c2.added.is_empty());
        assert_eq!(t2.slots[1].as_ref().unwrap().name, "b");
        assert_eq!(t2.slots[1].as_ref().unwrap().address, "127.0.0.1:9");
        // A duplicate hostname falls back to the address.
        let (t3, _) = t2.update(&[named(1, "a"), named(9, "b"), named(7, "b")], &[]);
        assert_eq!(t3.slots[2].as_ref().unwrap().name, "127.0.0.1:7");
    }

    #[test]
    fn the_seed_names_hosts_and_starts_the_table() {
        let cfg = Config::with_hosts(&["127.0.0.1:1", "127.0.0.1:2"]).unwrap();
        let mut seed = cfg.hosts.clone();
        seed[0].name = "first".into();
        let t = Table::seed(&seed);
        assert_eq!(t.members(), 2);
        let (t2, c) = t.update(&[member(2), member(1), member(5)], &seed);
        assert_eq!(c.added, vec![2]);
        assert_eq!(t2.slots[0].as_ref().unwrap().name, "first");
        let s = MemStore::default();
        let (a, ca) = sync(&s, &[member(1), member(2)], &seed).unwrap();
        assert!(ca.is_empty() && a.members() == 2);
        let (b, cb) = sync(&s, &[member(1)], &seed).unwrap();
        assert_eq!(cb.removed.len(), 1);
        assert_eq!(read_table(&s).unwrap(), Some(b));
    }

    fn owners(r: &Router, keys: &[u64]) -> Vec<String> {
        keys.iter()
            .map(|&k| {
                let h = r.ring().owner(k).unwrap();
                r.config().hosts[h].address.clone()
            })
            .collect()
    }

    fn router_for(t: &Table) -> Router {
        let mut cfg = Config::with_hosts(&["127.0.0.1:1"]).unwrap();
        cfg.hosts = t.hosts();
        Router::new(cfg)
    }

    /// Issue 20: a host that comes or goes moves only the keys it gains or
    /// owned, at most 1/N plus a small epsilon of them.
    #[test]
    fn a_membership_change_moves_only_that_hosts_keys() {
        let keys: Vec<u64> = (0..50_000u64)
            .map(|i| crate::hash::hash(&i.to_le_bytes(), 7))
            .collect();
        for n in [3usize, 4, 8, 16] {
            let all: Vec<Member> = (0..=n as u16).map(|p| member(18000 + p)).collect();
            let (base, _) = Table::default().update(&all[..n], &[]);
            let before = owners(&router_for(&base), &keys);
            // n -> n + 1.
            let (grown, _) = base.update(&all, &[]);
            let after = owners(&router_for(&grown), &keys);
            let newcomer = &all[n].address;
            let moved: Vec<usize> = (0..keys.len()).filter(|&i| before[i] != after[i]).collect();
            assert!(moved.iter().all(|&i| after[i] == *newcomer));
            let frac = moved.len() as f64 / keys.len() as f64;
            assert!(
                frac <= 1.0 / (n + 1) as f64 + 0.05,
                "{n} -> {}: {frac} of the keys moved",
                n + 1
            );
            // n -> n - 1 (the second host goes): only its keys move.
            let mut fewer = all[..n].to_vec();
            let gone = fewer.remove(1).address;
            let (shrunk, c) = base.update(&fewer, &[]);
            assert_eq!(c.removed, vec![(1, gone.clone())]);
            let after = owners(&router_for(&shrunk), &keys);
            let moved: Vec<usize> = (0..keys.len()).filter(|&i| before[i] != after[i]).collect();
            assert!(moved.iter().all(|&i| before[i] == gone));
            let frac = moved.len() as f64 / keys.len() as f64;
            assert!(
                frac <= 1.0 / n as f64 + 0.05,
                "{n} -> {}: {frac} of the keys moved",
                n - 1
            );
            eprintln!("{n} hosts: one leaving moved {frac:.4} of the keys");
        }
    }

    #[test]
    fn config_errors_name_the_field() {
        let raw = |j: serde_json::Value| serde_json::from_value::<RawMembership>(j).unwrap();
        assert!(raw(serde_json::json!({"cluster": "llm"})).compile().is_ok());
        let e = raw(serde_json::json!({"cluster": "llm", "admin_cluster": "llm"}))
            .compile()
            .unwrap_err();
        assert_eq!(e.field, "membership.admin_cluster");
        let e = raw(serde_json::json!({"cluster": "llm", "interval_ms": 5}))
            .compile()
            .unwrap_err();
        assert_eq!(e.field, "membership.interval_ms");
        let e = raw(serde_json::json!({"cluster": "llm", "timeout_ms": 5000}))
            .compile()
            .unwrap_err();
        assert_eq!(e.field, "membership.timeout_ms");
        let e = RawFailover { hosts: 9 }.compile().unwrap_err();
        assert_eq!(e.field, "failover.hosts");
        // `hosts` is optional with `membership` only.
        let c = Config::from_json(br#"{"membership": {"cluster": "llm"}}"#).unwrap();
        assert!(c.hosts.is_empty());
        assert_eq!(c.membership.unwrap().admin_cluster, "envoy_admin");
        let e = Config::from_json(br#"{"hosts": []}"#).unwrap_err();
        assert_eq!(e.field, "hosts");
        let e = Config::from_json(
            br#"{"hosts": [{"address": "127.0.0.1:1"}], "membership": {"cluster": "llm", "x": 1}}"#,
        )
        .unwrap_err();
        assert_eq!(e.field, "membership.x");
        let c = Config::from_json(
            br#"{"hosts": [{"address": "127.0.0.1:1"}], "failover": {"hosts": 0}}"#,
        )
        .unwrap();
        assert_eq!(c.failover_hosts, 0);
    }

    #[test]
    fn failover_names_the_ring_successors_skipping_ineligible_hosts() {
        use crate::load::HostLoad;
        let (t, _) = Table::default().update(&(1..=5).map(member).collect::<Vec<_>>(), &[]);
        let r = router_for(&t);
        assert_eq!(r.config().failover_hosts, 2);
        let loads = vec![HostLoad::default(); 5];
        for i in 0..200u64 {
            let k = crate::hash::hash(&i.to_le_bytes(), 3);
            let walk: Vec<usize> = r.ring().walk(k).collect();
            let f = r.failover(k, walk[0], &loads, 0);
            assert_eq!(f, walk[1..3].to_vec());
            let d = r.destination(walk[0], &f).unwrap();
            assert_eq!(d.split(',').count(), 3);
            assert!(d.starts_with(&r.config().hosts[walk[0]].address));
            // An ejected successor is skipped.
            let mut ej = loads.clone();
            ej[walk[1]].ejected = true;
            assert_eq!(r.failover(k, walk[0], &ej, 0), walk[2..4].to_vec());
        }
        // An unhealthy member (Envoy's health flags) is never chosen.
        let mut ms: Vec<Member> = (1..=5).map(member).collect();
        ms[2].healthy = false;
        let (t2, _) = t.update(&ms, &[]);
        let r2 = router_for(&t2);
        for i in 0..2000u64 {
            let k = crate::hash::hash(&i.to_le_bytes(), 4);
            let key = crate::Key {
                hash: k,
                source: crate::KeySource::Prompt,
                bytes_hashed: 0,
                prompt_bytes: 0,
                group: k,
                anchored: false,
                preamble_group: false,
            };
            let req = crate::Request::new(crate::extract::Api::ChatCompletions, b"", &loads, 0)
                .with_key(key);
            match r2.decide(&req).decision {
                crate::Decision::Routed { host, .. } => assert_ne!(host, 2),
                d => panic!("{d:?}"),
            }
            assert!(!r2.failover(k, 0, &loads, 0).contains(&2));
        }
        // Failover off: the chosen host alone.
        let mut cfg = r.config().clone();
        cfg.failover_hosts = 0;
        let r0 = Router::new(cfg);
        assert!(r0.failover(1, 0, &loads, 0).is_empty());
        assert_eq!(r0.destination(0, &[]).unwrap(), "127.0.0.1:1");
    }

    #[test]
    fn peers_are_the_healthy_hosts_of_their_cluster_less_this_envoy() {
        let body = serde_json::to_vec(&serde_json::json!({"cluster_statuses": [
            {"name": "prefix_router_peers", "host_statuses": [
                {"address": {"socket_address": {"address": "10.0.0.3", "port_value": 10000}}},
                {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 10000}}},
                {"address": {"socket_address": {"address": "10.0.0.2", "port_value": 10000}}},
                {"address": {"socket_address": {"address": "10.0.0.4", "port_value": 10000}},
                 "health_status": {"failed_outlier_check": true}}
            ]}
        ]}))
        .unwrap();
        assert_eq!(
            parse_peers(&body, "prefix_router_peers", Some("10.0.0.2:10000")).unwrap(),
            vec!["10.0.0.1:10000", "10.0.0.3:10000"]
        );
        assert_eq!(
            parse_peers(&body, "prefix_router_peers", None)
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn a_table_left_by_membership_is_checked_against_static_hosts() {
        let cfg = Config::with_hosts(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]).unwrap();
        let seeded = Table::seed(&cfg.hosts);
        assert!(!table_disagrees(&seeded, &cfg.hosts));
        // Host 1 went and 4 came into its slot: index 1 now means another host.
        let (t, _) = seeded.update(&[member(1), member(4), member(3)], &[]);
        assert!(table_disagrees(&t, &cfg.hosts));
        let (t2, _) = seeded.update(&[member(1), member(2)], &[]);
        assert!(table_disagrees(&t2, &cfg.hosts));
        let s = MemStore::default();
        sync(&s, &[member(1)], &cfg.hosts).unwrap();
        assert!(read_table(&s).unwrap().is_some());
        clear_table(&s).unwrap();
        assert_eq!(read_table(&s).unwrap(), None);
    }

    #[test]
    fn no_hosts_yet_falls_back_in_every_mode() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hello there"}]}"#;
        for mode in ["spill", "off", "index"] {
            let json =
                format!(r#"{{"membership": {{"cluster": "llm"}}, "cost": {{"mode": "{mode}"}}}}"#);
            let r = Router::new(Config::from_json(json.as_bytes()).unwrap());
            let api = crate::extract::Api::ChatCompletions;
            let d = r.decide(&crate::Request::new(api, body, &[], 0)).decision;
            assert!(matches!(d, crate::Decision::Fallback(_)), "{mode}: {d:?}");
            let idx = crate::index::PrefixIndex::new(r.config().cost.index);
            let d = r
                .decide(&crate::Request::new(api, body, &[], 0).with_index(&idx))
                .decision;
            assert!(matches!(d, crate::Decision::Fallback(_)), "{mode}: {d:?}");
            assert!(r.failover(1, 0, &[], 0).is_empty());
        }
    }
}
