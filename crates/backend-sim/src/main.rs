//! `prefix-router-backend`: OpenAI-compatible model-server simulator.
//!
//! Parses the flags (see `--help` and [`prefix_router_backend::cli`]), binds
//! the listen address, prints `listening on ADDR` (the bound address, useful
//! with port 0) on stdout, and serves forever.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use prefix_router_backend::cli::Args;
use prefix_router_backend::Server;

fn main() -> ExitCode {
    // Usage errors exit with status 2, --help and --version with 0.
    let cfg = Args::parse().config();
    let name = cfg.name.clone();
    let model = cfg.model.clone();
    let server = match Server::bind(cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot listen: {e}");
            return ExitCode::FAILURE;
        }
    };
    match server.local_addr() {
        Ok(addr) => println!("listening on {addr} (name={name}, model={model})"),
        Err(e) => eprintln!("warning: no local address: {e}"),
    }
    let _ = std::io::stdout().flush();
    if let Err(e) = server.run() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
