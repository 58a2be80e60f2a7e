//! Cost of each TrivialAugmentWide op per image, against torchvision on the same images:
//! `cargo run --release -p rn50-pipeline --example bench_autoaugment -- PHOTO_DIR [--images 32]
//! [--size 224] [--reps 5] [--python PY]`.
//!
//! The first `--images` JPEGs of PHOTO_DIR are decoded and made `size x size` with the validation
//! transform (Resize + CenterCrop), what the ops see after RandomResizedCrop. Each op, at
//! TrivialAugmentWide's middle bin (15 of 31, positive sign), is applied to a copy of every image
//! on this thread, then TrivialAugmentWide itself (random ops, seeded); the best of `--reps` passes
//! counts, in microseconds per image (the copy not included). With a Python that has torchvision
//! (`--python`, else `RN50_PYTHON`, else `.venv/bin/python`), `scripts/bench_autoaugment_torchvision.py`
//! times the same ops on the same pixels on one thread, and the table shows the ratio.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rand::SeedableRng;
use rn50_pipeline::autoaugment::{AutoAugment, Op, OpKind, Policy};
use rn50_pipeline::transform::{Augmenter, Transform};

#[derive(Parser)]
struct Args {
    /// A directory of JPEGs (e.g. shared/data/jpeg/imagenet).
    photos: PathBuf,
    #[arg(long, default_value_t = 32)]
    images: usize,
    #[arg(long, default_value_t = 224)]
    size: usize,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Python with torchvision for the comparison.
    #[arg(long)]
    python: Option<PathBuf>,
}

/// Best of `reps` passes of `f` over `images` copies, per image; `f` gets a fresh copy each time.
fn best(images: &[Vec<u8>], reps: usize, mut f: impl FnMut(&mut [u8])) -> Duration {
    let mut work = images[0].clone();
    let mut best = Duration::MAX;
    for _ in 0..reps + 1 {
        let mut total = Duration::ZERO;
        for img in images {
            work.copy_from_slice(img);
            let t = Instant::now();
            f(&mut work);
            total += t.elapsed();
        }
        best = best.min(total / images.len() as u32);
    }
    best
}

fn main() -> Result<()> {
    let a = Args::parse();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&a.photos)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| {
        !p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("LICENSE")
    });
    files.sort();
    files.truncate(a.images);
    anyhow::ensure!(!files.is_empty(), "no images in {}", a.photos.display());
    let size = a.size;
    let mut resize = Augmenter::new(Transform::val(size * 8 / 7, size), false)?;
    let mut rng = rand::rng();
    let images: Vec<Vec<u8>> = files
        .iter()
        .map(|f| {
            let mut out = vec![0u8; size * size * 3];
            resize.apply(&std::fs::read(f)?, &mut rng, &mut out)?;
            Ok(out)
        })
        .collect::<Result<_>>()?;

    let policy = Policy::trivial_augment_wide();
    let ops: Vec<(OpKind, f64)> = OpKind::ALL
        .iter()
        .map(|&k| (k, policy.magnitude(k, 15, size, size).unwrap_or(0.0)))
        .collect();
    let mut rows: Vec<(String, Duration)> = Vec::new();
    let mut scratch = Vec::new();
    for &(kind, m) in &ops {
        let op = Op::from_magnitude(kind, m);
        let t = best(&images, a.reps, |img| {
            op.apply(img, size, size, &mut scratch)
        });
        rows.push((kind.name().to_string(), t));
    }
    let mut aug = AutoAugment::new(policy);
    let mut seeded = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let t = best(&images, a.reps, |img| {
        aug.apply(img, size, size, &mut seeded);
    });
    rows.push(("TrivialAugmentWide".into(), t));

    let theirs = torchvision(&a, &images, &ops)
        .map_err(|e| eprintln!("no torchvision comparison: {e:#}"))
        .ok();
    println!(
        "{} images of {size}x{size}, best of {} passes, microseconds per image, one thread",
        images.len(),
        a.reps
    );
    println!("| op (magnitude) | rn50 µs | torchvision µs | torchvision / rn50 |");
    println!("| --- | --- | --- | --- |");
    for (name, t) in rows {
        let ours = t.as_secs_f64() * 1e6;
        let m = ops
            .iter()
            .find(|(k, _)| k.name() == name)
            .map_or(String::new(), |(k, m)| {
                if policy.magnitude(*k, 0, size, size).is_some() {
                    format!(" ({m:.4})")
                } else {
                    String::new()
                }
            });
        match theirs.as_ref().and_then(|t| t[&name].as_f64()) {
            Some(tv) => println!("| {name}{m} | {ours:.1} | {tv:.1} | {:.1}x |", tv / ours),
            None => println!("| {name}{m} | {ours:.1} | | |"),
        }
    }
    Ok(())
}

/// Runs scripts/bench_autoaugment_torchvision.py on the same pixels and ops.
fn torchvision(a: &Args, images: &[Vec<u8>], ops: &[(OpKind, f64)]) -> Result<serde_json::Value> {
    let python = a
        .python
        .clone()
        .or_else(|| std::env::var_os("RN50_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python").into());
    let tmp = tempfile::tempdir()?;
    let raw = tmp.path().join("images.rgb");
    std::fs::write(&raw, images.concat())?;
    let ops_file = tmp.path().join("ops.json");
    let list: Vec<_> = ops
        .iter()
        .map(|(k, m)| serde_json::json!([k.name(), m]))
        .collect();
    std::fs::write(&ops_file, serde_json::to_string(&list)?)?;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/bench_autoaugment_torchvision.py"
    );
    let out = Command::new(&python)
        .arg(script)
        .arg(&raw)
        .arg(a.size.to_string())
        .arg(&ops_file)
        .arg(a.reps.to_string())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed: {}",
        script,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}
