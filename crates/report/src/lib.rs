//! rn50's reporting layer, free of libtorch: the schemas of bench, sweep and training results; tables in the
//! shapes HPC sites publish (hardware × workers × img/s with scaling efficiency; WCT/Acc@1/Acc@5); CSV; PNG
//! plots; a ring all-reduce scaling model (`rn50 scaling`); and an I/O monitor reading /proc.
//!
//! How rn50 uses it:
//! - subcommands: `Report(rn50_report::report::ReportArgs)` → [`report::run`], `Scaling(Box<ScalingArgs>)` →
//!   [`scaling::run`] (boxed: the args are large next to other variants);
//! - `rn50 train`: an [`IoMonitor`] on the dataset path (`start_logging(data, interval, RUN_DIR/io.jsonl)`),
//!   `snapshot()` at each epoch's start and end, `end.delta(&start)` for the epoch's `disk_read_gbs`,
//!   `disk_read_iops`, `process_read_gbs` in metrics.jsonl; at the end a [`TrainSummary`] through
//!   [`write_summary`] (`fill_from_metrics` computes epochs, wall clock, accuracies and mean img/s), then
//!   [`write_run_report`] and [`summary_text`] for the terminal;
//! - `rn50 bench --sweep`: a [`SweepResult`] of [`SweepPoint::from_repeats`], `hardware` left empty and
//!   `device`/`threads`/`machine` set, so its rows group with bench results of the same hardware.

use std::path::PathBuf;

pub mod arch;
pub mod efficiency;
pub mod io_monitor;
mod plot;
pub mod report;
pub mod run_report;
pub mod scaling;
pub mod schema;
pub mod table;
pub mod tensorboard;

pub use io_monitor::{IoDelta, IoMonitor, IoSample};
pub use run_report::{summary_text, write_run_report, write_summary};
pub use schema::{
    BenchConfig, BenchResult, EpochMetrics, StepRecord, SweepPoint, SweepResult, TrainSummary,
};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: not a training run (no metrics.jsonl)", .0.display())]
    NotARun(PathBuf),
    #[error("{}: neither a bench result, a sweep result nor a run's summary.json", .0.display())]
    Unknown(PathBuf),
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
}

impl ReportError {
    /// A serde_json error at `line` of `path` (serde's own "at line L column C" suffix dropped: we say it first).
    pub(crate) fn json(path: &std::path::Path, line: usize, e: &serde_json::Error) -> ReportError {
        let text = e.to_string();
        let message = match text.rfind(" at line ") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        ReportError::Json {
            path: path.to_path_buf(),
            line,
            column: e.column(),
            message,
        }
    }
}
