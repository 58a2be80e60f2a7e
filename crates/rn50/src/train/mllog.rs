//! `train --mllog FILE`: MLPerf Training's result log, one `:::MLLOG {json}` line per event, as mlperf_logging's
//! `mllog` writes them (Python's `json.dumps`: `{"namespace": "", "time_ms": <Unix ms>, "event_type": "POINT_IN_TIME" |
//! "INTERVAL_START" | "INTERVAL_END", "key": ..., "value": ..., "metadata": {"file": ..., "lineno": ..., ...}}`).
//! The file and line are the Rust source line that logged the event (mllog gives the Python caller's). Only rank 0
//! writes; lines are appended, each in one write. A file holds one run, as MLCommons' compliance checker reads it:
//! one that already holds a run is refused ([`MlLog::check`]), and a run resumed from a checkpoint writes none.
//!
//! [`MlperfArgs`]: the submission's fields of the log and `--drop-caches`; [`TARGET_ACCURACY`]: MLPerf's quality
//! target, which decides `run_stop`'s status whenever `--mllog` is given.
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::panic::Location;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use rn50_args::UsageError;
use serde::Serialize;
use serde_json::{json, Value};

use crate::train::TrainArgs;

/// The line prefix of mllog (and of MLPerf's compliance checker).
pub const PREFIX: &str = ":::MLLOG ";

/// MLPerf Training's quality target for ResNet-50, top-1 in percent on the ImageNet validation set: the compliance
/// checker's `eval_accuracy >= 0.7590` (training_4.0.0/closed_resnet.yaml). With --mllog it is the run's target:
/// `run_stop` says `success` only when an evaluation reached it.
pub const TARGET_ACCURACY: f64 = 75.9;

/// `submission_division`: the rules a result is compared under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Division {
    /// The reference's model, optimizer and hyperparameter rules (LARS or SGD with MLPerf's polynomial decay).
    #[default]
    Closed,
    /// Any model, optimizer or schedule; the same data and quality target.
    Open,
}

/// `submission_status`: how available the system is (the values of the checker's 4.0.0 ruleset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Available: can be bought and run on premises.
    #[default]
    Onprem,
    /// Available: can be rented in a cloud.
    Cloud,
    /// Available within 180 days of the results' publication.
    Preview,
    /// Research, development or internal.
    Research,
}

/// The log's submission fields (`submission_org`, `_platform`, `_division`, `_status`) and `cache_clear`: what
/// MLCommons' compliance checker requires of a result log besides the run itself. All need --mllog.
#[derive(Args, Debug, Clone, Default, Serialize)]
pub struct MlperfArgs {
    /// --mllog's submission_org: the submitting organisation, as MLPerf's results name it (MLPerf's scripts take it
    /// from MLPERF_SUBMISSION_ORG). Not empty. The compliance checker requires it: without it the log is no result.
    #[arg(long, value_name = "NAME", requires = "mllog", value_parser = not_blank)]
    pub submission_org: Option<String>,
    /// --mllog's submission_platform: the system, named as its systems/NAME.json in the submission (e.g. 1xDGX-H100;
    /// MLPerf's scripts: MLPERF_SUBMISSION_PLATFORM, prefixed with the node count). Not empty. The compliance
    /// checker requires it.
    #[arg(long, value_name = "NAME", requires = "mllog", value_parser = not_blank)]
    pub submission_platform: Option<String>,
    /// --mllog's submission_division: closed (MLPerf's reference model and hyperparameter rules, LARS or SGD with
    /// its polynomial decay: results compared like for like) or open (any model or optimizer; same data and
    /// target) [default: closed, as MLPerf's reference scripts log].
    #[arg(long, value_enum, requires = "mllog")]
    pub submission_division: Option<Division>,
    /// --mllog's submission_status: onprem or cloud (available to buy or rent), preview (available within 180 days
    /// of publication) or research (research, development or internal) [default: onprem, as MLPerf's reference
    /// scripts log].
    #[arg(long, value_enum, requires = "mllog")]
    pub submission_status: Option<Status>,
    /// Before the run, write dirty pages back (sync) and drop the page cache, dentries and inodes (3 into
    /// /proc/sys/vm/drop_caches), as MLPerf's submission scripts do before each run on every node: the run reads
    /// its data from storage, not from memory a previous run filled. The first process of each node drops that
    /// node's cache. Needs root (an error otherwise, before anything is written). Logged as cache_clear true;
    /// without it cache_clear is false.
    #[arg(long, requires = "mllog")]
    pub drop_caches: bool,
}

/// clap's parser of a name that must say something: not empty, not only spaces.
fn not_blank(s: &str) -> Result<String, String> {
    match s.trim().is_empty() {
        true => Err("must not be empty".into()),
        false => Ok(s.to_string()),
    }
}

impl MlperfArgs {
    /// What keeps --mllog's log from being a result MLPerf accepts, as flags to add (for the warning at the
    /// start), with `logged` the keys the log has already (a job script's `cache_clear`); empty when nothing does.
    pub fn missing(&self, logged: &[String]) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.submission_org.is_none() {
            missing.push("--submission-org (the checker requires submission_org)");
        }
        if self.submission_platform.is_none() {
            missing.push("--submission-platform (the checker requires submission_platform)");
        }
        if !self.drop_caches && !logged.iter().any(|k| k == "cache_clear") {
            missing.push("--drop-caches (submissions clear the page cache before each run; cache_clear is false)");
        }
        missing
    }
}

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
        _ => Ok(()),
    }
}

/// The top-1 (percent) training stops at: --target-accuracy, else MLPerf's with --mllog (an MLPerf run ends at
/// its target), else none.
pub fn target(args: &TrainArgs) -> Option<f64> {
    args.target_accuracy
        .or(args.mllog.as_ref().map(|_| TARGET_ACCURACY))
}

/// The kernel's switch that drops the page cache.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// `--drop-caches` in this process: opens the kernel's switch (every process, so that all fail alike, before
/// anything is written, when they may not), and with `drop` (each node's first process) writes dirty pages back
/// and drops the page cache, dentries and inodes, as `sync && sysctl vm.drop_caches=3` in MLPerf's scripts. The
/// time it dropped them.
pub fn drop_caches(drop: bool) -> Result<Option<SystemTime>> {
    let mut switch = OpenOptions::new()
        .write(true)
        .open(DROP_CACHES)
        .with_context(|| {
            format!(
                "--drop-caches: cannot open {DROP_CACHES} for writing: dropping the page cache needs root (or a \
                 container allowed to write /proc/sys); run as root, or without --drop-caches"
            )
        })?;
    if !drop {
        return Ok(None);
    }
    // Only clean pages are dropped: the dirty ones are written back first.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    switch
        .write_all(b"3")
        .with_context(|| format!("--drop-caches: writing 3 to {DROP_CACHES}"))?;
    Ok(Some(SystemTime::now()))
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

/// `value` as JSON text the way Python's `json.dumps(value)` writes it, which mllog uses ([`PythonJson`]).
pub fn python_json(value: &impl Serialize) -> serde_json::Result<String> {
    let mut text = Vec::new();
    value.serialize(&mut serde_json::Serializer::with_formatter(
        &mut text, PythonJson,
    ))?;
    Ok(String::from_utf8(text).expect("every character outside printable ASCII is escaped"))
}

/// JSON as Python's `json.dumps` writes it with its defaults, as mllog does: `", "` and `": "` between items
/// (grep-based tools look for `"key": "run_stop"`), floats as Python's `repr` ([`python_float`]), and every
/// character outside printable ASCII as `\uXXXX` (ensure_ascii).
struct PythonJson;

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.begin_array_value(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    /// The characters serde_json does not escape itself (it writes `\"`, `\\`, `\n`... and the other controls
    /// as `\u00XX`, as Python does).
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if (' '..='~').contains(&c) {
                w.write_all(&[c as u8])?;
            } else {
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// A finite `x` as Python's `repr`: the shortest digits that read back as `x` (Rust's `{:e}` has the same), in
/// positional notation when the decimal point falls within 4 places before the first digit and 16 after it, with
/// at least one decimal (`2.0`, `0.0001`), else in exponent notation with a signed exponent of two digits or more
/// (`1e-05`, `1.5e+16`).
fn python_float(x: f64) -> String {
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits = mantissa.replace('.', "");
    // Python's decpt: the decimal point comes after this many digits.
    let point = exp + 1;
    if point <= -4 || point > 16 {
        let rest = match &digits[1..] {
            "" => String::new(),
            r => format!(".{r}"),
        };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{}{rest}e{exp_sign}{:02}", &digits[..1], exp.abs())
    } else if point <= 0 {
        format!(
            "{sign}0.{}{digits}",
            "0".repeat(point.unsigned_abs() as usize)
        )
    } else {
        let point = point as usize;
        match point < digits.len() {
            true => format!("{sign}{}.{}", &digits[..point], &digits[point..]),
            false => format!("{sign}{digits}{}.0", "0".repeat(point - digits.len())),
        }
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
