//! Helpers shared by the integration tests: the shared real data and small ImageFolder trees made from it, and
//! the command line of a small training run ([`TinyTrain`]).
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The shared test data (`RN50_SHARED_DATA`, else `<repo>/../shared/data`), its ImageNet sample photos sorted,
/// and the Python with torch and torchvision that reference scripts run under (`RN50_PYTHON`, else the repo's
/// .venv): rn50_util's, which every crate's tests use.
#[allow(unused_imports)]
pub use rn50_util::testing::{python, python_output, shared_data, shared_photos};

/// A directory for what a test binary makes once and many of its tests read (a reference's outputs, a reference
/// run): `<cargo's target tmp>/<name>-<pid>`. A `TempDir` in a static is never dropped, so each run left its copy in
/// /tmp (parity_torchvision's references are 2 GB); here each run first removes the directories of runs whose
/// process is gone, so at most the live runs' copies remain (and `cargo clean` removes those).
#[allow(dead_code)]
pub fn run_dir(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{name}-");
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let file = entry.file_name();
        let pid = file.to_str().and_then(|f| f.strip_prefix(&prefix));
        let pid = pid.filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if pid.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
    }
    // An earlier process of this pid left it: it is stale.
    let dir = root.join(format!("{prefix}{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `tests/reference/SCRIPT ARGS…` under [`python`] ([`python_output`]); panics with the script's stderr if it
/// fails.
#[allow(dead_code)]
pub fn reference_script<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(script);
    let mut line = vec![path.as_os_str()];
    line.extend(args.iter().map(AsRef::as_ref));
    let out = python_output(&line, None, &[]);
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
    let dir = shared_data().join("jpeg/imagenet");
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
    for p in shared_photos().iter().take(classes) {
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

/// `rn50 ARGS…`, run to the end (RN50_PARSE_ONLY removed from its environment: it runs, not only parses).
#[allow(dead_code)]
pub fn rn50(args: &[&str]) -> Output {
    rn50_in(Path::new("."), args)
}

/// [`rn50`] with RUST_BACKTRACE=1, so that a panic shows as one ("panicked", "stack backtrace"): for tests that
/// check an error is clean.
#[allow(dead_code)]
pub fn rn50_backtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args)
        .env_remove("RN50_PARSE_ONLY")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run rn50")
}

/// `rn50 ARGS…` only parsed, what `RN50_PARSE_ONLY=1 rn50 ARGS…` prints and exits with (train prints its resolved
/// flags as TOML and stops; the others parse and stop), here in this process: `rn50::cli::parse_only`, which that
/// binary runs. A process would spend about 0.7 CPU-seconds starting libtorch for it (docs/testing.md).
#[allow(dead_code)]
pub fn rn50_parse_only<S: AsRef<OsStr>>(args: &[S]) -> Output {
    use std::os::unix::process::ExitStatusExt;
    let argv = std::iter::once(OsStr::new("rn50"))
        .chain(args.iter().map(AsRef::as_ref))
        .map(OsStr::to_os_string)
        .collect();
    let parsed = rn50::cli::parse_only(argv);
    Output {
        status: std::process::ExitStatus::from_raw(i32::from(parsed.code) << 8),
        stdout: parsed.stdout.into_bytes(),
        stderr: parsed.stderr.into_bytes(),
    }
}

/// `rn50 ARGS…` run ([`rn50`]) in the working directory `cwd`.
#[allow(dead_code)]
pub fn rn50_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rn50"))
        .current_dir(cwd)
        .args(args)
        .env_remove("RN50_PARSE_ONLY")
        .output()
        .expect("run rn50")
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

    /// `rn50` with these arguments, to add environment or pipes to (RN50_PARSE_ONLY removed, as [`rn50`]
    /// does: it runs, not only parses, unless the test sets it again).
    pub fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rn50"));
        c.args(&self.0).env_remove("RN50_PARSE_ONLY");
        c
    }

    /// `rn50 launch --nproc-per-node NPROC -- ` with these arguments: `nproc` data-parallel ranks on this machine.
    pub fn launch(&self, nproc: usize) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rn50"));
        c.args(["launch", "--nproc-per-node", &nproc.to_string(), "--"])
            .args(&self.0)
            .env_remove("RN50_PARSE_ONLY");
        c
    }

    /// Runs it to the end.
    pub fn output(&self) -> Output {
        self.command().output().unwrap()
    }
}

/// The relative error of `a` against the reference `b` in the max norm: max |a − b| / max |b| (the largest
/// difference, against the largest value; at least 1e-12 below), for outputs compared value by value (logits,
/// weights).
#[allow(dead_code)]
pub fn max_abs_rel_err(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    let num = f64::try_from((a - b).abs().max()).unwrap();
    let den = f64::try_from(b.abs().max()).unwrap().max(1e-12);
    num / den
}

/// The relative error of `a` against the reference `b` in the L2 norm, both in fp32: ‖a − b‖ / ‖b‖ (at least
/// 1e-12 below), for whole tensors of low-precision results (fp16 against fp32), where single values may be off
/// by more.
#[allow(dead_code)]
pub fn l2_rel_err(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    let (a, b) = (a.to_kind(tch::Kind::Float), b.to_kind(tch::Kind::Float));
    let num = f64::try_from((&a - &b).norm()).unwrap();
    let den = f64::try_from(b.norm()).unwrap().max(1e-12);
    num / den
}

/// The check of a low-precision (fp16) computation against its fp32 reference `want`: `got` within `tol` of it
/// ([`l2_rel_err`]), or, given `peer` (the same computation by PyTorch's own ops in the same precision), no further
/// from it than 1.5 times the peer is. Panics naming `what` and both errors.
#[allow(dead_code)]
pub fn assert_as_close_as_peer(
    what: &str,
    got: &tch::Tensor,
    want: &tch::Tensor,
    peer: Option<&tch::Tensor>,
    tol: f64,
) {
    let e = l2_rel_err(got, want);
    let ep = peer.map(|p| l2_rel_err(p, want));
    let peer_err = ep.map_or("none given".to_string(), |ep| format!("{ep:.2e}"));
    assert!(
        e < tol || ep.is_some_and(|ep| e <= 1.5 * ep),
        "{what} is off the fp32 reference by {e:.2e} (tolerance {tol:.0e}; PyTorch's ops in the same precision: \
         {peer_err})"
    );
}
