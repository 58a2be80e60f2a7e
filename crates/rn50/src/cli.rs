//! The command line: every subcommand with its flags ([`Cli`]), parsed one way ([`parse`]) by `main` and by the
//! tests that check what a command line means without running it ([`parse_only`], what `RN50_PARSE_ONLY=1 rn50
//! …` prints).
use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// rn50: prepare ImageNet, train ResNet-50 (and 18…152) on one to many accelerators, and measure it.
#[derive(Parser)]
#[command(name = "rn50", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Verify and extract the ILSVRC2012 archives into an ImageFolder tree (parallel, resumable).
    Prepare(rn50_data::cli::PrepareArgs),
    /// Pack an image folder into a few large shard files for fast sequential reading.
    Pack(rn50_pipeline::cli::pack::PackArgs),
    /// Training throughput on synthetic data (images/s, step time, data wait, memory).
    Bench(crate::bench::BenchArgs),
    /// Train on DATA/train with per-epoch evaluation on DATA/val; checkpoints, resume, preemption-safe.
    Train(Box<crate::train::TrainArgs>),
    /// Evaluate saved weights: top-1/top-5 over every validation image once.
    Eval(crate::train::EvalArgs),
    /// Top-5 classes of images under saved weights, with their WordNet names.
    Classify(crate::classify::ClassifyArgs),
    /// Weights as TorchScript for PyTorch and ONNX: `rn50 export --weights W.safetensors -a resnet50 --out model.pt`.
    Export(crate::export::ExportArgs),
    /// Input-pipeline throughput: decode + augment + batch, without the model.
    BenchLoader(rn50_pipeline::cli::bench_loader::BenchLoaderArgs),
    /// Start N data-parallel workers on this node (like torchrun): `rn50 launch --nproc-per-node 2 -- train …`.
    Launch(rn50_distributed::launch::LaunchArgs),
    /// Tables (Markdown, CSV) and PNG plots from bench, sweep and train results.
    Report(rn50_report::report::ReportArgs),
    /// Predict throughput and scaling efficiency at N workers from a measured single-worker step.
    #[command(visible_alias = "predict")]
    Scaling(Box<rn50_report::scaling::ScalingArgs>),
    /// Check this node: libtorch, CPU features, GPUs, cuDNN/NCCL, Gloo, launcher environment.
    Doctor(crate::doctor::DoctorArgs),
}

/// Lets every flag that takes a value take a negative number, so that `--ema -1` or `-b -5` is refused by that
/// flag's range, with its name and the range, instead of as an unknown flag `-1`.
fn negative_numbers_are_values(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        let takes_values = a.get_action().takes_values();
        a.allow_negative_numbers(takes_values)
    })
    .mut_subcommands(negative_numbers_are_values)
}

/// Why a command line was refused before anything ran.
pub enum Refused {
    /// A `train --config` file that cannot be read or is not rn50's (a usage error: exit 2).
    Config(rn50_args::UsageError),
    /// clap's verdict: a flag out of its range or unknown (exit 2), or `--help` / `--version` (exit 0, printed on
    /// stdout).
    Clap(clap::Error),
}

/// `argv` (the program's name first) as the binary parses it: the flags of `train --config FILE.toml` before the
/// command line's, which override them (a flag given twice takes its last value; `--no-SWITCH` turns a switch off:
/// [`crate::train::config::with_negations`]), negative numbers as values, and
/// train's resolved flags (what its run directory's config.toml records) kept in [`crate::train::TrainArgs`].
pub fn parse(argv: Vec<OsString>) -> Result<Cli, Refused> {
    let argv = crate::train::config::expand(argv).map_err(Refused::Config)?;
    let matches = negative_numbers_are_values(Cli::command())
        .mut_subcommand("train", |c| {
            crate::train::config::with_negations(c.args_override_self(true))
        })
        .try_get_matches_from(argv)
        .map_err(Refused::Clap)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(Refused::Clap)?;
    if let (Command::Train(a), Some(m)) = (&mut cli.command, matches.subcommand_matches("train")) {
        a.resolved_config = Some(crate::train::config::resolved_flags(m));
    }
    Ok(cli)
}

/// What `RN50_PARSE_ONLY=1 rn50 ARGS…` ends with: its exit code and what it prints. It parses the command line
/// ([`parse`]); for `train` it also checks the rules between flags ([`crate::train::check`]) and prints the resolved
/// flags (the run directory's config.toml) on stdout.
pub struct ParseOnly {
    pub code: u8,
    pub stdout: String,
    pub stderr: String,
}

/// `argv` parsed and checked as [`ParseOnly`] says, without running anything.
pub fn parse_only(argv: Vec<OsString>) -> ParseOnly {
    let refused = |stderr: String| ParseOnly {
        code: 2,
        stdout: String::new(),
        stderr,
    };
    match parse(argv) {
        Err(Refused::Config(e)) => refused(format!("error: {e}\n")),
        Err(Refused::Clap(e)) => {
            let text = e.render().to_string();
            let (stdout, stderr) = if e.use_stderr() {
                (String::new(), text)
            } else {
                (text, String::new())
            };
            ParseOnly {
                code: e.exit_code() as u8,
                stdout,
                stderr,
            }
        }
        Ok(cli) => match &cli.command {
            Command::Train(a) => match crate::train::check(a) {
                Err(e) => refused(format!("error: {e}\n")),
                Ok(()) => ParseOnly {
                    code: 0,
                    stdout: a
                        .resolved_config
                        .as_ref()
                        .map(|flags| crate::train::config::document(flags, None))
                        .unwrap_or_default(),
                    stderr: String::new(),
                },
            },
            _ => ParseOnly {
                code: 0,
                stdout: String::new(),
                stderr: String::new(),
            },
        },
    }
}
