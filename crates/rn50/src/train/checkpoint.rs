//! Training checkpoints: one safetensors file holding the model state (torchvision keys under `model.`, which
//! `rn50 eval`, `classify`, `export` and `train --init-weights` read as weights), the optimizer's state
//! (SGD's momentum buffers `optim.<param>`, and Adam's moments and Lookahead's slow weights: `Optimizer::state`), the loss scaler (`scaler.*`), the weight EMA (`ema.*`, when kept), and in the header's
//! metadata the position (epoch, batch within epoch) and the run's configuration as JSON, beside what weights
//! files record ([`Recorded`]: the class names, which a resume must train on again; the network; the training and
//! evaluation sizes). Written atomically (temporary file, fsync, rename): a crash mid-write leaves the previous
//! checkpoint as it was.
use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::model::weights::{
    copy_into, names_list, write_safetensors, Recorded, CHECKPOINT_MODEL_PREFIX,
};
use crate::step::TrainStep;
use crate::train::ema::Ema;

const META_KEY: &str = "rn50";

/// Where training stands; with the loader's (seed, epoch, batch) determinism this is all resume needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: u64,
    /// Batches of `epoch` already trained.
    pub batch_in_epoch: u64,
    pub global_step: u64,
    pub best_acc1: f64,
    /// With --ema: the average's best top-1 (best_ema.safetensors); 0 in older checkpoints.
    #[serde(default)]
    pub best_ema_acc1: f64,
    /// Processes and per-process batch when it was written: a run resumed on another world size starts
    /// after the same number of samples (every world size walks the same global order).
    #[serde(default)]
    pub world_size: u64,
    #[serde(default)]
    pub batch_size: u64,
    /// What `epoch` gave before `batch_in_epoch`, so that a resumed epoch's record covers the whole epoch, as a
    /// straight run's does (its keys beside the others': `bad_images`, `loss_sum`, ...).
    #[serde(flatten)]
    pub so_far: EpochSoFar,
    /// Seconds of training that the run did twice: what attempts killed after their last checkpoint had trained
    /// past it, which their resumes trained again (0 after a stop on request, which checkpoints where it stops).
    /// Not in any epoch's seconds; stated beside them.
    #[serde(default)]
    pub redone_seconds: f64,
}

/// What an epoch gave so far: sums over its steps (all ranks), and its time. A checkpoint in the middle of an
/// epoch keeps them ([`Position::so_far`]) and its resume adds to them, so that the epoch's record (loss, top-1,
/// img/s, data wait, seconds) is the straight run's, whatever the stops in between. Fields older checkpoints
/// lack read as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EpochSoFar {
    /// Unreadable training images skipped.
    pub bad_images: u64,
    /// Batches not trained on (see `EpochMetrics::skipped_batches`).
    pub skipped_batches: u64,
    /// Images trained on, and those of them ranked top-1 correctly (main.py's `top1` meter).
    pub images: u64,
    pub correct1: u64,
    /// Every trained step's loss (averaged over ranks), summed, and how many steps: the epoch's loss is their
    /// mean (main.py's `losses` meter). Older checkpoints summed only the logged steps (every --print-freq); an
    /// epoch resumed from one mixes the two.
    pub loss_sum: f64,
    pub loss_steps: u64,
    /// Seconds in the training loop (rank 0), which the img/s are over, and of them waiting for the loader.
    pub train_seconds: f64,
    pub data_wait_seconds: f64,
    /// The epoch's wall-clock seconds (rank 0): from the record of the epoch before (or the run's start) to the
    /// checkpoint, training, evaluation and checkpoints included, as an epoch's record counts them.
    pub seconds: f64,
}

impl Position {
    /// Where epoch `epoch` resumes, in batches of `batch_size` per process for `world_size` processes.
    pub fn start_batch(&self, batch_size: usize, world_size: usize) -> usize {
        let (b0, w0) = (self.batch_size.max(1), self.world_size.max(1));
        if self.batch_size == 0 || (b0, w0) == (batch_size as u64, world_size as u64) {
            return self.batch_in_epoch as usize;
        }
        let samples = self.batch_in_epoch * b0 * w0;
        (samples / (batch_size * world_size).max(1) as u64) as usize
    }
}

#[derive(Serialize, Deserialize)]
struct Meta {
    format: u32,
    position: Position,
    config: serde_json::Value,
}

/// What a checkpoint's header holds besides its tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub position: Position,
    /// The run's flags.
    pub config: serde_json::Value,
    /// What weights files record too (none in checkpoints of rn50 before it recorded them).
    pub recorded: Recorded,
}

/// Everything of `step` that changes while training, by checkpoint key.
fn state_tensors(step: &TrainStep) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = step
        .model
        .state()
        .into_iter()
        .map(|(k, t)| (format!("{CHECKPOINT_MODEL_PREFIX}{k}"), t))
        .collect();
    out.extend(step.opt.state());
    if let Some(s) = &step.scaler {
        out.push(("scaler.scale".into(), s.scale.shallow_clone()));
        out.push((
            "scaler.growth_tracker".into(),
            s.growth_tracker.shallow_clone(),
        ));
    }
    out
}

fn ema_tensors(ema: &Ema) -> Vec<(String, Tensor)> {
    ema.tensors()
        .map(|(k, t)| (format!("ema.{k}"), t.shallow_clone()))
        .collect()
}

/// Writes a checkpoint of `step` at `position`, with `config` (the run's full configuration) and what weights
/// record (`recorded`) in the header.
pub fn save(
    path: &Path,
    step: &TrainStep,
    ema: Option<&Ema>,
    position: &Position,
    config: &serde_json::Value,
    recorded: &Recorded,
) -> Result<()> {
    let mut all = state_tensors(step);
    all.extend(ema.map(ema_tensors).unwrap_or_default());
    let meta = Meta {
        format: 1,
        position: position.clone(),
        config: config.clone(),
    };
    let mut info = recorded.metadata()?;
    info.insert(META_KEY.to_string(), serde_json::to_string(&meta)?);
    write_safetensors(path, &all, info)
}

/// The position and configuration of the checkpoint `path` ([`read_header`]).
pub fn read_meta(path: &Path) -> Result<(Position, serde_json::Value)> {
    read_header(path).map(|h| (h.position, h.config))
}

/// Reads only the header (to rebuild the run before loading its tensors); the whole file is checked to be
/// safetensors.
pub fn read_header(path: &Path) -> Result<Header> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading checkpoint {}", path.display()))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a safetensors file: {e:?}", path.display()))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let json = metadata.get(META_KEY).with_context(|| {
        format!(
            "{} is not an rn50 checkpoint (no '{META_KEY}' metadata)",
            path.display()
        )
    })?;
    let meta: Meta =
        serde_json::from_str(json).with_context(|| format!("{}: bad metadata", path.display()))?;
    Ok(Header {
        position: meta.position,
        config: meta.config,
        recorded: Recorded::from_metadata(&metadata, path)?,
    })
}

/// Restores `step` (built with the same architecture and options) and the EMA, if one is kept, from `path`
/// and returns its header. A checkpoint written without an EMA starts the EMA from the restored weights. One
/// trained on other classes than `classes` (the data's, in label order) is refused before anything is loaded,
/// naming both lists: each label would mean another class (a class folder renamed, added or removed since).
pub fn load(
    path: &Path,
    step: &mut TrainStep,
    ema: Option<&mut Ema>,
    classes: Option<&[String]>,
) -> Result<Header> {
    let header = read_header(path)?;
    if let (Some(before), Some(now)) = (header.recorded.classes.as_deref(), classes) {
        if before != now {
            bail!(
                "{} was trained on the classes {} but the data now has {}: each label would mean another \
                 class; resume with the class folders as they were, or start a new run",
                path.display(),
                names_list(before),
                names_list(now)
            );
        }
    }
    let file: HashMap<String, Tensor> = Tensor::read_safetensors(path)
        .with_context(|| format!("reading checkpoint {}", path.display()))?
        .into_iter()
        .collect();
    copy_into(state_tensors(step), &file, path)
        .context("the checkpoint does not fit this model/optimizer")?;
    if let Some(ema) = ema {
        if file.keys().any(|k| k.starts_with("ema.")) {
            copy_into(ema_tensors(ema), &file, path)
                .context("the checkpoint's EMA does not fit")?;
        } else {
            tracing::warn!(
                "{} holds no EMA: starting it from the restored weights",
                path.display()
            );
            *ema = Ema::new(&step.model, ema.decay);
        }
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Arch, Model, ResNetConfig, Stem};
    use crate::step::{OptimizerConfig, Precision, StepConfig};
    use anyhow::bail;
    use tch::{Device, Kind};

    fn step(seed: i64) -> TrainStep {
        tch::manual_seed(seed);
        let mut model = ResNetConfig::new(Arch::ResNet18);
        model.stem = Stem::Cifar;
        model.num_classes = 10;
        let optimizer = OptimizerConfig {
            nesterov: true,
            no_bn_bias_decay: true,
            ..OptimizerConfig::default()
        };
        let cfg = StepConfig {
            precision: Precision::Fp32,
            channels_last: true,
            label_smoothing: 0.1,
            optimizer,
        };
        TrainStep::new(Model::new(model, Device::Cpu), cfg)
    }

    fn batch(i: i64) -> (Tensor, Tensor) {
        tch::manual_seed(100 + i);
        (
            Tensor::randint(256, [4, 32, 32, 3], (Kind::Uint8, Device::Cpu)),
            Tensor::randint(10, [4], (Kind::Int64, Device::Cpu)),
        )
    }

    #[test]
    fn resume_position_carries_over_to_another_world_size() {
        let p = Position {
            batch_in_epoch: 6,
            world_size: 2,
            batch_size: 32,
            ..Position::default()
        };
        assert_eq!(p.start_batch(32, 2), 6, "same layout");
        assert_eq!(
            p.start_batch(32, 1),
            12,
            "384 samples seen = 12 batches of one process"
        );
        assert_eq!(p.start_batch(64, 3), 2, "384 / 192");
        let old = Position {
            batch_in_epoch: 5,
            ..Position::default()
        };
        assert_eq!(
            old.start_batch(32, 4),
            5,
            "a checkpoint without layout resumes as it says"
        );
    }

    /// A checkpoint of rn50 before the epoch's sums resumes with them at 0 and its counts kept.
    #[test]
    fn older_positions_read_with_their_sums_at_zero() {
        let old =
            r#"{"epoch":2,"batch_in_epoch":4,"global_step":20,"best_acc1":1.5,"bad_images":3}"#;
        let p: Position = serde_json::from_str(old).unwrap();
        assert_eq!((p.epoch, p.batch_in_epoch, p.so_far.bad_images), (2, 4, 3));
        assert_eq!(p.so_far.loss_steps, 0);
        assert_eq!(p.redone_seconds, 0.0);
        let flat = serde_json::to_value(&p).unwrap();
        assert_eq!(
            flat["bad_images"], 3,
            "the sums sit beside the other keys: {flat}"
        );
    }

    #[test]
    fn round_trip_gives_bit_identical_next_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt.safetensors");
        let mut a = step(0);
        let mut ema_a = Ema::new(&a.model, 0.9);
        for i in 0..2 {
            let (x, y) = batch(i);
            a.step_u8(&x, &y, 0.05).unwrap();
            ema_a.update();
        }
        let pos = Position {
            epoch: 3,
            batch_in_epoch: 2,
            global_step: 2,
            best_acc1: 12.5,
            best_ema_acc1: 10.0,
            world_size: 1,
            batch_size: 4,
            so_far: EpochSoFar {
                bad_images: 7,
                skipped_batches: 1,
                images: 8,
                correct1: 3,
                // Sums whose last bit JSON must keep (serde_json's float_roundtrip).
                loss_sum: 0.1 + 0.2 + 2.197224577336219,
                loss_steps: 3,
                train_seconds: 12.345678901234567,
                data_wait_seconds: 1.0 / 3.0,
                seconds: 20.000000000000004,
            },
            redone_seconds: 4.5,
        };
        let config = serde_json::json!({"arch": "resnet18", "lr": 0.05});
        let recorded = Recorded::with_classes(Some(&["cat".to_string(), "dog".to_string()]));
        save(&path, &a, Some(&ema_a), &pos, &config, &recorded).unwrap();

        // A differently initialised run restored from the file continues exactly like the original.
        let mut b = step(7);
        let mut ema_b = Ema::new(&b.model, 0.9);
        let classes = recorded.classes.as_deref();
        let header = load(&path, &mut b, Some(&mut ema_b), classes).unwrap();
        assert_eq!((header.position, header.config), (pos, config));
        assert_eq!(header.recorded, recorded);
        for ((k, ta), (_, tb)) in ema_a.tensors().zip(ema_b.tensors()) {
            assert!(ta.equal(tb), "EMA {k} differs after loading");
        }
        for i in 2..4 {
            let (x, y) = batch(i);
            let la = f64::try_from(&a.step_u8(&x, &y, 0.05).unwrap().loss).unwrap();
            let lb = f64::try_from(&b.step_u8(&x, &y, 0.05).unwrap().loss).unwrap();
            assert_eq!(la.to_bits(), lb.to_bits(), "step {i}: {la} vs {lb}");
        }
        for ((k, ta), (_, tb)) in a.model.state().iter().zip(b.model.state().iter()) {
            assert!(ta.equal(tb), "{k} differs after resuming");
        }
    }

    #[test]
    fn a_torn_write_leaves_the_previous_checkpoint_loadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt.safetensors");
        let a = step(0);
        let pos = Position {
            epoch: 1,
            ..Position::default()
        };
        save(
            &path,
            &a,
            None,
            &pos,
            &serde_json::json!({}),
            &Recorded::default(),
        )
        .unwrap();
        // A writer killed half way: its temporary file is left behind, torn, and never renamed.
        let err = rn50_util::atomic_write_with(&path, |tmp| -> Result<()> {
            std::fs::write(tmp, b"partial")?;
            bail!("killed")
        });
        assert!(err.is_err());
        let mut b = step(1);
        assert_eq!(load(&path, &mut b, None, None).unwrap().position, pos);
        // A torn file given directly is a clear error, not a panic.
        let torn = dir.path().join("torn.safetensors");
        let full = std::fs::read(&path).unwrap();
        std::fs::write(&torn, &full[..full.len() / 2]).unwrap();
        assert!(load(&torn, &mut b, None, None).is_err());
    }
}
