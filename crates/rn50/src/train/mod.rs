//! The training loop's parts (`rn50 train` is built from them): learning-rate recipe, checkpoints, EMA,
//! accuracy, the run directory's claim, and evaluation (`rn50 eval`).
pub mod args;
pub mod checkpoint;
pub mod data;
pub mod ema;
pub mod eval;
pub mod keeper;
pub mod metrics;
pub mod progress;
pub mod run;
mod rundir;
pub mod schedule;
