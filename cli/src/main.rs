//! `shardstream`: one binary over the shardstream crates (see `shardstream --help`).
//!
//! Each subcommand lives in its own module under [`commands`]; this file parses the command line,
//! sets up logging and turns an error into one line on stderr and a non-zero exit code.

use std::process::ExitCode;

use clap::Parser;

mod commands;
mod dataset;
mod logging;
mod metrics_server;
mod node_args;
mod progress;
mod runtime;
mod units;

use commands::Command;

/// Convert, move, check and stream ML datasets (MDS, WebDataset, LitData) on object stores.
#[derive(Debug, Parser)]
#[command(name = "shardstream", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Flags every subcommand takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value = "text", global = true)]
    log_format: logging::LogFormat,
    /// More logs (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Never draw progress bars (they are drawn only when stderr is a terminal anyway).
    #[arg(long, global = true)]
    no_progress: bool,
}

impl Global {
    /// Whether to draw progress bars.
    pub fn progress(&self) -> bool {
        progress::enabled(self.no_progress)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.global.log_format, cli.global.verbose);
    match commands::run(cli.command, &cli.global) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the context chain joined by ": ".
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("shardstream: error: {line}");
            ExitCode::FAILURE
        }
    }
}
