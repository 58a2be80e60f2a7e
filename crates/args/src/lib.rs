//! The ranges of rn50's command-line numbers, in one place for every crate with a command line (pipeline,
//! distributed, report, rn50; prepare's few numbers are clap's own u16/u32 ranges).
//!
//! Every numeric flag has a range. A value outside it is clap's error: exit 2, the flag named, before the command
//! runs. Integers use clap's ranged parsers ([`usize_in`] for `usize` fields), floats [`finite_in`], which also
//! turns away NaN and infinities (`--ema nan` once trained to NaN weights and exited 0). Flags that must agree
//! with each other (`--val-crop` at most `--val-resize`, a batch that fits [`MAX_BATCH_BYTES`]) are checked
//! where the command resolves its arguments, before anything is allocated or written, and fail with a
//! [`UsageError`], which `rn50`'s `main` exits 2 on as well.
use std::fmt;
use std::ops::{Bound, RangeBounds};

/// The largest side of any image-size flag (`--image-size`, `--size`, `--val-resize`, `--crop`…), in pixels:
/// 18x ImageNet's 224.
pub const MAX_IMAGE_SIZE: u64 = 4096;
/// The largest batch of one process.
pub const MAX_BATCH: u64 = 65536;
/// The most threads of one kind (decode workers, libtorch's intra-op pool) and processes per node.
pub const MAX_THREADS: u64 = 1024;
/// The largest batch of uint8 pixels, batch x side x side x 3 bytes: 16 GiB (65,536 images of 224 px take 9.9
/// GB). The loader holds a few such batches, the device more than that in activations.
pub const MAX_BATCH_BYTES: u64 = 16 << 30;
/// Synthetic JPEGs generated in memory (`--synthetic`, `--synthetic-images`): at ImageNet's sizes a few GB.
pub const MAX_SYNTHETIC_IMAGES: u64 = 100_000;

/// clap's range check for a `usize` flag, as `clap::value_parser!(u64).range(..)` is for a `u64` one.
pub fn usize_in(range: impl RangeBounds<u64>) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(range)
}

/// A clap value parser for a float flag: a finite number within `range`, e.g.
/// `#[arg(long, value_parser = finite_in(0.0..=1.0))]`. NaN and infinities are refused whatever the range.
pub fn finite_in<R>(
    range: R,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static
where
    R: RangeBounds<f64> + Clone + Send + Sync + 'static,
{
    move |s: &str| {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("expected a number in {}", interval(&range)))?;
        if v.is_finite() && range.contains(&v) {
            Ok(v)
        } else {
            Err(format!("must be a finite number in {}", interval(&range)))
        }
    }
}

/// [`finite_in`] above zero: (0, ∞).
pub fn positive() -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    finite_in((Bound::Excluded(0.0), Bound::Unbounded))
}

/// `range` in interval notation: [0, 1], (0, ∞).
fn interval(range: &impl RangeBounds<f64>) -> String {
    let lo = match range.start_bound() {
        Bound::Included(a) => format!("[{a}"),
        Bound::Excluded(a) => format!("({a}"),
        Bound::Unbounded => "(-∞".into(),
    };
    let hi = match range.end_bound() {
        Bound::Included(b) => format!("{b}]"),
        Bound::Excluded(b) => format!("{b})"),
        Bound::Unbounded => "∞)".into(),
    };
    format!("{lo}, {hi}")
}

/// Flags that parse one by one but not together. `rn50` exits 2 on it, like clap on a value out of range; with
/// anyhow, `bail!(UsageError::new(…))`; `main` finds it anywhere in the error's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        UsageError(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Checks that a batch of `batch` images of `side` x `side` uint8 RGB pixels stays within [`MAX_BATCH_BYTES`];
/// `batch_flag` and `side_flag` name the flags in the error (`"--batch-size"`, `"--image-size"`).
pub fn check_batch_bytes(
    batch_flag: &str,
    batch: u64,
    side_flag: &str,
    side: u64,
) -> Result<(), UsageError> {
    let bytes = batch
        .saturating_mul(side.saturating_mul(side))
        .saturating_mul(3);
    if bytes <= MAX_BATCH_BYTES {
        return Ok(());
    }
    Err(UsageError(format!(
        "{batch_flag} {batch} with {side_flag} {side} makes batches of {:.1} GB ({batch} x {side} x {side} x 3 \
         bytes); at most {:.1} GB (16 GiB) is allowed: lower one of them",
        bytes as f64 / 1e9,
        MAX_BATCH_BYTES as f64 / 1e9
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_in_takes_the_range_and_refuses_nan_and_infinities() {
        let p = finite_in(0.0..=1.0);
        assert_eq!(p("0"), Ok(0.0));
        assert_eq!(p(" 1 "), Ok(1.0));
        assert_eq!(p("2"), Err("must be a finite number in [0, 1]".into()));
        assert!(p("-1e-9").is_err());
        for bad in ["nan", "NaN", "inf", "-inf", "", "x"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        let open = finite_in(0.0..);
        assert_eq!(open("1e300"), Ok(1e300));
        assert_eq!(open("inf"), Err("must be a finite number in [0, ∞)".into()));
        let pos = positive();
        assert!(pos("0").is_err());
        assert_eq!(pos("1e-12"), Ok(1e-12));
    }

    #[test]
    fn batch_bytes_bound() {
        assert!(check_batch_bytes("-b", MAX_BATCH, "--size", 224).is_ok());
        assert!(check_batch_bytes("-b", 1, "--size", MAX_IMAGE_SIZE).is_ok());
        let e = check_batch_bytes("-b", MAX_BATCH, "--size", MAX_IMAGE_SIZE).unwrap_err();
        assert!(e.0.starts_with("-b 65536 with --size 4096"), "{e}");
        // No overflow whatever the operands.
        assert!(check_batch_bytes("-b", u64::MAX, "--size", u64::MAX).is_err());
    }
}
