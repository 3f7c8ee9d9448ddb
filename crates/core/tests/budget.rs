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
    for (name, body) in bodies::cases() {
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
    assert_eq!(stopped, 13);
    a_few_dense_elements_fit_the_fixed_allowance();
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
