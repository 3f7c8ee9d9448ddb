//! The streaming extractor against the former serde extractor
//! (`reference/`): same canonical bytes, anchor position, metadata, and
//! error kind, on golden vectors, generated bodies for all four APIs, random
//! edits of them, and a corpus of every JSON literal in the repository's
//! sources and examples. Also `peek_meta` against the router's former
//! pre-pass, the canonical JSON writer against `write_canonical_json`, and
//! the routing key and chain through `KeySink`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod gen;
mod reference;

use gen::{mutate, Gen, Rng};
use prefix_router_core::config::KeyMode;
use prefix_router_core::extract::{
    self, canonical_json, peek_meta, Api, ExtractError, PromptSink, RequestMeta,
};
use prefix_router_core::key::KeySink;
use proptest::prelude::*;

const APIS: [Api; 4] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::Responses,
    Api::Messages,
];

#[derive(Default, Debug, PartialEq, Eq)]
struct Rec {
    bytes: Vec<u8>,
    anchor: Option<usize>,
    writes: usize,
}
impl PromptSink for Rec {
    fn write(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
        self.writes += 1;
    }
    fn anchor(&mut self) {
        assert!(self.anchor.is_none(), "anchor called twice");
        self.anchor = Some(self.bytes.len());
    }
}

/// What an extraction gives, comparable across implementations.
#[derive(Debug, PartialEq, Eq)]
enum Out {
    Ok {
        bytes: Vec<u8>,
        anchor: Option<usize>,
        model: String,
        user: Option<String>,
        salt: Option<String>,
    },
    Parse,
    Empty,
    TooComplex,
}

/// The outcome of one extraction whose stream went into `r`.
fn outcome(res: Result<RequestMeta<'_>, ExtractError>, r: Rec) -> Out {
    match res {
        Ok(m) => Out::Ok {
            bytes: r.bytes,
            anchor: r.anchor,
            model: m.model.into_owned(),
            user: m.user.map(|u| u.into_owned()),
            salt: m.cache_salt.map(|u| u.into_owned()),
        },
        Err(ExtractError::Parse(_)) => Out::Parse,
        Err(ExtractError::EmptyPrompt) => Out::Empty,
        Err(ExtractError::TooComplex(_)) => Out::TooComplex,
    }
}

fn run_new(api: Api, body: &[u8]) -> Out {
    let mut r = Rec::default();
    let res = extract::extract(api, body, &mut r);
    outcome(res, r)
}

/// The extractor with a budget of `work` ns.
fn run_budget(api: Api, body: &[u8], work: u64) -> Out {
    let mut r = Rec::default();
    let res = extract::Scan::with_budget(body, work).extract(api, &mut r);
    outcome(res, r)
}

fn run_ref(api: Api, body: &[u8]) -> Out {
    let mut r = Rec::default();
    let res = reference::extract(api, body, &mut r);
    outcome(res, r)
}

fn peek_new(body: &[u8]) -> Result<(String, Option<String>), ()> {
    peek_meta(body)
        .map(|m| (m.model.into_owned(), m.cache_salt.map(|s| s.into_owned())))
        .map_err(|_| ())
}

/// Key and strided chain of the whole stream in both key modes.
fn keys(api: Api, body: &[u8], new: bool) -> Vec<(u64, u64, u64, Vec<u64>)> {
    let mut v = Vec::new();
    for mode in [KeyMode::Conversation, KeyMode::Prefix] {
        let mut s = KeySink::with_chain(7, 16, mode, 40, api.structured(), 2);
        let ok = if new {
            extract::extract(api, body, &mut s).is_ok()
        } else {
            reference::extract(api, body, &mut s).is_ok()
        };
        if ok {
            v.push((
                s.key(),
                s.bytes_hashed(),
                s.stream_bytes(),
                s.chain_history().to_vec(),
            ));
        }
    }
    v
}

/// Compare everything for one body; returns the outcome. A body over its
/// work budget (deeply nested fields) is compared without the budget.
fn check(api: Api, body: &[u8]) -> Out {
    let new = run_new(api, body);
    let old = run_ref(api, body);
    if new == Out::TooComplex {
        assert_eq!(
            run_budget(api, body, u64::MAX),
            old,
            "api {api:?} without a budget"
        );
        return new;
    }
    assert_eq!(
        new,
        old,
        "api {api:?} body {:?}",
        String::from_utf8_lossy(body)
    );
    let scan = extract::Scan::new(body);
    assert_eq!(
        scan.meta()
            .map(|m| (m.model.into_owned(), m.cache_salt.map(|s| s.into_owned())))
            .map_err(|_| ()),
        peek_new(body),
        "Scan::meta, body {:?}",
        String::from_utf8_lossy(body)
    );
    let mut r = Rec::default();
    let res = scan.extract(api, &mut r);
    let via_scan = outcome(res, r);
    assert_eq!(via_scan, new, "Scan::extract");
    assert_eq!(
        peek_new(body),
        reference::peek_meta(body),
        "peek_meta, body {:?}",
        String::from_utf8_lossy(body)
    );
    if matches!(new, Out::Ok { .. }) {
        assert_eq!(
            keys(api, body, true),
            keys(api, body, false),
            "keys, api {api:?}"
        );
    }
    new
}

fn check_all(body: &[u8]) {
    for api in APIS {
        check(api, body);
    }
}

fn canon_ref(v: &[u8]) -> Result<Vec<u8>, ()> {
    let v: reference::J = serde_json::from_slice(v).map_err(|_| ())?;
    let mut out = Vec::new();
    reference::write_canonical_json(&v, &mut out);
    Ok(out)
}

// ---------------------------------------------------------------- golden

/// Exact bytes for representative bodies (also checked against the
/// reference), so a change to the canonical stream cannot pass silently.
#[test]
fn golden_vectors() {
    let cases: &[(Api, &str, &[u8])] = &[
        (
            Api::ChatCompletions,
            r#"{"messages":[{"content":"q","role":"user"}],"model":"m","tools":[{"b":1,"a":{"d":[1.0,-0,1e2],"c":"\u0041\n"}}]}"#,
            b"\x1etools\x1f[{\"b\":1,\"a\":{\"d\":[1.0,-0.0,100.0],\"c\":\"A\\n\"}}]\x1euser\x1fq",
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":[{"text":"a","type":"text"},{"type":"image_url","image_url":{"url":"u","detail":"low"},"cache_control":{}},"x",[]]}]}"#,
            b"\x1euser\x1fa\x1f\x1dimage_url\x1d4dca0041156128df\x1f\x1dpart\x1da4c6127b245bd7b9\x1f\x1dpart\x1d6446dcd307f43ff7",
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"},"type":"function"}],"name":"bob"},{"role":"tool","tool_call_id":"c","content":"42"}]}"#,
            b"\x1eassistant\x1f\x1fname=bob\x1ftool_calls=[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"},\"type\":\"function\"}]\x1etool\x1f42\x1ftool_call_id=c",
        ),
        (Api::Completions, r#"{"prompt":[[1,258],"x\ud83d\ude00",[]]}"#, b"\x01\x00\x00\x00\x02\x01\x00\x00\x1ex\xf0\x9f\x98\x80\x1e"),
        (
            Api::Responses,
            r#"{"input":[{"content":"hi","role":"user"},{"type":"function_call","name":"f","arguments":"{}"}],"instructions":"be\tbrief"}"#,
            b"\x1esystem\x1fbe\tbrief\x1euser\x1fhi\x1e\x1dfunction_call\x1d",
        ),
        (
            Api::Messages,
            r#"{"system":[{"type":"text","text":"S","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"q"}],"metadata":{"user_id":"u1"}}"#,
            b"\x1esystem\x1fS\x1euser\x1fq",
        ),
    ];
    for (api, body, want) in cases {
        let got = check(*api, body.as_bytes());
        let Out::Ok { bytes, .. } = got else {
            panic!("{body}: {got:?}")
        };
        // Marker hashes are pinned by the reference; compare the rest.
        if want.contains(&0x1d) && *api == Api::Responses {
            assert!(
                bytes.starts_with(want),
                "{body}: {:?}",
                String::from_utf8_lossy(&bytes)
            );
        } else {
            assert_eq!(
                &bytes[..],
                *want,
                "{body}: {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}

/// A message opened as clients write it (`{"role":"`, then
/// `,"content":`) takes its role and content without the member walk
/// (both passes); every tail still gives the reference's bytes and errors.
#[test]
fn role_head_fast_path() {
    let roles = [
        r#""user""#,
        r#""us\u0065r""#,
        r#""""#,
        r#""a\"b""#,
        r#""\ud800""#,
        r#""x"#,
    ];
    let tails = [
        r#","content":"a"}"#,
        r#"}"#,
        r#","content":"a","role":"b"}"#,
        r#","role":"b","content":"a"}"#,
        r#",}"#,
        r#","name":"n","content":[{"type":"text","text":"t"}]}"#,
        "",
        // The content head (`,"content":`) taken without the walk too.
        r#","content":null}"#,
        r#","content": "a" }"#,
        r#","content":"a","content":"b"}"#,
        r#","content":"a","name":"n","tool_calls":[{"id":"c"}]}"#,
        r#","content":[{"type":"text","text":"t"},{"type":"image_url"}]}"#,
        r#","content":"a\u0000","role":"b"}"#,
        r#","content":5}"#,
        r#","content":"a""#,
        r#","content":"#,
        r#","content" :"a"}"#,
    ];
    for r in roles {
        for t in tails {
            for body in [
                format!(r#"{{"messages":[{{"role":{r}{t}]}}"#),
                format!(r#"{{"messages":[{{"role":"system","content":"s"}},{{"role":{r}{t}]}}"#),
                format!(r#"{{"input":[{{"role":{r}{t}],"messages":[{{"role":{r}{t}]}}"#),
            ] {
                check_all(body.as_bytes());
            }
        }
    }
}

/// Errors and empty prompts, and the edge cases of serde's behaviour that
/// the streaming extractor reproduces on purpose.
#[test]
fn edge_cases() {
    use Out::{Empty, Parse};
    let parse: &[(Api, &str)] = &[
        (Api::ChatCompletions, ""),
        (Api::ChatCompletions, "not json"),
        (Api::ChatCompletions, r#"{"model":"m"}"#),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":5}]}"#,
        ),
        (Api::ChatCompletions, "[1,2]"),
        (
            Api::ChatCompletions,
            r#"{"model":"a","model":"b","messages":[{"role":"user","content":"x"}]}"#,
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"x","role":null}]}"#,
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":[{"type":"i","x":1e400}]}]}"#,
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"\udc00"}]}"#,
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"a"}]} x"#,
        ),
        (
            Api::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"a"},]}"#,
        ),
        (Api::Completions, r#"{"prompt":[4294967296]}"#),
        (Api::Completions, r#"{"prompt":[1,"a"]}"#),
        (Api::Completions, r#"{"prompt":["a",1]}"#),
        (Api::Completions, r#"{"prompt":[1.0]}"#),
        (Api::Completions, r#"{"prompt":"a","messages":5}"#),
        (Api::Responses, r#"{"input":[1]}"#),
        (Api::Responses, r#"{"input":5}"#),
    ];
    for (api, body) in parse {
        assert_eq!(check(*api, body.as_bytes()), Parse, "{body}");
    }
    let empty: &[(Api, &str)] = &[
        (Api::ChatCompletions, r#"{"messages":[]}"#),
        (Api::ChatCompletions, r#"{"messages":[],"tools":[{"a":1}]}"#),
        (Api::Completions, r#"{"prompt":""}"#),
        (Api::Completions, r#"{"prompt":[]}"#),
        (Api::Completions, r#"{"prompt":[[],""]}"#),
        (Api::Responses, r#"{"model":"m"}"#),
    ];
    for (api, body) in empty {
        assert_eq!(check(*api, body.as_bytes()), Empty, "{body}");
    }
    // Accepted, as serde accepts them.
    let ok: &[(Api, &[u8])] = &[
        (
            Api::ChatCompletions,
            br#"["m",[{"role":"user","content":"x"}]]"#,
        ),
        (Api::ChatCompletions, br#"["m",[["message","user","hi"]]]"#),
        (
            Api::ChatCompletions,
            b"{\"x\":\"\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
        ),
        (
            Api::ChatCompletions,
            br#"{"x":"\udc00","messages":[{"role":"user","content":"a"}]}"#,
        ),
        (
            Api::Messages,
            br#"{"messages":[{"role":"user","content":"a"}],"metadata":["u"]}"#,
        ),
        (
            Api::ChatCompletions,
            br#"{"m\u0065ssages":[{"role":"user","content":"a"}]}"#,
        ),
    ];
    for (api, body) in ok {
        assert!(
            matches!(check(*api, body), Out::Ok { .. }),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
}

/// serde's recursion limit inside values parsed whole (127 levels), and
/// unbounded depth elsewhere.
#[test]
fn nesting_depth() {
    for d in [1usize, 100, 126, 127, 128, 129, 300] {
        let deep = format!("{}0{}", "[".repeat(d), "]".repeat(d));
        let obj = format!("{}0{}", "{\"a\":".repeat(d), "}".repeat(d));
        for v in [&deep, &obj] {
            check_all(format!(r#"{{"messages":[{{"role":"user","content":[{v}]}}]}}"#).as_bytes());
            check_all(
                format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":{v}}}"#)
                    .as_bytes(),
            );
            check_all(
                format!(r#"{{"messages":[{{"role":"user","content":"x","tool_calls":{v}}}]}}"#)
                    .as_bytes(),
            );
            check_all(format!(r#"{{"prompt":{v}}}"#).as_bytes());
            assert_eq!(
                canonical_json(v.as_bytes()).ok(),
                canon_ref(v.as_bytes()).ok(),
                "depth {d}"
            );
        }
    }
    let n = 50_000;
    let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
    for body in [
        format!(r#"{{"x":{deep},"messages":[{{"role":"user","content":"a"}}]}}"#),
        format!(r#"{{"messages":[{{"role":"user","content":"a","x":{deep}}}]}}"#),
        format!(r#"{{"messages":[{{"role":"user","content":[{deep}]}}]}}"#),
        format!(r#"{{"messages":[{{"role":"user","content":"a"}}],"tools":{deep}}}"#),
        deep.clone(),
        deep[..deep.len() - 1].to_string(),
    ] {
        // Without a budget, the reference's outcome; within it, the same
        // or a stop at the budget (50,000 nested values in 100 KB).
        for api in APIS {
            let free = run_budget(api, body.as_bytes(), u64::MAX);
            assert_eq!(free, run_ref(api, body.as_bytes()), "{api:?} {:.40}", body);
            let capped = run_new(api, body.as_bytes());
            assert!(
                capped == free || capped == Out::TooComplex,
                "{api:?} {capped:?}"
            );
        }
    }
}

// ------------------------------------------------------------- generated

proptest! {
    // 6000 cases each by default; PROPTEST_CASES=n for more.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(6000),
        ..ProptestConfig::default()
    })]

    /// Generated bodies for every API (clean and with deliberate mistakes),
    /// each also under a few random edits.
    #[test]
    fn generated_bodies(seed in any::<u64>(), noise in prop_oneof![Just(0u64), Just(2), Just(6)]) {
        for api in APIS {
            let mut g = Gen::new(seed ^ api as u64, noise);
            g.body(api);
            let body = g.out;
            check(api, &body);
            let mut r = Rng(seed);
            let mut m = body.clone();
            for _ in 0..3 {
                mutate(&mut r, &mut m);
                check(api, &m);
            }
        }
    }

    /// Arbitrary JSON values: the streaming canonical writer against
    /// the reference's `write_canonical_json` of the value as written (bytes
    /// and errors).
    #[test]
    fn canonical_json_matches(seed in any::<u64>(), noise in prop_oneof![Just(0u64), Just(3)]) {
        let mut g = Gen::new(seed, noise);
        g.value(6);
        let v = g.out;
        prop_assert_eq!(canonical_json(&v).ok(), canon_ref(&v).ok(), "{:?}", String::from_utf8_lossy(&v));
    }

    /// Arbitrary bytes never panic and agree with the reference.
    #[test]
    fn arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_all(&data);
    }
}

/// How many generated bodies are accepted (so the generator is known to
/// exercise the success path, not only errors).
#[test]
fn generator_coverage() {
    for api in APIS {
        let (mut ok, mut empty, mut parse, mut over) = (0, 0, 0, 0);
        for seed in 0..3000u64 {
            let mut g = Gen::new(seed.wrapping_mul(0x9E37) ^ api as u64, 0);
            g.body(api);
            match check(api, &g.out) {
                Out::Ok { .. } => ok += 1,
                Out::Empty => empty += 1,
                Out::Parse => parse += 1,
                Out::TooComplex => over += 1,
            }
        }
        println!("{api:?}: ok {ok} empty {empty} parse {parse} over budget {over}");
        assert!(
            over <= 30,
            "{api:?}: {over} of 3000 generated bodies over budget"
        );
        assert!(
            ok >= 600,
            "{api:?}: only {ok} of 3000 generated bodies accepted"
        );
    }
}

// ---------------------------------------------------------------- corpus

/// Every string literal in the repository's Rust sources that looks like
/// JSON, and the example bodies, through all four APIs, plus edits.
#[test]
// Reads the repository's files: not under wasm32's WASI runner, which has no
// preopened directories (the native run covers it; the rest of this file runs
// there too).
#[cfg_attr(target_os = "wasi", ignore = "reads repository files")]
fn corpus_of_repository_bodies() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    let mut dirs = vec![
        root.join("crates"),
        root.join("tests"),
        root.join("examples"),
    ];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if !p.ends_with("target") {
                    dirs.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "rs" || x == "json") {
                files.push(p);
            }
        }
    }
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        if f.extension().is_some_and(|x| x == "json") {
            bodies.push(text.into_bytes());
            continue;
        }
        // r#"..."# literals starting with { or [.
        let mut rest = text.as_str();
        while let Some(p) = rest.find("r#\"") {
            rest = &rest[p + 3..];
            let Some(e) = rest.find("\"#") else { break };
            let lit = &rest[..e];
            if lit.trim_start().starts_with(['{', '[']) {
                bodies.push(lit.as_bytes().to_vec());
            }
            rest = &rest[e + 2..];
        }
    }
    assert!(
        bodies.len() > 100,
        "corpus has only {} bodies",
        bodies.len()
    );
    let mut r = Rng(1);
    let mut n = 0;
    for b in &bodies {
        check_all(b);
        n += 1;
        let mut m = b.clone();
        for _ in 0..20 {
            mutate(&mut r, &mut m);
            check_all(&m);
            n += 1;
        }
    }
    println!(
        "corpus: {} files, {} bodies, {n} checked per API",
        files.len(),
        bodies.len()
    );
}

/// The `route` fuzz target's inputs (its first two bytes pick the API, a
/// session and the loads; the rest is the body): the committed seeds, and
/// the local corpus of earlier fuzz runs when there is one
/// (`fuzz/corpus/route`, not committed), through all four APIs.
#[test]
#[cfg_attr(target_os = "wasi", ignore = "reads repository files")]
fn fuzz_inputs_agree_with_the_reference() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut n = 0;
    for dir in ["seeds/route", "corpus/route"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(data) = std::fs::read(e.path()) else {
                continue;
            };
            if let Some(body) = data.get(2..) {
                check_all(body);
                n += 1;
            }
        }
    }
    println!("fuzz inputs: {n} bodies checked per API");
    assert!(
        n >= 5,
        "only {n} fuzz inputs found under {}",
        root.display()
    );
}

/// Bodies the size of real ones, and the adversarial element-heavy ones.
#[test]
fn large_bodies() {
    let text = "lorem ipsum \\\"dolor\\\" sit \\u00e9met\\n ".repeat(2000);
    let mut msgs = vec![format!(r#"{{"role":"system","content":"{text}"}}"#)];
    for i in 0..40 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        msgs.push(format!(r#"{{"content":"{text}{i}","role":"{role}"}}"#));
    }
    let chat = format!(
        r#"{{"model":"m","messages":[{}],"tools":[{{"x":"{text}"}}]}}"#,
        msgs.join(",")
    );
    check_all(chat.as_bytes());
    // Element-dense bodies: over their work budget (a counted fallback in
    // the router), and with no budget the reference's bytes.
    let empties = format!(r#"{{"messages":[{}]}}"#, vec!["{}"; 30_000].join(","));
    let parts = format!(
        r#"{{"messages":[{{"role":"user","content":[{}]}}]}}"#,
        vec!["0"; 30_000].join(",")
    );
    for body in [empties.as_bytes(), parts.as_bytes()] {
        assert_eq!(
            run_new(Api::ChatCompletions, body),
            Out::TooComplex,
            "{:.60}",
            String::from_utf8_lossy(body)
        );
        for api in APIS {
            assert_eq!(run_budget(api, body, u64::MAX), run_ref(api, body));
        }
    }
}

/// Many repeated short non-text parts (the extractor memoizes their
/// markers by their bytes), in every spelling that canonicalizes alike.
#[test]
fn repeated_short_parts() {
    let vals = [
        "0",
        "-0",
        "1e2",
        "100",
        "1.0",
        "\"a\"",
        "\"\"",
        "{}",
        "{ }",
        "[]",
        "[ ]",
        "true",
        "null",
        "false",
        "\"é\"",
        "[0]",
        "[0,1]",
        "{\"a\":1}",
        "-1.5e-3",
        "1e400",
        "\"\\u0041\"",
        "[{}]",
    ];
    let mut r = Rng(5);
    for _ in 0..300 {
        let n = 1 + r.below(40);
        let parts: Vec<&str> = (0..n)
            .map(|_| {
                let v = *r.pick(&vals);
                if v == "1e400" && r.pct(90) {
                    "1"
                } else {
                    v
                }
            })
            .collect();
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":[{}]}},{{"role":"user","content":[{}]}}]}}"#,
            parts.join(","),
            parts.join(" , ")
        );
        check_all(body.as_bytes());
    }
}

/// The element fast paths (empty objects as messages, parts and Responses
/// items; numbers of every length as parts) give the reference's bytes.
#[test]
fn element_fast_paths() {
    let nums = [
        "7",
        "-7",
        "12345",
        "1234567",
        "12345678",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "0.5",
        "1E2",
    ];
    let parts = format!("[{},{{}},{{ }},{}]", nums.join(","), nums.join(" , "));
    let bodies = [
        format!(r#"{{"messages":[{{}},{{ }},{{"role":"user","content":{parts}}},{{}}]}}"#),
        format!(r#"{{"input":[{{}},{{"role":"user","content":{parts}}},{{ }}]}}"#),
        r#"{"messages":[{},{"role":"user","content":"x"}],"input":[{},{"role":"user","content":"x"}]}"#
            .to_string(),
    ];
    for body in &bodies {
        check_all(body.as_bytes());
    }
}

/// Text parts as clients open them give the reference's bytes and errors,
/// whatever follows the text: the compact form (taken without the member
/// walk, `json_stream::TEXT_PART_HEAD`) and Python's separators.
#[test]
fn text_part_fast_path() {
    let heads = [r#"{"type":"text","text":"#, r#"{"type": "text", "text": "#];
    let texts = [
        r#""a""#,
        r#""""#,
        r#""\u00e9 \"q\" \ud83d\ude00""#,
        r#""é""#,
        r#""\x""#,
        r#""open"#,
    ];
    let tails = [
        "}",
        " }",
        r#","cache_control":{"type":"ephemeral"}}"#,
        r#", "x": [1, {"y": null}] }"#,
        r#","text":"b"}"#,
        r#","type":"image"}"#,
        r#","type":null}"#,
        ",}",
        "",
    ];
    for head in heads {
        for text in texts {
            for tail in tails {
                let part = format!("{head}{text}{tail}");
                for content in [
                    format!("[{part}]"),
                    format!("[{part},{part}]"),
                    format!("[{{}}, {part}]"),
                ] {
                    let body = format!(
                        r#"{{"messages":[{{"role":"user","content":{content}}},{{"role":"assistant","content":"x"}}]}}"#
                    );
                    check_all(body.as_bytes());
                }
            }
        }
    }
}

/// Objects of up to three members, some `cache_control`, with whitespace
/// (none, a space, a newline) at each place it may go and values of each
/// kind: canonical JSON copies the body in runs and writes a comma only
/// between written members, so every cut of a run is met here; also with a
/// token missing or one too many (the errors).
#[test]
fn member_runs() {
    let keys = [r#""a""#, r#""cache_control""#, r#""t\u0079pe""#];
    let vals = [
        "1",
        "2.50",
        r#""x\ny""#,
        "{}",
        "[1, {\"cache_control\":0}]",
        "[ ]",
    ];
    let gaps = ["", " ", "\n "];
    let mut n = 0;
    for k in 1..=3usize {
        for mask in 0..3usize.pow(k as u32) {
            for (g, v) in gaps.iter().zip(vals.iter().cycle().skip(mask)) {
                let (mut m, mut body) = (mask, String::from("{"));
                for j in 0..k {
                    let key = keys[m % 3];
                    m /= 3;
                    if j > 0 {
                        body.push_str(&format!("{g},{g}"));
                    }
                    body.push_str(&format!("{g}{key}{g}:{g}{v}"));
                }
                body.push_str(&format!("{g}}}"));
                for v in [
                    body.clone(),
                    format!("[{body}]"),
                    body.replacen(',', "", 1),
                    body.replacen(',', ",,", 1),
                    body.replacen(':', "", 1),
                    format!("{{{g}\"o\":{body},{body}"),
                ] {
                    assert_eq!(
                        canonical_json(v.as_bytes()).ok(),
                        canon_ref(v.as_bytes()).ok(),
                        "{v}"
                    );
                    n += 1;
                }
            }
        }
    }
    assert!(n > 200, "{n}");
}

/// Two-member objects (ordered by one comparison): every order, duplicate
/// keys however spelled, and `cache_control`, as the reference writes them.
#[test]
fn two_member_objects() {
    let keys = [
        r#""a""#,
        r#""b""#,
        r#""\u0061""#,
        r#""ab""#,
        r#""cache_control""#,
        r#""cache\u005fcontrol""#,
        r#""abcdefghij""#,
        r#""abcdefghik""#,
        r#""é""#,
        r#""""#,
    ];
    for x in keys {
        for y in keys {
            let v = format!(r#"[{{{x}:1,{y}:2}},{{"o":{{{x}:[3],{y}:{{}}}}}}]"#);
            assert_eq!(
                canonical_json(v.as_bytes()).ok(),
                canon_ref(v.as_bytes()).ok(),
                "{v}"
            );
        }
    }
    // A dropped `cache_control` is still checked as serde checks any value
    // (its numbers, its depth), and duplicates keep their places.
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    for v in [
        r#"{"cache_control":1e400,"a":1}"#.to_string(),
        r#"{"cache_control":[1,-0,"\ud800"],"a":1}"#.to_string(),
        r#"{"a":1,"cache_control":{"cache_control":2},"a":3,"type":"x","type":"y"}"#.to_string(),
        format!(r#"{{"cache_control":{}}}"#, deep(126)),
        format!(r#"{{"cache_control":{}}}"#, deep(127)),
        format!(r#"[{{"cache_control":{}}}]"#, deep(126)),
    ] {
        assert_eq!(
            canonical_json(v.as_bytes()).map_err(|_| ()),
            canon_ref(v.as_bytes()),
            "{v:.80}"
        );
    }
}
