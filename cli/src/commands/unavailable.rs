//! The refusal shared by commands that are declared but not built yet.

use anyhow::bail;

/// Refuses a command that is declared but not built yet, pointing at its issue.
pub fn not_available(issue: u32) -> anyhow::Result<()> {
    bail!("not available yet in this build: see issue {issue}")
}
