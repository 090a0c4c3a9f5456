//! What a command prints on stdout goes through [`outln!`]: a write error is returned instead
//! of panicking as `println!` does, and a closed stdout (`shardstream inspect ds | head -1`)
//! becomes [`StdoutClosed`], which ends the command quietly with exit code 141 (128 +
//! `SIGPIPE`, what a shell reports for a Unix tool that the closed pipe ended).
//!
//! Why this rather than restoring `SIGPIPE`'s default disposition at the start of `main`: the
//! signal would kill the process wherever it is, without running destructors: `run` and `mount`
//! supervise children and hold leases and mounts, and downloads remove their unfinished files
//! on drop. An error unwinds through all of that like any other. `println!` is refused by
//! `clippy::print_stdout` in this crate.

use std::fmt;
use std::io::{self, Write};

pub use crate::exit::StdoutClosed;

/// Prints a line on stdout; evaluates to `anyhow::Result<()>` (see the module docs).
macro_rules! outln {
    () => {
        $crate::output::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Writes `args` and a newline to stdout.
pub fn write_line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(stdout_error)
}

/// Flushes stdout.
pub fn flush() -> anyhow::Result<()> {
    io::stdout().flush().map_err(stdout_error)
}

/// A failed write to stdout as the error a command returns: [`StdoutClosed`] for a closed pipe.
pub fn stdout_error(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::Error::new(e).context("cannot write to stdout")
    }
}
