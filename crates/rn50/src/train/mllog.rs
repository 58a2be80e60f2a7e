//! `train --mllog FILE`: MLPerf Training's result log, one `:::MLLOG {json}` line per event, as mlperf_logging's
//! `mllog` writes them: `{"namespace": "", "time_ms": <Unix ms>, "event_type": "POINT_IN_TIME" |
//! "INTERVAL_START" | "INTERVAL_END", "key": ..., "value": ..., "metadata": {"file": ..., "lineno": ..., ...}}`.
//! The file and line are the Rust source line that logged the event (mllog gives the Python caller's). Only rank 0
//! writes; lines are appended, each in one write.
use std::fs::File;
use std::io::Write;
use std::panic::Location;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

/// The line prefix of mllog (and of MLPerf's compliance checker).
pub const PREFIX: &str = ":::MLLOG ";

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
    /// Refuses a `path` that holds something other than an MLPerf log (a checkpoint, a config, another
    /// program's log): the log is appended to, and appending to such a file would damage it. Writes nothing.
    pub fn check(path: &Path) -> Result<()> {
        use std::io::Read;
        let mut head = Vec::new();
        match File::open(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("opening --mllog {}", path.display())),
            Ok(f) => f
                .take(PREFIX.len() as u64)
                .read_to_end(&mut head)
                .with_context(|| format!("reading --mllog {}", path.display()))?,
        };
        anyhow::ensure!(
            head.is_empty() || head == PREFIX.as_bytes(),
            "--mllog {} exists and is not an MLPerf log (it does not start with \"{}\"): appending to it would \
             damage it; name a new file",
            path.display(),
            PREFIX.trim_end()
        );
        Ok(())
    }

    /// Opens `path` for appending (creating it), after [`MlLog::check`].
    pub fn open(path: &Path) -> Result<Self> {
        Self::check(path)?;
        let file = std::fs::OpenOptions::new()
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
        let text = format!("{PREFIX}{}\n", serde_json::to_string(&line)?);
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
}
