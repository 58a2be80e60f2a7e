//! Flags of pytorch/examples' imagenet/main.py and timm's train.py that rn50 spells another way or does another
//! way. Where the meaning is the same, the flag is a hidden alias on the rn50 flag itself (args.rs: `--learning-rate`,
//! `--model`, `--sched`, `--smoothing`, `--output`, ...), or a visible one where the flag's help names it
//! (`--min-lr`, `--model-ema-decay`, `--model-ema-steps`: tests/program/help_examples.rs checks that a name the help
//! mentions is shown as an alias). The rest are here: each is accepted by the parser (hidden,
//! with or without a value), so that clap does not answer it with a near-miss tip (`--pretrained` → "a similar
//! argument exists: --print-freq"), and [`ForeignFlags::check`] refuses it with rn50's way (exit 2, before
//! anything is allocated or written).
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use rn50_args::UsageError;

/// How rn50 does what a launcher flag of main.py does.
const LAUNCHER: &str = "rn50 starts one process per GPU with `rn50 launch --nproc-per-node N -- train ...`, or \
                        runs under torchrun, srun or mpirun and reads their environment (RANK, WORLD_SIZE, \
                        MASTER_ADDR...); see docs/distributed.md";

/// A flag of main.py or timm that rn50 refuses: its name (without `--`), whether it takes values, and what to
/// use instead.
struct Foreign {
    long: &'static str,
    takes_value: bool,
    instead: &'static str,
}

const fn foreign(long: &'static str, takes_value: bool, instead: &'static str) -> Foreign {
    Foreign {
        long,
        takes_value,
        instead,
    }
}

const FOREIGN: &[Foreign] = &[
    foreign(
        "pretrained",
        false,
        "rn50 downloads nothing: give the weights file with --init-weights (torchvision's resnet50-11ad3fa6.pth, \
         a main.py checkpoint.pth.tar or a safetensors file)",
    ),
    foreign(
        "initial-checkpoint",
        true,
        "use --init-weights FILE (safetensors, or a torch.save file such as main.py's checkpoint.pth.tar)",
    ),
    foreign(
        "gpu",
        true,
        "use --device cuda:N (one GPU per process; under a launcher each rank takes GPU LOCAL_RANK)",
    ),
    foreign("dist-url", true, LAUNCHER),
    foreign("dist-backend", true, LAUNCHER),
    foreign("world-size", true, LAUNCHER),
    foreign("rank", true, LAUNCHER),
    foreign("multiprocessing-distributed", false, LAUNCHER),
    foreign("local_rank", true, LAUNCHER),
    foreign("local-rank", true, LAUNCHER),
    foreign(
        "amp",
        false,
        "use --precision fp16 (CUDA, with loss scaling) or --precision bf16; rn50 picks fp16 on GPUs by default",
    ),
    foreign(
        "amp-dtype",
        true,
        "use --precision fp16 or --precision bf16",
    ),
    foreign(
        "start-epoch",
        true,
        "rn50 takes the epoch and step from the checkpoint: use --resume (a checkpoint, a run directory, or auto)",
    ),
    foreign(
        "opt",
        true,
        "use --optimizer sgd, lars, adamw or radam, --nesterov for Nesterov momentum (timm's `--opt sgd` is \
         Nesterov SGD, rn50's --optimizer sgd is plain momentum SGD as in main.py) and --lookahead for timm's \
         lookahead_ prefix",
    ),
    foreign(
        "decay-epochs",
        true,
        "use --lr-schedule step --lr-milestones E1,E2,... (the epochs where the rate is divided by 10)",
    ),
    foreign(
        "decay-milestones",
        true,
        "use --lr-schedule step --lr-milestones E1,E2,... (the epochs where the rate is divided by 10)",
    ),
    foreign(
        "warmup-lr",
        true,
        "rn50's warmup (--warmup-epochs) rises linearly from 0 to the peak rate",
    ),
    foreign(
        "num-classes",
        true,
        "rn50 takes the class count from DATA's class folders",
    ),
    foreign(
        "input-size",
        true,
        "use --image-size N (the training crop) and --val-resize/--val-crop for evaluation",
    ),
    foreign(
        "img-size",
        true,
        "timm's --img-size sets the training and the evaluation size alike; rn50 names them apart: --image-size N \
         (the training crop) and --val-resize/--val-crop (timm evaluates N after resizing to N/0.875: --val-resize \
         N/0.875 --val-crop N)",
    ),
    foreign(
        "crop-pct",
        true,
        "use --val-resize and --val-crop (crop-pct 0.875 = --val-resize 256 --val-crop 224)",
    ),
    foreign(
        "aa",
        true,
        "use --auto-augment ta_wide (TrivialAugmentWide) or --auto-augment ra (RandAugment, --ra-magnitude N): \
         torchvision's policies; timm's policy strings (rand-m9-mstd0.5-inc1, ...) are not read",
    ),
    foreign(
        "reprob",
        true,
        "use --random-erase P: torchvision's RandomErasing, the box set to 0 after normalisation (timm's default \
         --remode pixel fills it with noise instead)",
    ),
    foreign(
        "ra-sampler",
        false,
        "use --ra-reps N alone (torchvision's --ra-sampler --ra-reps N)",
    ),
    foreign(
        "norm-weight-decay",
        true,
        "use --no-bn-wd for no weight decay on batch-norm parameters (and biases), torchvision's \
         --norm-weight-decay 0",
    ),
];

/// The first main.py/timm flag of [`FOREIGN`] given, if any.
#[derive(Clone, Debug, Default)]
pub struct ForeignFlags {
    given: Option<&'static Foreign>,
}

impl std::fmt::Debug for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--{}", self.long)
    }
}

impl ForeignFlags {
    /// A [`UsageError`] naming rn50's way when one of main.py's or timm's flags was given.
    pub fn check(&self) -> Result<(), UsageError> {
        match self.given {
            None => Ok(()),
            Some(f) => Err(UsageError(format!(
                "--{} is a flag of pytorch/examples' main.py or timm, not of rn50: {}",
                f.long, f.instead
            ))),
        }
    }
}

impl Args for ForeignFlags {
    fn augment_args(cmd: Command) -> Command {
        FOREIGN.iter().fold(cmd, |cmd, f| {
            let arg = Arg::new(f.long).long(f.long).hide(true);
            cmd.arg(if f.takes_value {
                // Any values, even none (timm's `--decay-milestones 30 60`): the flag is refused whatever follows.
                arg.num_args(0..)
                    .action(ArgAction::Append)
                    .allow_hyphen_values(true)
            } else {
                arg.action(ArgAction::SetTrue)
            })
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for ForeignFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = FOREIGN.iter().find(|f| {
            m.value_source(f.long)
                .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
        });
        Ok(Self { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}
