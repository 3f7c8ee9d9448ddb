//! Extraction's work budget (`extract::budget`): what it charges is a
//! count of elements weighed by their measured cost, not a time, so these
//! outcomes are the same on every machine and in the .wasm.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod bodies;

use prefix_router_core::extract::{self, Api, ExtractError, Scan};

/// Legitimate bodies, the richest in structure included (short turns, an
/// agent with 120 tools), are extracted within three quarters of their
/// budget; the element-dense bodies of issue 21 stop at it. A megabyte of
/// whitespace is bytes, not elements: it costs what a plain prompt does
/// and routes.
#[test]
fn legitimate_bodies_fit_their_budget_and_dense_ones_stop() {
    let mut stopped = 0;
    let dense: Vec<String> = bodies::escape_dense().into_iter().map(|c| c.0).collect();
    for (name, body) in bodies::cases() {
        if dense.contains(&name) {
            continue;
        }
        let legit = ["plain_", "short_turn_", "agent_", "whitespace_"]
            .iter()
            .any(|p| name.starts_with(p));
        let r = extract::extract(Api::ChatCompletions, &body, &mut Vec::new());
        if legit {
            assert!(r.is_ok(), "{name}: {r:?}");
        } else {
            assert!(
                matches!(r, Err(ExtractError::TooComplex(_))),
                "{name}: {r:?}"
            );
            stopped += 1;
        }
        if legit {
            let tight = extract::budget(body.len()) * 3 / 4;
            let r = Scan::with_budget(&body, tight).extract(Api::ChatCompletions, &mut Vec::new());
            assert!(r.is_ok(), "{name} within 3/4 of its budget: {r:?}");
        }
    }
    assert_eq!(stopped, 17);
    a_few_dense_elements_fit_the_fixed_allowance();
    realistic_escapes_route();
}

/// Text that clients escape densely routes when its escapes fit the
/// budget (charged what they cost, `json_stream::cost`): CJK as Python's
/// `json.dumps` writes it (every character `\uXXXX`) and text with
/// `\r\n` line ends, at the red team's sizes and at 64 KiB. At 1 MiB,
/// and German prose, pasted CSV and JSON-in-string tool turns even at
/// 64 KiB, they cost more than 3x a plain prompt of their size and fall
/// back, as the adversarial escape bodies do; so does a coding agent's
/// chat of source files, whose escapes are charged about twice what they
/// cost (docs/design.md, "Extraction's work budget"), in tool messages
/// or in `tool_result` parts. The router keys such bodies by their raw
/// `messages` head instead. (Part of the test above.)
fn realistic_escapes_route() {
    let run = |b: &[u8]| extract::extract(Api::ChatCompletions, b, &mut Vec::new()).err();
    for body in [
        bodies::cjk_escaped(18_000),
        bodies::cjk_escaped(64 << 10),
        bodies::crlf_text(28_000),
        bodies::crlf_text(64 << 10),
    ] {
        assert_eq!(run(&body), None, "{}", body.len());
    }
    for (name, body) in bodies::escape_dense() {
        let r = run(&body);
        let routed = matches!(name.as_str(), "cjk_u_escapes_64KiB" | "crlf_text_64KiB");
        assert_eq!(r.is_none(), routed, "{name}: {r:?}");
        if !routed {
            assert!(matches!(r, Some(ExtractError::TooComplex(_))), "{name}");
        }
    }
}

/// The budget grows with the body: the same dense elements fit in a small
/// body's fixed allowance and stop in a large one. (Part of the test
/// above: as a second test in this binary, node's WASI crashes at exit.)
fn a_few_dense_elements_fit_the_fixed_allowance() {
    let body = |n: usize| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{}]}}]}}"#,
            vec!["{}"; n].join(",")
        )
        .into_bytes()
    };
    let run = |b: &[u8]| extract::extract(Api::ChatCompletions, b, &mut Vec::new()).err();
    assert_eq!(run(&body(200)), None);
    assert!(matches!(
        run(&body(200_000)),
        Some(ExtractError::TooComplex(_))
    ));
    // Escapes are charged wherever they are, keys and roles included, and
    // a long run of them stops before its end.
    let esc = |n: usize| "\\n".repeat(n);
    for (n, over) in [(100, false), (300_000, true)] {
        for b in [
            format!(
                r#"{{"{}":0,"messages":[{{"role":"user","content":"q"}}]}}"#,
                esc(n)
            ),
            format!(r#"{{"messages":[{{"role":"{}","content":"q"}}]}}"#, esc(n)),
            format!(
                r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
                esc(n)
            ),
        ] {
            let r = run(b.as_bytes());
            assert_eq!(
                matches!(r, Some(ExtractError::TooComplex(_))),
                over,
                "{n}: {r:?}"
            );
        }
    }
}
