//! `rn50 train`: the ImageNet recipe in one place, like pytorch/examples' main.py: data, model, step,
//! schedule, per-epoch evaluation, checkpoints that survive preemption, metrics and a summary.
//!
//! [`run`] is the recipe as a list of steps; `RunState` is the run's state, which it shares with `-e` (device,
//! ranks, data, model, EMA, resumed weights, schedule, position), `Trainer` adds what training needs (signals,
//! checkpoints, epochs) and its observers: the run directory's logs ([`crate::train::runlog`]) and MLPerf's
//! ([`crate::train::mllog`]).
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rn50_distributed::{DistContext, WorldInfo};
use rn50_pipeline::sampler::rng_for;
use rn50_pipeline::Epoch;
use tch::{Kind, Tensor};

use crate::device::{device_name, Compute, DeviceSettings};
use crate::input::{self, BatchSource, DeviceBatch};
use crate::model::weights::{self, Recorded};
use crate::model::{Model, ResNetConfig, Stem};
use crate::step::graph::{self, LoopNeeds, WARMUP_STEPS};
use crate::step::mix::BatchMix;
use crate::step::{Skipped, StepConfig, TrainStep};
use crate::train::args::{Augment, TrainArgs};
use crate::train::checkpoint::{self, EpochSoFar, Position};
use crate::train::data::{self, RealData};
use crate::train::ema::{self, Ema, EmaModel};
use crate::train::eval::{self, EvalResult, Evaluated};
use crate::train::keeper::{resolve_resume, Keeper};
use crate::train::metrics::correct_top1;
use crate::train::mllog::{self, MlperfRun, RunShape};
use crate::train::progress::{EpochProgress, EvalProgress, Later, Logged};
use crate::train::rundir::RunDir;
use crate::train::runlog::{self, EpochStats, RunInfo, RunLog};
use crate::train::schedule::{LrSchedule, Resolution};

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
    let state = RunState::new(args)?;
    if args.evaluate {
        state.evaluate_only()?;
        return Ok(Outcome::Done);
    }
    let mut t = Trainer::new(state)?;
    for epoch in t.first_epoch..args.epochs {
        // This epoch's batches were queued before; its evaluation and the next epoch's batches queue behind them.
        let passes = t.queue(epoch)?;
        t.state.mlperf.epoch_start(args, epoch)?;
        let stats = match t.train_one_epoch(epoch, passes.train)? {
            Trained::Epoch(stats) => *stats,
            Trained::Stopped(at) => {
                t.save_on_signal(&at)?;
                return t.finish(Outcome::Preempted);
            }
        };
        t.state.mlperf.trained(epoch, args.evaluates(epoch))?;
        // The epochs of --eval-every/--eval-offset, and the last; none other.
        let eval = match args.evaluates(epoch) {
            true => Some(t.evaluate_epoch(epoch, passes.val, passes.ema_val)?),
            false => None,
        };
        // Logged before the checkpoint: a rank 0 killed between the two resumes from the epoch before, which
        // drops the record and logs it again. In the other order the kill lost the epoch's record for good.
        if let Some(log) = &mut t.log {
            log.epoch(epoch, &stats, eval.as_ref(), t.state.target)?;
        }
        t.save_checkpoint(epoch, eval.as_ref())?;
        if t.target_reached {
            break;
        }
    }
    t.finish(Outcome::Done)
}

/// The run's state, which training and `-e` share: this process's device and rank, the run directory's claim,
/// the data, the model with its training step and EMA, resumed from the checkpoint when there is one, the LR
/// schedule, and the position training goes on from.
struct RunState<'a> {
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
    dummy: Option<BatchSource>,
    step: TrainStep,
    /// --cuda-graph, where it applies: each step through [`TrainStep::train_step_graphed`].
    cuda_graph: bool,
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
    /// --mllog's log of the run (rank 0 of a training run that does not resume).
    mlperf: MlperfRun,
    /// How long TensorBoard's events may wait in the buffer ([`runlog::tensorboard_flush_every`]).
    tensorboard_flush: Duration,
}

impl<'a> RunState<'a> {
    fn new(args: &'a TrainArgs) -> Result<Self> {
        crate::train::check(args)?;
        let tensorboard_flush = runlog::tensorboard_flush_every()?;
        // torchrun / SLURM / Open MPI / PBS / `rn50 launch` tell each process its rank; one device per process.
        let world_info = WorldInfo::from_env()?;
        // Before any data is read, as MLPerf's scripts do before each run: every process checks that it may, the
        // first of each node drops its node's cache. The others wait for it at the process group's rendezvous.
        let caches_dropped = match args.mlperf.drop_caches {
            true => data::drop_caches(world_info.local_rank == 0)?,
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
        let settings = crate::device::setup(
            device,
            DeviceSettings::for_device(device, &compute).for_arch(args.arch),
        )?;
        if let Some(paths) = settings.gpu_paths(args.arch) {
            tracing::info!("{}: {paths}", device_name(device));
        }
        // The CPUs this process may use, split between the ranks of this node (as bench does).
        let per_rank = world_info.threads_per_rank();
        if args.compute.threads.is_none()
            && world_info.local_world_size > 1
            && std::env::var_os("OMP_NUM_THREADS").is_none()
        {
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
        // What -e evaluates, for its start line.
        let weights_from = match (&resume, &args.init_weights) {
            (Some(r), _) => format!("the checkpoint {}", r.path.display()),
            (None, Some(w)) => format!("--init-weights {}", w.display()),
            (None, None) => "freshly initialised weights (no --resume)".into(),
        };
        // MLPerf's init interval starts here, once this process knows it is rank 0; it ends at run_start. The log
        // is opened when the run starts writing, and init_start is given this time.
        let mlperf = MlperfRun::new(
            args,
            rank0 && !args.evaluate,
            resume.is_some(),
            caches_dropped,
        )?;
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
            optimizer: args.optimizer_config(),
        };
        // The random draws come in this order (weights, dummy batch, EMA model's initial weights, overwritten),
        // so that a --dummy batch is the same with and without --ema.
        let mut step = TrainStep::new(Model::new(model_cfg.clone(), device), step_cfg);
        if let Some(w) = &args.init_weights {
            weights::init_weights(
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
            .then(|| BatchSource::device(args.batch_size, args.image_size, device));
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
        let schedule = LrSchedule::of_args(args, peak_lr)?;
        let resolution = Resolution::of_args(args)?;
        let (resize, crop) = super::data::val_sizes(args);
        if rank0 {
            let on = format!(
                "{} on {} ({}{}{})",
                args.arch,
                device_name(device),
                compute.precision,
                if compute.channels_last {
                    ", channels_last"
                } else {
                    ""
                },
                match device {
                    tch::Device::Cpu => format!(", {} threads", tch::get_num_threads()),
                    _ => String::new(),
                },
            );
            match args.evaluate {
                true => tracing::info!(
                    "rn50 train -e: evaluating {on} from {weights_from}{}, batch {} x {world} procs, resize \
                     {resize} then center crop {crop}",
                    if ema.is_some() { " and its EMA" } else { "" },
                    args.batch_size,
                ),
                false => tracing::info!(
                    "rn50 train: {on}, global batch {global_batch} ({} x {} accum x {world} procs), \
                     {}, {lr_line}; {schedule}; {}",
                    args.batch_size,
                    args.accum_steps,
                    crate::step::describe_optimizer(&step.opt.config),
                    match data {
                        Some(_) => args.val_sizes_line(),
                        None => "no evaluation (--dummy)".into(),
                    }
                ),
            }
        }
        let cuda_graph = args.cuda_graph && !args.evaluate && {
            let needs = LoopNeeds {
                micro_batches: args.accum_steps,
                momentum_schedule: schedule.momentum_at(0.0).is_some(),
                mixes: args.mixup_alpha > 0.0 || args.cutmix_alpha > 0.0,
                erases: args.augmentation.random_erase > 0.0,
            };
            match graph::declined(&step, needs) {
                None => true,
                Some(why) => {
                    if rank0 {
                        tracing::warn!("--cuda-graph: the steps run eager: {why}");
                    }
                    false
                }
            }
        };
        if cuda_graph && rank0 {
            tracing::info!(
                "--cuda-graph: the first {WARMUP_STEPS} steps of each batch shape run eager, then the step is \
                 captured as one CUDA graph and replayed"
            );
        }
        let recorded = Recorded::of_run(
            &model_cfg,
            class_names(data.as_ref()),
            args.image_size,
            crate::infer::imagenet_transform(resize, crop),
        );
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
            cuda_graph,
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
            mlperf,
            tensorboard_flush,
        })
    }

    /// Top-1/top-5 of `model` over `pass`, one pass of the validation set queued beforehand, all ranks together,
    /// its progress shown as `label` on rank 0; NaN without a dataset.
    fn evaluate(&self, model: &Model, pass: Option<Epoch>, label: String) -> Result<EvalResult> {
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
        eval::evaluate(model, pass, precision, channels_last, progress)?.all_ranks(&self.dist)
    }

    /// `-e`: evaluate the resumed (or fresh) weights once, and their EMA with --ema, and print the accuracy.
    fn evaluate_only(&self) -> Result<()> {
        let Some(d) = &self.data else {
            bail!("-e needs a dataset, not --dummy")
        };
        let r = self.evaluate(&self.step.model, Some(d.val.epoch(0, 0)), "val".into())?;
        if self.rank0 {
            println!(
                "Acc@1 {:.3} Acc@5 {:.3} ({} images)",
                r.acc1, r.acc5, r.images
            );
        }
        if let Some(e) = &self.ema {
            let r = self.evaluate(e.model(), Some(d.val.epoch(0, 0)), "val EMA".into())?;
            if self.rank0 {
                println!(
                    "EMA Acc@1 {:.3} Acc@5 {:.3} ({} images)",
                    r.acc1, r.acc5, r.images
                );
            }
        }
        Ok(())
    }
}

/// The class folder names in label order that best/final.safetensors record (none with --dummy).
fn class_names(data: Option<&RealData>) -> Option<&[String]> {
    data.map(|d| d.classes.as_slice())
}

/// Training: `RunState` with the stop signal, rank 0's logs and checkpoints, and the epochs' layout.
struct Trainer<'a> {
    state: RunState<'a>,
    /// Set by SIGINT/SIGTERM/SIGUSR1 ([`rn50_util::stop`]).
    stop: Arc<AtomicBool>,
    /// Rank 0: the run directory's logs (metrics.jsonl, steps.jsonl, TensorBoard, the summary).
    log: Option<RunLog>,
    keeper: Keeper,
    /// Optimizer steps per epoch.
    per_epoch: usize,
    /// The epoch training starts at (0, or the resumed one), and its first step to train in optimizer steps of
    /// this run's layout.
    first_epoch: usize,
    resume_step: usize,
    /// The next epoch's training batches, queued ahead (see `Trainer::queue`).
    next_train: Option<Epoch>,
    /// Set when an evaluation reached --target-accuracy: training stops after that epoch.
    target_reached: bool,
    /// What the epoch in training gave before this process's first step of it: a resumed epoch's sums from its
    /// checkpoint, zeros otherwise.
    carried: EpochSoFar,
    /// How long the last evaluation took (the trained weights' and their EMA's), for the run's ETA.
    eval_secs: Option<f64>,
}

/// One step's batches as this rank got them: `None` for one batch norm cannot train on.
struct Fetched {
    batches: Vec<Option<DeviceBatch>>,
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
    /// Rank 0's checkpoint timer (--checkpoint-minutes) is due: a checkpoint after this step.
    checkpoint: bool,
    /// Unreadable images of the step's batches, all ranks.
    bad_images: u64,
    /// Per micro-batch: every rank can train on it.
    train: Vec<bool>,
}

/// An epoch's sums as this process trains it: the counts go on from what the epoch carried; this rank's losses
/// and top-1 hits are its own (on the device, no host sync per step) until a checkpoint or the epoch's end sums
/// them over ranks ([`Trainer::so_far`]).
struct EpochRun {
    /// All ranks' counts (agreed each step).
    bad_images: u64,
    skipped_batches: u64,
    /// This rank's loss of every step trained, summed on the device in f64; rank 0's starts from the carried sum
    /// times the ranks (so the sum over ranks, divided by them, goes on from it: on one process in the straight
    /// run's order, so a resumed epoch's loss is its bits). And the steps trained, the same on every rank.
    loss_sum: Tensor,
    loss_steps: u64,
    /// This rank's top-1 hits since this process began the epoch, on the device.
    correct1: Tensor,
}

/// One epoch's passes over the data, queued on the loader threads.
struct Passes {
    train: Option<Epoch>,
    val: Option<Epoch>,
    /// With --ema: the average's evaluation, after the trained weights'.
    ema_val: Option<Epoch>,
}

/// How `Trainer::train_one_epoch` ended.
enum Trained {
    Epoch(Box<EpochStats>),
    /// A stop signal came: the position of the first step not trained.
    Stopped(Position),
}

impl<'a> Trainer<'a> {
    fn new(mut state: RunState<'a>) -> Result<Self> {
        let args = state.args;
        let (rank0, world) = (state.rank0, state.world);
        // SLURM sends SIGTERM (or --signal=USR1) before preemption, a user Ctrl-C: checkpoint, then exit
        // EXIT_PREEMPTED (a second Ctrl-C stops at once).
        let stop = rn50_util::stop::install("saving a checkpoint after this step")?;
        // Every check of the start comes before anything is written: a start that fails leaves the run
        // directory as it was, so the corrected command is not refused as a second run.
        let micro_per_epoch = match &mut state.data {
            Some(d) => d.batches_per_epoch(args)?,
            None => args.steps_per_epoch.unwrap_or(100) * args.accum_steps,
        };
        if micro_per_epoch == 0 {
            let images = state.data.as_ref().map_or(0, |d| d.train_images);
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
        if let (Some(decay), true) = (args.ema, rank0) {
            ema::warn_if_longer_than(decay, args.ema_steps, args.epochs * per_epoch);
        }
        let keeper = Keeper::new(&args.out, args.keep_checkpoints, args.checkpoint_minutes)?;
        let log = match state.run_dir.take() {
            Some(dir) => Some(RunLog::start(
                dir,
                RunInfo {
                    args,
                    compute: &state.compute,
                    world,
                    global_batch: state.global_batch,
                    peak_lr: state.peak_lr,
                    per_epoch,
                    full_per_epoch: (state.data.is_some())
                        .then_some(micro_per_epoch / args.accum_steps),
                    val_images: state
                        .data
                        .as_ref()
                        .map(|d| (d.val_images, d.val_images_total)),
                    position: &state.position,
                    tensorboard_flush: state.tensorboard_flush,
                    appends: state.mlperf.path(),
                    reads_data: state.data.is_some(),
                },
            )?),
            None => None,
        };
        if rank0 {
            keeper.clear_stale();
        }
        let position = &state.position;
        let resume_batch = position.start_batch(args.batch_size, world);
        if rank0 && resume_batch != position.batch_in_epoch as usize {
            tracing::info!(
                "checkpoint written by {} processes x batch {}: resuming epoch {} at batch {resume_batch} of this layout",
                position.world_size, position.batch_size, position.epoch
            );
        }
        let first_epoch = position.epoch as usize;
        // A checkpoint from the start of an epoch has nothing to carry (nor one written for another layout that
        // maps to its start).
        let carried = match resume_batch {
            0 => EpochSoFar::default(),
            _ => position.so_far,
        };
        let mut t = Trainer {
            state,
            stop,
            log,
            keeper,
            per_epoch,
            first_epoch,
            resume_step: resume_batch / args.accum_steps,
            next_train: None,
            target_reached: false,
            carried,
            eval_secs: None,
        };
        if t.first_epoch < args.epochs {
            t.next_train = t.queue_train(t.first_epoch)?;
        }
        let shape = RunShape {
            schedule: &t.state.schedule,
            global_batch: t.state.global_batch,
            world,
            per_epoch,
            samples: t
                .state
                .data
                .as_ref()
                .map(|d| (d.train_images, d.val_images)),
            first_epoch,
        };
        t.state.mlperf.start(args, &shape)?;
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

    /// The position after `s` optimizer steps of `epoch`, with what the epoch gave before it (`so_far`: none at
    /// an epoch's start).
    fn position_at(&self, epoch: usize, s: usize, so_far: EpochSoFar) -> Position {
        Position {
            epoch: epoch as u64,
            batch_in_epoch: (s * self.state.args.accum_steps) as u64,
            global_step: (epoch * self.per_epoch + s) as u64,
            best_acc1: self.state.position.best_acc1,
            best_ema_acc1: self.state.position.best_ema_acc1,
            world_size: self.state.world as u64,
            batch_size: self.state.args.batch_size as u64,
            so_far: if s > 0 { so_far } else { EpochSoFar::default() },
            redone_seconds: self.log.as_ref().map_or(0.0, |l| l.redone_seconds()),
        }
    }

    /// What `epoch` gave up to now: `run`'s sums, and the carried images, top-1 hits and times with this
    /// process's (`prog`): its images and hits summed over ranks (a collective: every rank calls it at the same
    /// step), its times rank 0's.
    fn so_far(&self, epoch: usize, run: &EpochRun, prog: &EpochProgress) -> Result<EpochSoFar> {
        let mut sums = [
            i64::try_from(&run.correct1)? as f64,
            prog.images as f64,
            f64::try_from(&run.loss_sum)?,
        ];
        self.state
            .dist
            .sum_f64(&mut sums, "summing the epoch's images, top-1 and loss")?;
        let carried = self.carried_into(epoch);
        let here = self.log.as_ref().map_or(0.0, |l| l.epoch_seconds_here());
        Ok(EpochSoFar {
            bad_images: run.bad_images,
            skipped_batches: run.skipped_batches,
            images: carried.images + sums[1] as u64,
            correct1: carried.correct1 + sums[0] as u64,
            loss_sum: sums[2] / self.state.world as f64,
            loss_steps: run.loss_steps,
            train_seconds: carried.train_seconds + prog.elapsed(),
            data_wait_seconds: carried.data_wait_seconds + prog.data_wait.as_secs_f64(),
            seconds: carried.seconds + here,
        })
    }

    /// The sums `epoch` carries from a checkpoint: the resumed epoch's, none for the others.
    fn carried_into(&self, epoch: usize) -> EpochSoFar {
        match epoch == self.first_epoch {
            true => self.carried,
            false => EpochSoFar::default(),
        }
    }

    /// Queues the training batches of `epoch` that are still to train (none without a dataset).
    fn queue_train(&mut self, epoch: usize) -> Result<Option<Epoch>> {
        let (args, res) = (self.state.args, self.state.resolution.at(epoch));
        let batches = self.first_step(epoch) * args.accum_steps..self.per_epoch * args.accum_steps;
        match &mut self.state.data {
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
        let val_pass = || match (&self.state.data, self.state.args.evaluates(epoch)) {
            (Some(d), true) => Some(d.val.epoch(0, 0)),
            _ => None,
        };
        let val = val_pass();
        let ema_val = self.state.ema.as_ref().and_then(|_| val_pass());
        if epoch + 1 < self.state.args.epochs {
            self.next_train = self.queue_train(epoch + 1)?;
        }
        Ok(Passes {
            train,
            val,
            ema_val,
        })
    }

    /// Evaluates the trained weights after `epoch` over `val`, and with --ema their average over `ema_val` (see
    /// `RunState::evaluate`), as timm does; with a target (--target-accuracy, or MLPerf's with --mllog), a top-1
    /// of either that reaches it sets `target_reached`.
    fn evaluate_epoch(
        &mut self,
        epoch: usize,
        val: Option<Epoch>,
        ema_val: Option<Epoch>,
    ) -> Result<Evaluated> {
        let started = std::time::Instant::now();
        let state = &self.state;
        let model = state.evaluate(&state.step.model, val, format!("val epoch {epoch}"))?;
        let ema = match &state.ema {
            Some(e) => {
                Some(state.evaluate(e.model(), ema_val, format!("val EMA epoch {epoch}"))?)
            }
            None => None,
        };
        let eval = Evaluated { model, ema };
        self.eval_secs = Some(started.elapsed().as_secs_f64());
        // Every rank has the same accuracy (summed over ranks), so they all stop after the same epoch.
        let acc1 = eval.best_acc1();
        self.target_reached = self.state.target.is_some_and(|t| acc1 >= t);
        self.state
            .mlperf
            .evaluated(epoch, acc1, self.target_reached)?;
        Ok(eval)
    }

    /// Trains epoch `epoch` from its first step still to train, on `batches` (the dummy batch without a
    /// dataset), until its last step or a stop signal. A resumed epoch's record adds this process's steps to the
    /// sums its checkpoint carried, so it is the straight run's.
    fn train_one_epoch(&mut self, epoch: usize, mut batches: Option<Epoch>) -> Result<Trained> {
        let io_start = self.log.as_ref().and_then(|l| l.io_snapshot());
        let (start, per_epoch) = (self.first_step(epoch), self.per_epoch);
        let args = self.state.args;
        let later = Later {
            epochs: args.epochs - epoch - 1,
            evaluations: (epoch..args.epochs).filter(|&e| args.evaluates(e)).count(),
            eval_secs: self.eval_secs,
        };
        let carried = self.carried_into(epoch);
        let mut prog = EpochProgress::new(
            epoch,
            start,
            per_epoch,
            self.state.world,
            self.state.rank0,
            later,
            &carried,
        );
        let mut run = EpochRun {
            bad_images: carried.bad_images,
            skipped_batches: carried.skipped_batches,
            loss_sum: Tensor::full(
                [],
                match self.state.rank0 {
                    true => carried.loss_sum * self.state.world as f64,
                    false => 0.0,
                },
                (Kind::Double, self.state.device),
            ),
            loss_steps: carried.loss_steps,
            correct1: Tensor::zeros([], (Kind::Int64, self.state.device)),
        };
        let mut lr = 0.0;
        for s in start..per_epoch {
            // The step's batches, then one agreement of all ranks: a stop signal (which may reach only some),
            // rank 0's checkpoint timer, and the batches every rank can train on.
            let fetched = self.fetch_step(batches.as_mut(), &mut prog)?;
            let agreed = self.agree(&fetched)?;
            if agreed.stop {
                let so_far = self.so_far(epoch, &run, &prog)?;
                prog.finish();
                return Ok(Trained::Stopped(self.position_at(epoch, s, so_far)));
            }
            // Counted once the step is taken (a stopped one is fetched again on resume).
            run.bad_images += agreed.bad_images;
            let t = epoch as f64 + (s + 1) as f64 / per_epoch as f64;
            lr = self.state.schedule.at(t);
            let trained: Vec<DeviceBatch> = fetched
                .batches
                .into_iter()
                .zip(&agreed.train)
                .filter_map(|(b, &train)| b.filter(|_| train))
                .collect();
            run.skipped_batches += (agreed.train.len() - trained.len()) as u64;
            let logged = if trained.is_empty() {
                // No batch to train on anywhere: no step (never one on an empty batch), as for a skipped fp16 step.
                None
            } else {
                let (stepped, skipped) = self.train_step(trained, epoch, s, t, lr, &mut prog)?;
                let _ = run.correct1.g_add_(&stepped.correct1);
                // The f32 loss added into the f64 sum by one kernel (an in-place add keeps the sum's type).
                let _ = run.loss_sum.g_add_(&stepped.loss);
                run.loss_steps += 1;
                if let Some(l) = &mut self.log {
                    l.taken();
                }
                // torchvision's --model-ema-steps: on the epoch's steps 0, N, 2N, ...
                if let Some(e) = &mut self.state.ema {
                    if s.is_multiple_of(args.ema_steps) {
                        e.ema.update();
                    }
                }
                let due = (s + 1).is_multiple_of(args.print_freq) || s + 1 == per_epoch;
                if due {
                    Some(self.log_step(epoch, s, &stepped, &skipped, lr)?)
                } else {
                    if s == start {
                        // This process's first step of the epoch is read for the progress only (not logged, nor
                        // in the bar's means, which a straight run does not read there): the bar shows numbers
                        // from the first step on, not NaN until the first --print-freq step.
                        prog.first(self.read_step(&stepped)?);
                    }
                    None
                }
            };
            prog.step(s, start, logged, lr);
            if agreed.checkpoint && s + 1 < per_epoch {
                let so_far = self.so_far(epoch, &run, &prog)?;
                if self.state.rank0 {
                    let at = self.position_at(epoch, s + 1, so_far);
                    self.checkpoint(&at)?;
                }
            }
        }
        prog.finish();
        let all = self.so_far(epoch, &run, &prog)?;
        // Every rank agreed on each batch, so all stop here alike. An epoch with nothing trained would report an
        // untrained network's accuracy as its result (and loss 0, train Acc@1 NaN).
        let batches = (per_epoch * args.accum_steps) as u64;
        if all.skipped_batches >= batches {
            bail!(
                "epoch {epoch}: no batch could be trained on (all {batches} skipped: {} images could not be \
                 read{}, and batch norm needs more than one value per channel): nothing was learnt; check the data",
                all.bad_images,
                match args.augment {
                    Augment::Cifar => " or were smaller than --augment cifar's crop less its padding",
                    _ => "",
                }
            );
        }
        let train_secs = all.train_seconds.max(1e-9);
        Ok(Trained::Epoch(Box::new(EpochStats {
            io_start,
            // main.py's meters at the epoch's end: the mean loss of every step, the hits over the images trained.
            train_loss: all.loss_sum / all.loss_steps.max(1) as f64,
            train_acc1: 100.0 * all.correct1 as f64 / all.images as f64,
            lr,
            images_per_sec: all.images as f64 / train_secs,
            train_seconds: all.train_seconds,
            data_wait_share: all.data_wait_seconds / train_secs,
            data_wait_per_step: all.data_wait_seconds / per_epoch as f64,
            resolution: self.state.resolution.at(epoch),
            bad_images: all.bad_images,
            skipped_batches: all.skipped_batches,
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
        let (accum, device) = (self.state.args.accum_steps, self.state.device);
        let mut fetched = Fetched {
            batches: Vec::with_capacity(accum),
            bad_images: 0,
        };
        for _ in 0..accum {
            let Some(it) = batches.as_deref_mut() else {
                let dummy = self
                    .state
                    .dummy
                    .as_mut()
                    .expect("dummy batch without a dataset");
                fetched.batches.push(Some(dummy.next(device)?));
                continue;
            };
            let (b, wait) = input::next_batch(it)
                .context("the loader ended before the epoch's last step")??;
            prog.data_wait += wait;
            fetched.bad_images += b.skipped() as u64;
            let net = &self.state.step.model.net.config;
            let (h, w) = (net.last_stage_side(b.h()), net.last_stage_side(b.w()));
            let trainable = b.n() * h * w > 1;
            fetched.batches.push(match trainable {
                true => Some(DeviceBatch::new(b, device)?),
                false => None,
            });
        }
        Ok(fetched)
    }

    /// What every rank must do alike this step, agreed in one collective: stop (a signal may reach only some
    /// ranks), and train on each micro-batch only where every rank can (DDP's backward is collective); with the
    /// unreadable images of all ranks.
    fn agree(&self, here: &Fetched) -> Result<Agreed> {
        let due = self.state.rank0 && self.keeper.due();
        let mut v = vec![
            f64::from(u8::from(self.stop.load(Ordering::Relaxed))),
            f64::from(u8::from(due)),
            here.bad_images as f64,
        ];
        v.extend(
            here.batches
                .iter()
                .map(|b| f64::from(u8::from(b.is_none()))),
        );
        self.state
            .dist
            .sum_in_step(&mut v, "the stop signal and the step's batches")?;
        Ok(Agreed {
            stop: v[0] > 0.0,
            checkpoint: v[1] > 0.0,
            bad_images: v[2] as u64,
            train: v[3..]
                .iter()
                .map(|&untrainable| untrainable == 0.0)
                .collect(),
        })
    }

    /// Step `s` of `epoch` (at `t` epochs, rate `lr`) on its micro-batches: forward and backward over each, then the
    /// update; with --cuda-graph, the step as one CUDA graph where it fits the batch.
    fn train_step(
        &mut self,
        mut batches: Vec<DeviceBatch>,
        epoch: usize,
        s: usize,
        t: f64,
        lr: f64,
        prog: &mut EpochProgress,
    ) -> Result<(Stepped, Skipped)> {
        if self.state.cuda_graph {
            // One micro-batch: --cuda-graph is declined with --accum-steps above 1.
            let batch = batches.pop().context("a step without a batch")?;
            let full = self.state.args.batch_size as i64;
            let out = self
                .state
                .step
                .train_step_graphed(&batch.images, &batch.labels, lr, full)?;
            let images = batch.labels.size()[0] as usize;
            prog.images += images;
            let stepped = Stepped {
                loss: out.outcome.loss,
                correct1: out.correct1,
                images,
            };
            return Ok((stepped, out.outcome.skipped));
        }
        self.state.step.opt.zero_grad();
        let stepped = self.forward_backward(batches, epoch, s, prog)?;
        let step = &mut self.state.step;
        // One cycle moves the momentum with the rate; other schedules keep --momentum.
        let momentum = self.state.schedule.momentum_at(t);
        let momentum = momentum.unwrap_or(step.opt.config.momentum);
        let skipped = step.apply(lr, momentum)?;
        Ok((stepped, skipped))
    }

    /// Forward and backward over the step's micro-batches (step `s` of `epoch`): their mean loss and top-1 hits
    /// (on the device). Each is normalised, its random-erasing boxes zeroed, and mixed (--mixup-alpha,
    /// --cutmix-alpha) with draws that depend on (seed, epoch, step, micro-batch, rank) only, so a resumed run mixes
    /// as an uninterrupted one.
    fn forward_backward(
        &mut self,
        batches: Vec<DeviceBatch>,
        epoch: usize,
        s: usize,
        prog: &mut EpochProgress,
    ) -> Result<Stepped> {
        let n = batches.len();
        let device = self.state.device;
        let mut out = Stepped {
            loss: Tensor::zeros([], (Kind::Float, device)),
            correct1: Tensor::zeros([], (Kind::Int64, device)),
            images: 0,
        };
        let (world, rank) = (self.state.world, self.state.dist.rank());
        for (micro, batch) in batches.into_iter().enumerate() {
            let mut rng = self.state.mix.as_ref().map(|m| {
                let key = ((s * n + micro) * world + rank) as u64;
                (
                    m,
                    rng_for(self.state.args.seed, epoch as u64, key, b"batchmix"),
                )
            });
            let step = &mut self.state.step;
            let (x, targets) = step.prepare(&batch, rng.as_mut().map(|(m, r)| (*m, r)));
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
        let Logged { loss, acc1 } = self.read_step(stepped)?;
        if !loss.is_finite() && !skipped.get()? {
            bail!("the loss became {loss} at epoch {epoch} step {s}: stopping (the last checkpoint is kept)");
        }
        if let Some(l) = &mut self.log {
            l.step(epoch, s, loss, acc1, lr)?;
        }
        Ok(Logged { loss, acc1 })
    }

    /// A step's loss (the mean over ranks) and top-1 (over all ranks' images), read from the device: a
    /// collective, which every rank calls at the same step.
    fn read_step(&self, stepped: &Stepped) -> Result<Logged> {
        let mut v = [
            f64::try_from(&stepped.loss)? / self.state.world as f64,
            i64::try_from(&stepped.correct1)? as f64,
            stepped.images as f64,
        ];
        self.state
            .dist
            .sum_f64(&mut v, "averaging the loss and top-1")?;
        Ok(Logged {
            loss: v[0],
            acc1: 100.0 * v[1] / v[2].max(1.0),
        })
    }

    /// Rank 0 saves the checkpoint of `at`: from here on the run is one, whose files stay whatever happens next
    /// (its start's undo list is dropped; it took a run whose only checkpoints were end-of-epoch ones for a failed
    /// start, and removed its logs at exit).
    fn checkpoint(&mut self, at: &Position) -> Result<PathBuf> {
        let ema = self.state.ema.as_ref().map(|e| &e.ema);
        let path = self.keeper.save(
            &self.state.step,
            ema,
            at,
            &self.state.config,
            &self.state.recorded,
        )?;
        if let Some(l) = &mut self.log {
            l.taken();
        }
        Ok(path)
    }

    /// After a stop signal: rank 0 saves a checkpoint at `at` to resume from.
    fn save_on_signal(&mut self, at: &Position) -> Result<()> {
        if !self.state.rank0 {
            return Ok(());
        }
        let path = self.checkpoint(at)?;
        tracing::warn!(
            "signal received: checkpoint saved to {} (resume with --resume {})",
            path.display(),
            self.state.args.out.display()
        );
        Ok(())
    }

    /// The end of `epoch`: the position moves to the next epoch, with the best top-1 so far of the trained
    /// weights and of their EMA; rank 0 saves the checkpoint, then best.safetensors (the trained weights) and
    /// best_ema.safetensors (the EMA) when they scored best (only an evaluated epoch can).
    fn save_checkpoint(&mut self, epoch: usize, eval: Option<&Evaluated>) -> Result<()> {
        // A new best of `acc1` (NaN without a dataset never is one) is kept in `best`.
        let improves = |acc1: Option<f64>, best: &mut f64| match acc1 {
            Some(a) if !a.is_nan() && a >= *best => {
                *best = a;
                true
            }
            _ => false,
        };
        let position = &mut self.state.position;
        let is_best = improves(eval.map(|e| e.model.acc1), &mut position.best_acc1);
        let ema_acc1 = eval.and_then(|e| e.ema.as_ref()).map(|e| e.acc1);
        let is_best_ema = improves(ema_acc1, &mut position.best_ema_acc1);
        self.state.position = self.position_at(epoch + 1, 0, EpochSoFar::default());
        if !self.state.rank0 {
            return Ok(());
        }
        let at = self.state.position.clone();
        self.checkpoint(&at)?;
        let out = &self.state.args.out;
        if is_best {
            let path = out.join("best.safetensors");
            weights::save(&self.state.step.model, &path, &self.state.recorded)?;
        }
        if let (true, Some(e)) = (is_best_ema, &self.state.ema) {
            let path = out.join("best_ema.safetensors");
            weights::save(e.model(), &path, &self.state.recorded)?;
        }
        Ok(())
    }

    /// Leaves the process group (rank 0, which serves the rendezvous store, last); when every epoch is done,
    /// rank 0 saves final.safetensors and prints the summary.
    fn finish(mut self, outcome: Outcome) -> Result<Outcome> {
        drop(self.state.step.grad_sync.take());
        crate::model::sync_bn::disable();
        let mut state = self.state;
        state.dist.finish()?;
        state.mlperf.finish(self.target_reached)?;
        if state.rank0 && outcome == Outcome::Done {
            let out = &state.args.out;
            weights::save(
                &state.step.model,
                &out.join("final.safetensors"),
                &state.recorded,
            )?;
        }
        if let (Some(log), Outcome::Done) = (&self.log, outcome) {
            log.finish(state.target)?;
        }
        Ok(outcome)
    }
}
