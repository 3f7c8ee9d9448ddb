//! `prefix-router-backend`: OpenAI-compatible model-server simulator.
//!
//! Parses the flags (see `--help` and [`prefix_router_backend::cli`]), binds
//! the listen address, prints `listening on ADDR` (the bound address, useful
//! with port 0) on stdout, and serves forever.

use std::io::Write;
use std::process::ExitCode;

use prefix_router_backend::cli::{self, Command};
use prefix_router_backend::Server;

fn main() -> ExitCode {
    let cfg = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(cfg)) => *cfg,
        Ok(Command::Help) => {
            print!("{}", cli::help());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("prefix-router-backend {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
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
