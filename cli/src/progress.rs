//! Progress bars on stderr, shown only when stderr is a terminal (and not asked away).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether progress bars may be drawn: stderr is a terminal and `--no-progress` was not given.
pub fn enabled(no_progress: bool) -> bool {
    !no_progress && std::io::stderr().is_terminal()
}

/// A bar counting `total` items (samples, files), hidden unless `show`.
pub fn items(total: u64, what: &str, show: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target(show));
    let template = format!(
        "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{human_pos}}/{{human_len}} {what} ({{per_sec}}, eta {{eta}})"
    );
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A bar counting `total` bytes, hidden unless `show`.
pub fn bytes(total: u64, what: &str, show: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), target(show));
    let template = format!(
        "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}} {what} ({{bytes_per_sec}}, eta {{eta}})"
    );
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn target(show: bool) -> ProgressDrawTarget {
    if show {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
