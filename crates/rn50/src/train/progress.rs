//! Per-epoch progress: a bar on a terminal (img/s, loss, lr, data-wait share, ETA of the epoch and of the run),
//! log lines every `--print-freq` steps otherwise (batch logs under SLURM/PBS: time-stamped by
//! [`rn50_util::log`], with both ETAs), nothing on ranks other than 0.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rn50_report::table::fmt_hms as hms;

pub struct EpochProgress {
    bar: Option<ProgressBar>,
    log_lines: bool,
    epoch: usize,
    per_epoch: usize,
    t0: Instant,
    /// Images this process trained on this epoch (times world size for the global rate).
    pub images: usize,
    world: usize,
    pub data_wait: Duration,
    loss: f64,
    later: Later,
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
        let tty = show && std::io::stderr().is_terminal();
        let bar = tty.then(|| {
            let bar = rn50_util::progress_bar(
                per_epoch as u64,
                "epoch {prefix:>3} {bar:30.cyan/blue} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
                true,
            )
            .with_position(start as u64);
            bar.set_prefix(epoch.to_string());
            bar
        });
        Self {
            bar,
            log_lines: show && !tty,
            epoch,
            per_epoch,
            t0: Instant::now(),
            images: 0,
            world,
            data_wait: Duration::ZERO,
            loss: f64::NAN,
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
        let per_step = self.elapsed() / (i + 1).saturating_sub(start).max(1) as f64;
        let epoch = (self.per_epoch - i - 1) as f64 * per_step;
        let each_later = self
            .later
            .epoch_secs
            .unwrap_or(self.per_epoch as f64 * per_step);
        (epoch, epoch + self.later.epochs as f64 * each_later)
    }

    /// Step `i` (0-based) of the steps `start..per_epoch` is done; `loss` is given on the steps where it was
    /// read from the device.
    pub fn step(&mut self, i: usize, start: usize, loss: Option<f64>, lr: f64) {
        if let Some(l) = loss {
            self.loss = l;
        }
        if self.bar.is_none() && !(self.log_lines && loss.is_some()) {
            return;
        }
        let (epoch_eta, run_eta) = self.eta(i, start);
        let line = format!(
            "loss {:.4} lr {lr:.5} {:.1} img/s data {:.0}%",
            self.loss,
            self.images_per_sec(),
            100.0 * self.data_wait_share()
        );
        if let Some(bar) = &self.bar {
            bar.set_position(i as u64 + 1);
            bar.set_message(format!("{line} run ETA {}", hms(run_eta)));
        } else if self.log_lines && loss.is_some() {
            tracing::info!(
                "epoch {} [{:>5}/{}] {line} ETA {} run ETA {}",
                self.epoch,
                i + 1,
                self.per_epoch,
                hms(epoch_eta),
                hms(run_eta)
            );
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
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
