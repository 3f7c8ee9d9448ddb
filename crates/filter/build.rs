//! Link flag of the shipped .wasm: `--compress-relocations` makes wasm-ld write the code
//! section's function, global and type indices as the shortest LEB128 instead of 5-byte
//! padded ones (the instructions are unchanged; about 45 KB less). Only for the wasm32
//! cdylib of the `release` profile, which strips debug info (wasm-ld refuses the flag when
//! debug info is kept).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let wasm = std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "wasm32");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    if wasm && release {
        println!("cargo:rustc-link-arg-cdylib=--compress-relocations");
    }
}
