//! `rn50 train`: the ImageNet recipe in one place, like pytorch/examples' main.py: data, model, step,
//! schedule, per-epoch evaluation, checkpoints that survive preemption, metrics and a summary.
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rn50_pipeline::{Epoch, Loader};
use serde::Serialize;
use tch::{Kind, Tensor};

use crate::device::{device_name, Compute};
use crate::input::DeviceBatch;
use crate::model::{weights, Model, ResNetConfig, Stem};
use crate::step::{Precision, SgdConfig, StepConfig, TrainStep};
pub use crate::train::args::TrainArgs;
use crate::train::args::{Augment, OptimizerKind, ScheduleKind};
use crate::train::checkpoint::{self, Position};
use crate::train::data::RealData;
use crate::train::ema::Ema;
use crate::train::eval::{evaluate, EvalResult};
use crate::train::keeper::{resolve_resume, Keeper};
use crate::train::progress::EpochProgress;
use crate::train::rundir::{self, RunDir};
use crate::train::schedule::{scaled_lr, Decay, LrSchedule, Resolution};
use rn50_distributed::{DistContext, WorldInfo};

/// Exit code after saving a checkpoint on SIGTERM/SIGUSR1, so job scripts can requeue.
pub const EXIT_PREEMPTED: i32 = 3;

/// One line of metrics.jsonl.
#[derive(Serialize)]
struct EpochRecord {
    epoch: usize,
    train_loss: f64,
    lr: f64,
    /// Training images per second over all processes.
    images_per_sec: f64,
    acc1: f64,
    acc5: f64,
    /// Validation images evaluated (all ranks).
    val_images: u64,
    /// The epoch's wall-clock time, evaluation included.
    seconds: f64,
    resolution: usize,
    data_wait_share: f64,
    /// Training images skipped because they could not be read or decoded (all ranks).
    bad_images: u64,
    /// The dataset's block device during the epoch (when it has one), and what this process read.
    disk_read_gbs: Option<f64>,
    disk_read_iops: Option<f64>,
    process_read_gbs: Option<f64>,
}

/// What the summary says about the run besides its flags.
struct RunInfo {
    device: String,
    world: usize,
    global_batch: usize,
    peak_lr: f64,
    precision: Precision,
}

/// summary.json, metrics.csv, summary.md and the plots, refreshed after every epoch so a run cut short
/// still has them.
fn write_report(args: &TrainArgs, run: &RunInfo) -> Result<()> {
    let metrics = rn50_report::schema::read_metrics(&args.out.join("metrics.jsonl"))?;
    let mut summary = rn50_report::TrainSummary {
        arch: args.arch.to_string(),
        device: run.device.clone(),
        world_size: run.world as u64,
        batch_size: args.batch_size as u64,
        global_batch: run.global_batch as u64,
        lr: run.peak_lr,
        precision: run.precision.to_string(),
        dataset: args
            .data
            .as_ref()
            .filter(|_| !args.dummy)
            .map_or("dummy".into(), |d| d.display().to_string()),
        ..Default::default()
    };
    summary.fill_from_metrics(&metrics);
    rn50_report::write_summary(&args.out, &summary)?;
    rn50_report::write_run_report(&args.out)?;
    Ok(())
}

fn schedule(args: &TrainArgs, peak: f64) -> Result<LrSchedule> {
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
    LrSchedule::new(peak, args.warmup_epochs, args.epochs as f64, decay)
}

fn resolution(args: &TrainArgs) -> Result<Resolution> {
    match args.min_res {
        None => Ok(Resolution::fixed(args.image_size)),
        Some(min) => Resolution::new(min, args.image_size, args.start_ramp, args.end_ramp_epoch()),
    }
}

fn append(dir: &Path, name: &str) -> Result<std::fs::File> {
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

pub fn command(args: &TrainArgs) -> Result<()> {
    args.check()?;
    // torchrun / SLURM / Open MPI / PBS / `rn50 launch` tell each process its rank; one device per process.
    let world_info = WorldInfo::from_env()?;
    let mut model_cfg = ResNetConfig::new(args.arch);
    model_cfg.zero_init_residual = args.zero_init_residual;
    model_cfg.width = args.width;
    if args.augment == Augment::Cifar {
        model_cfg.stem = Stem::Cifar;
    }
    let Compute {
        device,
        precision,
        channels_last,
        fused_bn,
        cpu,
    } = args
        .compute
        .resolve(world_info.local_rank, model_cfg.narrowest_conv())?;
    crate::device::setup(device, fused_bn)?;
    let local_ranks = world_info.local_world_size.max(1);
    if local_ranks > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
        // srun does not split the cores between the tasks of a node: do it here.
        tch::set_num_threads(world_info.threads_per_rank() as i32);
    }
    let dist = DistContext::init_with(world_info, device)?;
    // Ranks started with different flags would drift out of step: an error now. Data path, loader threads and
    // device may differ (node-local copies, cores, cuda:N).
    dist.check_same_config(
        &serde_json::to_value(args)?,
        &["data", "workers", "compute.device"],
    )?;
    let (rank, world) = (dist.rank(), dist.world_size());
    let rank0 = dist.is_main();
    // Rank 0 writes the run directory: claim it (or refuse to reuse it) before the model and data are set up.
    let _run_dir = (rank0 && !args.evaluate)
        .then(|| RunDir::claim(&args.out, args.resume.is_some(), args.overwrite))
        .transpose()?;
    let workers = args
        .workers
        .unwrap_or(cpu.logical_cores / local_ranks)
        .max(1);
    tch::manual_seed(args.seed as i64);

    let mut data = match (&args.data, args.dummy) {
        (Some(root), false) => Some(RealData::open(root, args, workers, rank, world)?),
        _ => None,
    };
    let classes = data.as_ref().map_or(1000, |d| d.classes);

    model_cfg.num_classes = classes as i64;
    let sgd = SgdConfig {
        momentum: args.momentum,
        weight_decay: args.wd,
        nesterov: args.nesterov,
        no_bn_bias_decay: args.no_bn_wd,
        lars_eta: (args.optimizer == OptimizerKind::Lars).then_some(args.lars_eta),
    };
    let step_cfg = StepConfig {
        precision,
        channels_last,
        label_smoothing: args.label_smoothing,
        sgd,
    };
    let mut step = TrainStep::new(Model::new(model_cfg.clone(), device), step_cfg);
    let mut ema = args.ema.map(|d| Ema::new(&step.model, d));
    let config = serde_json::to_value(args)?;
    let mut position = Position::default();
    if let Some(resume) = match &args.resume {
        Some(r) => resolve_resume(r, &args.out)?,
        None => None,
    } {
        if let (Some(w), true) = (&resume.warning, rank0) {
            eprintln!("warning: {w}");
        }
        let ckpt = resume.path;
        let (p, _) = checkpoint::load(&ckpt, &mut step, ema.as_mut()).with_context(|| {
            match crate::train::keeper::other_kept(&ckpt) {
                Some(older) => format!(
                    "resuming from {} (another checkpoint is kept: --resume {})",
                    ckpt.display(),
                    older.display()
                ),
                None => format!("resuming from {}", ckpt.display()),
            }
        })?;
        if rank0 {
            eprintln!(
                "resumed from {} at epoch {} batch {}",
                ckpt.display(),
                p.epoch,
                p.batch_in_epoch
            );
        }
        position = p;
    }
    if world > 1 {
        // DDP: rank 0's weights everywhere, then gradients averaged in buckets during backward. Built after
        // the channels_last conversion and the checkpoint load: buckets follow the parameters' strides.
        let opts = rn50_distributed::DdpOptions {
            bucket_cap_bytes: (args.bucket_cap_mb * 1024.0 * 1024.0) as usize,
            ..Default::default()
        };
        step.sync_gradients(&dist, &opts)?;
        // A fresh EMA starts from the broadcast weights; a resumed one is the checkpoint's on every rank.
        if let (Some(e), None) = (&mut ema, &args.resume) {
            *e = Ema::new(&step.model, e.decay);
        }
    }

    let global_batch = args.batch_size * args.accum_steps * world;
    let peak = scaled_lr(args.lr, global_batch);
    let schedule = schedule(args, peak)?;
    let resolution = resolution(args)?;
    if rank0 {
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        eprintln!(
            "rn50 train: {} on {} ({precision}{}), global batch {global_batch} ({} x {} accum x {world} procs), \
             lr {} x {global_batch}/256 = {peak}; {schedule}",
            args.arch,
            device_name(device),
            if channels_last { ", channels_last" } else { "" },
            args.batch_size,
            args.accum_steps,
            args.lr
        );
    }

    let eval_model =
        |step: &TrainStep, ema: &Option<Ema>, val: &Loader, pass: Epoch| -> Result<EvalResult> {
            match ema {
                Some(e) => {
                    let m = Model::new(model_cfg.clone(), device);
                    if channels_last {
                        m.to_channels_last();
                    }
                    e.copy_to(&m);
                    evaluate(&m, val, pass, precision, channels_last)
                }
                None => evaluate(&step.model, val, pass, precision, channels_last),
            }
        };
    if args.evaluate {
        let Some(d) = &data else {
            bail!("-e needs a dataset, not --dummy")
        };
        let r = eval_model(&step, &ema, &d.val, d.val.epoch(0, 0))?.all_ranks(&dist)?;
        if rank0 {
            println!(
                "Acc@1 {:.3} Acc@5 {:.3} ({} images)",
                r.acc1, r.acc5, r.images
            );
        }
        return Ok(());
    }

    // SLURM sends SIGTERM (or --signal=USR1) before preemption: checkpoint, then exit EXIT_PREEMPTED.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGUSR1] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    if rank0 && args.resume.is_some() {
        // What was logged after the resumed position is logged again from here on.
        let (epoch, step) = (
            position.epoch,
            (position.start_batch(args.batch_size, world) / args.accum_steps) as u64,
        );
        let at = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or(0);
        rundir::trim_log(&args.out.join("metrics.jsonl"), |r| at(r, "epoch") < epoch)?;
        rundir::trim_log(&args.out.join("steps.jsonl"), |r| {
            (at(r, "epoch"), at(r, "step")) < (epoch, step)
        })?;
    }
    // Per-epoch records, and every logged step with its loss at full precision.
    let (mut metrics, mut steps_log) = if rank0 {
        (
            Some(append(&args.out, "metrics.jsonl")?),
            Some(append(&args.out, "steps.jsonl")?),
        )
    } else {
        (None, None)
    };
    let mut keeper = Keeper::new(&args.out, args.keep_checkpoints, args.checkpoint_minutes)?;
    if rank0 {
        keeper.clear_stale();
    }
    let dummy = data.is_none().then(|| {
        let s = args.image_size as i64;
        let b = args.batch_size as i64;
        (
            Tensor::randint(256, [b, s, s, 3], (Kind::Uint8, device)),
            Tensor::randint(classes as i64, [b], (Kind::Int64, device)),
        )
    });
    let micro_per_epoch = match &mut data {
        Some(d) => d.batches_per_epoch(args)?,
        None => args.steps_per_epoch.unwrap_or(100) * args.accum_steps,
    };
    if micro_per_epoch < args.accum_steps {
        bail!(
            "an epoch has {micro_per_epoch} batches, fewer than --accum-steps {}",
            args.accum_steps
        );
    }
    let per_epoch = args
        .steps_per_epoch
        .map_or(micro_per_epoch / args.accum_steps, |s| {
            s.min(micro_per_epoch / args.accum_steps)
        })
        .max(1);
    let run_start = Instant::now();
    let run_info = RunInfo {
        device: match device {
            tch::Device::Cpu => format!("{} ({} threads)", cpu.model, tch::get_num_threads()),
            d => device_name(d),
        },
        world,
        global_batch,
        peak_lr: peak,
        precision,
    };
    // Read bandwidth and IOPS of the dataset's disk and of this process, per epoch and as io.jsonl.
    let io = match (&args.data, rank0 && data.is_some()) {
        (Some(root), true) => Some(rn50_report::IoMonitor::start_logging(
            root,
            std::time::Duration::from_secs(1),
            &args.out.join("io.jsonl"),
        )?),
        _ => None,
    };

    // The position after `s` optimizer steps of `epoch`.
    let here = |epoch: usize, s: usize, best_acc1: f64| Position {
        epoch: epoch as u64,
        batch_in_epoch: (s * args.accum_steps) as u64,
        global_step: (epoch * per_epoch + s) as u64,
        best_acc1,
        world_size: world as u64,
        batch_size: args.batch_size as u64,
    };
    let (resume_epoch, resume_batch) =
        (position.epoch, position.start_batch(args.batch_size, world));
    if rank0 && resume_batch != position.batch_in_epoch as usize {
        eprintln!(
            "checkpoint written by {} processes x batch {}: resuming epoch {} at batch {resume_batch} of this layout",
            position.world_size, position.batch_size, position.epoch
        );
    }
    // The loader threads take work in the order it is queued, which is the order it is consumed: an epoch's
    // batches, its evaluation, the next epoch's batches. Both are queued as an epoch starts, so they decode as soon
    // as the epoch's last batches are handed out (or whenever the steps leave the threads idle): nothing waits
    // for a loader to start at an epoch boundary.
    let first_start = |epoch: usize| {
        if epoch as u64 == resume_epoch {
            resume_batch / args.accum_steps
        } else {
            0
        }
    };
    let micro = per_epoch * args.accum_steps;
    let queue_train = |d: &mut RealData, epoch: usize| {
        let start = first_start(epoch) * args.accum_steps;
        d.train_epoch(args, resolution.at(epoch), epoch, start..micro)
    };
    let first_epoch = position.epoch as usize;
    let mut next_train = match &mut data {
        Some(d) if first_epoch < args.epochs => Some(queue_train(d, first_epoch)?),
        _ => None,
    };
    for epoch in first_epoch..args.epochs {
        let start = first_start(epoch);
        let res = resolution.at(epoch);
        let mut prog = EpochProgress::new(epoch, start, per_epoch, world, rank0);
        let io_start = io.as_ref().map(|m| m.snapshot());
        let mut batches = next_train.take();
        let val_pass = data.as_ref().map(|d| d.val.epoch(0, 0));
        if let Some(d) = data.as_mut().filter(|_| epoch + 1 < args.epochs) {
            next_train = Some(queue_train(d, epoch + 1)?);
        }
        let (mut loss_sum, mut loss_n, mut lr) = (0.0, 0usize, 0.0);
        let mut bad_images = 0;
        let mut s = start;
        // Every rank must stop at the same step (a signal may reach only some): agree on it each step.
        let stop_now = |dist: &DistContext| -> Result<bool> {
            Ok(dist.any_rank(stop.load(Ordering::Relaxed), "checking for a stop signal")?)
        };
        let mut stopping = false;
        while s < per_epoch {
            stopping = stop_now(&dist)?;
            if stopping {
                break;
            }
            step.opt.zero_grad();
            let mut loss = Tensor::zeros([], (Kind::Float, device));
            for micro in 0..args.accum_steps {
                let (images, labels, _batch);
                if let Some(it) = &mut batches {
                    let t = Instant::now();
                    let b = it
                        .next()
                        .context("the loader ended before the epoch's last step")??;
                    prog.data_wait += t.elapsed();
                    bad_images += b.skipped();
                    let db = DeviceBatch::new(b, device)?;
                    (images, labels) = (db.images.shallow_clone(), db.labels.shallow_clone());
                    _batch = Some(db);
                } else {
                    let (x, y) = dummy.as_ref().expect("dummy batch without a dataset");
                    (images, labels, _batch) = (x.shallow_clone(), y.shallow_clone(), None);
                }
                let x = step.input.normalize(&images);
                let l = step.backward(&x, &labels, micro, args.accum_steps)?;
                loss += l / args.accum_steps as f64;
                prog.images += labels.size()[0] as usize;
            }
            lr = schedule.at(epoch as f64 + (s + 1) as f64 / per_epoch as f64);
            let skipped = step.apply(lr)?;
            if let Some(e) = &mut ema {
                e.update();
            }
            let logged = if (s + 1).is_multiple_of(args.print_freq) || s + 1 == per_epoch {
                // The mean over ranks: what is logged, and what every rank judges (so all stop together).
                let mut mean = [f64::try_from(&loss)? / world as f64];
                dist.sum_f64(&mut mean, "averaging the loss")?;
                let loss = mean[0];
                if !loss.is_finite() && !skipped.get()? {
                    bail!("the loss became {loss} at epoch {epoch} step {s}: stopping (the last checkpoint is kept)");
                }
                loss_sum += loss;
                loss_n += 1;
                if let Some(f) = &mut steps_log {
                    let rec =
                        serde_json::json!({"epoch": epoch, "step": s, "loss": loss, "lr": lr});
                    writeln!(f, "{rec}")?;
                }
                Some(loss)
            } else {
                None
            };
            prog.step(s, logged, lr);
            s += 1;
            if rank0 && keeper.due() && s < per_epoch {
                let p = here(epoch, s, position.best_acc1);
                keeper.save(&step, ema.as_ref(), &p, &config)?;
            }
        }
        prog.finish();
        drop(batches);
        if stopping {
            let p = here(epoch, s, position.best_acc1);
            if rank0 {
                let path = keeper.save(&step, ema.as_ref(), &p, &config)?;
                eprintln!(
                    "signal received: checkpoint saved to {} (resume with --resume {})",
                    path.display(),
                    args.out.display()
                );
            }
            std::process::exit(EXIT_PREEMPTED);
        }
        let (train_secs, images_per_sec) = (prog.elapsed(), prog.images_per_sec());
        let r = match (&data, val_pass) {
            (Some(d), Some(pass)) => eval_model(&step, &ema, &d.val, pass)?.all_ranks(&dist)?,
            _ => EvalResult {
                acc1: f64::NAN,
                acc5: f64::NAN,
                ..EvalResult::default()
            },
        };
        let mut bad = [bad_images as f64];
        dist.sum_f64(&mut bad, "counting unreadable images")?;
        let improved = !r.acc1.is_nan() && r.acc1 >= position.best_acc1;
        position = here(
            epoch + 1,
            0,
            if improved { r.acc1 } else { position.best_acc1 },
        );
        if !rank0 {
            continue;
        }
        let io_epoch = io
            .as_ref()
            .zip(io_start)
            .map(|(m, s0)| m.snapshot().delta(&s0));
        keeper.save(&step, ema.as_ref(), &position, &config)?;
        if improved {
            // The weights that scored: the EMA's when evaluation used it.
            let best = args.out.join("best.safetensors");
            match &ema {
                Some(e) => {
                    let m = Model::new(model_cfg.clone(), device);
                    e.copy_to(&m);
                    weights::save(&m, &best)?;
                }
                None => weights::save(&step.model, &best)?,
            }
        }
        let rec = EpochRecord {
            epoch,
            train_loss: loss_sum / loss_n.max(1) as f64,
            lr,
            images_per_sec,
            acc1: r.acc1,
            acc5: r.acc5,
            val_images: r.images,
            seconds: prog.elapsed(),
            resolution: res,
            data_wait_share: prog.data_wait.as_secs_f64() / train_secs.max(1e-9),
            bad_images: bad[0] as u64,
            disk_read_gbs: io_epoch.as_ref().and_then(|d| d.disk_read_gbs),
            disk_read_iops: io_epoch.as_ref().and_then(|d| d.disk_read_iops),
            process_read_gbs: io_epoch.as_ref().and_then(|d| d.process_read_gbs),
        };
        if let Some(f) = &mut metrics {
            writeln!(f, "{}", serde_json::to_string(&rec)?)?;
        }
        eprintln!(
            "epoch {epoch}: loss {:.4}  Acc@1 {:.3}  Acc@5 {:.3}  {:.1} img/s  data wait {:.0}%  ({:.0} s)",
            rec.train_loss,
            r.acc1,
            r.acc5,
            rec.images_per_sec,
            100.0 * rec.data_wait_share,
            rec.seconds
        );
        if rec.bad_images > 0 {
            eprintln!(
                "epoch {epoch}: skipped {} unreadable training images (they could not be read or decoded)",
                rec.bad_images
            );
        }
        write_report(args, &run_info)?;
    }
    // Rank 0 serves the rendezvous store: it leaves last.
    drop(step.grad_sync.take());
    dist.finish()?;
    if rank0 {
        weights::save(&step.model, &args.out.join("final.safetensors"))?;
        if args.out.join("metrics.jsonl").exists() {
            eprint!("{}", rn50_report::summary_text(&args.out)?);
        }
        eprintln!(
            "done in {:.0} s; weights in {}",
            run_start.elapsed().as_secs_f64(),
            args.out.display()
        );
    }
    Ok(())
}
