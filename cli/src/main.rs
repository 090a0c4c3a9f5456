//! `shardstream`: one binary over the shardstream crates (see `shardstream --help`).
//!
//! Each subcommand lives in its own module under [`commands`]; this file parses the command line,
//! sets up logging and hands an error to [`exit`], which reports it once on stderr (as JSON under
//! `--json`) and picks the exit code. What a command prints goes through [`output`].

// Every line on stdout goes through `output::outln!`, which turns a closed pipe into a quiet
// exit instead of the panic of `println!`.
#![deny(clippy::print_stdout)]

use std::process::ExitCode;

use clap::Parser;

mod commands;
mod dataset;
mod exit;
mod logging;
mod metrics_server;
mod node_args;
mod output;
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
    /// Log line format on stderr (SHARDSTREAM_LOG_FORMAT sets it in a pod).
    #[arg(
        long,
        value_enum,
        default_value = "text",
        global = true,
        env = "SHARDSTREAM_LOG_FORMAT"
    )]
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return exit::usage(e, json_requested(std::env::args_os())),
    };
    logging::init(cli.global.log_format, cli.global.verbose);
    // Under `--json` (or JSON logs on stderr) the error is one JSON object too.
    let json = cli.command.json() || cli.global.log_format == logging::LogFormat::Json;
    match commands::run(cli.command, &cli.global) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => exit::report(&err, json),
    }
}

/// Whether a command line that clap refused asked for JSON (`--json` or `--log-format json`),
/// read from the raw arguments before `--` (after it they belong to `run`'s command).
fn json_requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<std::ffi::OsString> = args.into_iter().take_while(|a| a != "--").collect();
    args.iter()
        .any(|a| a == "--json" || a == "--log-format=json")
        || args
            .windows(2)
            .any(|w| w[0] == "--log-format" && w[1] == "json")
}
