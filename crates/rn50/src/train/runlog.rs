//! What rank 0 of `rn50 train` logs in the run directory: metrics.jsonl (one record an epoch), steps.jsonl (every
//! logged step), TensorBoard's scalars (tensorboard/), io.jsonl, config.toml, and summary.json with its report,
//! refreshed each epoch; as one [`RunLog`] the trainer holds and tells what happened, in plain values, as timm's
//! `update_summary` is told. Its start's files are removed again if the run fails before its first step
//! ([`StartUndo`]).
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rn50_args::UsageError;
use rn50_report::tensorboard::{EventWriter, FLUSH_EVERY};
use rn50_report::{EpochMetrics, IoMonitor, IoSample, StepRecord, TrainSummary};

use crate::device::{hardware_name, Compute};
use crate::train::args::TrainArgs;
use crate::train::checkpoint::Position;
use crate::train::config::{self, RunRecord};
use crate::train::eval::Evaluated;
use crate::train::rundir::{self, RunDir};

/// What the logs are told of the run when it starts.
pub struct RunInfo<'a> {
    pub args: &'a TrainArgs,
    pub compute: &'a Compute,
    /// Processes, and images per optimizer step of all of them.
    pub world: usize,
    pub global_batch: usize,
    pub peak_lr: f64,
    /// Optimizer steps an epoch, and those of a whole pass over the training set (more when
    /// --steps-per-epoch cuts epochs short; none without a dataset).
    pub per_epoch: usize,
    pub full_per_epoch: Option<usize>,
    /// The validation images evaluated, and the split's (more when --val-max-images takes a subset).
    pub val_images: Option<(usize, usize)>,
    /// Where training goes on (a resumed run's logs are trimmed to it).
    pub position: &'a Position,
    /// How long TensorBoard's events may wait in the buffer ([`tensorboard_flush_every`]).
    pub tensorboard_flush: Duration,
    /// A file the run appends to besides its logs (--mllog), cut back to its length if the start fails.
    pub appends: Option<&'a Path>,
    /// Whether the run reads a dataset (io.jsonl follows its disk).
    pub reads_data: bool,
}

/// One epoch's training, as its metrics record sums it up.
pub struct EpochStats {
    /// The disk's counters when the epoch began ([`RunLog::io_snapshot`]).
    pub io_start: Option<IoSample>,
    /// Mean over the logged steps of the loss averaged over ranks.
    pub train_loss: f64,
    /// Top-1 over the images trained (all ranks), percent; NaN when none was.
    pub train_acc1: f64,
    /// The last step's rate.
    pub lr: f64,
    /// Over all processes.
    pub images_per_sec: f64,
    /// Seconds in the training loop (rank 0; a resumed epoch's earlier attempts' included).
    pub train_seconds: f64,
    pub data_wait_share: f64,
    /// Seconds a step waited for the loader, on average.
    pub data_wait_per_step: f64,
    pub resolution: usize,
    /// Unreadable training images skipped and batches not trained on, all ranks.
    pub bad_images: u64,
    pub skipped_batches: u64,
}

/// Rank 0's logs in the run directory, with the records of metrics.jsonl (earlier runs' when resumed, and this
/// one's) that the summary is made of. The run directory's claim is held with them.
pub struct RunLog {
    /// Held until the run ends (released first when it is dropped, as the files close after it).
    _claim: RunDir,
    out: PathBuf,
    metrics: File,
    steps: File,
    /// TensorBoard scalars in RUN_DIR/tensorboard/ (the tags: `rn50_report::tensorboard`).
    tensorboard: EventWriter,
    epochs: Vec<EpochMetrics>,
    summary: TrainSummary,
    /// With a dataset: read bandwidth and IOPS of the dataset's disk and of this process, per epoch and as
    /// io.jsonl.
    io: Option<IoMonitor>,
    per_epoch: usize,
    run_start: Instant,
    /// When the last epoch record was logged (this process's first epoch: when training was set up).
    last_record: Instant,
    /// The seconds a mid-epoch checkpoint carried of the epoch it resumes, until that epoch's record is written.
    carried_seconds: f64,
    /// Seconds of training done twice over the whole run ([`Position::redone_seconds`]).
    redone_seconds: f64,
    /// What the start created, until the first step is taken (undone once the files are closed).
    undo: StartUndo,
}

impl RunLog {
    /// Rank 0 starts writing the run directory `dir`, once every check of the start has passed. First a
    /// TensorBoard file of its own (an unwritable tensorboard/ fails here, before anything else is written);
    /// then, with --overwrite, the earlier run's files go; the logs are trimmed to the resumed position and
    /// opened; config.toml and io.jsonl follow.
    pub fn start(mut dir: RunDir, run: RunInfo) -> Result<Self> {
        let (args, position, per_epoch) = (run.args, run.position, run.per_epoch);
        // What this start creates, removed again if it fails before the first step.
        let mut undo = StartUndo::default();
        let out = &args.out;
        let new = |name: &str| Some(out.join(name)).filter(|p| !p.exists());
        // A resumed run's epoch and its first optimizer step to train, in this run's layout: what was logged
        // from there on is logged again.
        let resumed = args.resume.is_some().then(|| {
            let step = position.start_batch(args.batch_size, run.world) / args.accum_steps;
            (position.epoch, step as u64)
        });
        // TensorBoard drops what the earlier files have from the first step this run logs on (steps are the
        // optimizer steps taken), as after torch's SummaryWriter(purge_step=…).
        let purge_step = resumed.map(|(epoch, step)| (epoch * per_epoch as u64 + step + 1) as i64);
        undo.created.extend(new("tensorboard"));
        let tensorboard =
            EventWriter::create(&out.join("tensorboard"), purge_step, run.tensorboard_flush)?;
        undo.created.push(tensorboard.path().to_path_buf());
        dir.begin()?;
        let metrics_path = args.out.join("metrics.jsonl");
        let steps_path = args.out.join("steps.jsonl");
        let mut epochs = Vec::new();
        // A resumed epoch goes on with the seconds its checkpoint counted; training past the checkpoint that an
        // attempt killed without one did is redone, and counted apart.
        let mut carried_seconds = 0.0;
        let mut redone_seconds = position.redone_seconds;
        if let Some((epoch, step)) = resumed {
            let at = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or(0);
            let beyond = last_clock_beyond(&steps_path, (epoch, step))?;
            rundir::trim_log(&metrics_path, |r| at(r, "epoch") < epoch)?;
            rundir::trim_log(&steps_path, |r| {
                (at(r, "epoch"), at(r, "step")) < (epoch, step)
            })?;
            if metrics_path.exists() {
                epochs = rn50_report::schema::read_metrics(&metrics_path)?;
            }
            if step > 0 {
                carried_seconds = position.so_far.seconds;
            }
            let at_checkpoint = clock(&epochs) + carried_seconds;
            if let Some(lost) = beyond.map(|b| b - at_checkpoint).filter(|&l| l > 0.0) {
                tracing::info!(
                    "the last attempt trained {lost:.0} s past its checkpoint: that part is trained again, and \
                     counted apart (redone_s in summary.json), not in the epochs' seconds"
                );
                redone_seconds += lost;
            }
        }
        let created = ["metrics.jsonl", "steps.jsonl", "config.toml", "io.jsonl"].map(new);
        undo.created.extend(created.into_iter().flatten());
        if let Some(path) = run.appends {
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() => undo.appended.push((path.to_path_buf(), m.len())),
                // A pipe or a device: what was written to it cannot be taken back (and opening a pipe to cut it
                // would wait for a reader).
                Ok(_) => {}
                Err(_) => undo.created.push(path.to_path_buf()),
            }
        }
        let (metrics, steps) = (
            append(&args.out, "metrics.jsonl")?,
            append(&args.out, "steps.jsonl")?,
        );
        // What was run, every flag's value as this machine resolved it: reusable with --config.
        if let Some(flags) = &args.resolved_config {
            let record = RunRecord {
                processes: run.world,
                global_batch: run.global_batch,
                device: match run.compute.device {
                    tch::Device::Cpu => format!("cpu ({})", run.compute.cpu.model),
                    d => format!("cuda ({})", hardware_name(d)),
                },
                libtorch: crate::shim::torch_version(),
            };
            let reused = args.config.as_deref();
            if let Some((file, earlier)) = reused.and_then(|f| Some((f, RunRecord::of_file(f)?))) {
                let differences = record.differences(&earlier);
                if !differences.is_empty() {
                    tracing::warn!(
                        "--config {} was run with other settings than this run's, so the numbers will differ: {}",
                        file.display(),
                        differences.join(", ")
                    );
                }
            }
            // The evaluation's sizes as resolved (from --image-size when not given), so the file runs the same
            // evaluation whatever the defaults of another rn50.
            let mut flags = flags.clone();
            let (resize, crop) = crate::train::data::val_sizes(args);
            for (key, value) in [("val-resize", resize), ("val-crop", crop)] {
                flags.entry(key).or_insert((value as i64).into());
            }
            let path = args.out.join("config.toml");
            let text = config::document(&flags, Some((run.compute, &record)));
            rn50_util::atomic_write(&path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let io = match (&args.data, run.reads_data) {
            (Some(root), true) => Some(IoMonitor::start_logging(
                root,
                Duration::from_secs(1),
                &args.out.join("io.jsonl"),
            )?),
            _ => None,
        };
        let summary = TrainSummary {
            arch: args.arch.to_string(),
            width: Some(args.width as u64),
            device: match run.compute.device {
                tch::Device::Cpu => format!(
                    "{} ({} threads)",
                    run.compute.cpu.model,
                    tch::get_num_threads()
                ),
                d => hardware_name(d),
            },
            world_size: run.world as u64,
            batch_size: args.batch_size as u64,
            global_batch: run.global_batch as u64,
            lr: run.peak_lr,
            lr_base: args.lr.is_none().then_some(args.lr_base),
            lr_base_size: args.lr.is_none().then_some(args.lr_base_size as u64),
            precision: run.compute.precision.to_string(),
            steps_per_epoch: Some(per_epoch as u64),
            full_steps_per_epoch: run.full_per_epoch.map(|s| s as u64),
            val_images_total: run.val_images.map(|(_, total)| total as u64),
            dataset: args
                .data
                .as_ref()
                .filter(|_| !args.dummy)
                .map_or("dummy".into(), |d| d.display().to_string()),
            ..Default::default()
        };
        Ok(Self {
            _claim: dir,
            out: out.clone(),
            metrics,
            steps,
            tensorboard,
            epochs,
            summary,
            io,
            per_epoch,
            run_start: Instant::now(),
            last_record: Instant::now(),
            carried_seconds,
            redone_seconds,
            undo,
        })
    }

    /// The seconds this process spent in `epoch` so far (since the record before, or its start), which a
    /// checkpoint adds to what the epoch carried.
    pub fn epoch_seconds_here(&self) -> f64 {
        self.last_record.elapsed().as_secs_f64()
    }

    /// Seconds of training the run did twice ([`Position::redone_seconds`]), for the checkpoints to carry.
    pub fn redone_seconds(&self) -> f64 {
        self.redone_seconds
    }

    /// The run's clock now: the logged epochs' seconds, and the epoch in training's so far (with what its
    /// checkpoint carried); what steps.jsonl's `time_s` says.
    fn run_clock(&self) -> f64 {
        clock(&self.epochs) + self.carried_seconds + self.last_record.elapsed().as_secs_f64()
    }

    /// A step was taken (or a checkpoint saved): the run is one from here on, whose files stay whatever happens
    /// next.
    pub fn taken(&mut self) {
        self.undo.taken();
    }

    /// The dataset disk's counters now, for [`EpochStats::io_start`].
    pub fn io_snapshot(&self) -> Option<IoSample> {
        self.io.as_ref().map(|m| m.snapshot())
    }

    /// Appends step `s` of `epoch` to steps.jsonl and TensorBoard: its loss and top-1 (all ranks), its rate.
    pub fn step(&mut self, epoch: usize, s: usize, loss: f64, acc1: f64, lr: f64) -> Result<()> {
        let rec = StepRecord {
            epoch: epoch as u64,
            step: s as u64,
            loss,
            acc1: finite(acc1),
            lr,
            time_s: Some(self.run_clock()),
        };
        append_record(&mut self.steps, &rec)?;
        let global_step = (epoch * self.per_epoch + s + 1) as i64;
        let tb = &mut self.tensorboard;
        tb.scalar("train/loss", global_step, loss)?;
        tb.scalar("train/acc1", global_step, acc1)?;
        tb.scalar("train/lr", global_step, lr)?;
        Ok(())
    }

    /// Appends `epoch`'s record to metrics.jsonl (its evaluation when it had one, its seconds since the record
    /// before), prints the epoch's line, and refreshes summary.json, metrics.csv, summary.md and the plots, so a
    /// run cut short still has them; with `target`, the summary's time to it.
    pub fn epoch(
        &mut self,
        epoch: usize,
        stats: &EpochStats,
        evaluated: Option<&Evaluated>,
        target: Option<f64>,
    ) -> Result<()> {
        let io = self
            .io
            .as_ref()
            .zip(stats.io_start.as_ref())
            .map(|(m, s0)| m.snapshot().delta(s0));
        let (eval, ema) = (
            evaluated.map(|e| &e.model),
            evaluated.and_then(|e| e.ema.as_ref()),
        );
        let mut record = EpochMetrics {
            epoch: epoch as u64,
            train_loss: finite(stats.train_loss),
            train_acc1: finite(stats.train_acc1),
            lr: finite(stats.lr),
            images_per_sec: finite(stats.images_per_sec),
            acc1: eval.and_then(|e| finite(e.acc1)),
            acc5: eval.and_then(|e| finite(e.acc5)),
            val_loss: eval.and_then(|e| finite(e.loss)),
            val_images: eval.map(|e| e.images),
            ema_acc1: ema.and_then(|e| finite(e.acc1)),
            ema_acc5: ema.and_then(|e| finite(e.acc5)),
            ema_val_loss: ema.and_then(|e| finite(e.loss)),
            seconds: None,
            train_seconds: None,
            resolution: Some(stats.resolution as u64),
            data_wait_share: finite(stats.data_wait_share),
            bad_images: Some(stats.bad_images),
            skipped_batches: Some(stats.skipped_batches),
            val_bad_images: eval.map(|e| e.bad_images),
            disk_read_gbs: io.as_ref().and_then(|d| d.disk_read_gbs),
            disk_read_iops: io.as_ref().and_then(|d| d.disk_read_iops),
            process_read_gbs: io.as_ref().and_then(|d| d.process_read_gbs),
        };
        // The epoch's wall-clock time: from the record before (so the previous epoch's checkpoint, written after
        // its record, is counted here) to this one, training and evaluation included, and a resumed epoch's
        // seconds before its checkpoint. Their sum is the run's time but the set-up, the last checkpoint and
        // the training redone after a kill.
        record.seconds = Some(self.carried_seconds + self.last_record.elapsed().as_secs_f64());
        record.train_seconds = finite(stats.train_seconds);
        self.carried_seconds = 0.0;
        self.last_record = Instant::now();
        append_record(&mut self.metrics, &record)?;
        let tb = &mut self.tensorboard;
        // All at the epoch's last optimizer step: one step axis, which a resume's purge step cuts alike.
        let step = ((record.epoch as usize + 1) * self.per_epoch) as i64;
        tb.scalar("train/images_per_sec", step, stats.images_per_sec)?;
        tb.scalar("train/data_wait", step, stats.data_wait_per_step)?;
        if let Some(gbs) = record.disk_read_gbs.or(record.process_read_gbs) {
            tb.scalar("io/read_gbps", step, gbs)?;
        }
        for (tag, value) in [
            ("val/acc1", record.acc1),
            ("val/acc5", record.acc5),
            ("val/loss", record.val_loss),
            ("val/ema_acc1", record.ema_acc1),
            ("val/ema_acc5", record.ema_acc5),
            ("val/ema_loss", record.ema_val_loss),
        ] {
            if let Some(a) = value {
                tb.scalar(tag, step, a)?;
            }
        }
        tb.flush()?;
        // An epoch --eval-every skips has no evaluation (val_images absent).
        let nan = |x: Option<f64>| x.unwrap_or(f64::NAN);
        let acc = match record.val_images {
            Some(_) => format!(
                "Acc@1 {:.3}  Acc@5 {:.3}  val loss {:.4}",
                nan(record.acc1),
                nan(record.acc5),
                nan(record.val_loss)
            ),
            None => "not evaluated".into(),
        };
        let acc = match ema {
            Some(_) => format!(
                "{acc}  EMA Acc@1 {:.3}  Acc@5 {:.3}",
                nan(record.ema_acc1),
                nan(record.ema_acc5)
            ),
            None => acc,
        };
        tracing::info!(
            "epoch {}: loss {:.4}  train Acc@1 {:.3}  {acc}  {:.1} img/s  data wait {:.0}%  ({:.0} s)",
            record.epoch,
            stats.train_loss,
            stats.train_acc1,
            stats.images_per_sec,
            100.0 * stats.data_wait_share,
            record.seconds.unwrap_or_default()
        );
        let bad_images = record.bad_images.unwrap_or(0);
        if bad_images > 0 {
            tracing::warn!(
                "epoch {}: skipped {bad_images} unreadable training images (they could not be read or decoded)",
                record.epoch
            );
        }
        let skipped = record.skipped_batches.unwrap_or(0);
        if skipped > 0 {
            tracing::warn!(
                "epoch {}: did not train on {skipped} batches (no readable image, or one value per channel for \
                 batch norm)",
                record.epoch
            );
        }
        let val_bad = record.val_bad_images.unwrap_or(0);
        if val_bad > 0 {
            tracing::warn!(
                "epoch {}: evaluated without {val_bad} unreadable validation images (accuracy is over the {} read)",
                record.epoch,
                record.val_images.unwrap_or(0)
            );
        }
        self.epochs.push(record);
        self.summary.fill_from_metrics(&self.epochs);
        self.summary.fill_target(&self.epochs, target);
        self.summary.redone_s = (self.redone_seconds > 0.0).then_some(self.redone_seconds);
        rn50_report::write_summary(&self.out, &self.summary)?;
        rn50_report::write_run_report(&self.out)?;
        Ok(())
    }

    /// Every epoch is done: prints the summary, whether `target` was reached, and the run's time.
    pub fn finish(&self, target: Option<f64>) -> Result<()> {
        let out = &self.out;
        if out.join("metrics.jsonl").exists() {
            eprint!("{}", rn50_report::summary_text(out)?);
        }
        if let Some(target) = target {
            let s = &self.summary;
            match (s.target_epochs, s.time_to_target_s) {
                (Some(epochs), Some(secs)) => tracing::info!(
                    "target Acc@1 {target} reached after {epochs} epochs: time to target {secs:.0} s"
                ),
                _ => tracing::info!(
                    "target Acc@1 {target} not reached in {} epochs (best Acc@1 {:.3})",
                    s.epochs,
                    s.best_acc1.unwrap_or(f64::NAN)
                ),
            }
        }
        tracing::info!(
            "done in {:.0} s; weights in {}",
            self.run_start.elapsed().as_secs_f64(),
            out.display()
        );
        Ok(())
    }
}

/// The run's clock at the end of the logged epochs `epochs`: their seconds.
fn clock(epochs: &[rn50_report::EpochMetrics]) -> f64 {
    epochs.iter().filter_map(|e| e.seconds).sum()
}

/// The latest run clock (`time_s`) steps.jsonl records at `(epoch, step)` or after: how far an attempt trained
/// past the checkpoint a resume goes on from. None when no such record has one (or no file).
fn last_clock_beyond(steps: &Path, from: (u64, u64)) -> Result<Option<f64>> {
    let text = match std::fs::read_to_string(steps) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", steps.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<StepRecord>(l).ok())
        .filter(|r| (r.epoch, r.step) >= from)
        .filter_map(|r| r.time_s)
        .reduce(f64::max))
}

/// Opens the JSON-lines log `name` of `dir` for appending.
fn append(dir: &Path, name: &str) -> Result<File> {
    let path = dir.join(name);
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Appends `rec` and its newline in one write (a kill leaves a whole line or a cut one, which a resume drops).
fn append_record(f: &mut File, rec: &impl serde::Serialize) -> Result<()> {
    let mut line = serde_json::to_string(rec)?;
    line.push('\n');
    f.write_all(line.as_bytes())?;
    Ok(())
}

/// A metric that is a number; NaN and infinities are written as null and read back as absent, so they are
/// absent in the records kept in memory too.
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// How long TensorBoard's events may wait in the buffer: `RN50_TENSORBOARD_FLUSH_SECS`, whole seconds in
/// [`FLUSH_SECS`] (tests shorten it to see events reach the file mid-epoch), else a minute; exit 2 on another
/// value. The range is checked by the parser of flags' ranges ([`rn50_args::usize_in`]).
pub fn tensorboard_flush_every() -> Result<Duration, UsageError> {
    use clap::builder::TypedValueParser;
    const VAR: &str = "RN50_TENSORBOARD_FLUSH_SECS";
    let Some(v) = std::env::var_os(VAR) else {
        return Ok(FLUSH_EVERY);
    };
    let parser = rn50_args::usize_in(FLUSH_SECS);
    let cmd = clap::Command::new("rn50");
    match v
        .to_str()
        .map(|s| parser.parse_ref(&cmd, None, s.trim().as_ref()))
    {
        Some(Ok(secs)) => Ok(Duration::from_secs(secs as u64)),
        _ => Err(UsageError::new(format!(
            "{VAR}={} must be whole seconds from {} to {}",
            v.to_string_lossy(),
            FLUSH_SECS.start(),
            FLUSH_SECS.end()
        ))),
    }
}

/// The seconds `RN50_TENSORBOARD_FLUSH_SECS` may say.
const FLUSH_SECS: std::ops::RangeInclusive<u64> = 1..=60;

/// The files (and the tensorboard/ folder) a start created, removed again when training fails before its
/// first step is taken or checkpointed: memory running out at the first step, say; and the files it appended to
/// (an --mllog a job script began), cut back to their length before. The corrected command then starts as after
/// a start that failed its checks, without --overwrite.
#[derive(Default)]
struct StartUndo {
    created: Vec<PathBuf>,
    appended: Vec<(PathBuf, u64)>,
}

impl StartUndo {
    /// A step was taken (or a checkpoint saved): nothing is undone.
    fn taken(&mut self) {
        self.created.clear();
        self.appended.clear();
    }
}

impl Drop for StartUndo {
    fn drop(&mut self) {
        for (p, len) in &self.appended {
            let _ = OpenOptions::new()
                .write(true)
                .open(p)
                .and_then(|f| f.set_len(*len));
        }
        // Files before the folder they are in.
        for p in self.created.iter().rev() {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}
