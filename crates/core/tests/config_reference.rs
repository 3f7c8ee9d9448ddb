//! docs/config.md, the configuration reference, is generated from one
//! source: the doc comments of the serde structs the filter JSON is read
//! into (`Raw*`, crates/core/src), and the defaults those structs really
//! deserialize to. This test regenerates it and fails when the committed
//! file differs. Regenerate with
//!
//!     PREFIX_ROUTER_BLESS=1 cargo test -p prefix-router-core --test config_reference
//!
//! What it reads, so new sections and fields need no edit here:
//! - every `#[derive(.. Deserialize ..)] pub struct` in crates/core/src/*.rs:
//!   its doc comment (the section's text) and each `pub` field's doc
//!   comment, `#[serde(default ..)]` / `rename` attribute and type;
//! - a field's line `Allowed: ...` in its doc comment is its allowed
//!   values (otherwise they follow from its type);
//! - starting at `RawConfig`, a field whose type (or `Option<T>`,
//!   `Vec<T>`) is another such struct is a section, documented in turn;
//! - defaults: a probe config (every section present, required fields
//!   filled with placeholders) deserialized into `RawConfig` by serde, read
//!   back from its `Debug` form, so the default shown is the one the code
//!   uses, not a copy.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prefix_router_core::config::RawConfig;

const BLESS: &str = "PREFIX_ROUTER_BLESS";
const COMMAND: &str =
    "PREFIX_ROUTER_BLESS=1 cargo test -p prefix-router-core --test config_reference";

/// A field of a deserialized struct, as written in the source.
#[derive(Debug, Clone)]
struct Field {
    /// The Rust name (the `Debug` form's).
    rust: String,
    /// The JSON key (`rename` applied).
    json: String,
    /// The Rust type, as written.
    ty: String,
    /// Doc text, without the `Allowed:` line.
    doc: String,
    /// The `Allowed:` line, if any.
    allowed: Option<String>,
    /// `#[serde(default)]` or `#[serde(default = "..")]`.
    has_default: bool,
}

#[derive(Debug, Clone)]
struct Struct {
    doc: String,
    fields: Vec<Field>,
}

/// Doc comment lines (`/// x`) joined into paragraphs: lines join with a
/// space, an empty `///` line separates paragraphs.
fn join_doc(lines: &[String]) -> String {
    let mut paras: Vec<String> = vec![String::new()];
    for l in lines {
        let l = l.trim();
        if l.is_empty() {
            if !paras.last().unwrap().is_empty() {
                paras.push(String::new());
            }
            continue;
        }
        let p = paras.last_mut().unwrap();
        if !p.is_empty() {
            p.push(' ');
        }
        p.push_str(l);
    }
    paras.retain(|p| !p.is_empty());
    paras.join("\n\n")
}

/// Intra-doc links: `[`crate::m::X`]` becomes a link to the module's
/// source (`crates/core/src/m.rs`, relative to docs/), any other
/// `[`x`]` / `[`x`](..)` a plain code span.
fn unlink(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("[`") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.find("`]") {
            Some(j) => {
                let code = &after[..j + 1];
                match code.trim_matches('`').strip_prefix("crate::") {
                    Some(path) => {
                        let module = path.split("::").next().unwrap_or(path);
                        write!(out, "[{code}](../crates/core/src/{module}.rs)").unwrap();
                    }
                    None => out.push_str(code),
                }
                rest = &after[j + 2..];
                // An explicit target `(...)` after the link goes too.
                if rest.starts_with('(') {
                    if let Some(k) = rest.find(')') {
                        rest = &rest[k + 1..];
                    }
                }
            }
            None => {
                out.push_str("[`");
                rest = after.get(1..).unwrap_or("");
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every `Deserialize` struct in `src`, by name.
fn parse_structs(src: &str) -> BTreeMap<String, Struct> {
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = src.lines().collect();
    let mut i = 0;
    let mut doc: Vec<String> = Vec::new();
    let mut attrs: Vec<String> = Vec::new();
    while i < lines.len() {
        let t = lines[i].trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.strip_prefix(' ').unwrap_or(d).to_string());
        } else if t.starts_with("#[") {
            attrs.push(t.to_string());
        } else if let Some(rest) = t.strip_prefix("pub struct ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let derives = attrs
                .iter()
                .any(|a| a.starts_with("#[derive(") && a.contains("Deserialize"));
            if derives && rest.trim_end().ends_with('{') {
                let (fields, end) = parse_fields(&lines, i + 1, &name);
                out.insert(
                    name,
                    Struct {
                        doc: unlink(&join_doc(&doc)),
                        fields,
                    },
                );
                i = end;
            }
            doc.clear();
            attrs.clear();
        } else {
            doc.clear();
            attrs.clear();
        }
        i += 1;
    }
    out
}

/// The fields of a struct whose body starts at `lines[start]`; returns
/// them and the index of the closing `}` line.
fn parse_fields(lines: &[&str], start: usize, name: &str) -> (Vec<Field>, usize) {
    let mut fields = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut serde: Vec<String> = Vec::new();
    let mut i = start;
    while i < lines.len() {
        let t = lines[i].trim();
        if t == "}" {
            return (fields, i);
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.strip_prefix(' ').unwrap_or(d).to_string());
        } else if t.starts_with("#[serde(") {
            serde.push(t.to_string());
        } else if t.starts_with("#[") || t.is_empty() || t.starts_with("//") {
            // Other attributes and comments.
        } else if let Some(rest) = t.strip_prefix("pub ") {
            let (fname, ty) = rest
                .split_once(':')
                .unwrap_or_else(|| panic!("{name}: cannot read the field line {t:?}"));
            let ty = unqualified(ty.trim().trim_end_matches(','));
            assert!(
                !ty.is_empty(),
                "{name}.{fname}: write the field's type on its line"
            );
            let rename = serde.iter().find_map(|a| {
                let r = a.split("rename = \"").nth(1)?;
                Some(r.split('"').next()?.to_string())
            });
            let has_default = serde
                .iter()
                .any(|a| a.contains("(default") || a.contains(" default"));
            let allowed_at = doc.iter().position(|l| l.starts_with("Allowed: "));
            let allowed = allowed_at.map(|k| {
                let a = doc.remove(k);
                a.trim_start_matches("Allowed: ")
                    .trim()
                    .trim_end_matches('.')
                    .to_string()
            });
            fields.push(Field {
                rust: fname.trim().to_string(),
                json: rename.unwrap_or_else(|| fname.trim().to_string()),
                ty,
                doc: unlink(&join_doc(&doc)),
                allowed,
                has_default,
            });
            doc.clear();
            serde.clear();
        } else {
            panic!(
                "{name}: only `pub` fields are read (a private field is not configurable): {t:?}"
            );
        }
        i += 1;
    }
    panic!("{name}: no closing brace");
}

/// `Option<T>` -> `T`, `Vec<T>` -> `T`, else the type.
fn strip(ty: &str, wrapper: &str) -> Option<String> {
    ty.strip_prefix(wrapper)?
        .strip_prefix('<')?
        .strip_suffix('>')
        .map(|s| s.trim().to_string())
}

/// The section struct a field's type names, and whether it is an array.
fn section_of(ty: &str, structs: &BTreeMap<String, Struct>) -> Option<(String, bool)> {
    let inner = strip(ty, "Option").unwrap_or_else(|| ty.to_string());
    if let Some(t) = strip(&inner, "Vec") {
        return structs.contains_key(&t).then_some((t, true));
    }
    structs.contains_key(&inner).then_some((inner, false))
}

/// The type as the JSON has it.
fn json_type(ty: &str, structs: &BTreeMap<String, Struct>) -> String {
    if let Some(t) = strip(ty, "Option") {
        return format!("{} or null", json_type(&t, structs));
    }
    if let Some(t) = strip(ty, "Vec") {
        let inner = json_type(&t, structs);
        return match inner.as_str() {
            "object" => "array of objects".to_string(),
            _ => format!("array of {inner}s"),
        };
    }
    match ty {
        "String" => "string".into(),
        "bool" => "boolean".into(),
        "f32" | "f64" => "number".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i8" | "i16" | "i32" | "i64" => "integer".into(),
        t if structs.contains_key(t) => "object".into(),
        // Another serde type (e.g. an enum): its Rust name; the doc
        // comment says what it takes.
        t => format!("`{t}`"),
    }
}

/// What a field allows when its doc has no `Allowed:` line: a boolean's
/// values; for anything else the validation may narrow the type, so the
/// text says.
fn type_allows(ty: &str) -> String {
    match ty {
        "bool" => "`true`, `false`".into(),
        "Option<bool>" => "`true`, `false`, null".into(),
        _ => "see the text".into(),
    }
}

/// A type with its paths dropped: `Option<crate::m::RawX>` ->
/// `Option<RawX>` (sections are found by their struct's name).
fn unqualified(ty: &str) -> String {
    let mut out = String::with_capacity(ty.len());
    let mut word = String::new();
    let mut chars = ty.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            word.clear();
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            out.push_str(&word);
            word.clear();
            if !c.is_whitespace() {
                out.push(c);
            }
        }
    }
    out.push_str(&word);
    out
}

// ------------------------------------------------------------- defaults

/// A value read back from `{:?}` of the deserialized config.
#[derive(Debug, Clone, PartialEq)]
enum V {
    Obj(Vec<(String, V)>),
    Arr(Vec<V>),
    Str(String),
    Num(String),
    Bool(bool),
    Null,
}

/// A parser of derived `Debug` output (structs, `Vec`s, `Option`s,
/// strings, numbers, booleans): what the `Raw*` structs are made of.
struct DebugParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl DebugParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn ident(&mut self) -> String {
        self.ws();
        let st = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
        {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[st..self.i]).into_owned()
    }
    fn value(&mut self) -> V {
        self.ws();
        match self.s.get(self.i) {
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                while let Some(&c) = self.s.get(self.i) {
                    self.i += 1;
                    match c {
                        b'"' => return V::Str(out),
                        b'\\' => {
                            let e = self.s[self.i];
                            self.i += 1;
                            match e {
                                b'n' => out.push('\n'),
                                b't' => out.push('\t'),
                                b'u' => panic!("\\u escapes in a default are not read here"),
                                other => out.push(other as char),
                            }
                        }
                        c => {
                            // Multi-byte UTF-8: copy the bytes through.
                            let st = self.i - 1;
                            let len = match c {
                                0..=0x7f => 1,
                                0xc0..=0xdf => 2,
                                0xe0..=0xef => 3,
                                _ => 4,
                            };
                            out.push_str(std::str::from_utf8(&self.s[st..st + len]).unwrap());
                            self.i = st + len;
                        }
                    }
                }
                panic!("unterminated string");
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(b']') {
                        return V::Arr(items);
                    }
                    items.push(self.value());
                    self.eat(b',');
                }
            }
            Some(c) if c.is_ascii_digit() || *c == b'-' => {
                let st = self.i;
                self.i += 1;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric()
                        || matches!(self.s[self.i], b'.' | b'-' | b'+'))
                {
                    self.i += 1;
                }
                V::Num(String::from_utf8_lossy(&self.s[st..self.i]).into_owned())
            }
            _ => {
                let id = self.ident();
                match id.as_str() {
                    "true" => V::Bool(true),
                    "false" => V::Bool(false),
                    "None" => V::Null,
                    "Some" => {
                        assert!(self.eat(b'('));
                        let v = self.value();
                        assert!(self.eat(b')'));
                        v
                    }
                    // A tuple variant: its value.
                    _ if self.eat(b'(') => {
                        let v = self.value();
                        assert!(self.eat(b')'));
                        v
                    }
                    _ if self.eat(b'{') => {
                        let mut fields = Vec::new();
                        loop {
                            if self.eat(b'}') {
                                return V::Obj(fields);
                            }
                            let k = self.ident();
                            assert!(self.eat(b':'), "{id}.{k}: expected ':'");
                            fields.push((k, self.value()));
                            self.eat(b',');
                        }
                    }
                    // A unit variant (an enum deserialized by serde).
                    _ if !id.is_empty() => V::Str(id),
                    _ => panic!("unexpected input at {} in the Debug form", self.i),
                }
            }
        }
    }
}

/// JSON text of a value read from `Debug` (`16000.0` -> `16000`).
fn json_of(v: &V) -> String {
    match v {
        V::Obj(_) => "{…}".into(),
        V::Arr(items) => {
            let parts: Vec<String> = items.iter().map(json_of).collect();
            format!("[{}]", parts.join(", "))
        }
        V::Str(s) => serde_json::to_string(s).unwrap(),
        V::Num(n) => n.strip_suffix(".0").unwrap_or(n).to_string(),
        V::Bool(b) => b.to_string(),
        V::Null => "null".into(),
    }
}

/// A placeholder JSON value for a required field of type `ty`.
fn placeholder(ty: &str, structs: &BTreeMap<String, Struct>) -> serde_json::Value {
    if let Some((s, array)) = section_of(ty, structs) {
        let obj = probe(&s, structs, true);
        return if array {
            serde_json::Value::Array(vec![obj])
        } else {
            obj
        };
    }
    if ty.starts_with("Vec<") {
        return serde_json::json!([]);
    }
    match ty {
        "String" => serde_json::json!(""),
        "bool" => serde_json::json!(false),
        t if t.starts_with("Option<") => serde_json::Value::Null,
        _ => serde_json::json!(0),
    }
}

/// A JSON object of struct `name` with every required field filled and,
/// with `all`, every section present too (an array of sections: one
/// element), so deserializing it yields the sections' own defaults;
/// without, the defaults of the fields themselves (e.g. an array's `[]`).
fn probe(name: &str, structs: &BTreeMap<String, Struct>, all: bool) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for f in &structs[name].fields {
        if !f.has_default {
            m.insert(f.json.clone(), placeholder(&f.ty, structs));
        } else if let Some((s, array)) = section_of(&f.ty, structs).filter(|_| all) {
            // An optional or defaulted section: present, so its own
            // defaults show (an array of sections: one element).
            let obj = probe(&s, structs, all);
            m.insert(
                f.json.clone(),
                if array {
                    serde_json::Value::Array(vec![obj])
                } else {
                    obj
                },
            );
        }
    }
    serde_json::Value::Object(m)
}

fn field_of<'a>(v: &'a V, rust_name: &str) -> Option<&'a V> {
    match v {
        V::Obj(fs) => fs.iter().find(|(k, _)| k == rust_name).map(|(_, v)| v),
        _ => None,
    }
}

// ------------------------------------------------------------- rendering

/// One documented field: its JSON path and what to show.
struct Row {
    path: String,
    ty: String,
    default: String,
    allowed: String,
    doc: String,
    /// Starts a section (its struct's doc), if it is one.
    section_doc: Option<String>,
}

/// The defaults of a struct's fields: `own` from the probe without
/// optional sections (a field's own default), `all` from the probe with
/// every section present (for the fields inside sections).
#[derive(Clone, Copy)]
struct Defaults<'a> {
    own: Option<&'a V>,
    all: Option<&'a V>,
}

/// The first element of an array value, or the value.
fn element(v: Option<&V>, array: bool) -> Option<&V> {
    match (v, array) {
        (Some(V::Arr(items)), true) => items.first(),
        (v, _) => v,
    }
}

fn collect(
    name: &str,
    prefix: &str,
    structs: &BTreeMap<String, Struct>,
    defaults: Defaults<'_>,
    optional_section: bool,
    rows: &mut Vec<Row>,
) {
    for f in &structs[name].fields {
        let path = format!("{prefix}{}", f.json);
        // The Debug form names fields by their Rust names; a rename only
        // changes the JSON key.
        let own = defaults.own.and_then(|d| field_of(d, &f.rust));
        let all = defaults.all.and_then(|d| field_of(d, &f.rust));
        let dv = own.or(all);
        let section = section_of(&f.ty, structs);
        let default = if !f.has_default {
            if optional_section {
                "required (in the section)".to_string()
            } else {
                "required".to_string()
            }
        } else {
            match (&section, dv) {
                (Some((_, false)), _) if f.ty.starts_with("Option<") => "null (off)".into(),
                (Some((_, false)), _) => "each field's default".into(),
                (_, Some(v)) => format!("`{}`", json_of(v)),
                (_, None) => panic!("{path}: no default found in the probe's Debug form"),
            }
        };
        assert!(
            !f.doc.is_empty(),
            "{path} ({name}.{}) has no doc comment: document it in crates/core/src (it is the reference's text)",
            f.json
        );
        rows.push(Row {
            path: path.clone(),
            ty: json_type(&f.ty, structs),
            default,
            allowed: f.allowed.clone().unwrap_or_else(|| match &section {
                Some(_) if f.ty.starts_with("Option<") => "an object (fields below), null".into(),
                Some(_) => "an object (fields below)".into(),
                None => type_allows(&f.ty),
            }),
            doc: f.doc.clone(),
            section_doc: section.as_ref().map(|(s, _)| structs[s].doc.clone()),
        });
        if let Some((s, array)) = section {
            let inner = Defaults {
                own: element(own, array),
                all: element(all, array),
            };
            let sub = if array {
                format!("{path}[].")
            } else {
                format!("{path}.")
            };
            collect(
                &s,
                &sub,
                structs,
                inner,
                f.ty.starts_with("Option<") || optional_section,
                rows,
            );
        }
    }
}

/// GitHub's heading anchor for a heading made of `text`.
fn anchor(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            'a'..='z' | '0'..='9' | '_' | '-' => Some(c),
            ' ' => Some('-'),
            _ => None,
        })
        .collect()
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn render(structs: &BTreeMap<String, Struct>, rows: &[Row]) -> String {
    let mut md = String::new();
    let root = &structs["RawConfig"];
    writeln!(md, "# Configuration reference").unwrap();
    writeln!(md).unwrap();
    writeln!(
        md,
        "<!-- Generated from the doc comments of the config structs in crates/core/src (config.rs); do not edit. Regenerate: {COMMAND} -->"
    )
    .unwrap();
    writeln!(md).unwrap();
    writeln!(md, "{}", root.doc).unwrap();
    writeln!(md).unwrap();
    writeln!(
        md,
        "Ranges `a..=b` include both ends. A field left out takes its default; `null` is accepted where the type says so."
    )
    .unwrap();
    writeln!(md).unwrap();
    writeln!(md, "| field | type | default |").unwrap();
    writeln!(md, "|---|---|---|").unwrap();
    for r in rows {
        writeln!(
            md,
            "| [`{}`](#{}) | {} | {} |",
            r.path,
            anchor(&r.path),
            cell(&r.ty),
            cell(&r.default)
        )
        .unwrap();
    }
    for r in rows {
        writeln!(md).unwrap();
        let level = if r.section_doc.is_some() || !r.path.contains('.') {
            "##"
        } else {
            "###"
        };
        writeln!(md, "{level} `{}`", r.path).unwrap();
        writeln!(md).unwrap();
        writeln!(
            md,
            "Type: {} · Default: {} · Allowed: {}",
            r.ty, r.default, r.allowed
        )
        .unwrap();
        writeln!(md).unwrap();
        // A section shows its struct's doc (the field's is a label).
        match &r.section_doc {
            Some(sd) if !sd.is_empty() => writeln!(md, "{sd}").unwrap(),
            _ => writeln!(md, "{}", r.doc).unwrap(),
        }
    }
    md
}

/// The reference for the sources in `src`.
fn generate(src_dir: &Path) -> (String, Vec<Row>) {
    let mut structs = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(src_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    for p in files {
        for (name, s) in parse_structs(&std::fs::read_to_string(&p).unwrap()) {
            assert!(
                !structs.contains_key(&name),
                "two Deserialize structs named {name}: the reference finds sections by type name"
            );
            structs.insert(name, s);
        }
    }
    assert!(
        structs.contains_key("RawConfig"),
        "no RawConfig in {}",
        src_dir.display()
    );
    let read = |all: bool| {
        let probe = probe("RawConfig", &structs, all);
        let raw: RawConfig = serde_json::from_value(probe.clone())
            .unwrap_or_else(|e| panic!("the probe config {probe} does not deserialize: {e}"));
        let dbg = format!("{raw:?}");
        DebugParser {
            s: dbg.as_bytes(),
            i: 0,
        }
        .value()
    };
    let (own, all) = (read(false), read(true));
    let defaults = Defaults {
        own: Some(&own),
        all: Some(&all),
    };
    let mut rows = Vec::new();
    collect("RawConfig", "", &structs, defaults, false, &mut rows);
    (render(&structs, &rows), rows)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
// Reads the repository's files: not under wasm32's WASI runner, which has
// no preopened directories (the native run covers it).
#[cfg_attr(target_os = "wasi", ignore = "reads repository files")]
fn docs_config_md_is_generated_from_the_config_structs() {
    let (md, rows) = generate(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let cost = rows.iter().filter(|r| r.path.starts_with("cost.")).count();
    println!("{} fields; the cost section lists {cost}", rows.len());
    // Issue 19: at most five cost knobs; the rules' other values are
    // constants (docs/design.md) or learned.
    assert!(cost <= 5, "the cost section lists {cost} knobs (at most 5)");
    let path = repo_root().join("docs/config.md");
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(&path, &md).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != md {
        let first = committed
            .lines()
            .zip(md.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(md.lines().count()));
        panic!(
            "docs/config.md is stale (first difference at line {}): it is generated from the doc comments of the config structs in crates/core/src. Regenerate it:\n\n    {COMMAND}\n",
            first + 1
        );
    }
}

#[test]
#[cfg_attr(target_os = "wasi", ignore = "reads repository files")]
fn every_field_the_filter_reads_is_in_the_reference() {
    let (md, rows) = generate(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let paths: Vec<&str> = rows.iter().map(|r| r.path.as_str()).collect();
    for p in [
        "hosts",
        "hosts[].address",
        "capacity_factor",
        "key.mode",
        "load.report_fade_ms",
        "health.cooldown_ms",
        "scrape.cluster",
        "cost.mode",
        "cost.host_tokens",
        "gossip.name",
    ] {
        assert!(paths.contains(&p), "{p} missing from {paths:?}");
    }
    // Defaults come from the code.
    let row = |p: &str| rows.iter().find(|r| r.path == p).unwrap();
    assert_eq!(row("capacity_factor").default, "`1.25`");
    assert_eq!(row("cost.mode").default, "`\"spill\"`");
    assert_eq!(row("cost.prefill_tokens_per_s").default, "`16000`");
    assert_eq!(
        row("load.orca_metrics").default,
        "`[\"num_requests_waiting\"]`"
    );
    assert_eq!(row("hosts[].address").default, "required");
    assert_eq!(row("scrape.cluster").default, "required (in the section)");
    assert_eq!(row("scrape").default, "null (off)");
    assert_eq!(row("decision_header").default, "`null`");
    assert_eq!(
        row("cost.mode").allowed,
        "`\"spill\"`, `\"index\"`, `\"off\"`"
    );
    assert_eq!(row("key.use_user_field").allowed, "`true`, `false`");
    assert!(md.contains("## `cost`"));
}

#[test]
fn a_new_section_and_field_are_picked_up() {
    let src = r#"
/// The filter JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Replicas.
    pub hosts: Vec<String>,
    /// Membership.
    #[serde(default)]
    pub membership: Option<RawMembership>,
}

/// How replicas are discovered.
#[derive(Debug, Clone, Deserialize)]
pub struct RawMembership {
    /// Poll period, ms.
    /// Allowed: 100..=60000.
    #[serde(default = "d_poll")]
    pub poll_ms: u64,
    /// The cluster.
    #[serde(rename = "cluster_name")]
    pub cluster: String,
}

#[derive(Debug)]
pub struct NotConfig {
    pub x: u32,
}
"#;
    let s = parse_structs(src);
    assert_eq!(s.len(), 2, "{s:?}");
    let m = &s["RawMembership"];
    assert_eq!(m.doc, "How replicas are discovered.");
    assert_eq!(m.fields[0].json, "poll_ms");
    assert_eq!(m.fields[0].allowed.as_deref(), Some("100..=60000"));
    assert_eq!(m.fields[0].doc, "Poll period, ms.");
    assert!(m.fields[0].has_default);
    assert_eq!(m.fields[1].json, "cluster_name");
    assert!(!m.fields[1].has_default);
    assert_eq!(
        section_of("Option<RawMembership>", &s),
        Some(("RawMembership".to_string(), false))
    );
    assert_eq!(json_type("Option<RawMembership>", &s), "object or null");
    assert_eq!(
        unqualified("Option<crate::membership::RawMembership>"),
        "Option<RawMembership>"
    );
    assert_eq!(unqualified("Vec< std::string::String >"), "Vec<String>");
    let p = probe("RawConfig", &s, true);
    assert_eq!(
        p,
        serde_json::json!({"hosts": [], "membership": {"cluster_name": ""}})
    );
}

#[test]
fn debug_forms_parse() {
    let d =
        r#"RawX { a: "s\"q", b: Some(1.5), c: None, d: [Y { e: true }], f: 16000.0, g: Static }"#;
    let v = DebugParser {
        s: d.as_bytes(),
        i: 0,
    }
    .value();
    assert_eq!(json_of(field_of(&v, "a").unwrap()), r#""s\"q""#);
    assert_eq!(json_of(field_of(&v, "b").unwrap()), "1.5");
    assert_eq!(json_of(field_of(&v, "c").unwrap()), "null");
    assert_eq!(json_of(field_of(&v, "f").unwrap()), "16000");
    assert_eq!(json_of(field_of(&v, "g").unwrap()), r#""Static""#);
    assert!(matches!(field_of(&v, "d"), Some(V::Arr(a)) if a.len() == 1));
    assert_eq!(
        unlink("see [`crate::x::Y`] and [`Z`](a::Z)."),
        "see [`crate::x::Y`](../crates/core/src/x.rs) and `Z`."
    );
    assert_eq!(anchor("cost.hot_rule"), "costhot_rule");
    assert_eq!(anchor("hosts[].address"), "hostsaddress");
}

/// A config that validates, `path` set to `value` (an optional section
/// is present for its own fields: scrape, and gossip with the index rule
/// it needs).
fn config_with(path: &str, value: serde_json::Value) -> serde_json::Value {
    let mut c = serde_json::json!({"hosts": [{"address": "127.0.0.1:8000"}]});
    if path.starts_with("scrape.") {
        c["scrape"] = serde_json::json!({"cluster": "c", "timeout_ms": 1});
    }
    if path.starts_with("gossip.") {
        c["gossip"] = serde_json::json!({});
        c["cost"] = serde_json::json!({"mode": "index"});
    }
    let mut at = &mut c;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, p) in parts.iter().enumerate() {
        let obj = at.as_object_mut().unwrap();
        if i + 1 == parts.len() {
            obj.insert(p.to_string(), value);
            break;
        }
        at = obj.entry(p.to_string()).or_insert(serde_json::json!({}));
    }
    c
}

/// Whether the config with `path` = `value` validates; an error must name
/// the field.
fn accepts(path: &str, value: serde_json::Value) -> bool {
    let json = config_with(path, value.clone());
    match prefix_router_core::Config::from_json(json.to_string().as_bytes()) {
        Ok(_) => true,
        Err(e) => {
            assert_eq!(
                e.field, path,
                "{path} = {value}: the error names another field: {e}"
            );
            false
        }
    }
}

#[test]
#[cfg_attr(target_os = "wasi", ignore = "reads repository files")]
fn allowed_ranges_and_values_are_what_the_validation_does() {
    let (_, rows) = generate(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut checked = 0;
    for r in &rows {
        if r.path.contains("[]") || r.allowed.contains('`') && !r.allowed.starts_with("`\"") {
            continue;
        }
        let integer = r.ty.starts_with("integer");
        // `a..=b` (optionally followed by a parenthesis): both ends pass,
        // just outside fails.
        let range = r.allowed.split(" (").next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once("..=") {
            let (Ok(lo), Ok(hi)) = (lo.parse::<f64>(), hi.parse::<f64>()) else {
                continue;
            };
            let num = |x: f64| {
                if integer {
                    serde_json::json!(x as i128)
                } else {
                    serde_json::json!(x)
                }
            };
            let step = if integer { 1.0 } else { 1e-3 };
            assert!(accepts(&r.path, num(lo)), "{}: {lo} is refused", r.path);
            assert!(accepts(&r.path, num(hi)), "{}: {hi} is refused", r.path);
            assert!(
                !accepts(&r.path, num(lo - step)),
                "{}: below {lo} passes",
                r.path
            );
            assert!(
                !accepts(&r.path, num(hi + step.max(hi * 1e-9))),
                "{}: above {hi} passes",
                r.path
            );
            checked += 1;
        } else if let Some(hi) = r.allowed.strip_prefix("> 0 and <= ") {
            let hi: f64 = hi.parse().unwrap();
            assert!(accepts(&r.path, serde_json::json!(hi)), "{}", r.path);
            assert!(
                accepts(&r.path, serde_json::json!(hi / 1000.0)),
                "{}",
                r.path
            );
            assert!(!accepts(&r.path, serde_json::json!(0.0)), "{}", r.path);
            assert!(
                !accepts(&r.path, serde_json::json!(hi * 1.001)),
                "{}",
                r.path
            );
            checked += 1;
        } else if r.allowed.starts_with("`\"") {
            // A list of strings (and maybe null): each passes, another fails.
            for v in r.allowed.split(", ") {
                let v = v.split(" (").next().unwrap_or(v);
                let value = match v {
                    "null" => serde_json::Value::Null,
                    v => serde_json::json!(v.trim_matches('`').trim_matches('"')),
                };
                assert!(
                    accepts(&r.path, value.clone()),
                    "{}: {value} is refused",
                    r.path
                );
            }
            assert!(
                !accepts(&r.path, serde_json::json!("no-such-value")),
                "{}",
                r.path
            );
            checked += 1;
        }
    }
    println!("{checked} fields checked against the validation");
    // Most of the constrained fields are checked this way.
    assert!(checked >= 20, "only {checked} fields checked");
}
