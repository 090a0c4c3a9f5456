//! `shardstream completions <shell>`: a completion script generated from the command-line
//! definition itself (clap_complete), so it never lags behind a new flag.
//!
//! ```sh
//! shardstream completions bash > /etc/bash_completion.d/shardstream
//! shardstream completions zsh > "${fpath[1]}/_shardstream"
//! shardstream completions fish > ~/.config/fish/completions/shardstream.fish
//! ```

use clap::CommandFactory;
use clap_complete::Shell;

use crate::output;

/// `completions SHELL`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the script on stdout.
pub fn run(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = crate::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "shardstream", &mut script);
    use std::io::Write;
    std::io::stdout()
        .write_all(&script)
        .map_err(output::stdout_error)?;
    output::flush()
}
