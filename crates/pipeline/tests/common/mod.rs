//! Helpers shared by the integration tests: locating shared test data and the Python reference
//! implementation (Pillow / torchvision).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use rn50_util::testing::python_output;
/// `RN50_SHARED_DATA`, else `<repo>/../shared/data`.
pub use rn50_util::testing::shared_data;

/// Sorted files of a directory under shared/data/jpeg (licence files left out).
pub fn jpeg_files(sub: &str) -> Vec<PathBuf> {
    let dir = shared_data().join("jpeg").join(sub);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("LICENSE")
        })
        .collect();
    v.sort();
    v
}

/// An ImageFolder view of the 220 ImageNet samples: `<tmp>/<wnid>/<wnid>.JPEG` (symlinks).
pub fn imagenet_folder(tmp: &Path) -> PathBuf {
    let root = tmp.join("imagenet");
    for f in jpeg_files("imagenet") {
        let stem = f.file_stem().unwrap().to_string_lossy().to_string();
        let dir = root.join(&stem);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    root
}

/// The ImageNet class index of each shared photo (named `<wnid>.JPEG`).
pub fn imagenet_label(photo: &Path) -> usize {
    let wnid = photo.file_stem().unwrap().to_str().unwrap();
    rn50_pipeline::imagenet::wnids()
        .iter()
        .position(|w| *w == wnid)
        .unwrap()
}

/// The multiset of (image bytes, class name) of a dataset.
pub fn samples(ds: &rn50_pipeline::Dataset) -> BTreeMap<(Vec<u8>, String), usize> {
    let mut out = BTreeMap::new();
    let mut buf = Vec::new();
    for i in 0..ds.len() {
        let bytes = ds.read(i, &mut buf).unwrap().to_vec();
        let class = ds.classes()[ds.label(i) as usize].clone();
        *out.entry((bytes, class)).or_default() += 1;
    }
    out
}

/// The multiset of (pixels, class name) the loader makes of a dataset's images (Resize 40, CenterCrop 32).
pub fn decoded_samples(ds: rn50_pipeline::Dataset) -> BTreeMap<(Vec<u8>, String), usize> {
    use rn50_pipeline::{Loader, LoaderConfig, Transform};
    let cfg = LoaderConfig {
        transform: Transform::val(40, 32),
        ..LoaderConfig::val(32, 2)
    };
    let classes = ds.classes().to_vec();
    let loader = Loader::new(ds, cfg).unwrap();
    let mut out = BTreeMap::new();
    for b in loader.epoch(0, 0) {
        let b = b.unwrap();
        for (k, &label) in b.labels().iter().enumerate() {
            let image = b[k * 32 * 32 * 3..(k + 1) * 32 * 32 * 3].to_vec();
            *out.entry((image, classes[label as usize].clone()))
                .or_insert(0) += 1;
        }
    }
    out
}

/// One evaluation epoch of `ds` (batches of 4, 2 threads, Resize 40, CenterCrop 32): the images its batches
/// hold, and the loader's stats (bad images).
pub fn load_epoch(ds: rn50_pipeline::Dataset) -> (usize, rn50_pipeline::Stats) {
    use rn50_pipeline::{Loader, LoaderConfig, Transform};
    let cfg = LoaderConfig {
        transform: Transform::val(40, 32),
        ..LoaderConfig::val(4, 2)
    };
    let loader = Loader::new(ds, cfg).unwrap();
    let images = loader.epoch(0, 0).map(|b| b.unwrap().labels().len()).sum();
    (images, loader.stats())
}

/// The error of opening `file`, which must fail, in one line naming it.
pub fn open_error<T>(opened: anyhow::Result<T>, file: &Path) -> String {
    let err = match opened {
        Ok(_) => panic!("{} opened", file.display()),
        Err(e) => format!("{e:#}"),
    };
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(err.contains(name), "{err}");
    assert!(!err.contains('\n'), "{err}");
    err
}

/// Runs `scripts/dataset_writers.py ARGS...`, which writes datasets with webdataset's and Hugging Face
/// `datasets`' own writers. Fails (never skips) when Python or its packages are missing.
pub fn dataset_writer(args: &[&str]) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/dataset_writers.py"
    );
    let out = python_output(&[&[script], args].concat(), None, &[]);
    assert!(
        out.status.success(),
        "dataset_writers.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `scripts/pipeline_reference.py` runs with: MKL pinned to its AVX2 path where MKL_CBWR is unset (the
/// script's header says why), before torch is imported, as MKL reads it when it starts (`python_output`).
pub fn reference_env() -> &'static [(&'static str, &'static str)] {
    if std::env::var_os("MKL_CBWR").is_none() {
        &[("MKL_CBWR", "AVX2")]
    } else {
        &[]
    }
}

/// Run `scripts/pipeline_reference.py MODE OUT ARGS...` and return its manifest.
/// Fails (never skips) when Python or its packages are missing.
pub fn reference(mode: &str, out: &Path, args: &[String]) -> serde_json::Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/pipeline_reference.py"
    );
    let mut line: Vec<&OsStr> = vec![script.as_ref(), mode.as_ref(), out.as_os_str()];
    line.extend(args.iter().map(OsStr::new));
    let output = python_output(&line, None, reference_env());
    assert!(
        output.status.success(),
        "reference script failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Raw RGB written by the reference script for item `n`.
pub fn reference_pixels(out: &Path, n: usize) -> Vec<u8> {
    std::fs::read(out.join(format!("{n}.rgb"))).unwrap()
}

/// Mean absolute difference per channel value.
pub fn mae(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len(), "images differ in size");
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as i32 - *y as i32).unsigned_abs() as u64)
        .sum::<u64>() as f64
        / a.len().max(1) as f64
}

/// Two-sample Kolmogorov–Smirnov statistic.
pub fn ks(mut a: Vec<f64>, mut b: Vec<f64>) -> f64 {
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (mut i, mut j, mut d) = (0, 0, 0.0f64);
    while i < a.len() && j < b.len() {
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
    }
    d
}

/// The two-sample KS statistic above which samples of `n` and `m` differ at α = 0.001.
pub fn ks_critical(n: usize, m: usize) -> f64 {
    1.95 * ((n + m) as f64 / (n * m) as f64).sqrt()
}

/// A valid PNG of `width x height` black pixels, 1 bit each: a few kilobytes for any size, and
/// `width * height * 3` bytes once decoded to RGB (a decompression bomb).
pub fn blank_png(width: u32, height: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::One);
    let mut w = enc.write_header().unwrap();
    w.write_image_data(&vec![0; (width as usize).div_ceil(8) * height as usize])
        .unwrap();
    w.finish().unwrap();
    out
}

/// `jpeg` with other dimensions in its frame header (SOFn): a decoder that trusts the header sets
/// aside `width x height` pixels for a file of a few kilobytes.
pub fn with_dimensions(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    let mut at = 2;
    loop {
        assert!(
            at + 9 <= out.len() && out[at] == 0xFF,
            "no frame header found"
        );
        let marker = out[at + 1];
        // SOF0..SOF15, less DHT (C4), JPG (C8) and DAC (CC).
        if (0xC0..=0xCF).contains(&marker) && ![0xC4, 0xC8, 0xCC].contains(&marker) {
            out[at + 5..at + 7].copy_from_slice(&height.to_be_bytes());
            out[at + 7..at + 9].copy_from_slice(&width.to_be_bytes());
            return out;
        }
        at += 2 + u16::from_be_bytes([out[at + 2], out[at + 3]]) as usize;
    }
}

/// Files in the pixel limit's tests, all above Pillow's MAX_IMAGE_PIXELS (89,478,485) and a few
/// kilobytes each: the smallest ImageNet photo (2 kB) with a header claiming 16000x16000 or
/// 10000x10000 (above the limit, below twice it, where Pillow only warns), and a valid 16000x16000
/// PNG.
pub fn pixel_bombs() -> Vec<(&'static str, Vec<u8>)> {
    let photo = std::fs::read(shared_data().join("jpeg/imagenet/n03825788.JPEG")).unwrap();
    vec![
        ("16000x16000.jpg", with_dimensions(&photo, 16000, 16000)),
        ("10000x10000.jpg", with_dimensions(&photo, 10000, 10000)),
        ("16000x16000.png", blank_png(16000, 16000)),
    ]
}

/// A seeded mutation of `bytes`, of the kinds a fuzzer makes: 1 to 4 edits among a flipped bit, a
/// random or boundary byte, a boundary 16-bit value (lengths, dimensions), a range deleted or
/// repeated, a marker-like `FF xx` inserted, and the tail cut off.
pub fn mutate(bytes: &[u8], rng: &mut impl rand::Rng) -> Vec<u8> {
    use rand::seq::IndexedRandom;
    let mut b = bytes.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        if b.is_empty() {
            b.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..b.len());
        let end = (at + rng.random_range(1..=64)).min(b.len());
        match rng.random_range(0..8) {
            0 => b[at] ^= 1 << rng.random_range(0..8),
            1 => b[at] = rng.random(),
            2 => b[at] = *[0x00, 0x01, 0x7F, 0x80, 0xFF].choose(rng).unwrap(),
            3 => {
                let v: u16 = *[0, 1, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF].choose(rng).unwrap();
                let n = (b.len() - at).min(2);
                b[at..at + n].copy_from_slice(&v.to_be_bytes()[..n]);
            }
            4 => {
                b.drain(at..end);
            }
            5 => {
                let repeated = b[at..end].to_vec();
                b.splice(at..at, repeated);
            }
            6 => {
                b.splice(at..at, [0xFF, rng.random()]);
            }
            _ => b.truncate(at),
        }
    }
    b
}

/// Makes a named pipe at `path` (`mkfifo`). A reader's `open` blocks until a writer opens it, so a
/// test that puts one among a dataset's files knows, deterministically, when a worker has reached
/// that file, and holds the worker there until it writes.
pub fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfifo {} failed", path.display());
}

/// `RN50_CACHE_DIR`, where opening WebDataset shards keeps their indexes ([`rn50_pipeline::source::wds`]),
/// pointed at a fresh folder while this lives, then unset and the folder removed: the tests leave nothing in
/// `~/.cache/rn50`. The variable is the process's, so the tests that hold one run one at a time.
pub struct TempCache {
    pub dir: tempfile::TempDir,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

pub fn temp_cache() -> TempCache {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed holding it poisons it; the next one may still run.
    let guard = rn50_util::lock_unpoisoned(&LOCK);
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("RN50_CACHE_DIR", dir.path());
    TempCache {
        dir,
        _one_at_a_time: guard,
    }
}

impl Drop for TempCache {
    fn drop(&mut self) {
        std::env::remove_var("RN50_CACHE_DIR");
    }
}

/// Runs `rn50 pack ARGS` as the binary would.
pub fn pack_command(args: &[&str]) -> anyhow::Result<()> {
    use clap::Parser;
    #[derive(Parser)]
    struct Pack {
        #[command(flatten)]
        args: rn50_pipeline::cli::pack::PackArgs,
    }
    let cmd = Pack::try_parse_from([&["pack", "--quiet"], args].concat())?;
    rn50_pipeline::cli::pack::run(&cmd.args)
}
