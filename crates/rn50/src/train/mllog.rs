//! `train --mllog FILE`: MLPerf Training's result log, one `:::MLLOG {json}` line per event, as mlperf_logging's
//! `mllog` writes them (Python's `json.dumps`: `{"namespace": "", "time_ms": <Unix ms>, "event_type": "POINT_IN_TIME" |
//! "INTERVAL_START" | "INTERVAL_END", "key": ..., "value": ..., "metadata": {"file": ..., "lineno": ..., ...}}`).
//! The file and line are the Rust source line that logged the event (mllog gives the Python caller's). Only rank 0
//! writes; lines are appended, each in one write. A file holds one run, as MLCommons' compliance checker reads it:
//! one that already holds a run is refused ([`MlLog::check`]), and a run resumed from a checkpoint writes none.
//!
//! [`MlperfRun`]: what a training run logs, at the trainer's five points (`start`, `epoch_start`, `trained`,
//! `evaluated`, `finish`); [`TARGET_ACCURACY`]: MLPerf's quality target, which decides `run_stop`'s status
//! whenever `--mllog` is given. The flags are [`crate::train::args::MlperfArgs`].
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rn50_args::UsageError;
use serde::Serialize;
use serde_json::{json, Value};

use crate::pyjson::python_json;
use crate::train::args::OptimizerKind;
use crate::train::schedule::{Decay, LrSchedule};
use crate::train::TrainArgs;

/// The line prefix of mllog (and of MLPerf's compliance checker).
pub const PREFIX: &str = ":::MLLOG ";

/// MLPerf Training's quality target for ResNet-50, top-1 in percent on the ImageNet validation set: the compliance
/// checker's `eval_accuracy >= 0.7590` (training_4.0.0/closed_resnet.yaml). With --mllog it is the run's target:
/// `run_stop` says `success` only when an evaluation reached it.
pub const TARGET_ACCURACY: f64 = 75.9;

/// The rules between --mllog and the flags of a run ([`TrainArgs::check`] has the others): a --target-accuracy
/// other than MLPerf's is a [`UsageError`]. The log's `run_stop` says `success` for MLPerf's target only, and a
/// log whose success meant another target would claim a result it does not have; an error costs one flag less
/// on the command line, a warning would scroll away while the log stays.
pub fn check(args: &TrainArgs) -> Result<(), UsageError> {
    match (&args.mllog, args.target_accuracy) {
        (Some(_), Some(t)) if t != TARGET_ACCURACY => Err(UsageError(format!(
            "--target-accuracy {t} with --mllog: MLPerf's ResNet-50 target is fixed at {TARGET_ACCURACY} (top-1 \
             %), and the log's run_stop says success for it only; leave out --target-accuracy (--mllog stops at \
             {TARGET_ACCURACY}) or --mllog"
        ))),
        (Some(_), _) if args.val_max_images.is_some() => Err(UsageError(
            "--val-max-images with --mllog: MLPerf's eval_accuracy is over the whole validation set, and a log \
             of a part of it would claim a result it does not have; leave out one of them"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// The top-1 (percent) training stops at: --target-accuracy, else MLPerf's with --mllog (an MLPerf run ends at
/// its target), else none.
pub fn target(args: &TrainArgs) -> Option<f64> {
    args.target_accuracy
        .or(args.mllog.as_ref().map(|_| TARGET_ACCURACY))
}

/// MLPerf's log of one training run (`--mllog`): rank 0 of a run that does not resume writes it; elsewhere every
/// hook does nothing. The trainer calls each hook from one place: [`MlperfRun::start`] when training is set up,
/// [`MlperfRun::epoch_start`], [`MlperfRun::trained`] after an epoch's steps, [`MlperfRun::evaluated`], and
/// [`MlperfRun::finish`].
pub struct MlperfRun {
    /// Where the log goes, until it is opened at the start.
    path: Option<PathBuf>,
    log: Option<MlLog>,
    /// When MLPerf's init interval began (this process knew it was rank 0), and when this process dropped the
    /// page cache (--drop-caches, each node's first process).
    init_start: SystemTime,
    caches_dropped: Option<SystemTime>,
    /// The first epoch of the run, and of the epochs up to the next evaluation (MLPerf's block).
    first_epoch: usize,
    block_first: usize,
}

/// What [`MlperfRun::start`] logs of the run beside its flags.
pub struct RunShape<'a> {
    pub schedule: &'a LrSchedule,
    /// Images per optimizer step of all processes, and the processes.
    pub global_batch: usize,
    pub world: usize,
    /// Optimizer steps an epoch.
    pub per_epoch: usize,
    /// The training and validation images (all ranks'), with a dataset.
    pub samples: Option<(usize, usize)>,
    /// The epoch training starts at.
    pub first_epoch: usize,
}

impl MlperfRun {
    /// MLPerf's init interval starts now. `writes`: rank 0 of a training run, which writes `--mllog` unless it
    /// resumes from a checkpoint: MLPerf times one uninterrupted run from init_start to run_stop, and a resumed
    /// attempt's lines, after the first attempt's or in a file of their own, would claim a time to train that
    /// no run had; the resumed run trains on without a log, and says so. The log is checked now ([`MlLog::check`],
    /// with a warning when it lacks what a result needs) and written once the run starts.
    pub fn new(
        args: &TrainArgs,
        writes: bool,
        resumes: bool,
        caches_dropped: Option<SystemTime>,
    ) -> Result<Self> {
        let init_start = SystemTime::now();
        let path = match (&args.mllog, writes) {
            (Some(path), true) => log_path(args, path, resumes)?,
            _ => None,
        };
        Ok(Self {
            path: path.map(Path::to_path_buf),
            log: None,
            init_start,
            caches_dropped,
            first_epoch: 0,
            block_first: 0,
        })
    }

    /// The file the run will append to, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The run starts: `cache_clear` and `init_start` at their times, the submission's fields and the
    /// hyperparameters, `init_stop` and `run_start`.
    pub fn start(&mut self, args: &TrainArgs, run: &RunShape) -> Result<()> {
        self.first_epoch = run.first_epoch;
        self.block_first = run.first_epoch;
        let Some(path) = &self.path else {
            return Ok(());
        };
        // A job script that dropped the caches itself logged cache_clear first: rn50's false would contradict it.
        let script_cleared = MlLog::keys(path)?.iter().any(|k| k == "cache_clear");
        let mut log = MlLog::open(path)?;
        if args.mlperf.drop_caches || !script_cleared {
            // Dropped before init_start (logged at init_start's time when another process of the node did it).
            let cleared = self.caches_dropped.unwrap_or(self.init_start);
            log.event_at(cleared, "cache_clear", args.mlperf.drop_caches)?;
        }
        log.started_at(self.init_start, "init_start", json!({}))?;
        config(&mut log, args, run)?;
        log.end("init_stop", json!({}))?;
        log.start("run_start", json!({}))?;
        self.log = Some(log);
        Ok(())
    }

    /// A block (the epochs up to the next evaluation) starts at the run's first epoch and after each
    /// evaluation; then the epoch starts. MLPerf numbers epochs from 1.
    pub fn epoch_start(&mut self, args: &TrainArgs, epoch: usize) -> Result<()> {
        let new_block = epoch == self.first_epoch || args.evaluates(epoch - 1);
        if new_block {
            self.block_first = epoch;
        }
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        if new_block {
            let last = (epoch..args.epochs)
                .find(|&e| args.evaluates(e))
                .expect("the last epoch is evaluated");
            log.start(
                "block_start",
                json!({"first_epoch_num": epoch + 1, "epoch_count": last + 1 - epoch}),
            )?;
        }
        log.start("epoch_start", json!({"epoch_num": epoch + 1}))
    }

    /// `epoch`'s steps are done: the epoch's end, and the evaluation's start when it `evaluates`.
    pub fn trained(&mut self, epoch: usize, evaluates: bool) -> Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let n = json!({"epoch_num": epoch + 1});
        log.end("epoch_stop", n.clone())?;
        if evaluates {
            log.start("eval_start", n)?;
        }
        Ok(())
    }

    /// `epoch` was evaluated to top-1 `acc1` (percent): the evaluation's end, its accuracy as a fraction, the
    /// block's end, and run_stop (success) when it `reached` MLPerf's target (top-1 at least 75.9 and the
    /// checker's eval_accuracy at least 0.759 agree for every image count up to 200,000).
    pub fn evaluated(&mut self, epoch: usize, acc1: f64, reached: bool) -> Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let n = json!({"epoch_num": epoch + 1});
        log.end("eval_stop", n.clone())?;
        log.event_with("eval_accuracy", acc1 / 100.0, n)?;
        log.end(
            "block_stop",
            json!({"first_epoch_num": self.block_first + 1}),
        )?;
        if reached {
            log.end("run_stop", json!({"status": "success"}))?;
        }
        Ok(())
    }

    /// The run ends: MLPerf's status of a run that did not reach its quality target (every epoch trained, or
    /// stopped by a signal; a resumed run writes no log, so this attempt's log ends here).
    pub fn finish(&mut self, reached: bool) -> Result<()> {
        match (&mut self.log, reached) {
            (Some(log), false) => log.end("run_stop", json!({"status": "aborted"})),
            _ => Ok(()),
        }
    }
}

/// Where rank 0 of a training run writes `--mllog path`: there, after [`MlLog::check`], with a warning when the log
/// lacks what a result needs; nowhere when the run resumes from a checkpoint (see [`MlperfRun::new`]).
fn log_path<'a>(args: &TrainArgs, path: &'a Path, resumes: bool) -> Result<Option<&'a Path>> {
    if resumes {
        // A path that is no MLPerf log (the checkpoint's) is still a mistake worth an error.
        MlLog::keys(path)?;
        tracing::warn!(
            "--mllog {}: not written by this run: it resumes from a checkpoint, and MLPerf times one uninterrupted \
             run (the log keeps the first attempt, to where it stopped)",
            path.display()
        );
        return Ok(None);
    }
    let logged = MlLog::check(path)?;
    let missing = args.mlperf.missing(&logged);
    if !missing.is_empty() {
        tracing::warn!(
            "--mllog {} is not a submission log without {}",
            path.display(),
            missing.join(", ")
        );
    }
    Ok(Some(path))
}

/// The submission's fields and the hyperparameters as MLPerf's ResNet-50 rules name them (`lars_opt_*` or
/// `sgd_opt_*`).
fn config(log: &mut MlLog, args: &TrainArgs, run: &RunShape) -> Result<()> {
    let m = &args.mlperf;
    log.event("submission_benchmark", "resnet")?;
    if let Some(org) = &m.submission_org {
        log.event("submission_org", org)?;
    }
    if let Some(platform) = &m.submission_platform {
        log.event("submission_platform", platform)?;
    }
    log.event(
        "submission_division",
        m.submission_division.unwrap_or_default(),
    )?;
    log.event("submission_status", m.submission_status.unwrap_or_default())?;
    log.event("seed", args.seed)?;
    log.event("global_batch_size", run.global_batch)?;
    log.event("gradient_accumulation_steps", args.accum_steps)?;
    // The images batch norm's statistics are taken over: one process's batch, or every rank's with --sync-bn.
    let bn_span = match args.sync_bn {
        true => args.batch_size * run.world,
        false => args.batch_size,
    };
    log.event("model_bn_span", bn_span)?;
    if let Some((train, val)) = run.samples {
        log.event("train_samples", train)?;
        log.event("eval_samples", val)?;
    }
    let lars = args.optimizer == OptimizerKind::Lars;
    let p = if lars { "lars" } else { "sgd" };
    let schedule = run.schedule;
    log.event("opt_name", p)?;
    log.event(&format!("{p}_opt_base_learning_rate"), schedule.peak_lr)?;
    // The rate of the last step (the one that ends at epoch --epochs): --lr-end for poly and cosine, 0 for
    // linear, the rate after the last milestone for step.
    let end = schedule.at(schedule.epochs);
    log.event(&format!("{p}_opt_end_learning_rate"), end)?;
    match &schedule.decay {
        Decay::Poly { power, .. } => {
            log.event(&format!("{p}_opt_learning_rate_decay_poly_power"), power)?
        }
        // mllog's names for a step schedule (MLPerf's ResNet-50 rules before LARS and the polynomial decay).
        Decay::Step { milestones, gamma } => {
            log.event("opt_learning_rate_decay_boundary_epochs", milestones)?;
            log.event("opt_learning_rate_decay_factor", gamma)?;
        }
        Decay::Cosine { .. }
        | Decay::Linear
        | Decay::FlatCosine { .. }
        | Decay::OneCycle { .. } => {}
    }
    let decay_steps = (args.epochs as f64 - args.warmup_epochs) * run.per_epoch as f64;
    log.event(
        &format!("{p}_opt_learning_rate_decay_steps"),
        decay_steps.round() as u64,
    )?;
    let warmup_key = if lars {
        "lars_opt_learning_rate_warmup_epochs"
    } else {
        "opt_learning_rate_warmup_epochs"
    };
    log.event(warmup_key, args.warmup_epochs)?;
    log.event(&format!("{p}_opt_momentum"), args.momentum)?;
    log.event(&format!("{p}_opt_weight_decay"), args.wd)?;
    if lars {
        // rn50's LARS has no epsilon in its trust ratio.
        log.event("lars_epsilon", 0.0)?;
    }
    Ok(())
}

/// MLPerf's `event_type`s: `start`/`end` pairs (`run_start`/`run_stop`, `epoch_start`/`epoch_stop`...) and
/// points (`eval_accuracy`, the hyperparameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventType {
    PointInTime,
    IntervalStart,
    IntervalEnd,
}

/// One log line's JSON, its fields in mllog's order.
#[derive(Serialize)]
struct Line<'a> {
    namespace: &'a str,
    time_ms: u64,
    event_type: EventType,
    key: &'a str,
    value: Value,
    metadata: Metadata,
}

#[derive(Serialize)]
struct Metadata {
    file: &'static str,
    lineno: u32,
    #[serde(flatten)]
    extra: serde_json::Map<String, Value>,
}

/// The open log.
pub struct MlLog {
    file: File,
}

impl MlLog {
    /// The keys `path` logged so far, in order (none for a missing file). A file that is not an MLPerf log (a
    /// checkpoint, a config, another program's log) is an error: the log is appended to, and appending to such a
    /// file would damage it. Only a regular file is read, line by line: a pipe (`/dev/stdout | cat`, `>(tee
    /// log)`, a FIFO) or a device is written to as it is, and holds no earlier run; reading one waited for ever
    /// (a pipe whose write end this process holds) or without end (`/dev/zero`). Writes nothing.
    pub fn keys(path: &Path) -> Result<Vec<String>> {
        let reading = || format!("reading --mllog {}", path.display());
        match std::fs::metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(reading),
            Ok(m) if !m.is_file() => return Ok(Vec::new()),
            Ok(_) => {}
        }
        let mut lines = io::BufReader::new(File::open(path).with_context(reading)?);
        let head = lines.fill_buf().with_context(reading)?;
        anyhow::ensure!(
            head.is_empty() || head.starts_with(PREFIX.as_bytes()),
            "--mllog {} exists and is not an MLPerf log (it does not start with \"{}\"): appending to it would \
             damage it; name a new file",
            path.display(),
            PREFIX.trim_end()
        );
        let mut keys = Vec::new();
        for line in lines.split(b'\n') {
            let line = line.with_context(reading)?;
            let line = String::from_utf8_lossy(&line);
            let key = line
                .trim_end_matches('\r')
                .strip_prefix(PREFIX)
                .and_then(|l| serde_json::from_str::<Value>(l).ok())
                .and_then(|v| Some(v["key"].as_str()?.to_string()));
            keys.extend(key);
        }
        Ok(keys)
    }

    /// The keys of `path` ([`MlLog::keys`]), refusing one that already holds a run (an `init_start`): the
    /// compliance checker reads a file as one run, and a second run in it (another seed, a rerun) would make
    /// neither a result. Lines without a run (a `cache_clear` a job script logged first) are appended to.
    /// Writes nothing.
    pub fn check(path: &Path) -> Result<Vec<String>> {
        let keys = Self::keys(path)?;
        anyhow::ensure!(
            !keys.iter().any(|k| k == "init_start"),
            "--mllog {} already holds a run (its init_start): MLPerf's compliance checker reads a log as one \
             run, so each run needs its own file (result_0.txt, result_1.txt...); name a new file",
            path.display()
        );
        Ok(keys)
    }

    /// Opens `path` for appending (creating it), after [`MlLog::check`].
    pub fn open(path: &Path) -> Result<Self> {
        Self::check(path)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening --mllog {}", path.display()))?;
        Ok(Self { file })
    }

    /// A `POINT_IN_TIME` event: `key` = `value`.
    #[track_caller]
    pub fn event(&mut self, key: &str, value: impl Serialize) -> Result<()> {
        self.write(EventType::PointInTime, key, json!(value), json!({}))
    }

    /// A `POINT_IN_TIME` event with metadata (an object, e.g. `{"epoch_num": 3}`).
    #[track_caller]
    pub fn event_with(&mut self, key: &str, value: impl Serialize, metadata: Value) -> Result<()> {
        self.write(EventType::PointInTime, key, json!(value), metadata)
    }

    /// An `INTERVAL_START` event (value null, as mllog's `start` without a value).
    #[track_caller]
    pub fn start(&mut self, key: &str, metadata: Value) -> Result<()> {
        self.write(EventType::IntervalStart, key, Value::Null, metadata)
    }

    /// [`MlLog::event`] at `at`, before the log could be opened (`cache_clear`: the caches are dropped before
    /// the run starts).
    #[track_caller]
    pub fn event_at(&mut self, at: SystemTime, key: &str, value: impl Serialize) -> Result<()> {
        self.write_at(at, EventType::PointInTime, key, json!(value), json!({}))
    }

    /// [`MlLog::start`] of an interval that began at `at`, before the log could be opened (`init_start`: the
    /// log is written only once every check of the start has passed).
    #[track_caller]
    pub fn started_at(&mut self, at: SystemTime, key: &str, metadata: Value) -> Result<()> {
        self.write_at(at, EventType::IntervalStart, key, Value::Null, metadata)
    }

    /// An `INTERVAL_END` event.
    #[track_caller]
    pub fn end(&mut self, key: &str, metadata: Value) -> Result<()> {
        self.write(EventType::IntervalEnd, key, Value::Null, metadata)
    }

    #[track_caller]
    fn write(
        &mut self,
        event_type: EventType,
        key: &str,
        value: Value,
        metadata: Value,
    ) -> Result<()> {
        self.write_at(SystemTime::now(), event_type, key, value, metadata)
    }

    #[track_caller]
    fn write_at(
        &mut self,
        time: SystemTime,
        event_type: EventType,
        key: &str,
        value: Value,
        metadata: Value,
    ) -> Result<()> {
        let at = Location::caller();
        let extra = match metadata {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let line = Line {
            namespace: "",
            time_ms: time
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            event_type,
            key,
            value,
            metadata: Metadata {
                file: at.file(),
                lineno: at.line(),
                extra,
            },
        };
        let text = format!("{PREFIX}{}\n", python_json(&line)?);
        self.file
            .write_all(text.as_bytes())
            .context("writing --mllog")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_mllog_json_in_its_field_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.txt");
        let mut log = MlLog::open(&path).unwrap();
        log.event("global_batch_size", 3264).unwrap();
        log.start("epoch_start", json!({"epoch_num": 1})).unwrap();
        log.end("run_stop", json!({"status": "success"})).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let first = lines[0].strip_prefix(PREFIX).unwrap();
        // The field order of mlperf_logging's lines.
        let order = [
            "namespace",
            "time_ms",
            "event_type",
            "key",
            "value",
            "metadata",
        ]
        .map(|k| first.find(&format!("\"{k}\":")).unwrap());
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{first}");
        let v: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l.strip_prefix(PREFIX).unwrap()).unwrap())
            .collect();
        assert_eq!(v[0]["event_type"], "POINT_IN_TIME");
        assert_eq!(v[0]["value"], 3264);
        assert_eq!(v[0]["namespace"], "");
        assert!(v[0]["time_ms"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(v[0]["metadata"]["file"], file!());
        assert!(v[0]["metadata"]["lineno"].as_u64().unwrap() > 0);
        assert_eq!(v[1]["event_type"], "INTERVAL_START");
        assert_eq!(v[1]["metadata"]["epoch_num"], 1);
        assert!(v[1]["value"].is_null());
        assert_eq!(v[2]["event_type"], "INTERVAL_END");
        assert_eq!(v[2]["metadata"]["status"], "success");
        // Appends.
        drop(log);
        MlLog::open(&path).unwrap().event("seed", 0).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 4);
    }

    /// `--mllog RUN/checkpoint.safetensors` used to append log lines to the checkpoint (issue 25): a file that
    /// is not an MLPerf log is refused and left as it was; an empty one or a log is appended to.
    #[test]
    fn a_file_that_is_not_an_mlperf_log_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("checkpoint.safetensors");
        std::fs::write(&ckpt, b"\x08\0\0\0\0\0\0\0{}      ").unwrap();
        let err = MlLog::open(&ckpt).err().unwrap().to_string();
        assert!(err.contains("is not an MLPerf log"), "{err}");
        assert_eq!(std::fs::read(&ckpt).unwrap(), b"\x08\0\0\0\0\0\0\0{}      ");
        let short = dir.path().join("short");
        std::fs::write(&short, b":::ML").unwrap();
        assert!(MlLog::check(&short).is_err());
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        MlLog::open(&empty).unwrap().event("seed", 0).unwrap();
        MlLog::check(&empty).unwrap();
        MlLog::check(&dir.path().join("new")).unwrap();
        assert!(!dir.path().join("new").exists());
    }

    /// Issue 26: a second run appended to a log made a file the compliance checker reads as one run with two
    /// of each EXACTLY_ONE key. A log that holds a run is refused untouched; one with lines before a run (a job
    /// script's cache_clear) is appended to.
    #[test]
    fn a_log_that_holds_a_run_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.txt");
        let mut log = MlLog::open(&path).unwrap();
        log.event("cache_clear", true).unwrap();
        drop(log);
        let mut log = MlLog::open(&path).unwrap();
        log.start("init_start", json!({})).unwrap();
        drop(log);
        let before = std::fs::read(&path).unwrap();
        let err = MlLog::open(&path).err().unwrap().to_string();
        assert!(err.contains("already holds a run"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // A compact line of an older rn50 counts as well.
        let old = dir.path().join("old.txt");
        std::fs::write(
            &old,
            format!("{PREFIX}{{\"key\":\"init_start\",\"value\":null}}\n"),
        )
        .unwrap();
        assert!(MlLog::check(&old).is_err());
    }
}
