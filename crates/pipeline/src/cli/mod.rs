//! Command-line surfaces for the `rn50` binary, one module per command, each an `XxxArgs` and a
//! `run(&XxxArgs)`: [`pack`] (`rn50 pack`) and [`bench_loader`] (`rn50 bench-loader`); and the
//! flags the commands that decode images share ([`PixelLimit`]).

use anyhow::{Context, Result};

use crate::decode::MAX_IMAGE_PIXELS;

pub mod bench_loader;
pub mod pack;

pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `--max-image-pixels`, for every command that decodes images (pack, bench-loader, train, eval), passed
/// on as `LoaderConfig::max_image_pixels`.
#[derive(clap::Args, Debug, Clone, Copy, serde::Serialize)]
pub struct PixelLimit {
    /// Images with more pixels than this are bad images, refused from their header before any
    /// pixel is decoded (a guard against decompression bombs). The default is Pillow's
    /// MAX_IMAGE_PIXELS; Pillow warns above it and refuses above twice it.
    #[arg(long, value_name = "PIXELS", default_value_t = MAX_IMAGE_PIXELS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
}

/// `--json FILE`, written atomically.
pub(crate) fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    rn50_util::atomic_write(path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{bench_loader::BenchLoaderArgs, pack::PackArgs};

    #[derive(clap::Parser)]
    enum Cli {
        Pack(PackArgs),
        BenchLoader(BenchLoaderArgs),
    }

    fn max_image_pixels(args: &[&str]) -> Result<u64, clap::Error> {
        Ok(match Cli::try_parse_from(args)? {
            Cli::Pack(c) => c.pixel_limit.max_image_pixels,
            Cli::BenchLoader(c) => c.pixel_limit.max_image_pixels,
        })
    }

    #[test]
    fn max_image_pixels_defaults_to_pillows_and_must_be_positive() {
        for cmd in [
            &["rn50", "pack", "in", "out"][..],
            &["rn50", "bench-loader", "in"],
        ] {
            assert_eq!(max_image_pixels(cmd).unwrap(), MAX_IMAGE_PIXELS);
            let with = |v: &str| max_image_pixels(&[cmd, &["--max-image-pixels", v]].concat());
            assert_eq!(with("1000").unwrap(), 1000);
            assert!(with("0").is_err() && with("-1").is_err());
        }
    }
}
