//! Progress of a pass over batches, on rank 0 only: a bar on a terminal, log lines every `--print-freq` batches
//! otherwise (batch logs under SLURM/PBS: time-stamped by [`rn50_util::log`]), with the images per second
//! and the ETA. Training's ([`EpochProgress`]) adds the loss, top-1, lr, data-wait share and the ETA of the
//! run; evaluation's ([`EvalProgress`]) the images per second and ETA of the pass.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rn50_report::table::fmt_hms as hms;

use crate::train::checkpoint::EpochSoFar;

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
    /// The last step read, and main.py's running means (AverageMeter) of the steps read this epoch, each standing
    /// for the steps since the one read before it (`weighed`: the steps the means cover), the checkpoint's steps
    /// included after a resume.
    last: Option<Logged>,
    loss: Meter,
    acc1: Meter,
    weighed: usize,
    later: Later,
}

/// A running mean: main.py's AverageMeter.
#[derive(Clone, Copy, Debug, Default)]
struct Meter {
    sum: f64,
    count: f64,
}

impl Meter {
    fn add(&mut self, value: f64, weight: f64) {
        self.sum += value * weight;
        self.count += weight;
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

/// What a logged step read from the device: its loss and top-1 (percent), over all ranks.
#[derive(Clone, Copy, Debug)]
pub struct Logged {
    pub loss: f64,
    pub acc1: f64,
}

/// What the run has left after this epoch, for its ETA: the epochs at this epoch's measured step rate, and
/// the evaluations at the last one's time.
#[derive(Clone, Copy, Debug)]
pub struct Later {
    /// Epochs still to train after this one.
    pub epochs: usize,
    /// How many of this epoch and those evaluate, and how long the last evaluation took (none yet: not
    /// counted).
    pub evaluations: usize,
    pub eval_secs: Option<f64>,
}

impl EpochProgress {
    /// Epoch `epoch`'s progress from step `start` of `per_epoch`; `carried` is what the epoch gave before
    /// `start` (a resumed epoch's checkpoint), which the running means start from.
    pub fn new(
        epoch: usize,
        start: usize,
        per_epoch: usize,
        world: usize,
        show: bool,
        later: Later,
        carried: &EpochSoFar,
    ) -> Self {
        let mut loss = Meter::default();
        let mut acc1 = Meter::default();
        if carried.loss_steps > 0 {
            loss.add(
                carried.loss_sum / carried.loss_steps as f64,
                carried.loss_steps as f64,
            );
        }
        if carried.images > 0 {
            let steps = carried.loss_steps.max(1) as f64;
            acc1.add(
                100.0 * carried.correct1 as f64 / carried.images as f64,
                steps,
            );
        }
        Self {
            shown: Shown::new(format!("epoch {epoch}"), start, per_epoch, show),
            per_epoch,
            t0: Instant::now(),
            images: 0,
            world,
            data_wait: Duration::ZERO,
            last: None,
            loss,
            acc1,
            weighed: start,
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

    /// Seconds left in this epoch and in the run once step `i` (0-based) is done, from this epoch's measured step
    /// rate (steps `start..=i` in the time they took) for every step left, this epoch's and the later epochs',
    /// plus the evaluations left at the last one's time.
    fn eta(&self, i: usize, start: usize) -> (f64, f64) {
        let done = (i + 1).saturating_sub(start);
        let step_secs = self.elapsed() / done.max(1) as f64;
        let epoch = (self.per_epoch - i - 1) as f64 * step_secs;
        let later = self.later.epochs as f64 * self.per_epoch as f64 * step_secs;
        let evals = self.later.evaluations as f64 * self.later.eval_secs.unwrap_or(0.0);
        (epoch, epoch + later + evals)
    }

    /// The first step this process trained of the epoch, read for the progress only (not a logged step, nor in
    /// the means): what the bar shows until the first logged step.
    pub fn first(&mut self, l: Logged) {
        self.last = Some(l);
    }

    /// `loss LAST (MEAN) Acc@1 LAST (MEAN)`, as main.py's ProgressMeter shows its meters: the mean of the logged
    /// steps (the epoch's loss so far), the last step read alone before any; `-` before any step was read.
    fn meters(&self) -> String {
        let Some(last) = self.last else {
            return "loss - Acc@1 -".into();
        };
        format!(
            "loss {:.4} ({:.4}) Acc@1 {:.2} ({:.2})",
            last.loss,
            self.loss.mean().unwrap_or(last.loss),
            last.acc1,
            self.acc1.mean().unwrap_or(last.acc1)
        )
    }

    /// Step `i` (0-based) of the steps `start..per_epoch` is done; `logged` is given on the steps whose loss
    /// and top-1 were read from the device and logged.
    pub fn step(&mut self, i: usize, start: usize, logged: Option<Logged>, lr: f64) {
        if let Some(l) = logged {
            let steps = (i + 1).saturating_sub(self.weighed) as f64;
            self.weighed = i + 1;
            self.last = Some(l);
            self.loss.add(l.loss, steps);
            self.acc1.add(l.acc1, steps);
        }
        let due = logged.is_some();
        if !self.shown.shows(due) {
            return;
        }
        let (epoch_eta, run_eta) = self.eta(i, start);
        let msg = format!(
            "{} lr {lr:.5} {:.1} img/s data {:.0}%",
            self.meters(),
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
    fn run_eta_counts_every_step_left_at_the_measured_rate_and_the_evaluations_left() {
        let later = |eval_secs| Later {
            epochs: 2,
            evaluations: 3,
            eval_secs,
        };
        let mut p = EpochProgress::new(0, 0, 10, 1, false, later(None), &EpochSoFar::default());
        p.t0 = Instant::now() - Duration::from_secs(4);
        // 4 of 10 steps in 4 s: 6 s left in the epoch, 2 more epochs of 10 s each.
        let (epoch, run) = p.eta(3, 0);
        assert!(
            (epoch - 6.0).abs() < 0.1 && (run - 26.0).abs() < 0.1,
            "{epoch} {run}"
        );
        // Three evaluations of 5 s each.
        p.later = later(Some(5.0));
        let (_, run) = p.eta(3, 0);
        assert!((run - 41.0).abs() < 0.1, "{run}");
        // Resumed at step 6: the rate is of the steps this process ran (2 in 4 s), not of the whole epoch.
        let (epoch, run) = p.eta(7, 6);
        assert!((epoch - 4.0).abs() < 0.1, "{epoch}");
        assert!((run - (4.0 + 40.0 + 15.0)).abs() < 0.1, "{run}");
    }

    /// main.py's meters from the first step: the first step read shows until a logged one; after a resume the
    /// means start from the checkpoint's sums, each logged step weighing the steps since the one before.
    #[test]
    fn the_bar_shows_numbers_from_the_first_step_and_a_resumed_epochs_means() {
        let later = Later {
            epochs: 0,
            evaluations: 0,
            eval_secs: None,
        };
        let mut p = EpochProgress::new(0, 0, 10, 1, false, later, &EpochSoFar::default());
        assert_eq!(p.meters(), "loss - Acc@1 -");
        p.first(Logged {
            loss: 6.5,
            acc1: 12.5,
        });
        assert_eq!(p.meters(), "loss 6.5000 (6.5000) Acc@1 12.50 (12.50)");
        // Steps 0 to 5 at a mean loss of 2 and top-1 25%, then step 8 logged (standing for 6, 7 and 8).
        let carried = EpochSoFar {
            loss_sum: 12.0,
            loss_steps: 6,
            images: 48,
            correct1: 12,
            ..EpochSoFar::default()
        };
        let mut p = EpochProgress::new(0, 6, 10, 1, false, later, &carried);
        for i in 6..8 {
            p.step(i, 6, None, 0.1);
        }
        p.step(
            8,
            6,
            Some(Logged {
                loss: 1.0,
                acc1: 45.0,
            }),
            0.1,
        );
        assert_eq!(p.meters(), "loss 1.0000 (1.6667) Acc@1 45.00 (31.67)");
    }
}
