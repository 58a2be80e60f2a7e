//! Progress of a pass over batches, on rank 0 only: a bar on a terminal, log lines every `--print-freq` batches
//! otherwise (batch logs under SLURM/PBS: time-stamped by [`rn50_util::log`]), with the images per second
//! and the ETA. Training's ([`EpochProgress`]) adds the loss, top-1, lr, data-wait share and the ETA of the
//! run; evaluation's ([`EvalProgress`]) the images per second and ETA of the pass.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rn50_report::table::fmt_hms as hms;

/// Where a pass's progress goes: a bar, log lines, or nowhere (ranks other than 0).
struct Shown {
    bar: Option<ProgressBar>,
    log_lines: bool,
    /// What each line starts with: `epoch 3`, `val epoch 3`, `eval`.
    label: String,
    /// Batches in the whole pass.
    len: usize,
}

impl Shown {
    /// A pass of `len` batches of which the first `start` are done (a resumed epoch).
    fn new(label: String, start: usize, len: usize, show: bool) -> Self {
        let tty = show && std::io::stderr().is_terminal();
        let bar = tty.then(|| {
            let bar = rn50_util::progress_bar(
                len as u64,
                "{prefix} {bar:30.cyan/blue} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
                true,
            )
            .with_position(start as u64);
            bar.set_prefix(label.clone());
            bar
        });
        Self {
            bar,
            log_lines: show && !tty,
            label,
            len,
        }
    }

    /// Whether batch `i`'s progress is drawn: always on a bar, when a line is `due` in a log.
    fn shows(&self, due: bool) -> bool {
        self.bar.is_some() || (self.log_lines && due)
    }

    /// Batch `i` (0-based) is done: the bar moves to it and shows `msg` (and the run's ETA), or, when a line is
    /// `due`, a log line `LABEL [  i+1/len] MSG ETA h:mm:ss [run ETA h:mm:ss]`.
    fn show(&self, i: usize, due: bool, msg: &str, eta: f64, run_eta: Option<f64>) {
        let run = run_eta.map_or(String::new(), |r| format!(" run ETA {}", hms(r)));
        if let Some(bar) = &self.bar {
            bar.set_position(i as u64 + 1);
            bar.set_message(format!("{msg}{run}"));
        } else if self.log_lines && due {
            tracing::info!(
                "{} [{:>5}/{}] {msg} ETA {}{run}",
                self.label,
                i + 1,
                self.len,
                hms(eta)
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Seconds the `left` batches take at the rate of the `done` ones, which took `elapsed` seconds.
fn eta(elapsed: f64, done: usize, left: usize) -> f64 {
    left as f64 * elapsed / done.max(1) as f64
}

pub struct EpochProgress {
    shown: Shown,
    per_epoch: usize,
    t0: Instant,
    /// Images this process trained on this epoch (times world size for the global rate).
    pub images: usize,
    world: usize,
    pub data_wait: Duration,
    last: Logged,
    later: Later,
}

/// What a logged step read from the device: its loss and top-1 (percent), over all ranks.
#[derive(Clone, Copy, Debug)]
pub struct Logged {
    pub loss: f64,
    pub acc1: f64,
}

/// What the run has left after this epoch, for its ETA.
#[derive(Clone, Copy, Debug)]
pub struct Later {
    /// Epochs still to train after this one.
    pub epochs: usize,
    /// The wall time of the last whole epoch (training, evaluation, checkpoint), when one has run: the
    /// estimate for each later epoch; this epoch's step rate otherwise.
    pub epoch_secs: Option<f64>,
}

impl EpochProgress {
    pub fn new(
        epoch: usize,
        start: usize,
        per_epoch: usize,
        world: usize,
        show: bool,
        later: Later,
    ) -> Self {
        Self {
            shown: Shown::new(format!("epoch {epoch}"), start, per_epoch, show),
            per_epoch,
            t0: Instant::now(),
            images: 0,
            world,
            data_wait: Duration::ZERO,
            last: Logged {
                loss: f64::NAN,
                acc1: f64::NAN,
            },
            later,
        }
    }

    pub fn elapsed(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Images per second over all processes.
    pub fn images_per_sec(&self) -> f64 {
        (self.images * self.world) as f64 / self.elapsed().max(1e-9)
    }

    pub fn data_wait_share(&self) -> f64 {
        self.data_wait.as_secs_f64() / self.elapsed().max(1e-9)
    }

    /// Seconds left in this epoch and in the run once step `i` (0-based) is done, from this epoch's step rate
    /// (steps `start..=i`) and [`Later`].
    fn eta(&self, i: usize, start: usize) -> (f64, f64) {
        let done = (i + 1).saturating_sub(start);
        let epoch = eta(self.elapsed(), done, self.per_epoch - i - 1);
        let each_later = self
            .later
            .epoch_secs
            .unwrap_or(self.per_epoch as f64 * self.elapsed() / done.max(1) as f64);
        (epoch, epoch + self.later.epochs as f64 * each_later)
    }

    /// Step `i` (0-based) of the steps `start..per_epoch` is done; `logged` is given on the steps whose loss
    /// and top-1 were read from the device.
    pub fn step(&mut self, i: usize, start: usize, logged: Option<Logged>, lr: f64) {
        if let Some(l) = logged {
            self.last = l;
        }
        let due = logged.is_some();
        if !self.shown.shows(due) {
            return;
        }
        let (epoch_eta, run_eta) = self.eta(i, start);
        let msg = format!(
            "loss {:.4} Acc@1 {:.2} lr {lr:.5} {:.1} img/s data {:.0}%",
            self.last.loss,
            self.last.acc1,
            self.images_per_sec(),
            100.0 * self.data_wait_share()
        );
        self.shown.show(i, due, &msg, epoch_eta, Some(run_eta));
    }

    pub fn finish(&self) {
        self.shown.finish();
    }
}

/// An evaluation pass's progress: images per second (all processes, from this one's rate) and the ETA of the
/// pass, a line every `every` batches in a log (main.py's validate() prints every --print-freq batches).
pub struct EvalProgress {
    shown: Shown,
    every: usize,
    world: usize,
    t0: Instant,
    images: usize,
}

impl EvalProgress {
    /// A pass of `batches` batches, shown as `label` (`val epoch 3`, `eval`) on rank 0 (`show`) of `world`.
    pub fn new(label: String, batches: usize, world: usize, show: bool, every: usize) -> Self {
        Self {
            shown: Shown::new(label, 0, batches, show),
            every,
            world,
            t0: Instant::now(),
            images: 0,
        }
    }

    /// Batch `i` (0-based), of `images` images, is evaluated.
    pub fn batch(&mut self, i: usize, images: usize) {
        self.images += images;
        let due = (i + 1).is_multiple_of(self.every) || i + 1 == self.shown.len;
        if !self.shown.shows(due) {
            return;
        }
        let elapsed = self.t0.elapsed().as_secs_f64();
        let rate = (self.images * self.world) as f64 / elapsed.max(1e-9);
        let left = self.shown.len.saturating_sub(i + 1);
        let msg = format!("{rate:.1} img/s");
        self.shown
            .show(i, due, &msg, eta(elapsed, i + 1, left), None);
    }

    pub fn finish(&self) {
        self.shown.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_eta_adds_later_epochs_at_the_last_epochs_time_or_this_epochs_rate() {
        let later = |epoch_secs| Later {
            epochs: 2,
            epoch_secs,
        };
        let mut p = EpochProgress::new(0, 0, 10, 1, false, later(None));
        p.t0 = Instant::now() - Duration::from_secs(4);
        // 4 of 10 steps in 4 s: 6 s left in the epoch, 2 more epochs of 10 s each.
        let (epoch, run) = p.eta(3, 0);
        assert!(
            (epoch - 6.0).abs() < 0.1 && (run - 26.0).abs() < 0.1,
            "{epoch} {run}"
        );
        p.later = later(Some(30.0));
        let (_, run) = p.eta(3, 0);
        assert!((run - 66.0).abs() < 0.1, "{run}");
        // Resumed at step 6: the rate counts the steps this process ran.
        let (epoch, _) = p.eta(7, 6);
        assert!((epoch - 4.0).abs() < 0.1, "{epoch}");
    }
}
