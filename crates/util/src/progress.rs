//! Progress bars on stderr in one style (`[=====>    ]`), drawn only when asked for and stderr is a terminal:
//! logs and CI get no escape sequences.
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` steps laid out by `template` (indicatif's, e.g. `"{prefix} [{bar:30}] {pos}/{len} {msg}"`),
/// hidden unless `show` and stderr is a terminal.
pub fn progress_bar(len: u64, template: &str, show: bool) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .expect("valid progress-bar template")
        .progress_chars("=> ");
    ProgressBar::with_draw_target(Some(len), progress_target(show)).with_style(style)
}

/// Where bars are drawn: stderr when `show` and stderr is a terminal, nowhere otherwise (also for a
/// `MultiProgress`).
pub fn progress_target(show: bool) -> ProgressDrawTarget {
    if show && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
