//! The training loop's parts (`rn50 train` is built from them): learning-rate recipe, checkpoints, EMA.
pub mod checkpoint;
pub mod ema;
pub mod schedule;
