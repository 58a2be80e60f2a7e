//! The training loop's parts (`rn50 train` is built from them): learning-rate recipe, checkpoints.
pub mod checkpoint;
pub mod schedule;
