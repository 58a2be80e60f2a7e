//! Which checkpoints a run keeps: `checkpoint-<step>.safetensors` written each epoch and every N minutes,
//! the newest K kept, and `checkpoint.safetensors` a link to the newest (what `--resume RUN_DIR` reads).
//! Each file is written atomically and the link replaced atomically, so a kill at any moment leaves a
//! loadable latest checkpoint; should the link or its file be damaged anyway (a disk fault, a half-copied
//! directory), resuming the directory falls back to the newest checkpoint that loads, and pruning never
//! removes the checkpoint just written.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::model::weights::Recorded;
use crate::step::TrainStep;
use crate::train::checkpoint::{self, Position};
use crate::train::ema::Ema;

pub const LATEST: &str = "checkpoint.safetensors";

pub struct Keeper {
    dir: PathBuf,
    keep: usize,
    every: Option<Duration>,
    last: Instant,
}

impl Keeper {
    /// `minutes` = 0 turns timed checkpoints off.
    pub fn new(dir: &Path, keep: usize, minutes: f64) -> Result<Self> {
        if keep == 0 {
            bail!("--keep-checkpoints must be at least 1");
        }
        if !minutes.is_finite() || minutes < 0.0 {
            bail!("--checkpoint-minutes must be >= 0 (got {minutes})");
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            keep,
            every: (minutes > 0.0).then(|| Duration::from_secs_f64(minutes * 60.0)),
            last: Instant::now(),
        })
    }

    /// Removes the temporary files that writers killed mid-write (kill -9, node failure) left in the run
    /// directory: [`rn50_util::atomic`]'s `.NAME.tmpPID` (checkpoints, the latest link, and best/final
    /// weights: a 33 MB `.best.safetensors.tmpPID` was seen after a kill), of processes no longer running, so
    /// that one writing here right now keeps its own. Call it from the one process that writes checkpoints,
    /// before it writes any.
    pub fn clear_stale(&self) {
        rn50_util::remove_stale_temps(&self.dir);
    }

    /// A timed checkpoint is due.
    pub fn due(&self) -> bool {
        self.every.is_some_and(|d| self.last.elapsed() >= d)
    }

    /// Writes the checkpoint of `position`, points the latest link at it and prunes the oldest.
    pub fn save(
        &mut self,
        step: &TrainStep,
        ema: Option<&Ema>,
        position: &Position,
        config: &serde_json::Value,
        recorded: &Recorded,
    ) -> Result<PathBuf> {
        let name = format!("checkpoint-{:09}.safetensors", position.global_step);
        let path = self.dir.join(&name);
        checkpoint::save(&path, step, ema, position, config, recorded)?;
        // Readers see the old link or the new one, never none.
        rn50_util::atomic_symlink(Path::new(&name), &self.dir.join(LATEST))
            .with_context(|| format!("linking {LATEST} to {}", path.display()))?;
        let others = self.list()?.into_iter().filter(|p| *p != path);
        for old in others.rev().skip(self.keep - 1) {
            std::fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
        }
        self.last = Instant::now();
        Ok(path)
    }

    /// This run's numbered checkpoints, oldest first.
    fn list(&self) -> Result<Vec<PathBuf>> {
        kept(&self.dir).with_context(|| format!("listing {}", self.dir.display()))
    }
}

/// Whether `name` is a numbered checkpoint's file name, `checkpoint-<digits>.safetensors`, as rn50 writes them:
/// only those are listed and pruned, never a user's `checkpoint-my-best-copy.safetensors` beside them.
pub fn is_checkpoint(name: &str) -> bool {
    name.strip_prefix("checkpoint-")
        .and_then(|n| n.strip_suffix(".safetensors"))
        .is_some_and(|step| !step.is_empty() && step.bytes().all(|b| b.is_ascii_digit()))
}

/// The numbered checkpoints in `dir`, oldest first. Oldest by modification time, not by step: a run resumed
/// from an earlier checkpoint writes lower step numbers than the abandoned ones beside it, and those are
/// what must go first.
fn kept(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_str().is_some_and(is_checkpoint) {
            v.push((e.metadata()?.modified()?, e.path()));
        }
    }
    v.sort();
    Ok(v.into_iter().map(|(_, p)| p).collect())
}

/// For an error resuming from `ckpt`: the newest other checkpoint kept next to it, to name in the message.
pub fn other_kept(ckpt: &Path) -> Option<PathBuf> {
    let dir = ckpt.parent().filter(|d| !d.as_os_str().is_empty())?;
    let this = std::fs::canonicalize(ckpt).ok();
    kept(dir)
        .ok()?
        .into_iter()
        .rev()
        .find(|p| std::fs::canonicalize(p).ok() != this)
}

/// The checkpoint `--resume X` names, and a warning when it is not the latest one.
pub struct Resume {
    pub path: PathBuf,
    pub warning: Option<String>,
}

/// What `--resume X` means: a checkpoint file, a run directory (its newest checkpoint that loads), or `auto`
/// (the same in `out`, or a fresh start when `out` holds no checkpoint at all).
pub fn resolve_resume(arg: &Path, out: &Path) -> Result<Option<Resume>> {
    let auto = arg == Path::new("auto");
    if !auto && !arg.is_dir() {
        return Ok(Some(Resume {
            path: arg.to_path_buf(),
            warning: None,
        }));
    }
    let dir = if auto { out } else { arg };
    let latest = dir.join(LATEST);
    // The link first, then the other numbered files, newest first.
    let linked = std::fs::canonicalize(&latest).ok();
    let mut candidates: Vec<PathBuf> = match kept(dir) {
        Ok(v) => v
            .into_iter()
            .rev()
            .filter(|p| std::fs::canonicalize(p).ok() != linked)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && auto => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    if latest.symlink_metadata().is_ok() {
        candidates.insert(0, latest.clone());
    }
    if candidates.is_empty() {
        if auto {
            return Ok(None);
        }
        bail!("{} holds no checkpoint to resume from", dir.display());
    }
    let mut failed = Vec::new();
    for c in candidates {
        match checkpoint::read_meta(&c) {
            Ok(_) => {
                let warning = (!failed.is_empty()).then(|| {
                    format!(
                        "resuming from {}, the newest checkpoint that loads: {}",
                        c.display(),
                        failed.join("; ")
                    )
                });
                return Ok(Some(Resume { path: c, warning }));
            }
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    bail!(
        "no checkpoint in {} loads ({}); nothing was changed: start over with --overwrite, or resume another \
         checkpoint with --resume FILE",
        dir.display(),
        failed.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, Model, ResNetConfig, Stem};
    use crate::step::{OptimizerConfig, Precision, StepConfig};
    use tch::Device;

    fn tiny_step() -> TrainStep {
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.stem = Stem::Cifar;
        cfg.width = 8;
        cfg.num_classes = 10;
        TrainStep::new(
            Model::new(cfg, Device::Cpu),
            StepConfig {
                precision: Precision::Fp32,
                channels_last: false,
                label_smoothing: 0.0,
                optimizer: OptimizerConfig::default(),
            },
        )
    }

    fn save_at(k: &mut Keeper, step: &TrainStep, global_step: u64) {
        let pos = Position {
            global_step,
            ..Position::default()
        };
        k.save(
            step,
            None,
            &pos,
            &serde_json::json!({}),
            &Recorded::default(),
        )
        .unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A user's own files named like checkpoints are neither counted nor pruned (issue 25).
    #[test]
    fn pruning_leaves_files_rn50_did_not_write() {
        let dir = tempfile::tempdir().unwrap();
        let mine = [
            "checkpoint-my-best-copy.safetensors",
            "checkpoint-.safetensors",
            "checkpoint-12a.safetensors",
        ];
        for name in mine {
            std::fs::write(dir.path().join(name), b"user data").unwrap();
        }
        let step = tiny_step();
        let mut k = Keeper::new(dir.path(), 1, 0.0).unwrap();
        for s in [10u64, 20] {
            save_at(&mut k, &step, s);
        }
        let left = names(dir.path());
        for name in mine {
            assert!(
                left.iter().any(|n| n == name),
                "{name} was removed: {left:?}"
            );
        }
        assert!(left.iter().any(|n| n == "checkpoint-000000020.safetensors"));
        assert!(!left.iter().any(|n| n == "checkpoint-000000010.safetensors"));
        assert!(is_checkpoint("checkpoint-000000010.safetensors"));
        assert!(!is_checkpoint("checkpoint-my-best-copy.safetensors"));
    }

    #[test]
    fn keeps_the_newest_and_links_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let step = tiny_step();
        let mut k = Keeper::new(dir.path(), 2, 0.0).unwrap();
        assert!(!k.due(), "timed checkpoints are off");
        for s in [10u64, 20, 30] {
            save_at(&mut k, &step, s);
        }
        assert_eq!(
            names(dir.path()),
            [
                "checkpoint-000000020.safetensors",
                "checkpoint-000000030.safetensors",
                LATEST
            ]
        );
        let latest = resolve_resume(dir.path(), dir.path()).unwrap().unwrap();
        assert_eq!(latest.path, dir.path().join(LATEST));
        assert!(latest.warning.is_none());
        assert_eq!(
            checkpoint::read_meta(&latest.path).unwrap().0.global_step,
            30
        );
        let auto = resolve_resume(Path::new("auto"), dir.path()).unwrap();
        assert_eq!(auto.map(|r| r.path), Some(latest.path));
        let empty = tempfile::tempdir().unwrap();
        assert!(resolve_resume(Path::new("auto"), empty.path())
            .unwrap()
            .is_none());
        assert!(resolve_resume(empty.path(), empty.path()).is_err());
        assert!(Keeper::new(dir.path(), 0, 1.0).is_err());
        let timed = Keeper::new(dir.path(), 1, 1e-6).unwrap(); // every 60 µs
        std::thread::sleep(Duration::from_millis(1));
        assert!(timed.due());
    }

    /// A dangling link or a damaged file: resuming the directory takes the newest checkpoint that loads and
    /// says so; when none loads it is an error, not a fresh start. A run resumed from an older checkpoint
    /// prunes the abandoned newer ones, never the checkpoint it just wrote.
    #[test]
    fn resume_falls_back_to_the_newest_loadable_and_pruning_keeps_the_new() {
        let dir = tempfile::tempdir().unwrap();
        let step = tiny_step();
        let mut k = Keeper::new(dir.path(), 2, 0.0).unwrap();
        for s in [20u64, 30] {
            save_at(&mut k, &step, s);
        }
        std::fs::remove_file(dir.path().join("checkpoint-000000030.safetensors")).unwrap();
        for arg in [Path::new("auto"), dir.path()] {
            let r = resolve_resume(arg, dir.path()).unwrap().unwrap();
            assert_eq!(r.path, dir.path().join("checkpoint-000000020.safetensors"));
            let warning = r.warning.expect("a fallback is reported");
            assert!(warning.contains(LATEST), "{warning}");
        }
        let older = dir.path().join("checkpoint-000000020.safetensors");
        let bytes = std::fs::read(&older).unwrap();
        std::fs::write(&older, &bytes[..bytes.len() / 2]).unwrap();
        let err = resolve_resume(Path::new("auto"), dir.path())
            .err()
            .expect("nothing loads")
            .to_string();
        assert!(
            err.contains("no checkpoint") && err.contains("--overwrite"),
            "{err}"
        );

        // Resumed from step 5 of an earlier copy, with 20 and 30 beside it: 5 stays, the oldest file goes.
        std::fs::write(&older, &bytes).unwrap();
        save_at(&mut k, &step, 30);
        save_at(&mut k, &step, 5);
        assert_eq!(
            names(dir.path()),
            [
                "checkpoint-000000005.safetensors",
                "checkpoint-000000030.safetensors",
                LATEST
            ]
        );
    }

    /// kill -9 leaves `rn50_util::atomic`'s temporary files behind: a new start removes those of dead processes,
    /// not a running writer's, nor files of the user's.
    #[test]
    fn clears_temporary_files_of_dead_writers_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        let files = [
            (format!(".best.safetensors.tmp{dead}"), false),
            (
                format!(".checkpoint-000000004.safetensors.tmp{dead}"),
                false,
            ),
            (format!(".{LATEST}.link{dead}"), false),
            (format!(".final.safetensors.tmp{live}"), true),
            (".notes.tmpfile".to_string(), true),
            ("best.safetensors".to_string(), true),
        ];
        for (f, _) in &files {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        Keeper::new(dir.path(), 1, 0.0).unwrap().clear_stale();
        for (f, kept) in &files {
            assert_eq!(dir.path().join(f).exists(), *kept, "{f}");
        }
    }
}
