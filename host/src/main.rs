//! `nodeipam`: run the node IPAM component against the embedded store. See `nodeipam --help`.

use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

mod cli;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let default = match cli.verbosity() {
        // The component logs each failed resync; the summary and events say it once.
        0 => "warn,nodeipam::guest=error",
        1 => "info,nodeipam_host=debug",
        _ => "debug,nodeipam_host=trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli.execute() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
