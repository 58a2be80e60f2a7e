//! The training loop's parts (`rn50 train` is built from them): learning-rate recipe, checkpoints, EMA,
//! accuracy, and evaluation (`rn50 eval`).
pub mod checkpoint;
pub mod ema;
pub mod eval;
pub mod metrics;
pub mod run;
pub mod schedule;
