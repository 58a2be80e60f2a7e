//! `rn50 train`: the ImageNet recipe in one place, like pytorch/examples' main.py: data, model, step,
//! schedule, per-epoch evaluation, checkpoints that survive preemption, metrics and a summary.
//!
//! [`run`] is the recipe as a list of steps; `Setup` is what it shares with `-e` (device, ranks, data, model,
//! EMA, resumed weights, schedule), `Trainer` adds what training needs (signals, logs, checkpoints, epochs).
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rn50_args::UsageError;
use rn50_distributed::{DistContext, WorldInfo};
use rn50_pipeline::sampler::rng_for;
use rn50_pipeline::Epoch;
use rn50_report::tensorboard::{EventWriter, FLUSH_EVERY};
use rn50_report::{EpochMetrics, IoMonitor, IoSample, StepRecord, TrainSummary};
use serde_json::json;
use tch::{Kind, Tensor};

use crate::device::{device_name, Compute};
use crate::input::{DeviceBatch, Source, Staged};
use crate::model::weights::{self, Recorded, WeightsFile};
use crate::model::{Model, ResNetConfig, Stem};
use crate::step::mix::{self, BatchMix};
use crate::step::{SgdConfig, Skipped, StepConfig, TrainStep};
use crate::train::args::{Augment, OptimizerKind, ScheduleKind, TrainArgs};
use crate::train::checkpoint::{self, Position};
use crate::train::config::{self, RunRecord};
use crate::train::data::RealData;
use crate::train::ema::Ema;
use crate::train::eval::{self, EvalResult};
use crate::train::keeper::{resolve_resume, Keeper};
use crate::train::metrics::correct_top1;
use crate::train::mllog::{self, MlLog};
use crate::train::progress::{EpochProgress, EvalProgress, Later, Logged};
use crate::train::rundir::{self, RunDir};
use crate::train::schedule::{Decay, LrSchedule, Resolution};

/// Exit code after saving a checkpoint on SIGINT/SIGTERM/SIGUSR1, so job scripts can requeue.
pub const EXIT_PREEMPTED: u8 = rn50_util::stop::EXIT_STOPPED;

/// How `rn50 train` ended without an error; `main` turns it into the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every epoch trained (or `-e` evaluated).
    Done,
    /// Stopped by SIGINT/SIGTERM/SIGUSR1 after saving a checkpoint: exit [`EXIT_PREEMPTED`].
    Preempted,
}

/// `rn50 train`: set up, then for each epoch train, evaluate, checkpoint and log, as main.py does.
pub fn run(args: &TrainArgs) -> Result<Outcome> {
    let setup = Setup::new(args)?;
    if args.evaluate {
        setup.evaluate_only()?;
        return Ok(Outcome::Done);
    }
    let mut t = Trainer::new(setup)?;
    for epoch in t.first_epoch..args.epochs {
        // This epoch's batches were queued before; its evaluation and the next epoch's batches queue behind them.
        let passes = t.queue(epoch)?;
        t.mllog_epoch_start(epoch)?;
        let stats = match t.train_one_epoch(epoch, passes.train)? {
            Trained::Epoch(stats) => *stats,
            Trained::Stopped(at) => {
                t.save_on_signal(&at)?;
                return t.finish(Outcome::Preempted);
            }
        };
        // The epochs of --eval-every/--eval-offset, and the last; none other.
        let eval = match args.evaluates(epoch) {
            true => Some(t.evaluate_epoch(epoch, passes.val)?),
            false => None,
        };
        // Unreadable images summed over ranks, the dataset's disk reads so far.
        let record = t.epoch_record(epoch, &stats, eval.as_ref())?;
        // Logged before the checkpoint: a rank 0 killed between the two resumes from the epoch before, which
        // drops the record and logs it again. In the other order the kill lost the epoch's record for good.
        t.log_epoch(record, &stats)?;
        t.save_checkpoint(epoch, eval.as_ref())?;
        if t.target_reached {
            break;
        }
    }
    t.finish(Outcome::Done)
}

/// What training and `-e` share: this process's device and rank, the run directory's claim, the data, the
/// model with its training step and EMA, resumed from the checkpoint when there is one, and the LR schedule.
struct Setup<'a> {
    args: &'a TrainArgs,
    dist: DistContext,
    rank0: bool,
    world: usize,
    device: tch::Device,
    compute: Compute,
    /// Rank 0 of a training run: the claim on `--out`.
    run_dir: Option<RunDir>,
    data: Option<RealData>,
    /// With --dummy: one random batch, trained on at every step.
    dummy: Option<Source>,
    step: TrainStep,
    /// --mixup-alpha / --cutmix-alpha, when either is above 0.
    mix: Option<BatchMix>,
    ema: Option<EmaModel>,
    /// The flags, as checkpoints record them.
    config: serde_json::Value,
    /// What checkpoints and weights record beside the tensors: the class names.
    recorded: Recorded,
    /// Where training goes on (epoch 0 batch 0 for a fresh run), with the best top-1 so far.
    position: Position,
    global_batch: usize,
    peak_lr: f64,
    schedule: LrSchedule,
    resolution: Resolution,
    /// The top-1 (percent) that stops training: --target-accuracy, or MLPerf's with --mllog.
    target: Option<f64>,
    /// When this process dropped the page cache (--drop-caches, each node's first process).
    caches_dropped: Option<SystemTime>,
    /// When MLPerf's init interval began; rank 0 of a training run with --mllog that does not resume: where
    /// MLPerf's log goes, and the log once the run starts writing.
    init_start: SystemTime,
    mllog_path: Option<&'a Path>,
    mllog: Option<MlLog>,
    /// How long TensorBoard's events may wait in the buffer ([`tensorboard_flush_every`]).
    tensorboard_flush: Duration,
}

/// `--ema`: the average, and the model it is copied into to be evaluated and saved as best.safetensors.
struct EmaModel {
    ema: Ema,
    model: Model,
}

impl<'a> Setup<'a> {
    fn new(args: &'a TrainArgs) -> Result<Self> {
        crate::train::check(args)?;
        let tensorboard_flush = tensorboard_flush_every()?;
        // torchrun / SLURM / Open MPI / PBS / `rn50 launch` tell each process its rank; one device per process.
        let world_info = WorldInfo::from_env()?;
        // Before any data is read, as MLPerf's scripts do before each run: every process checks that it may, the
        // first of each node drops its node's cache. The others wait for it at the process group's rendezvous.
        let caches_dropped = match args.mlperf.drop_caches {
            true => mllog::drop_caches(world_info.local_rank == 0)?,
            false => None,
        };
        let mut model_cfg = ResNetConfig::new(args.arch);
        model_cfg.zero_init_residual = args.zero_init_residual;
        model_cfg.width = args.width;
        if args.augment == Augment::Cifar {
            model_cfg.stem = Stem::Cifar;
        }
        let compute = args
            .compute
            .resolve(world_info.local_rank, model_cfg.narrowest_conv())?;
        let device = compute.device;
        crate::device::setup(device, compute.fused_bn, compute.fused_block)?;
        // The CPUs this process may use, split between the ranks of this node (as bench does).
        let per_rank = world_info.threads_per_rank();
        if world_info.local_world_size > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
            // srun does not split the cores between the tasks of a node: do it here.
            tch::set_num_threads(per_rank as i32);
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
        // Nothing is written into it until every check of the start has passed (`Trainer::new`).
        let run_dir = (rank0 && !args.evaluate)
            .then(|| RunDir::claim(&args.out, args.resume.as_deref(), args.overwrite))
            .transpose()?;
        let resume = match &args.resume {
            Some(r) => resolve_resume(r, &args.out)?,
            None => None,
        };
        // MLPerf's init interval starts here, once this process knows it is rank 0; it ends at run_start. The log
        // is opened when the run starts writing, and init_start is given this time.
        let init_start = SystemTime::now();
        let mllog_path = match (&args.mllog, rank0 && !args.evaluate) {
            (Some(path), true) => mllog_path(args, path, resume.is_some())?,
            _ => None,
        };
        let workers = args.workers.unwrap_or(per_rank);
        tch::manual_seed(args.seed as i64);

        let data = match (&args.data, args.dummy) {
            (Some(root), false) => Some(RealData::open(root, args, workers, rank, world)?),
            _ => None,
        };
        let classes = data.as_ref().map_or(1000, |d| d.classes.len());
        model_cfg.num_classes = classes as i64;
        let step_cfg = StepConfig {
            precision: compute.precision,
            channels_last: compute.channels_last,
            label_smoothing: args.label_smoothing,
            sgd: SgdConfig {
                momentum: args.momentum,
                weight_decay: args.wd,
                nesterov: args.nesterov,
                no_bn_bias_decay: args.no_bn_wd,
                lars_eta: (args.optimizer == OptimizerKind::Lars).then_some(args.lars_eta),
            },
        };
        // The random draws come in this order (weights, dummy batch, EMA model's initial weights, overwritten),
        // so that a --dummy batch is the same with and without --ema.
        let mut step = TrainStep::new(Model::new(model_cfg.clone(), device), step_cfg);
        if let Some(w) = &args.init_weights {
            init_weights(
                &step.model,
                w,
                args.reset_head,
                class_names(data.as_ref()),
                rank0,
            )?;
        }
        // Without a dataset there are 1000 classes, as the dummy batch's labels.
        let dummy = data
            .is_none()
            .then(|| Source::device(args.batch_size, args.image_size, device));
        let mut ema = args.ema.map(|decay| {
            let model = Model::new(model_cfg.clone(), device);
            if compute.channels_last {
                model.to_channels_last();
            }
            EmaModel {
                ema: Ema::new(&step.model, decay),
                model,
            }
        });
        let mut position = Position::default();
        if let Some(resume) = resume {
            if let (Some(w), true) = (&resume.warning, rank0) {
                tracing::warn!("{w}");
            }
            let ckpt = resume.path;
            let classes = class_names(data.as_ref());
            let header =
                checkpoint::load(&ckpt, &mut step, ema.as_mut().map(|e| &mut e.ema), classes)
                    .with_context(|| match crate::train::keeper::other_kept(&ckpt) {
                        Some(older) => format!(
                            "resuming from {} (another checkpoint is kept: --resume {})",
                            ckpt.display(),
                            older.display()
                        ),
                        None => format!("resuming from {}", ckpt.display()),
                    })?;
            if rank0 {
                tracing::info!(
                    "resumed from {} at epoch {} batch {}",
                    ckpt.display(),
                    header.position.epoch,
                    header.position.batch_in_epoch
                );
            }
            position = header.position;
        }
        if world > 1 {
            // DDP: rank 0's weights everywhere, then gradients averaged in buckets during backward. Built after
            // the channels_last conversion and the checkpoint load: buckets follow the parameters' strides.
            let opts = rn50_distributed::DdpOptions {
                bucket_cap_bytes: (args.bucket_cap_mb * 1024.0 * 1024.0) as usize,
                ..Default::default()
            };
            step.sync_gradients(&dist, &opts)?;
            if let (true, Some(group)) = (args.sync_bn, dist.group()) {
                crate::model::sync_bn::enable(group);
            }
            // A fresh EMA starts from the broadcast weights; a resumed one is the checkpoint's on every rank.
            if let (Some(e), None) = (&mut ema, &args.resume) {
                e.ema = Ema::new(&step.model, e.ema.decay);
            }
        } else if args.sync_bn && rank0 && !args.evaluate {
            tracing::info!("--sync-bn in a single process: batch norm uses this process's batch, as without it");
        }

        let global_batch = args.batch_size * args.accum_steps * world;
        let (peak_lr, lr_line) = args.peak_lr(global_batch);
        let schedule = schedule(args, peak_lr)?;
        let resolution = match args.min_res {
            None => Resolution::fixed(args.image_size),
            Some(min) => {
                Resolution::new(min, args.image_size, args.start_ramp, args.end_ramp_epoch())?
            }
        };
        if rank0 {
            tracing::info!(
                "rn50 train: {} on {} ({}{}), global batch {global_batch} ({} x {} accum x {world} procs), \
                 {lr_line}; {schedule}",
                args.arch,
                device_name(device),
                compute.precision,
                if compute.channels_last { ", channels_last" } else { "" },
                args.batch_size,
                args.accum_steps,
            );
        }
        let recorded = Recorded::with_classes(class_names(data.as_ref()));
        Ok(Self {
            args,
            dist,
            rank0,
            world,
            device,
            compute,
            run_dir,
            data,
            dummy,
            step,
            mix: BatchMix::new(args.mixup_alpha, args.cutmix_alpha),
            ema,
            config: serde_json::to_value(args)?,
            recorded,
            position,
            global_batch,
            peak_lr,
            schedule,
            resolution,
            target: mllog::target(args),
            caches_dropped,
            init_start,
            mllog_path,
            mllog: None,
            tensorboard_flush,
        })
    }

    /// What config.toml's `[run]` table records of this run.
    fn run_record(&self) -> RunRecord {
        RunRecord {
            processes: self.world,
            global_batch: self.global_batch,
            device: match self.device {
                tch::Device::Cpu => format!("cpu ({})", self.compute.cpu.model),
                d => format!("cuda ({})", device_name(d)),
            },
            libtorch: crate::shim::torch_version(),
        }
    }

    /// The weights that are evaluated and kept as best.safetensors: the EMA's when there is one (copied into
    /// its model now), else the trained model's.
    fn scored_model(&self) -> &Model {
        match &self.ema {
            Some(e) => {
                e.ema.copy_to(&e.model);
                &e.model
            }
            None => &self.step.model,
        }
    }

    /// The submission's fields and the hyperparameters as MLPerf's ResNet-50 rules name them (`lars_opt_*` or
    /// `sgd_opt_*`), with `per_epoch` optimizer steps an epoch.
    fn mllog_config(&mut self, per_epoch: usize) -> Result<()> {
        let Some(log) = &mut self.mllog else {
            return Ok(());
        };
        let args = self.args;
        let m = &args.mlperf;
        log.event("submission_benchmark", "resnet")?;
        if let Some(org) = &m.submission_org {
            log.event("submission_org", org)?;
        }
        if let Some(platform) = &m.submission_platform {
            log.event("submission_platform", platform)?;
        }
        log.event(
            "submission_division",
            m.submission_division.unwrap_or_default(),
        )?;
        log.event("submission_status", m.submission_status.unwrap_or_default())?;
        log.event("seed", args.seed)?;
        log.event("global_batch_size", self.global_batch)?;
        log.event("gradient_accumulation_steps", args.accum_steps)?;
        // The images batch norm's statistics are taken over: one process's batch, or every rank's with --sync-bn.
        let bn_span = match args.sync_bn {
            true => args.batch_size * self.world,
            false => args.batch_size,
        };
        log.event("model_bn_span", bn_span)?;
        if let Some(d) = &self.data {
            log.event("train_samples", d.train_images)?;
            log.event("eval_samples", d.val_images)?;
        }
        let lars = args.optimizer == OptimizerKind::Lars;
        let p = if lars { "lars" } else { "sgd" };
        log.event("opt_name", p)?;
        log.event(&format!("{p}_opt_base_learning_rate"), self.peak_lr)?;
        // The rate of the last step (the one that ends at epoch --epochs): --lr-end for poly and cosine, 0 for
        // linear, the rate after the last milestone for step.
        let end = self.schedule.at(self.schedule.epochs);
        log.event(&format!("{p}_opt_end_learning_rate"), end)?;
        match &self.schedule.decay {
            Decay::Poly { power, .. } => {
                log.event(&format!("{p}_opt_learning_rate_decay_poly_power"), power)?
            }
            // mllog's names for a step schedule (MLPerf's ResNet-50 rules before LARS and the polynomial decay).
            Decay::Step { milestones, gamma } => {
                log.event("opt_learning_rate_decay_boundary_epochs", milestones)?;
                log.event("opt_learning_rate_decay_factor", gamma)?;
            }
            Decay::Cosine { .. } | Decay::Linear => {}
        }
        let decay_steps = (args.epochs as f64 - args.warmup_epochs) * per_epoch as f64;
        log.event(
            &format!("{p}_opt_learning_rate_decay_steps"),
            decay_steps.round() as u64,
        )?;
        let warmup_key = if lars {
            "lars_opt_learning_rate_warmup_epochs"
        } else {
            "opt_learning_rate_warmup_epochs"
        };
        log.event(warmup_key, args.warmup_epochs)?;
        log.event(&format!("{p}_opt_momentum"), args.momentum)?;
        log.event(&format!("{p}_opt_weight_decay"), args.wd)?;
        if lars {
            // rn50's LARS has no epsilon in its trust ratio.
            log.event("lars_epsilon", 0.0)?;
        }
        Ok(())
    }

    /// Top-1/top-5 of the scored weights over `pass`, one pass of the validation set queued beforehand, all
    /// ranks together, its progress shown as `label` on rank 0; NaN without a dataset.
    fn evaluate(&self, pass: Option<Epoch>, label: String) -> Result<EvalResult> {
        let (Some(_), Some(pass)) = (&self.data, pass) else {
            return Ok(EvalResult {
                acc1: f64::NAN,
                acc5: f64::NAN,
                loss: f64::NAN,
                ..EvalResult::default()
            });
        };
        let (precision, channels_last) = (self.compute.precision, self.compute.channels_last);
        let batches = pass.remaining();
        let progress =
            EvalProgress::new(label, batches, self.world, self.rank0, self.args.print_freq);
        eval::evaluate(
            self.scored_model(),
            pass,
            precision,
            channels_last,
            progress,
        )?
        .all_ranks(&self.dist)
    }

    /// `-e`: evaluate the resumed (or fresh) weights once and print the accuracy.
    fn evaluate_only(&self) -> Result<()> {
        let Some(d) = &self.data else {
            bail!("-e needs a dataset, not --dummy")
        };
        let r = self.evaluate(Some(d.val.epoch(0, 0)), "val".into())?;
        if self.rank0 {
            println!(
                "Acc@1 {:.3} Acc@5 {:.3} ({} images)",
                r.acc1, r.acc5, r.images
            );
        }
        Ok(())
    }
}

/// The LR schedule of the flags, `peak` after the warmup.
fn schedule(args: &TrainArgs, peak: f64) -> Result<LrSchedule> {
    let decay = match args.lr_schedule {
        ScheduleKind::Step => Decay::step_for(args.epochs as f64, args.lr_milestones.as_deref()),
        ScheduleKind::Cosine => Decay::Cosine {
            final_lr: args.lr_end,
        },
        ScheduleKind::Linear => Decay::Linear,
        ScheduleKind::Poly => Decay::Poly {
            power: args.lr_poly_power,
            final_lr: args.lr_end,
        },
    };
    LrSchedule::new(peak, args.warmup_epochs, args.epochs as f64, decay)
}

/// Where rank 0 of a training run writes `--mllog path`: there, after [`MlLog::check`], with a warning when the log
/// lacks what a result needs; nowhere when the run resumes from a checkpoint. MLPerf times one uninterrupted run
/// from init_start to run_stop: a resumed attempt's lines, after the first attempt's or in a file of their own,
/// would claim a time to train that no run had. The resumed run trains on without a log, and says so.
fn mllog_path<'a>(args: &TrainArgs, path: &'a Path, resumes: bool) -> Result<Option<&'a Path>> {
    if resumes {
        // A path that is no MLPerf log (the checkpoint's) is still a mistake worth an error.
        MlLog::keys(path)?;
        tracing::warn!(
            "--mllog {}: not written by this run: it resumes from a checkpoint, and MLPerf times one uninterrupted \
             run (the log keeps the first attempt, to where it stopped)",
            path.display()
        );
        return Ok(None);
    }
    let logged = MlLog::check(path)?;
    let missing = args.mlperf.missing(&logged);
    if !missing.is_empty() {
        tracing::warn!(
            "--mllog {} is not a submission log without {}",
            path.display(),
            missing.join(", ")
        );
    }
    Ok(Some(path))
}

/// The class folder names in label order that best/final.safetensors record (none with --dummy).
fn class_names(data: Option<&RealData>) -> Option<&[String]> {
    data.map(|d| d.classes.as_slice())
}

/// `--init-weights`: the weights of `path` in `model`; the classifier keeps its initialisation when the file's
/// class count differs from the model's, when the file records other class names than `names` (the data's: its
/// labels would mean other classes), or with `reset_head`.
fn init_weights(
    model: &Model,
    path: &Path,
    reset_head: bool,
    names: Option<&[String]>,
    rank0: bool,
) -> Result<()> {
    let file = WeightsFile::read(path)?;
    let file_classes = file.shape()?.num_classes;
    let classes = model.net.config.num_classes;
    let renamed =
        file_classes == classes && matches!((file.classes(), names), (Some(a), Some(b)) if a != b);
    if reset_head || file_classes != classes || renamed {
        file.load_backbone(model)?;
        if rank0 {
            tracing::info!(
                "initialised from {} with a new classifier ({file_classes} → {classes} classes{})",
                path.display(),
                match (reset_head, renamed) {
                    (true, _) => ", --reset-head",
                    (false, true) => ", the file's class names differ from the data's",
                    _ => "",
                }
            );
        }
    } else {
        file.load(model)?;
        if rank0 {
            tracing::info!("initialised from {}", path.display());
        }
    }
    Ok(())
}

/// Training: `Setup` with the stop signal, rank 0's logs and checkpoints, and the epochs' layout.
struct Trainer<'a> {
    setup: Setup<'a>,
    /// Set by SIGINT/SIGTERM/SIGUSR1 ([`rn50_util::stop`]).
    stop: Arc<AtomicBool>,
    /// Rank 0: per-epoch records (metrics.jsonl), and every logged step with its loss at full precision
    /// (steps.jsonl).
    metrics: Option<File>,
    steps_log: Option<File>,
    /// Rank 0: TensorBoard scalars in RUN_DIR/tensorboard/ (the tags: `rn50_report::tensorboard`).
    tensorboard: Option<EventWriter>,
    /// Rank 0: the records of metrics.jsonl, earlier runs' (when resumed) and this one's, for the summary.
    epochs: Vec<EpochMetrics>,
    summary: TrainSummary,
    keeper: Keeper,
    /// Rank 0 with a dataset: read bandwidth and IOPS of the dataset's disk and of this process, per epoch and
    /// as io.jsonl.
    io: Option<IoMonitor>,
    /// Optimizer steps per epoch.
    per_epoch: usize,
    /// The epoch training starts at (0, or the resumed one), and its first step to train in optimizer steps of
    /// this run's layout.
    first_epoch: usize,
    resume_step: usize,
    /// The next epoch's training batches, queued ahead (see `Trainer::queue`).
    next_train: Option<Epoch>,
    run_start: Instant,
    /// The first epoch of the epochs up to the next evaluation (MLPerf's block), for --mllog.
    block_first: usize,
    /// Set when an evaluation reached --target-accuracy: training stops after that epoch.
    target_reached: bool,
    /// When the last epoch record was logged (this process's first epoch: when training was set up).
    last_record: Instant,
    /// What the epoch in training left out so far (a resumed epoch: from its checkpoint on).
    so_far: EpochCounts,
    /// Rank 0: what the start created, until the first step is taken.
    first_step: FirstStep,
}

/// One step's batches as this rank got them: `None` for one batch norm cannot train on.
struct Fetched {
    batches: Vec<Option<Staged>>,
    /// Unreadable images this rank skipped in them.
    bad_images: u64,
}

/// What this rank's micro-batches of a step gave, on the device until logged.
struct Stepped {
    /// Their mean loss.
    loss: Tensor,
    /// Their images ranked top-1 correctly, and their images.
    correct1: Tensor,
    images: usize,
}

/// What all ranks agreed for a step.
struct Agreed {
    stop: bool,
    /// Unreadable images of the step's batches, all ranks.
    bad_images: u64,
    /// Per micro-batch: every rank can train on it.
    train: Vec<bool>,
}

/// What an epoch left out so far, all ranks; checkpoints keep it, so a resumed epoch counts from the start.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EpochCounts {
    /// Unreadable training images skipped.
    pub bad_images: u64,
    /// Batches not trained on (see [`EpochMetrics::skipped_batches`]).
    pub skipped_batches: u64,
}

/// One epoch's passes over the data, queued on the loader threads.
struct Passes {
    train: Option<Epoch>,
    val: Option<Epoch>,
}

/// How `Trainer::train_one_epoch` ended.
enum Trained {
    Epoch(Box<EpochStats>),
    /// A stop signal came: the position of the first step not trained.
    Stopped(Position),
}

/// One epoch's training, as its metrics record sums it up.
struct EpochStats {
    io_start: Option<IoSample>,
    /// Mean over the logged steps of the loss averaged over ranks.
    train_loss: f64,
    /// Top-1 over the images trained (all ranks), percent; NaN when none was.
    train_acc1: f64,
    /// The last step's rate.
    lr: f64,
    /// Over all processes.
    images_per_sec: f64,
    data_wait_share: f64,
    /// Seconds a step waited for the loader, on average.
    data_wait_per_step: f64,
    resolution: usize,
    /// What the epoch left out, all ranks.
    counts: EpochCounts,
}

/// Opens the JSON-lines log `name` of `dir` for appending.
fn append(dir: &Path, name: &str) -> Result<File> {
    let path = dir.join(name);
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Appends `rec` and its newline in one write (a kill leaves a whole line or a cut one, which a resume drops).
fn append_record(f: &mut File, rec: &impl serde::Serialize) -> Result<()> {
    let mut line = serde_json::to_string(rec)?;
    line.push('\n');
    f.write_all(line.as_bytes())?;
    Ok(())
}

/// How long TensorBoard's events may wait in the buffer: `RN50_TENSORBOARD_FLUSH_SECS`, 1 to 60 (tests shorten
/// it to see events reach the file mid-epoch), else a minute; exit 2 on another value.
fn tensorboard_flush_every() -> Result<Duration, UsageError> {
    const VAR: &str = "RN50_TENSORBOARD_FLUSH_SECS";
    let Some(v) = std::env::var_os(VAR) else {
        return Ok(FLUSH_EVERY);
    };
    match v.to_str().and_then(|s| s.trim().parse::<u64>().ok()) {
        Some(secs @ 1..=60) => Ok(Duration::from_secs(secs)),
        _ => Err(UsageError::new(format!(
            "{VAR}={} must be whole seconds from 1 to 60",
            v.to_string_lossy()
        ))),
    }
}

/// A metric that is a number; NaN and infinities are written as null and read back as absent, so they are
/// absent in the records kept in memory too.
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// Rank 0's logs in the run directory (nothing on the other ranks), and the epochs' records logged before.
#[derive(Default)]
struct RunLogs {
    metrics: Option<File>,
    steps_log: Option<File>,
    tensorboard: Option<EventWriter>,
    epochs: Vec<EpochMetrics>,
    io: Option<IoMonitor>,
    undo: FirstStep,
}

impl RunLogs {
    /// Rank 0 starts writing the run directory, once every check of the start has passed. First a TensorBoard
    /// file of its own (an unwritable tensorboard/ fails here, before anything else is written); then, with
    /// --overwrite, the earlier run's files go; the logs are trimmed to the resumed position and opened;
    /// config.toml, --mllog (with init_start's time) and io.jsonl follow. `per_epoch`: optimizer steps an
    /// epoch.
    fn start(setup: &mut Setup, per_epoch: usize) -> Result<Self> {
        let (args, position) = (setup.args, &setup.position);
        // What this start creates, removed again if it fails before the first step.
        let mut undo = FirstStep::default();
        let out = &args.out;
        let new = |name: &str| Some(out.join(name)).filter(|p| !p.exists());
        // A resumed run's epoch and its first optimizer step to train, in this run's layout: what was logged
        // from there on is logged again.
        let resumed = args.resume.is_some().then(|| {
            let step = position.start_batch(args.batch_size, setup.world) / args.accum_steps;
            (position.epoch, step as u64)
        });
        // TensorBoard drops what the earlier files have from the first step this run logs on (steps are the
        // optimizer steps taken), as after torch's SummaryWriter(purge_step=…).
        let purge_step = resumed.map(|(epoch, step)| (epoch * per_epoch as u64 + step + 1) as i64);
        undo.created.extend(new("tensorboard"));
        let tensorboard = EventWriter::create(
            &out.join("tensorboard"),
            purge_step,
            setup.tensorboard_flush,
        )?;
        undo.created.push(tensorboard.path().to_path_buf());
        if let Some(dir) = &mut setup.run_dir {
            dir.begin()?;
        }
        let metrics_path = args.out.join("metrics.jsonl");
        let mut epochs = Vec::new();
        if let Some((epoch, step)) = resumed {
            let at = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or(0);
            rundir::trim_log(&metrics_path, |r| at(r, "epoch") < epoch)?;
            rundir::trim_log(&args.out.join("steps.jsonl"), |r| {
                (at(r, "epoch"), at(r, "step")) < (epoch, step)
            })?;
            if metrics_path.exists() {
                epochs = rn50_report::schema::read_metrics(&metrics_path)?;
            }
        }
        let created = ["metrics.jsonl", "steps.jsonl", "config.toml", "io.jsonl"].map(new);
        undo.created.extend(created.into_iter().flatten());
        if let Some(path) = setup.mllog_path {
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() => undo.appended.push((path.to_path_buf(), m.len())),
                // A pipe or a device: what was written to it cannot be taken back (and opening a pipe to cut it
                // would wait for a reader).
                Ok(_) => {}
                Err(_) => undo.created.push(path.to_path_buf()),
            }
        }
        let (metrics, steps_log) = (
            append(&args.out, "metrics.jsonl")?,
            append(&args.out, "steps.jsonl")?,
        );
        // What was run, every flag's value as this machine resolved it: reusable with --config.
        if let Some(flags) = &args.resolved_config {
            let run = setup.run_record();
            let reused = args.config.as_deref();
            if let Some((file, earlier)) = reused.and_then(|f| Some((f, RunRecord::of_file(f)?))) {
                let differences = run.differences(&earlier);
                if !differences.is_empty() {
                    tracing::warn!(
                        "--config {} was run with other settings than this run's, so the numbers will differ: {}",
                        file.display(),
                        differences.join(", ")
                    );
                }
            }
            let path = args.out.join("config.toml");
            let text = config::document(flags, Some((&setup.compute, &run)));
            rn50_util::atomic_write(&path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(path) = setup.mllog_path {
            // A job script that dropped the caches itself logged cache_clear first: rn50's false would contradict it.
            let script_cleared = MlLog::keys(path)?.iter().any(|k| k == "cache_clear");
            let mut log = MlLog::open(path)?;
            if args.mlperf.drop_caches || !script_cleared {
                // Dropped before init_start (logged at init_start's time when another process of the node did it).
                let cleared = setup.caches_dropped.unwrap_or(setup.init_start);
                log.event_at(cleared, "cache_clear", args.mlperf.drop_caches)?;
            }
            log.started_at(setup.init_start, "init_start", json!({}))?;
            setup.mllog = Some(log);
        }
        let io = match (&args.data, &setup.data) {
            (Some(root), Some(_)) => Some(IoMonitor::start_logging(
                root,
                std::time::Duration::from_secs(1),
                &args.out.join("io.jsonl"),
            )?),
            _ => None,
        };
        Ok(Self {
            metrics: Some(metrics),
            steps_log: Some(steps_log),
            tensorboard: Some(tensorboard),
            epochs,
            io,
            undo,
        })
    }
}

/// The files (and the tensorboard/ folder) a start created, removed again when training fails before its
/// first step is taken or checkpointed: memory running out at the first step, say; and the files it appended to
/// (an --mllog a job script began), cut back to their length before. The corrected command then starts as after
/// a start that failed its checks, without --overwrite.
#[derive(Default)]
struct FirstStep {
    created: Vec<PathBuf>,
    appended: Vec<(PathBuf, u64)>,
}

impl FirstStep {
    /// A step was taken (or a checkpoint saved): the run is one from here on.
    fn taken(&mut self) {
        self.created.clear();
        self.appended.clear();
    }
}

impl Drop for FirstStep {
    fn drop(&mut self) {
        for (p, len) in &self.appended {
            let _ = OpenOptions::new()
                .write(true)
                .open(p)
                .and_then(|f| f.set_len(*len));
        }
        // Files before the folder they are in.
        for p in self.created.iter().rev() {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}

impl<'a> Trainer<'a> {
    fn new(mut setup: Setup<'a>) -> Result<Self> {
        let args = setup.args;
        let (rank0, world) = (setup.rank0, setup.world);
        // SLURM sends SIGTERM (or --signal=USR1) before preemption, a user Ctrl-C: checkpoint, then exit
        // EXIT_PREEMPTED (a second Ctrl-C stops at once).
        let stop = rn50_util::stop::install("saving a checkpoint after this step")?;
        // Every check of the start comes before anything is written: a start that fails leaves the run
        // directory as it was, so the corrected command is not refused as a second run.
        let micro_per_epoch = match &mut setup.data {
            Some(d) => d.batches_per_epoch(args)?,
            None => args.steps_per_epoch.unwrap_or(100) * args.accum_steps,
        };
        if micro_per_epoch == 0 {
            let images = setup.data.as_ref().map_or(0, |d| d.train_images);
            bail!(
                "the training set is smaller than one batch: {images} images{} and --batch-size {}; lower \
                 --batch-size",
                match world {
                    1 => String::new(),
                    w => format!(" over {w} processes"),
                },
                args.batch_size
            );
        }
        if micro_per_epoch < args.accum_steps {
            bail!(
                "an epoch has {micro_per_epoch} batches of {}, fewer than --accum-steps {}: lower --accum-steps \
                 or --batch-size",
                args.batch_size,
                args.accum_steps
            );
        }
        let per_epoch = args
            .steps_per_epoch
            .map_or(micro_per_epoch / args.accum_steps, |s| {
                s.min(micro_per_epoch / args.accum_steps)
            })
            .max(1);
        let keeper = Keeper::new(&args.out, args.keep_checkpoints, args.checkpoint_minutes)?;
        let RunLogs {
            metrics,
            steps_log,
            tensorboard,
            epochs,
            io,
            undo,
        } = match rank0 {
            true => RunLogs::start(&mut setup, per_epoch)?,
            false => RunLogs::default(),
        };
        if rank0 {
            keeper.clear_stale();
        }
        let run_start = Instant::now();
        let summary = TrainSummary {
            arch: args.arch.to_string(),
            device: match setup.device {
                tch::Device::Cpu => format!(
                    "{} ({} threads)",
                    setup.compute.cpu.model,
                    tch::get_num_threads()
                ),
                d => device_name(d),
            },
            world_size: world as u64,
            batch_size: args.batch_size as u64,
            global_batch: setup.global_batch as u64,
            lr: setup.peak_lr,
            precision: setup.compute.precision.to_string(),
            dataset: args
                .data
                .as_ref()
                .filter(|_| !args.dummy)
                .map_or("dummy".into(), |d| d.display().to_string()),
            ..Default::default()
        };
        let position = &setup.position;
        let resume_batch = position.start_batch(args.batch_size, world);
        if rank0 && resume_batch != position.batch_in_epoch as usize {
            tracing::info!(
                "checkpoint written by {} processes x batch {}: resuming epoch {} at batch {resume_batch} of this layout",
                position.world_size, position.batch_size, position.epoch
            );
        }
        let first_epoch = position.epoch as usize;
        let so_far = EpochCounts {
            bad_images: position.bad_images,
            skipped_batches: position.skipped_batches,
        };
        let mut t = Trainer {
            setup,
            stop,
            metrics,
            steps_log,
            tensorboard,
            epochs,
            summary,
            keeper,
            io,
            per_epoch,
            first_epoch,
            resume_step: resume_batch / args.accum_steps,
            next_train: None,
            run_start,
            block_first: first_epoch,
            target_reached: false,
            last_record: Instant::now(),
            so_far,
            first_step: undo,
        };
        if t.first_epoch < args.epochs {
            t.next_train = t.queue_train(t.first_epoch)?;
        }
        t.setup.mllog_config(per_epoch)?;
        if let Some(log) = &mut t.setup.mllog {
            log.end("init_stop", json!({}))?;
            log.start("run_start", json!({}))?;
        }
        Ok(t)
    }

    /// The optimizer step epoch `epoch` starts at: 0, or where the resumed epoch left off.
    fn first_step(&self, epoch: usize) -> usize {
        if epoch == self.first_epoch {
            self.resume_step
        } else {
            0
        }
    }

    /// The position after `s` optimizer steps of `epoch`.
    fn position_at(&self, epoch: usize, s: usize) -> Position {
        Position {
            epoch: epoch as u64,
            batch_in_epoch: (s * self.setup.args.accum_steps) as u64,
            global_step: (epoch * self.per_epoch + s) as u64,
            best_acc1: self.setup.position.best_acc1,
            world_size: self.setup.world as u64,
            batch_size: self.setup.args.batch_size as u64,
            bad_images: if s > 0 { self.so_far.bad_images } else { 0 },
            skipped_batches: if s > 0 {
                self.so_far.skipped_batches
            } else {
                0
            },
        }
    }

    /// Queues the training batches of `epoch` that are still to train (none without a dataset).
    fn queue_train(&mut self, epoch: usize) -> Result<Option<Epoch>> {
        let (args, res) = (self.setup.args, self.setup.resolution.at(epoch));
        let batches = self.first_step(epoch) * args.accum_steps..self.per_epoch * args.accum_steps;
        match &mut self.setup.data {
            Some(d) => Ok(Some(d.train_epoch(args, res, epoch, batches)?)),
            None => Ok(None),
        }
    }

    /// Epoch `epoch`'s training batches (queued when the epoch before it started) and its evaluation pass.
    ///
    /// The loader threads take work in the order it is queued, which is the order it is consumed: an epoch's
    /// batches, its evaluation, the next epoch's batches. Both are queued as an epoch starts, so they decode as
    /// soon as the epoch's last batches are handed out (or whenever the steps leave the threads idle): nothing
    /// waits for a loader to start at an epoch boundary.
    fn queue(&mut self, epoch: usize) -> Result<Passes> {
        let train = self.next_train.take();
        let val = match (&self.setup.data, self.setup.args.evaluates(epoch)) {
            (Some(d), true) => Some(d.val.epoch(0, 0)),
            _ => None,
        };
        if epoch + 1 < self.setup.args.epochs {
            self.next_train = self.queue_train(epoch + 1)?;
        }
        Ok(Passes { train, val })
    }

    /// --mllog: a block (the epochs up to the next evaluation) starts at the run's first epoch and after each
    /// evaluation; then the epoch starts. MLPerf numbers epochs from 1.
    fn mllog_epoch_start(&mut self, epoch: usize) -> Result<()> {
        let args = self.setup.args;
        let new_block = epoch == self.first_epoch || args.evaluates(epoch - 1);
        if new_block {
            self.block_first = epoch;
        }
        let Some(log) = &mut self.setup.mllog else {
            return Ok(());
        };
        if new_block {
            let last = (epoch..args.epochs)
                .find(|&e| args.evaluates(e))
                .expect("the last epoch is evaluated");
            log.start(
                "block_start",
                json!({"first_epoch_num": epoch + 1, "epoch_count": last + 1 - epoch}),
            )?;
        }
        log.start("epoch_start", json!({"epoch_num": epoch + 1}))
    }

    /// Evaluates after `epoch` over `val` (see `Setup::evaluate`); with a target (--target-accuracy, or MLPerf's
    /// with --mllog), a top-1 that reaches it sets `target_reached`. --mllog: the epoch's end, the evaluation, its
    /// accuracy as a fraction, the block's end, and run_stop (success) when MLPerf's target is reached (top-1 at
    /// least 75.9 and the checker's eval_accuracy at least 0.759 agree for every image count up to 200,000).
    fn evaluate_epoch(&mut self, epoch: usize, val: Option<Epoch>) -> Result<EvalResult> {
        let n = json!({"epoch_num": epoch + 1});
        if let Some(log) = &mut self.setup.mllog {
            log.end("epoch_stop", n.clone())?;
            log.start("eval_start", n.clone())?;
        }
        let eval = self.setup.evaluate(val, format!("val epoch {epoch}"))?;
        // Every rank has the same accuracy (summed over ranks), so they all stop after the same epoch.
        self.target_reached = self.setup.target.is_some_and(|t| eval.acc1 >= t);
        if let Some(log) = &mut self.setup.mllog {
            log.end("eval_stop", n.clone())?;
            log.event_with("eval_accuracy", eval.acc1 / 100.0, n)?;
            log.end(
                "block_stop",
                json!({"first_epoch_num": self.block_first + 1}),
            )?;
            if self.target_reached {
                log.end("run_stop", json!({"status": "success"}))?;
            }
        }
        Ok(eval)
    }

    /// Trains epoch `epoch` from its first step still to train, on `batches` (the dummy batch without a
    /// dataset), until its last step or a stop signal.
    fn train_one_epoch(&mut self, epoch: usize, mut batches: Option<Epoch>) -> Result<Trained> {
        let io_start = self.io.as_ref().map(|m| m.snapshot());
        let (start, per_epoch) = (self.first_step(epoch), self.per_epoch);
        let later = Later {
            epochs: self.setup.args.epochs - epoch - 1,
            epoch_secs: self.epochs.last().and_then(|r| r.seconds),
        };
        let mut prog = EpochProgress::new(
            epoch,
            start,
            per_epoch,
            self.setup.world,
            self.setup.rank0,
            later,
        );
        let (mut loss_sum, mut loss_n, mut lr) = (0.0, 0usize, 0.0);
        // The epoch's top-1 hits on this rank, counted on the device (read at the epoch's end).
        let mut correct1 = Tensor::zeros([], (Kind::Int64, self.setup.device));
        // A mid-epoch resume goes on counting from the checkpoint's counts.
        if start == 0 {
            self.so_far = EpochCounts::default();
        }
        for s in start..per_epoch {
            // The step's batches, then one agreement of all ranks: a stop signal (which may reach only some),
            // and the batches every rank can train on.
            let fetched = self.fetch_step(batches.as_mut(), &mut prog)?;
            let agreed = self.agree(&fetched)?;
            if agreed.stop {
                prog.finish();
                return Ok(Trained::Stopped(self.position_at(epoch, s)));
            }
            // Counted once the step is taken (a stopped one is fetched again on resume).
            self.so_far.bad_images += agreed.bad_images;
            lr = self
                .setup
                .schedule
                .at(epoch as f64 + (s + 1) as f64 / per_epoch as f64);
            let trained: Vec<Staged> = fetched
                .batches
                .into_iter()
                .zip(&agreed.train)
                .filter_map(|(b, &train)| b.filter(|_| train))
                .collect();
            self.so_far.skipped_batches += (agreed.train.len() - trained.len()) as u64;
            let logged = if trained.is_empty() {
                // No batch to train on anywhere: no step (never one on an empty batch), as for a skipped fp16 step.
                None
            } else {
                self.setup.step.opt.zero_grad();
                let stepped = self.forward_backward(trained, epoch, s, &mut prog)?;
                let _ = correct1.g_add_(&stepped.correct1);
                let skipped = self.setup.step.apply(lr)?;
                self.first_step.taken();
                // torchvision's --model-ema-steps: on the epoch's steps 0, N, 2N, ...
                if let Some(e) = &mut self.setup.ema {
                    if s.is_multiple_of(self.setup.args.ema_steps) {
                        e.ema.update();
                    }
                }
                let due = (s + 1).is_multiple_of(self.setup.args.print_freq) || s + 1 == per_epoch;
                match due {
                    true => Some(self.log_step(epoch, s, &stepped, &skipped, lr)?),
                    false => None,
                }
            };
            if let Some(l) = logged {
                loss_sum += l.loss;
                loss_n += 1;
            }
            prog.step(s, start, logged, lr);
            if self.setup.rank0 && self.keeper.due() && s + 1 < per_epoch {
                let at = self.position_at(epoch, s + 1);
                self.checkpoint(&at)?;
            }
        }
        prog.finish();
        // Every rank agreed on each batch, so all stop here alike. An epoch with nothing trained would report an
        // untrained network's accuracy as its result (and loss 0, train Acc@1 NaN).
        let batches = (per_epoch * self.setup.args.accum_steps) as u64;
        if self.so_far.skipped_batches >= batches {
            bail!(
                "epoch {epoch}: no batch could be trained on (all {batches} skipped: {} images could not be \
                 read{}, and batch norm needs more than one value per channel): nothing was learnt; check the data",
                self.so_far.bad_images,
                match self.setup.args.augment {
                    Augment::Cifar => " or were smaller than --augment cifar's crop less its padding",
                    _ => "",
                }
            );
        }
        let train_secs = prog.elapsed();
        // main.py's top1 meter at the epoch's end: the hits over the images trained, all ranks.
        let mut top1 = [i64::try_from(&correct1)? as f64, prog.images as f64];
        self.setup
            .dist
            .sum_f64(&mut top1, "summing the training top-1")?;
        Ok(Trained::Epoch(Box::new(EpochStats {
            io_start,
            train_loss: loss_sum / loss_n.max(1) as f64,
            train_acc1: 100.0 * top1[0] / top1[1],
            lr,
            images_per_sec: prog.images_per_sec(),
            data_wait_share: prog.data_wait.as_secs_f64() / train_secs.max(1e-9),
            data_wait_per_step: prog.data_wait.as_secs_f64() / (per_epoch - start).max(1) as f64,
            resolution: self.setup.resolution.at(epoch),
            counts: self.so_far,
        })))
    }

    /// This rank's batches of one step (`--accum-steps` of them; the dummy batch without a dataset), each
    /// `None` when batch norm cannot train on it here: no image (every one unreadable), or one value per channel
    /// (one image whose last stage is 1x1), which gives NaN statistics.
    fn fetch_step(
        &mut self,
        mut batches: Option<&mut Epoch>,
        prog: &mut EpochProgress,
    ) -> Result<Fetched> {
        let (accum, device) = (self.setup.args.accum_steps, self.setup.device);
        let mut fetched = Fetched {
            batches: Vec::with_capacity(accum),
            bad_images: 0,
        };
        for _ in 0..accum {
            let Some(it) = batches.as_deref_mut() else {
                let dummy = self
                    .setup
                    .dummy
                    .as_mut()
                    .expect("dummy batch without a dataset");
                fetched.batches.push(Some(dummy.next(device)?));
                continue;
            };
            let t = Instant::now();
            let b = it
                .next()
                .context("the loader ended before the epoch's last step")??;
            prog.data_wait += t.elapsed();
            fetched.bad_images += b.skipped() as u64;
            let net = &self.setup.step.model.net.config;
            let (h, w) = (net.last_stage_side(b.h()), net.last_stage_side(b.w()));
            let trainable = b.n() * h * w > 1;
            fetched.batches.push(match trainable {
                true => Some(Staged::from(DeviceBatch::new(b, device)?)),
                false => None,
            });
        }
        Ok(fetched)
    }

    /// What every rank must do alike this step, agreed in one collective: stop (a signal may reach only some
    /// ranks), and train on each micro-batch only where every rank can (DDP's backward is collective); with the
    /// unreadable images of all ranks.
    fn agree(&self, here: &Fetched) -> Result<Agreed> {
        let mut v = vec![
            f64::from(u8::from(self.stop.load(Ordering::Relaxed))),
            here.bad_images as f64,
        ];
        v.extend(
            here.batches
                .iter()
                .map(|b| f64::from(u8::from(b.is_none()))),
        );
        self.setup
            .dist
            .sum_in_step(&mut v, "the stop signal and the step's batches")?;
        Ok(Agreed {
            stop: v[0] > 0.0,
            bad_images: v[1] as u64,
            train: v[2..]
                .iter()
                .map(|&untrainable| untrainable == 0.0)
                .collect(),
        })
    }

    /// Forward and backward over the step's micro-batches (step `s` of `epoch`): their mean loss and top-1 hits
    /// (on the device). Each is normalised, its random-erasing boxes zeroed, and mixed (--mixup-alpha,
    /// --cutmix-alpha) with draws that depend on (seed, epoch, step, micro-batch, rank) only, so a resumed run mixes
    /// as an uninterrupted one.
    fn forward_backward(
        &mut self,
        batches: Vec<Staged>,
        epoch: usize,
        s: usize,
        prog: &mut EpochProgress,
    ) -> Result<Stepped> {
        let n = batches.len();
        let device = self.setup.device;
        let mut out = Stepped {
            loss: Tensor::zeros([], (Kind::Float, device)),
            correct1: Tensor::zeros([], (Kind::Int64, device)),
            images: 0,
        };
        let (world, rank) = (self.setup.world, self.setup.dist.rank());
        for (micro, batch) in batches.into_iter().enumerate() {
            let step = &mut self.setup.step;
            let mut x = step.input.normalize(&batch.images);
            mix::erase(&mut x, &batch.erased);
            let targets = match &self.setup.mix {
                Some(m) => {
                    let key = ((s * n + micro) * world + rank) as u64;
                    let mut rng = rng_for(self.setup.args.seed, epoch as u64, key, b"batchmix");
                    let (h, w) = (x.size()[2] as usize, x.size()[3] as usize);
                    let classes = step.model.net.config.num_classes;
                    m.draw(&mut rng, h, w).apply(&mut x, &batch.labels, classes)
                }
                None => batch.labels.shallow_clone(),
            };
            let f = step.backward(&x, &targets, micro, n)?;
            out.loss += f.loss / n as f64;
            // main.py's top1 meter; with mixed targets, against the class each weighs most (torchvision's
            // reference, utils.accuracy).
            let hits = match targets.dim() {
                2 => correct_top1(&f.logits, &targets.argmax(1, false)),
                _ => correct_top1(&f.logits, &batch.labels),
            };
            out.correct1 += hits;
            out.images += batch.labels.size()[0] as usize;
        }
        prog.images += out.images;
        Ok(out)
    }

    /// The loss and top-1 of step `s` as logged: the loss's mean over ranks, which every rank judges (so all
    /// stop together), the top-1 over all ranks' images; rank 0 appends them to steps.jsonl and TensorBoard.
    fn log_step(
        &mut self,
        epoch: usize,
        s: usize,
        stepped: &Stepped,
        skipped: &Skipped,
        lr: f64,
    ) -> Result<Logged> {
        let mut v = [
            f64::try_from(&stepped.loss)? / self.setup.world as f64,
            i64::try_from(&stepped.correct1)? as f64,
            stepped.images as f64,
        ];
        self.setup
            .dist
            .sum_f64(&mut v, "averaging the loss and top-1")?;
        let (loss, acc1) = (v[0], 100.0 * v[1] / v[2].max(1.0));
        if !loss.is_finite() && !skipped.get()? {
            bail!("the loss became {loss} at epoch {epoch} step {s}: stopping (the last checkpoint is kept)");
        }
        if let Some(f) = &mut self.steps_log {
            let rec = StepRecord {
                epoch: epoch as u64,
                step: s as u64,
                loss,
                acc1: finite(acc1),
                lr,
            };
            append_record(f, &rec)?;
        }
        if let Some(tb) = &mut self.tensorboard {
            let global_step = (epoch * self.per_epoch + s + 1) as i64;
            tb.scalar("train/loss", global_step, loss)?;
            tb.scalar("train/acc1", global_step, acc1)?;
            tb.scalar("train/lr", global_step, lr)?;
        }
        Ok(Logged { loss, acc1 })
    }

    /// Rank 0 saves the checkpoint of `at`: from here on the run is one, whose files stay whatever happens next
    /// (its start's undo list is dropped; it took a run whose only checkpoints were end-of-epoch ones for a failed
    /// start, and removed its logs at exit).
    fn checkpoint(&mut self, at: &Position) -> Result<PathBuf> {
        let ema = self.setup.ema.as_ref().map(|e| &e.ema);
        let path = self.keeper.save(
            &self.setup.step,
            ema,
            at,
            &self.setup.config,
            &self.setup.recorded,
        )?;
        self.first_step.taken();
        Ok(path)
    }

    /// After a stop signal: rank 0 saves a checkpoint at `at` to resume from.
    fn save_on_signal(&mut self, at: &Position) -> Result<()> {
        if !self.setup.rank0 {
            return Ok(());
        }
        let path = self.checkpoint(at)?;
        tracing::warn!(
            "signal received: checkpoint saved to {} (resume with --resume {})",
            path.display(),
            self.setup.args.out.display()
        );
        Ok(())
    }

    /// The metrics.jsonl record of `epoch` (its seconds are set when it is logged), with the unreadable images
    /// summed over ranks.
    fn epoch_record(
        &mut self,
        epoch: usize,
        stats: &EpochStats,
        eval: Option<&EvalResult>,
    ) -> Result<EpochMetrics> {
        if let (Some(log), None) = (&mut self.setup.mllog, eval) {
            log.end("epoch_stop", json!({"epoch_num": epoch + 1}))?;
        }
        let io = self
            .io
            .as_ref()
            .zip(stats.io_start.as_ref())
            .map(|(m, s0)| m.snapshot().delta(s0));
        Ok(EpochMetrics {
            epoch: epoch as u64,
            train_loss: finite(stats.train_loss),
            train_acc1: finite(stats.train_acc1),
            lr: finite(stats.lr),
            images_per_sec: finite(stats.images_per_sec),
            acc1: eval.and_then(|e| finite(e.acc1)),
            acc5: eval.and_then(|e| finite(e.acc5)),
            val_loss: eval.and_then(|e| finite(e.loss)),
            val_images: eval.map(|e| e.images),
            seconds: None,
            resolution: Some(stats.resolution as u64),
            data_wait_share: finite(stats.data_wait_share),
            bad_images: Some(stats.counts.bad_images),
            skipped_batches: Some(stats.counts.skipped_batches),
            val_bad_images: eval.map(|e| e.bad_images),
            disk_read_gbs: io.as_ref().and_then(|d| d.disk_read_gbs),
            disk_read_iops: io.as_ref().and_then(|d| d.disk_read_iops),
            process_read_gbs: io.as_ref().and_then(|d| d.process_read_gbs),
        })
    }

    /// The end of `epoch`: the position moves to the next epoch, with the best top-1 so far; rank 0 saves the
    /// checkpoint, and the scored weights as best.safetensors when they scored best (only an evaluated epoch
    /// can).
    fn save_checkpoint(&mut self, epoch: usize, eval: Option<&EvalResult>) -> Result<()> {
        let acc1 = eval.map_or(f64::NAN, |e| e.acc1);
        let is_best = !acc1.is_nan() && acc1 >= self.setup.position.best_acc1;
        if is_best {
            self.setup.position.best_acc1 = acc1;
        }
        self.setup.position = self.position_at(epoch + 1, 0);
        if !self.setup.rank0 {
            return Ok(());
        }
        let at = self.setup.position.clone();
        self.checkpoint(&at)?;
        if is_best {
            weights::save(
                self.setup.scored_model(),
                &self.setup.args.out.join("best.safetensors"),
                &self.setup.recorded,
            )?;
        }
        Ok(())
    }

    /// Rank 0 appends `record` to metrics.jsonl, prints the epoch's line, and refreshes summary.json,
    /// metrics.csv, summary.md and the plots, so a run cut short still has them.
    fn log_epoch(&mut self, mut record: EpochMetrics, stats: &EpochStats) -> Result<()> {
        if !self.setup.rank0 {
            return Ok(());
        }
        // The epoch's wall-clock time: from the record before (so the previous epoch's checkpoint, written after
        // its record, is counted here) to this one, training and evaluation included. Their sum is the run's time
        // but the set-up and the last checkpoint.
        record.seconds = Some(self.last_record.elapsed().as_secs_f64());
        self.last_record = Instant::now();
        if let Some(f) = &mut self.metrics {
            append_record(f, &record)?;
        }
        if let Some(tb) = &mut self.tensorboard {
            // All at the epoch's last optimizer step: one step axis, which a resume's purge step cuts alike.
            let step = ((record.epoch as usize + 1) * self.per_epoch) as i64;
            tb.scalar("train/images_per_sec", step, stats.images_per_sec)?;
            tb.scalar("train/data_wait", step, stats.data_wait_per_step)?;
            if let Some(gbs) = record.disk_read_gbs.or(record.process_read_gbs) {
                tb.scalar("io/read_gbps", step, gbs)?;
            }
            for (tag, value) in [
                ("val/acc1", record.acc1),
                ("val/acc5", record.acc5),
                ("val/loss", record.val_loss),
            ] {
                if let Some(a) = value {
                    tb.scalar(tag, step, a)?;
                }
            }
            tb.flush()?;
        }
        // An epoch --eval-every skips has no evaluation (val_images absent).
        let acc = match record.val_images {
            Some(_) => format!(
                "Acc@1 {:.3}  Acc@5 {:.3}  val loss {:.4}",
                record.acc1.unwrap_or(f64::NAN),
                record.acc5.unwrap_or(f64::NAN),
                record.val_loss.unwrap_or(f64::NAN)
            ),
            None => "not evaluated".into(),
        };
        tracing::info!(
            "epoch {}: loss {:.4}  train Acc@1 {:.3}  {acc}  {:.1} img/s  data wait {:.0}%  ({:.0} s)",
            record.epoch,
            stats.train_loss,
            stats.train_acc1,
            stats.images_per_sec,
            100.0 * stats.data_wait_share,
            record.seconds.unwrap_or_default()
        );
        let bad_images = record.bad_images.unwrap_or(0);
        if bad_images > 0 {
            tracing::warn!(
                "epoch {}: skipped {bad_images} unreadable training images (they could not be read or decoded)",
                record.epoch
            );
        }
        let skipped = record.skipped_batches.unwrap_or(0);
        if skipped > 0 {
            tracing::warn!(
                "epoch {}: did not train on {skipped} batches (no readable image, or one value per channel for \
                 batch norm)",
                record.epoch
            );
        }
        let val_bad = record.val_bad_images.unwrap_or(0);
        if val_bad > 0 {
            tracing::warn!(
                "epoch {}: evaluated without {val_bad} unreadable validation images (accuracy is over the {} read)",
                record.epoch,
                record.val_images.unwrap_or(0)
            );
        }
        self.epochs.push(record);
        self.summary.fill_from_metrics(&self.epochs);
        self.summary.fill_target(&self.epochs, self.setup.target);
        rn50_report::write_summary(&self.setup.args.out, &self.summary)?;
        rn50_report::write_run_report(&self.setup.args.out)?;
        Ok(())
    }

    /// Leaves the process group (rank 0, which serves the rendezvous store, last); when every epoch is done,
    /// rank 0 saves final.safetensors and prints the summary.
    fn finish(mut self, outcome: Outcome) -> Result<Outcome> {
        drop(self.setup.step.grad_sync.take());
        crate::model::sync_bn::disable();
        let mut setup = self.setup;
        setup.dist.finish()?;
        if let (Some(log), false) = (&mut setup.mllog, self.target_reached) {
            // MLPerf's status of a run that ended without reaching its quality target: every epoch trained, or
            // stopped by a signal (a resumed run writes no log, so this attempt's log ends here).
            log.end("run_stop", json!({"status": "aborted"}))?;
        }
        if setup.rank0 && outcome == Outcome::Done {
            let out = &setup.args.out;
            weights::save(
                &setup.step.model,
                &out.join("final.safetensors"),
                &setup.recorded,
            )?;
            if out.join("metrics.jsonl").exists() {
                eprint!("{}", rn50_report::summary_text(out)?);
            }
            if let Some(target) = setup.target {
                let s = &self.summary;
                match (s.target_epochs, s.time_to_target_s) {
                    (Some(epochs), Some(secs)) => tracing::info!(
                        "target Acc@1 {target} reached after {epochs} epochs: time to target {secs:.0} s"
                    ),
                    _ => tracing::info!(
                        "target Acc@1 {target} not reached in {} epochs (best Acc@1 {:.3})",
                        s.epochs,
                        s.best_acc1.unwrap_or(f64::NAN)
                    ),
                }
            }
            tracing::info!(
                "done in {:.0} s; weights in {}",
                self.run_start.elapsed().as_secs_f64(),
                out.display()
            );
        }
        Ok(outcome)
    }
}
