//! The training loop's parts (issue 5 builds `rn50 train` from them): the learning-rate recipe first.
pub mod schedule;
