//! Which checkpoints a run keeps: `checkpoint-<step>.safetensors` written each epoch and every N minutes,
//! the newest K kept, and `checkpoint.safetensors` a link to the newest (what `--resume RUN_DIR` reads).
//! Each file is written atomically and the link replaced atomically, so a kill at any moment leaves a
//! loadable latest checkpoint.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

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
    /// directory: `write_atomic`'s `.NAME.tmpPID` (checkpoints, and best/final weights: a 33 MB
    /// `.best.safetensors.tmpPID` was seen after a kill) and the latest link's `.NAME.linkPID`, of processes no
    /// longer running, so that one writing here right now keeps its own. Call it from the one process that
    /// writes checkpoints, before it writes any.
    pub fn clear_stale(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if is_stale_temp(&e.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
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
    ) -> Result<PathBuf> {
        let name = format!("checkpoint-{:09}.safetensors", position.global_step);
        let path = self.dir.join(&name);
        checkpoint::save(&path, step, ema, position, config)?;
        // A new link under a temporary name, renamed over the old one: readers see old or new, never none.
        let tmp = self
            .dir
            .join(format!(".{LATEST}.link{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp)
            .and_then(|()| std::fs::rename(&tmp, self.dir.join(LATEST)))
            .with_context(|| format!("linking {LATEST} to {}", path.display()))?;
        for old in self.list()?.into_iter().rev().skip(self.keep) {
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

/// The numbered checkpoints in `dir`, oldest first.
fn kept(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("checkpoint-") && n.ends_with(".safetensors"))
        })
        .collect();
    v.sort();
    Ok(v)
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

/// What `--resume X` means: a checkpoint file, a run directory (its latest checkpoint), or `auto` (the
/// latest checkpoint in `out` if there is one, else a fresh start).
pub fn resolve_resume(arg: &Path, out: &Path) -> Result<Option<PathBuf>> {
    if arg == Path::new("auto") {
        let latest = out.join(LATEST);
        return Ok(latest.exists().then_some(latest));
    }
    if arg.is_dir() {
        let latest = arg.join(LATEST);
        if !latest.exists() {
            bail!("{} holds no {LATEST} to resume from", arg.display());
        }
        return Ok(Some(latest));
    }
    Ok(Some(arg.to_path_buf()))
}

/// Whether `name` is a temporary file of rn50's (`.NAME.tmpPID`, `.NAME.linkPID`) whose process is gone.
fn is_stale_temp(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let pid = rest
        .rsplit_once(".tmp")
        .or_else(|| rest.rsplit_once(".link"))
        .and_then(|(_, pid)| pid.parse::<i32>().ok());
    match pid {
        Some(pid) if pid > 0 => {
            // SAFETY: signal 0 only asks whether the process exists (EPERM: it does, as another user's).
            let rc = unsafe { libc::kill(pid, 0) };
            rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, Model, ResNetConfig, Stem};
    use crate::step::{Precision, SgdConfig, StepConfig};
    use tch::Device;

    #[test]
    fn keeps_the_newest_and_links_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ResNetConfig::new(Arch::ResNet18);
        cfg.stem = Stem::Cifar;
        cfg.width = 8;
        cfg.num_classes = 10;
        let step = TrainStep::new(
            Model::new(cfg, Device::Cpu),
            StepConfig {
                precision: Precision::Fp32,
                channels_last: false,
                label_smoothing: 0.0,
                sgd: SgdConfig::default(),
            },
        );
        let mut k = Keeper::new(dir.path(), 2, 0.0).unwrap();
        assert!(!k.due(), "timed checkpoints are off");
        for s in [10u64, 20, 30] {
            let pos = Position {
                global_step: s,
                ..Position::default()
            };
            k.save(&step, None, &pos, &serde_json::json!({})).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "checkpoint-000000020.safetensors",
                "checkpoint-000000030.safetensors",
                LATEST
            ]
        );
        let latest = resolve_resume(dir.path(), dir.path()).unwrap().unwrap();
        assert_eq!(checkpoint::read_meta(&latest).unwrap().0.global_step, 30);
        let auto = resolve_resume(Path::new("auto"), dir.path()).unwrap();
        assert_eq!(auto, Some(latest));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            resolve_resume(Path::new("auto"), empty.path()).unwrap(),
            None
        );
        assert!(resolve_resume(empty.path(), empty.path()).is_err());
        assert!(Keeper::new(dir.path(), 0, 1.0).is_err());
        let timed = Keeper::new(dir.path(), 1, 1e-6).unwrap(); // every 60 µs
        std::thread::sleep(Duration::from_millis(1));
        assert!(timed.due());
    }

    /// kill -9 leaves `write_atomic`'s temporary files behind: a new start removes those of dead processes,
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
