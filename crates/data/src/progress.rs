//! Progress bars on stderr (drawn only when stderr is a terminal).

use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar};
use rn50_util::{progress_bar, progress_target};

pub struct Progress {
    multi: MultiProgress,
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Progress {
    pub fn new() -> Progress {
        Progress {
            multi: MultiProgress::with_draw_target(progress_target(true)),
        }
    }

    /// A bar over the bytes of one archive; its message carries classes and images/s.
    pub fn bytes_bar(&self, prefix: &str, len: u64) -> ProgressBar {
        let bar = self.multi.add(progress_bar(
            len,
            "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
            true,
        ));
        bar.set_prefix(prefix.to_string());
        bar
    }
}

/// Formats "classes 12/1000 · 15234 images (3100 img/s)" for a bar's message.
pub fn rate_message(
    start: Instant,
    classes: Option<u64>,
    class_total: Option<u64>,
    images: u64,
) -> String {
    let secs = start.elapsed().as_secs_f64().max(1e-3);
    let classes = match (classes, class_total) {
        (Some(c), Some(t)) => format!("classes {c}/{t} · "),
        (Some(c), None) => format!("classes {c} · "),
        _ => String::new(),
    };
    format!(
        "{classes}{images} images ({:.0} img/s)",
        images as f64 / secs
    )
}
