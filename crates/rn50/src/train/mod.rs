//! `rn50 train` and `rn50 eval`. The recipe, read top to bottom like pytorch/examples' main.py, is
//! [`trainer`] ([`run`]); its parts:
//!
//! - [`args`]: the flags (`foreign`: main.py's and timm's that rn50 spells another way), [`config`]: `--config FILE.toml` and the run's config.toml; [`data`]: the loaders of DATA/train and DATA/val and the hand-over to the device;
//! - [`schedule`]: learning rate (scaling, warmup, decay) and progressive resizing; [`ema`]: the weights' moving
//!   average; [`metrics`]: top-1/top-5 counting; [`progress`]: the per-epoch progress bar or log lines;
//! - [`checkpoint`]: the resumable state in one safetensors file; [`keeper`]: when to save, which to keep, what
//!   `--resume` means; `rundir`: the run directory's claim and its logs' trimming on resume;
//! - [`runlog`]: rank 0's logs in the run directory (metrics.jsonl, steps.jsonl, TensorBoard, the summary);
//!   [`mllog`]: MLPerf's `:::MLLOG` lines (`--mllog`), written at the trainer's hooks;
//! - [`eval`]: one evaluation pass, and `rn50 eval` ([`eval::run`]).
pub mod args;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod ema;
pub mod eval;
mod foreign;
pub mod keeper;
pub mod metrics;
pub mod mllog;
pub mod progress;
mod rundir;
pub mod runlog;
pub mod schedule;
pub mod trainer;

pub use args::TrainArgs;
pub use eval::EvalArgs;
pub use trainer::{run, Outcome, EXIT_PREEMPTED};

/// Every rule between `train`'s flags, before anything is allocated or written: [`TrainArgs::check`]'s, then
/// --mllog's ([`mllog::check`]). A [`rn50_args::UsageError`] (exit 2) when one is broken.
pub fn check(args: &TrainArgs) -> Result<(), rn50_args::UsageError> {
    args.check()?;
    mllog::check(args)
}
