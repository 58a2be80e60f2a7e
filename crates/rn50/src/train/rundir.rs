//! The run directory (`--out`) belongs to one run. One `rn50 train` writes to it at a time (an `flock` on
//! `.rn50-train.lock`, held until the process ends: two runs would interleave their metrics and rotate each
//! other's checkpoints away), and a directory that already holds a run is continued only with `--resume`, or
//! replaced only with `--overwrite`. A forgotten `--resume` used to start a new run that pruned the earlier
//! run's checkpoints at its first save and overwrote its best weights.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rn50_util::{try_lock_pid, Locked, PidLock};

use crate::train::keeper::{is_checkpoint, LATEST};

const LOCK: &str = ".rn50-train.lock";

/// What `rn50 train` writes into a run directory besides the numbered checkpoints: the files that say a run
/// was here, and that `--overwrite` removes (nothing else of the directory's is touched).
const RUN_FILES: &[&str] = &[
    LATEST,
    "config.toml",
    "metrics.jsonl",
    "steps.jsonl",
    "io.jsonl",
    "metrics.csv",
    "summary.json",
    "summary.md",
    "loss.png",
    "accuracy.png",
    "lr.png",
    "best.safetensors",
    "best_ema.safetensors",
    "final.safetensors",
];

/// The folder of the TensorBoard event files.
const TENSORBOARD: &str = "tensorboard";

/// The claim on a run directory: the lock is released when this is dropped (or the process ends, however).
pub struct RunDir {
    _lock: PidLock,
    out: PathBuf,
    /// With `--overwrite`: the earlier run's files, removed by [`RunDir::begin`].
    replaced: Vec<PathBuf>,
}

impl RunDir {
    /// Creates `out` if needed and locks it for this process. If it holds an earlier run: a `resume` of that
    /// run (`auto`, `out` itself or a checkpoint in it) goes on with it, `overwrite` replaces it (its files are
    /// removed by [`RunDir::begin`], once every other check has passed), and otherwise it is an error that says
    /// which to use. Resuming another run's checkpoint into `out` is such an error too: it would prune this
    /// run's checkpoints and mix the two runs' metrics.
    pub fn claim(out: &Path, resume: Option<&Path>, overwrite: bool) -> Result<RunDir> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join(LOCK);
        let lock = match try_lock_pid(&path).with_context(|| format!("locking {}", path.display()))? {
            Locked::Ours(lock) => lock,
            Locked::HeldBy(holder) => bail!(
                "{} is in use by another rn50 train ({holder}): two runs in one directory would mix their \
                 metrics and prune each other's checkpoints; choose another --out",
                out.display(),
            ),
        };
        let earlier = run_files(out)?;
        let continuing = resume.is_some_and(|r| resumes_run_in(r, out));
        if continuing || earlier.is_empty() {
            return Ok(RunDir {
                _lock: lock,
                out: out.to_path_buf(),
                replaced: Vec::new(),
            });
        }
        if !overwrite {
            let from_elsewhere = match resume {
                Some(r) => format!(
                    " and --resume {} is not a checkpoint of it (resuming another run here would prune this \
                     one's checkpoints and mix their metrics)",
                    r.display()
                ),
                None => String::new(),
            };
            bail!(
                "{} already holds a run ({}){from_elsewhere}: continue it with --resume auto, replace it with \
                 --overwrite, or choose another --out",
                out.display(),
                describe(&earlier)
            );
        }
        Ok(RunDir {
            _lock: lock,
            out: out.to_path_buf(),
            replaced: earlier,
        })
    }

    /// The run starts writing: with `--overwrite`, the earlier run's files go first. Called when every check of
    /// the start has passed, so a start that fails leaves the earlier run as it was.
    pub fn begin(&mut self) -> Result<()> {
        if self.replaced.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            "--overwrite: removing the earlier run in {} ({})",
            self.out.display(),
            describe(&self.replaced)
        );
        for f in self.replaced.drain(..) {
            std::fs::remove_file(&f).with_context(|| format!("removing {}", f.display()))?;
        }
        Ok(())
    }
}

/// Whether `--resume resume` continues the run in `out`: `auto`, `out` itself, or a file in `out` (compared as
/// canonical paths, so `./run/` and a link to it count).
fn resumes_run_in(resume: &Path, out: &Path) -> bool {
    if resume == Path::new("auto") {
        return true;
    }
    let (Ok(out), Ok(r)) = (std::fs::canonicalize(out), std::fs::canonicalize(resume)) else {
        return false;
    };
    // A checkpoint is named by its file (the latest one is a link, whose target is in the same folder).
    let folder = resume.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = || std::fs::canonicalize(folder.unwrap_or(Path::new("."))).ok();
    r == out || (!r.is_dir() && parent().is_some_and(|p| p == out))
}

/// Keeps the records of the JSON-lines log `path` (metrics.jsonl, steps.jsonl) that `keep` accepts. A run
/// resumed from a checkpoint older than its last record (the newest one was damaged, or an older one was
/// named) would otherwise log those epochs and steps twice; a line cut short by a kill is dropped too.
pub fn trim_log(path: &Path, keep: impl Fn(&serde_json::Value) -> bool) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let kept: String = text
        .lines()
        .filter(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|r| keep(&r)))
        .map(|l| format!("{l}\n"))
        .collect();
    if kept != text {
        rn50_util::atomic_write(path, kept.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The files of an earlier run in `out`: checkpoints (a dangling latest link included) and [`RUN_FILES`].
fn run_files(out: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))? {
        let e = e.with_context(|| format!("listing {}", out.display()))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if is_checkpoint(&name) || RUN_FILES.contains(&name.as_ref()) {
            found.push(e.path());
        } else if name == TENSORBOARD && e.path().is_dir() {
            found.extend(event_files(&e.path())?);
        }
    }
    found.sort();
    Ok(found)
}

/// The TensorBoard event files rn50 wrote in `dir` (`events.out.tfevents.*`); anything else there is the user's.
fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        if e.file_name()
            .to_string_lossy()
            .starts_with("events.out.tfevents.")
        {
            found.push(e.path());
        }
    }
    Ok(found)
}

/// "checkpoint-000000004.safetensors, metrics.jsonl and 3 more".
fn describe(files: &[PathBuf]) -> String {
    let names: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    match names.len() {
        0..=3 => names.join(", "),
        n => format!("{} and {} more", names[..2].join(", "), n - 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--resume A --out B` where B holds another run: refused, B untouched (it used to prune B's checkpoints
    /// and append A's epochs to B's metrics); B's own checkpoints, B itself and `auto` continue B; into an
    /// empty B, A's checkpoint is fine (issue 25).
    #[test]
    fn resuming_another_run_into_a_used_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, empty) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        for run in [&a, &b] {
            std::fs::create_dir_all(run).unwrap();
            for f in ["checkpoint-000000004.safetensors", "metrics.jsonl"] {
                std::fs::write(run.join(f), b"x").unwrap();
            }
            std::os::unix::fs::symlink("checkpoint-000000004.safetensors", run.join(LATEST))
                .unwrap();
        }
        for other in [
            a.clone(),
            a.join(LATEST),
            a.join("checkpoint-000000004.safetensors"),
        ] {
            let err = RunDir::claim(&b, Some(&other), false)
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("already holds a run") && err.contains("is not a checkpoint of it"),
                "{err}"
            );
            assert!(
                b.join("metrics.jsonl").exists()
                    && b.join("checkpoint-000000004.safetensors").exists()
            );
        }
        for own in [
            b.clone(),
            b.join(LATEST),
            b.join("checkpoint-000000004.safetensors"),
            dir.path().join("b/../b"),
            PathBuf::from("auto"),
        ] {
            drop(RunDir::claim(&b, Some(&own), false).unwrap());
        }
        assert!(b.join("metrics.jsonl").exists());
        drop(RunDir::claim(&empty, Some(&a.join(LATEST)), false).unwrap());
        RunDir::claim(&b, Some(&a), true).unwrap().begin().unwrap();
        assert!(
            !b.join("metrics.jsonl").exists(),
            "--overwrite replaces B's run"
        );
    }

    #[test]
    fn a_used_directory_needs_resume_or_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        // Empty or new: claimed; the claim ends with the value.
        drop(RunDir::claim(&out, None, false).unwrap());
        std::fs::write(out.join("notes.txt"), b"mine").unwrap();
        drop(RunDir::claim(&out, None, false).unwrap());
        for f in ["checkpoint-000000004.safetensors", "metrics.jsonl"] {
            std::fs::write(out.join(f), b"x").unwrap();
        }
        std::os::unix::fs::symlink("checkpoint-000000009.safetensors", out.join(LATEST)).unwrap();
        let tb = out.join(TENSORBOARD);
        std::fs::create_dir(&tb).unwrap();
        std::fs::write(tb.join("events.out.tfevents.1700000000.node.1.0"), b"x").unwrap();
        std::fs::write(tb.join("my-notes.txt"), b"mine").unwrap();
        let err = RunDir::claim(&out, None, false).err().unwrap().to_string();
        assert!(
            err.contains("already holds a run") && err.contains("--resume auto"),
            "{err}"
        );
        assert!(out.join("metrics.jsonl").exists());
        drop(RunDir::claim(&out, Some(Path::new("auto")), false).unwrap());
        assert!(out.join("metrics.jsonl").exists(), "--resume keeps the run");
        // --overwrite removes the earlier run only once the start has passed every check (`begin`).
        drop(RunDir::claim(&out, None, true).unwrap());
        assert!(out.join("metrics.jsonl").exists(), "a start that failed");
        RunDir::claim(&out, None, true).unwrap().begin().unwrap();
        let mut left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [LOCK, "notes.txt", TENSORBOARD],
            "--overwrite removes the run's files only"
        );
        let left: Vec<_> = std::fs::read_dir(&tb)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            ["my-notes.txt"],
            "and of tensorboard/, its event files"
        );
    }

    #[test]
    fn trimming_a_log_keeps_the_records_before_the_resumed_position() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("metrics.jsonl");
        std::fs::write(&log, "{\"epoch\":0}\n{\"epoch\":1}\n{\"epoch\":2}\n{\"epo").unwrap();
        trim_log(&log, |r| r["epoch"].as_u64().is_some_and(|e| e < 2)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "{\"epoch\":0}\n{\"epoch\":1}\n"
        );
        trim_log(&dir.path().join("none.jsonl"), |_| true).unwrap();
        assert!(!dir.path().join("none.jsonl").exists());
    }

    #[test]
    fn one_claim_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let first = RunDir::claim(dir.path(), None, false).unwrap();
        let err = RunDir::claim(dir.path(), Some(Path::new("auto")), false)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("in use by another rn50 train")
                && err.contains(&format!("PID {}", std::process::id())),
            "{err}"
        );
        drop(first);
        RunDir::claim(dir.path(), Some(Path::new("auto")), false).unwrap();
    }
}
