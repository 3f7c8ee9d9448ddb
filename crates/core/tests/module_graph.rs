//! crates/core has no import cycle among its modules.
//!
//! Reads every `src/*.rs`, takes the `crate::<module>` paths in its code
//! (`use crate::a::X`, `use crate::{a::X, b::Y}`, `crate::a::f()` inline,
//! and `crate::Name` for a name `lib.rs` re-exports from a module; comments
//! and doc links do not count, test modules do), and fails on any cycle,
//! printing it. Run: `cargo test -p prefix-router-core --test module_graph`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The source without comments (`//…` to the end of the line, `/* … */`)
/// and without the contents of string and char literals, so neither doc
/// links nor text mentioning `crate::x` count as edges.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            // Block comments nest in Rust.
            let mut depth = 0usize;
            while i < b.len() {
                if src[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if src[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(n) = raw_string_len(rest) {
            out.push_str("\"\"");
            i += n;
        } else if rest.starts_with('"') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if let Some(n) = char_literal_len(rest) {
            out.push_str("' '");
            i += n;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Length of a raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`) at the
/// start of `s`, if there is one.
fn raw_string_len(s: &str) -> Option<usize> {
    let start = if s.starts_with("br") {
        2
    } else if s.starts_with('r') {
        1
    } else {
        return None;
    };
    let hashes = s[start..].bytes().take_while(|&c| c == b'#').count();
    let open = start + hashes;
    if s.as_bytes().get(open) != Some(&b'"') {
        return None;
    }
    let close = format!("\"{}", "#".repeat(hashes));
    let end = s[open + 1..].find(&close)?;
    Some(open + 1 + end + close.len())
}

/// Length of a char literal (`'x'`, `'\n'`, `'\u{1F600}'`) at the start of
/// `s`; `None` for a lifetime (`'a`).
fn char_literal_len(s: &str) -> Option<usize> {
    let rest = s.strip_prefix('\'')?;
    if let Some(esc) = rest.strip_prefix('\\') {
        let end = esc.find('\'')?;
        return Some(2 + end + 1);
    }
    let c = rest.chars().next()?;
    rest[c.len_utf8()..]
        .starts_with('\'')
        .then(|| 1 + c.len_utf8() + 1)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segments after each `crate::` in `code`, expanding
/// `crate::{a::X, b}` groups.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(p) = rest.find("crate::") {
        let before = rest[..p].chars().next_back();
        rest = &rest[p + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue; // e.g. `my_crate::` or `$crate::`
        }
        let tail = rest.trim_start();
        if let Some(group) = tail.strip_prefix('{') {
            // Top-level items of the group: split on commas at depth 0.
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && is_ident(c) => {
                        let name: String =
                            group[i..].chars().take_while(|&c| is_ident(c)).collect();
                        out.push(name);
                        item_start = false;
                    }
                    c if !c.is_whitespace() => item_start = false,
                    _ => {}
                }
            }
        } else {
            let name: String = tail.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// Names `lib.rs` re-exports from a module (`pub use m::{A, B};`), mapped
/// to that module.
fn reexports(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = path.split_once("::") else {
            continue;
        };
        let module = module.trim().trim_start_matches("crate::");
        if !modules.contains(module) {
            continue;
        }
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.split(" as ").last().unwrap_or("").trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.to_string());
            }
        }
    }
    out
}

/// Module -> the modules its code names.
fn module_graph(src_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(src_dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "rs") {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            files.insert(stem, code_only(&std::fs::read_to_string(&p).unwrap()));
        }
        // A module directory (src/m/…) would need reading too; there is none.
        assert!(
            !p.is_dir(),
            "{}: module directories are not read by this test; extend it",
            p.display()
        );
    }
    let lib = files.remove("lib").expect("src/lib.rs");
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let names = reexports(&lib, &modules);
    let mut g = BTreeMap::new();
    for (m, code) in &files {
        let deps: BTreeSet<String> = crate_paths(code)
            .into_iter()
            .filter_map(|n| {
                if modules.contains(&n) {
                    Some(n)
                } else {
                    names.get(&n).cloned()
                }
            })
            .filter(|d| d != m)
            .collect();
        g.insert(m.clone(), deps);
    }
    g
}

/// A cycle of `g` (its modules in order, the first repeated at the end),
/// if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // 0 unvisited, 1 on the DFS stack, 2 done.
    fn dfs(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            match state.get(d).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == d).unwrap_or(0);
                    let mut c = stack[from..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = dfs(g, d, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = dfs(g, m, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn graph(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in edges {
        g.entry(a.to_string()).or_default().insert(b.to_string());
        g.entry(b.to_string()).or_default();
    }
    g
}

#[test]
// Reads the crate's files: not under wasm32's WASI runner, which has no
// preopened directories (the native run covers it).
#[cfg_attr(target_os = "wasi", ignore = "reads repository files")]
fn core_modules_have_no_import_cycle() {
    let g = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    // The parse found the crate's modules and some of their edges.
    assert!(g.len() >= 10, "{g:?}");
    assert!(g["router"].contains("ring"), "{g:?}");
    if let Some(c) = find_cycle(&g) {
        let edges: Vec<String> = g
            .iter()
            .map(|(m, d)| {
                format!(
                    "  {m} -> {}",
                    d.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        panic!(
            "import cycle among crates/core modules: {}\n(uses of `crate::<module>` in each file's code)\n{}",
            c.join(" -> "),
            edges.join("\n")
        );
    }
}

#[test]
fn the_parse_sees_groups_inline_paths_and_reexports_not_comments() {
    let code = code_only(
        r##"
        //! see [`crate::doc_only`]
        use crate::{a::X, b::{Y, Z}, c};
        /* crate::block_comment */
        fn f() { crate::d::g(); let s = "crate::in_string"; let r = r#"crate::raw"#; }
        fn h<'a>(x: &'a str) -> char { let _ = my_crate::e::f(); '"' }
        fn k() -> crate::Router { crate::i::new() }
        "##,
    );
    assert_eq!(crate_paths(&code), ["a", "b", "c", "d", "Router", "i"]);
    let modules: BTreeSet<String> = ["router", "config"].iter().map(|s| s.to_string()).collect();
    let r = reexports(
        "pub mod router;\npub use config::{Config, ConfigError};\npub use router::{Decision, Router};",
        &modules,
    );
    assert_eq!(r.get("Router").map(String::as_str), Some("router"));
    assert_eq!(r.get("ConfigError").map(String::as_str), Some("config"));
}

#[test]
fn a_cycle_is_found_and_a_dag_passes() {
    let dag = graph(&[("a", "b"), ("b", "c"), ("a", "c")]);
    assert_eq!(find_cycle(&dag), None);
    let cyc = graph(&[
        ("cost", "index"),
        ("index", "shared"),
        ("shared", "load"),
        ("load", "cost"),
        ("x", "cost"),
    ]);
    let c = find_cycle(&cyc).unwrap();
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 5, "{c:?}");
}
