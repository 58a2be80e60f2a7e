//! `rn50 train`: the ImageNet recipe in one place, like pytorch/examples' main.py: data, model, step,
//! schedule, per-epoch evaluation, checkpoints that survive preemption.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rn50_pipeline::{Dataset, Loader, LoaderConfig, Transform};
use serde::Serialize;
use tch::{Kind, Tensor};

use crate::device::{device_name, Compute, ComputeArgs};
use crate::model::{weights, Arch, Model, ResNetConfig};
use crate::step::{SgdConfig, StepConfig, TrainStep};
use crate::train::checkpoint::{self, Position};
use crate::train::ema::Ema;
use crate::train::eval::{evaluate, EvalResult};
use crate::train::schedule::{scaled_lr, Decay, LrSchedule};

/// Exit code after saving a checkpoint on SIGTERM/SIGUSR1, so job scripts can requeue.
pub const EXIT_PREEMPTED: i32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Step,
    Cosine,
    Linear,
}

/// Train a ResNet on DATA/train, evaluating on DATA/val after every epoch.
#[derive(Args, Debug, Clone, Serialize)]
pub struct TrainArgs {
    /// Dataset root with train/ and val/ (ImageFolder trees or packed shards).
    #[arg(required_unless_present = "dummy")]
    pub data: Option<PathBuf>,
    /// Model architecture.
    #[arg(short = 'a', long = "arch", default_value = "resnet50", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Batch size per process.
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    pub batch_size: usize,
    #[arg(long, default_value_t = 90)]
    pub epochs: usize,
    /// Learning rate per 256 images; the effective rate is lr·global_batch/256.
    #[arg(long, default_value_t = 0.1)]
    pub lr: f64,
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay.
    #[arg(long = "wd", alias = "weight-decay", default_value_t = 1e-4)]
    pub wd: f64,
    #[arg(long, default_value_t = 0.0)]
    pub warmup_epochs: f64,
    /// LR decay after warmup: step (÷10 at 30, 60, 80 epochs, scaled to --epochs), cosine or linear.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Step)]
    pub lr_schedule: ScheduleKind,
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    #[arg(long)]
    pub nesterov: bool,
    /// No weight decay on BN parameters and biases.
    #[arg(long)]
    pub no_bn_wd: bool,
    /// Zero-init the last BN γ of each residual block.
    #[arg(long)]
    pub zero_init_residual: bool,
    /// Keep an EMA of the weights with this decay (e.g. 0.9999) and evaluate it.
    #[arg(long)]
    pub ema: Option<f64>,
    /// Data loading threads [default: the CPUs this process may use].
    #[arg(short = 'j', long = "workers")]
    pub workers: Option<usize>,
    /// Training crop size.
    #[arg(long, default_value_t = 224)]
    pub image_size: usize,
    #[arg(long, default_value_t = 256)]
    pub val_resize: usize,
    #[arg(long, default_value_t = 224)]
    pub val_crop: usize,
    /// Stop each epoch after this many steps (smoke tests, quick measurements).
    #[arg(long)]
    pub steps_per_epoch: Option<usize>,
    /// Resume from this checkpoint (exact position, optimizer and scaler state).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Only evaluate (the --resume checkpoint or fresh weights) on DATA/val.
    #[arg(short = 'e', long = "evaluate")]
    pub evaluate: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run directory: checkpoints, metrics.jsonl (per epoch), steps.jsonl (per logged step), weights.
    #[arg(long, default_value = "runs/train")]
    pub out: PathBuf,
    /// Synthetic data instead of DATA (no disk, no decode).
    #[arg(long)]
    pub dummy: bool,
    #[command(flatten)]
    pub compute: ComputeArgs,
    /// Log every N steps.
    #[arg(short = 'p', long = "print-freq", default_value_t = 10)]
    pub print_freq: usize,
}

#[derive(Serialize)]
struct EpochRecord {
    epoch: usize,
    train_loss: f64,
    lr: f64,
    images_per_sec: f64,
    acc1: f64,
    acc5: f64,
    seconds: f64,
}

/// Where the batches come from.
enum Data {
    Real {
        train: Box<Loader>,
        val: Box<Loader>,
    },
    Dummy {
        classes: usize,
    },
}

fn open(dir: &Path) -> Result<Dataset> {
    Dataset::open(dir).with_context(|| format!("opening {}", dir.display()))
}

pub fn command(args: &TrainArgs) -> Result<()> {
    if args.batch_size == 0 || args.epochs == 0 || args.print_freq == 0 {
        bail!("--batch-size, --epochs and --print-freq must be at least 1");
    }
    let Compute {
        device,
        precision,
        channels_last,
        cpu,
    } = args.compute.resolve()?;
    let workers = args.workers.unwrap_or(cpu.logical_cores).max(1);
    tch::manual_seed(args.seed as i64);

    let mut classes = 1000;
    let data = if args.dummy {
        Data::Dummy { classes }
    } else {
        let root = args
            .data
            .as_ref()
            .expect("clap requires DATA without --dummy");
        let (train, val) = (open(&root.join("train"))?, open(&root.join("val"))?);
        if train.classes() != val.classes() {
            bail!(
                "train/ has {} classes and val/ {}, or their names differ: they must be the same set",
                train.classes().len(),
                val.classes().len()
            );
        }
        classes = train.classes().len();
        let train_cfg = LoaderConfig {
            transform: Transform::train(args.image_size),
            seed: args.seed,
            ..LoaderConfig::train(args.batch_size, workers)
        };
        let val_cfg = LoaderConfig {
            transform: Transform::val(args.val_resize, args.val_crop),
            ..LoaderConfig::val(args.batch_size, workers)
        };
        Data::Real {
            train: Box::new(Loader::new(train, train_cfg)?),
            val: Box::new(Loader::new(val, val_cfg)?),
        }
    };

    let mut model_cfg = ResNetConfig::new(args.arch);
    model_cfg.num_classes = classes as i64;
    model_cfg.zero_init_residual = args.zero_init_residual;
    let sgd = SgdConfig {
        momentum: args.momentum,
        weight_decay: args.wd,
        nesterov: args.nesterov,
        no_bn_bias_decay: args.no_bn_wd,
        lars_eta: None,
    };
    let step_cfg = StepConfig {
        precision,
        channels_last,
        label_smoothing: args.label_smoothing,
        sgd,
    };
    let mut step = TrainStep::new(Model::new(model_cfg.clone(), device), step_cfg);
    let config = serde_json::to_value(args)?;
    let mut position = Position::default();
    if let Some(ckpt) = &args.resume {
        let (p, _) = checkpoint::load(ckpt, &mut step)
            .with_context(|| format!("resuming from {}", ckpt.display()))?;
        eprintln!(
            "resumed from {} at epoch {} batch {}",
            ckpt.display(),
            p.epoch,
            p.batch_in_epoch
        );
        position = p;
    }
    let mut ema = args.ema.map(|d| Ema::new(&step.model, d));

    let global_batch = args.batch_size;
    let peak = scaled_lr(args.lr, global_batch);
    let decay = match args.lr_schedule {
        ScheduleKind::Step => {
            let e = args.epochs as f64;
            Decay::Step {
                milestones: vec![e / 3.0, e * 2.0 / 3.0, e * 8.0 / 9.0],
                gamma: 0.1,
            }
        }
        ScheduleKind::Cosine => Decay::Cosine { final_lr: 0.0 },
        ScheduleKind::Linear => Decay::Linear,
    };
    let schedule = LrSchedule::new(peak, args.warmup_epochs, args.epochs as f64, decay)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    eprintln!(
        "rn50 train: {} on {} ({precision}{}), batch {global_batch}, lr {} x {global_batch}/256 = {peak}; {schedule}",
        args.arch,
        device_name(device),
        if channels_last { ", channels_last" } else { "" },
        args.lr
    );

    let eval_model = |step: &TrainStep, ema: &Option<Ema>, val: &Loader| -> Result<EvalResult> {
        match ema {
            Some(e) => {
                let m = Model::new(model_cfg.clone(), device);
                if channels_last {
                    m.to_channels_last();
                }
                e.copy_to(&m);
                evaluate(&m, val, precision, channels_last)
            }
            None => evaluate(&step.model, val, precision, channels_last),
        }
    };
    if args.evaluate {
        let Data::Real { val, .. } = &data else {
            bail!("-e needs a dataset, not --dummy")
        };
        let r = eval_model(&step, &ema, val)?;
        println!(
            "Acc@1 {:.3} Acc@5 {:.3} ({} images)",
            r.acc1, r.acc5, r.images
        );
        return Ok(());
    }

    // SLURM sends SIGTERM (or --signal=USR1) before preemption: checkpoint, then exit EXIT_PREEMPTED.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGUSR1] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let append = |name: &str| {
        let path = args.out.join(name);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))
    };
    // Per-epoch records, and every logged step with its loss at full precision.
    let mut metrics = append("metrics.jsonl")?;
    let mut steps_log = append("steps.jsonl")?;
    let ckpt_path = args.out.join("checkpoint.safetensors");
    let dummy = match &data {
        Data::Dummy { classes } => Some((
            Tensor::randint(
                256,
                [
                    global_batch as i64,
                    args.image_size as i64,
                    args.image_size as i64,
                    3,
                ],
                (Kind::Uint8, device),
            ),
            Tensor::randint(
                *classes as i64,
                [global_batch as i64],
                (Kind::Int64, device),
            ),
        )),
        Data::Real { .. } => None,
    };
    let batches_per_epoch = match &data {
        Data::Real { train, .. } => train.batches_per_epoch(),
        Data::Dummy { .. } => args.steps_per_epoch.unwrap_or(100),
    };
    let per_epoch = args
        .steps_per_epoch
        .map_or(batches_per_epoch, |s| s.min(batches_per_epoch))
        .max(1);

    for epoch in position.epoch as usize..args.epochs {
        let start_batch = if epoch as u64 == position.epoch {
            position.batch_in_epoch as usize
        } else {
            0
        };
        let t0 = Instant::now();
        let (mut loss_sum, mut loss_n, mut images, mut lr) = (0.0, 0usize, 0usize, 0.0);
        let mut run_batch = |i: usize,
                             images_u8: &Tensor,
                             labels: &Tensor,
                             step: &mut TrainStep|
         -> Result<()> {
            lr = schedule.at(epoch as f64 + (i + 1) as f64 / per_epoch as f64);
            let out = step.step_u8(images_u8, labels, lr)?;
            if let Some(e) = &mut ema {
                e.update();
            }
            images += labels.size()[0] as usize;
            if (i + 1).is_multiple_of(args.print_freq) || i + 1 == per_epoch {
                let loss = f64::try_from(&out.loss)?;
                if !loss.is_finite() && !out.skipped {
                    bail!("the loss became {loss} at epoch {epoch} step {i}: stopping (the last checkpoint is kept)");
                }
                loss_sum += loss;
                loss_n += 1;
                let rec = serde_json::json!({"epoch": epoch, "step": i, "loss": loss, "lr": lr});
                writeln!(steps_log, "{rec}")?;
                eprintln!(
                    "epoch {epoch} [{:>5}/{per_epoch}] loss {loss:.4} lr {lr:.5} {:.1} img/s",
                    i + 1,
                    images as f64 / t0.elapsed().as_secs_f64()
                );
            }
            Ok(())
        };
        let mut i = start_batch;
        match (&data, &dummy) {
            (Data::Real { train, .. }, _) => {
                for batch in train.epoch(epoch as u64, start_batch) {
                    if i >= per_epoch || stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let b = batch?;
                    let shape = [b.n() as i64, b.h() as i64, b.w() as i64, 3];
                    let x = Tensor::f_from_data_size(&b, &shape, Kind::Uint8)?.to_device(device);
                    let y = Tensor::from_slice(b.labels()).to_device(device);
                    drop(b);
                    run_batch(i, &x, &y, &mut step)?;
                    i += 1;
                }
            }
            (Data::Dummy { .. }, Some((x, y))) => {
                while i < per_epoch && !stop.load(Ordering::Relaxed) {
                    run_batch(i, x, y, &mut step)?;
                    i += 1;
                }
            }
            _ => unreachable!("dummy batch exists exactly for dummy data"),
        }
        if stop.load(Ordering::Relaxed) {
            let p = Position {
                epoch: epoch as u64,
                batch_in_epoch: i as u64,
                global_step: (epoch * per_epoch + i) as u64,
                best_acc1: position.best_acc1,
            };
            checkpoint::save(&ckpt_path, &step, &p, &config)?;
            eprintln!(
                "signal received: checkpoint saved to {} (resume with --resume)",
                ckpt_path.display()
            );
            std::process::exit(EXIT_PREEMPTED);
        }
        let train_secs = t0.elapsed().as_secs_f64();
        let r = match &data {
            Data::Real { val, .. } => eval_model(&step, &ema, val)?,
            Data::Dummy { .. } => EvalResult {
                acc1: f64::NAN,
                acc5: f64::NAN,
                images: 0,
                bad_images: 0,
                seconds: 0.0,
                images_per_sec: 0.0,
            },
        };
        position = Position {
            epoch: epoch as u64 + 1,
            batch_in_epoch: 0,
            global_step: ((epoch + 1) * per_epoch) as u64,
            best_acc1: position
                .best_acc1
                .max(if r.acc1.is_nan() { 0.0 } else { r.acc1 }),
        };
        checkpoint::save(&ckpt_path, &step, &position, &config)?;
        if r.acc1 >= position.best_acc1 {
            weights::save(&step.model, &args.out.join("best.safetensors"))?;
        }
        let rec = EpochRecord {
            epoch,
            train_loss: loss_sum / loss_n.max(1) as f64,
            lr,
            images_per_sec: images as f64 / train_secs,
            acc1: r.acc1,
            acc5: r.acc5,
            seconds: t0.elapsed().as_secs_f64(),
        };
        writeln!(metrics, "{}", serde_json::to_string(&rec)?)?;
        eprintln!(
            "epoch {epoch}: loss {:.4}  Acc@1 {:.3}  Acc@5 {:.3}  {:.1} img/s",
            rec.train_loss, r.acc1, r.acc5, rec.images_per_sec
        );
    }
    weights::save(&step.model, &args.out.join("final.safetensors"))?;
    Ok(())
}
