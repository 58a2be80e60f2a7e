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
    /// Opens `path` for appending (creating it).
    pub fn open(path: &Path) -> Result<Self> {
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
        let at = Location::caller();
        let extra = match metadata {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let line = Line {
            namespace: "",
            time_ms: SystemTime::now()
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
}
