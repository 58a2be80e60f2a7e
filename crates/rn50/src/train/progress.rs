//! Per-epoch progress: a bar on a terminal (img/s, loss, lr, data-wait share, ETA), plain log lines every
//! `--print-freq` steps otherwise (batch logs under SLURM/PBS), nothing on ranks other than 0.
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

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
}

impl EpochProgress {
    pub fn new(epoch: usize, start: usize, per_epoch: usize, world: usize, show: bool) -> Self {
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

    /// Step `i` (0-based) is done; `loss` is given on the steps where it was read from the device.
    pub fn step(&mut self, i: usize, loss: Option<f64>, lr: f64) {
        if let Some(l) = loss {
            self.loss = l;
        }
        let line = format!(
            "loss {:.4} lr {lr:.5} {:.1} img/s data {:.0}%",
            self.loss,
            self.images_per_sec(),
            100.0 * self.data_wait_share()
        );
        if let Some(bar) = &self.bar {
            bar.set_position(i as u64 + 1);
            bar.set_message(line);
        } else if self.log_lines && loss.is_some() {
            eprintln!(
                "epoch {} [{:>5}/{}] {line}",
                self.epoch,
                i + 1,
                self.per_epoch
            );
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
