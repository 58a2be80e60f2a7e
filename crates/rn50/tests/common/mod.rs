//! Helpers shared by the integration tests: the shared real data and small ImageFolder trees made from it, and
//! the command line of a small training run ([`TinyTrain`]).
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn shared() -> PathBuf {
    std::env::var_os("RN50_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data"))
}

/// The Python with torch and torchvision that reference scripts run under: RN50_PYTHON, or the repo's .venv.
#[allow(dead_code)]
pub fn python() -> PathBuf {
    std::env::var_os("RN50_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"))
}

/// Runs `tests/reference/SCRIPT ARGS…` under [`python`]; panics with the script's stderr if it fails.
#[allow(dead_code)]
pub fn reference_script<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(script);
    let py = python();
    let out = std::process::Command::new(&py)
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (run ./dev setup): {e}", py.display()));
    assert!(
        out.status.success(),
        "{script} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Five of the shared ImageNet photos, colour and grayscale, small and large: tench, a dog, a church, a tray, a
/// washer.
#[allow(dead_code)]
pub fn imagenet_photos() -> Vec<PathBuf> {
    let dir = shared().join("jpeg/imagenet");
    [
        "n01440764",
        "n02107908",
        "n02948072",
        "n03868242",
        "n04554684",
    ]
    .iter()
    .map(|w| dir.join(format!("{w}.JPEG")))
    .collect()
}

/// `root/split/<wnid>/<wnid>_<i>.JPEG`: `copies` copies of each of the first `classes` ImageNet sample photos.
#[allow(dead_code)]
pub fn image_tree(root: &Path, split: &str, classes: usize, copies: usize) {
    let mut photos: Vec<PathBuf> = std::fs::read_dir(shared().join("jpeg/imagenet"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    photos.sort();
    for p in photos.iter().take(classes) {
        let wnid = p.file_stem().unwrap().to_str().unwrap();
        let dir = root.join(split).join(wnid);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..copies {
            std::fs::copy(p, dir.join(format!("{wnid}_{i}.JPEG"))).unwrap();
        }
    }
}

/// The records of a JSON-lines file of a run (metrics.jsonl, steps.jsonl).
#[allow(dead_code)]
pub fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The records of a run's steps.jsonl, typed (`rn50_report::schema::StepRecord`).
#[allow(dead_code)]
pub fn steps(run: &Path) -> Vec<rn50_report::schema::StepRecord> {
    std::fs::read_to_string(run.join("steps.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The epochs of a run's metrics.jsonl as `rn50_report::schema::read_metrics` reads them (the last record of
/// an epoch logged twice, by epoch): for the records' values; count the lines with [`json_lines`].
#[allow(dead_code)]
pub fn metrics(run: &Path) -> Vec<rn50_report::EpochMetrics> {
    rn50_report::schema::read_metrics(&run.join("metrics.jsonl")).unwrap()
}

/// Every record of a run's metrics.jsonl, typed, in the file's order (an epoch logged twice is there twice): for
/// what the file holds line by line; [`metrics`] for the epochs' values.
#[allow(dead_code)]
pub fn metrics_lines(run: &Path) -> Vec<rn50_report::EpochMetrics> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[allow(dead_code)]
pub fn rn50(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args)
        .output()
        .unwrap()
}

/// Reads `child`'s piped stderr until a line contains `text` (a training run's `[    3/` for its third step, or
/// `rn50 train:` for its start), then gives the reader back: for tests that stop or race a run once it got there.
/// Keep the reader while the child runs (dropping it closes the pipe). Panics if the child ends first.
#[allow(dead_code)]
pub fn read_stderr_until(
    child: &mut std::process::Child,
    text: &str,
) -> std::io::BufReader<std::process::ChildStderr> {
    use std::io::BufRead;
    let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr piped"));
    let mut line = String::new();
    while !line.contains(text) {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "rn50 ended before printing {text:?}"
        );
    }
    err
}

/// The command line of a small `rn50 train` on the CPU, which tests build on: `train SOURCE --out OUT -a resnet18
/// --device cpu`, SOURCE `--dummy` or a dataset, then the flags each test adds (width, batch, image size, epochs...:
/// the shared part has none that tests vary; `train` takes a flag's last value, so a test that needs another
/// network, device or `--out` adds it after them).
#[allow(dead_code)]
#[derive(Clone, Debug)]
pub struct TinyTrain(Vec<OsString>);

#[allow(dead_code)]
impl TinyTrain {
    /// On `--dummy` data (one random batch of 1000 classes).
    pub fn dummy(out: &Path) -> Self {
        Self::with_source("--dummy".as_ref(), out)
    }

    /// On the dataset in `data` (train/ and val/).
    pub fn on(data: &Path, out: &Path) -> Self {
        Self::with_source(data.as_ref(), out)
    }

    fn with_source(source: &OsStr, out: &Path) -> Self {
        let mut args: Vec<OsString> =
            vec!["train".into(), source.into(), "--out".into(), out.into()];
        args.extend(["-a", "resnet18", "--device", "cpu"].map(OsString::from));
        Self(args)
    }

    /// Adds `flags`, split at whitespace ("--epochs 2 -p 1").
    pub fn flags(mut self, flags: &str) -> Self {
        self.0.extend(flags.split_whitespace().map(OsString::from));
        self
    }

    /// Adds `args` as they are (paths, values with spaces).
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.0
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// The arguments after `rn50` (for `rn50 launch -- …`).
    pub fn to_args(&self) -> Vec<OsString> {
        self.0.clone()
    }

    /// `rn50` with these arguments, to add environment or pipes to.
    pub fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rn50"));
        c.args(&self.0);
        c
    }

    /// Runs it to the end.
    pub fn output(&self) -> Output {
        self.command().output().unwrap()
    }
}
