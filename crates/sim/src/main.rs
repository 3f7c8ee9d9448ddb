//! `prefix-router-sim`: see `crates/sim/README.md` or `--help`.

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(prefix_router_sim::cli::main_with_args(&argv));
}
