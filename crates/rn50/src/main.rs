use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use rn50::train::Outcome;

/// rn50: prepare ImageNet, train ResNet-50 (and 18…152) on one to many accelerators, and measure it.
#[derive(Parser)]
#[command(name = "rn50", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Verify and extract the ILSVRC2012 archives into an ImageFolder tree (parallel, resumable).
    Prepare(rn50_data::cli::PrepareArgs),
    /// Pack an image folder into a few large shard files for fast sequential reading.
    Pack(rn50_pipeline::cli::pack::PackArgs),
    /// Training throughput on synthetic data (images/s, step time, data wait, memory).
    Bench(rn50::bench::BenchArgs),
    /// Train on DATA/train with per-epoch evaluation on DATA/val; checkpoints, resume, preemption-safe.
    Train(Box<rn50::train::TrainArgs>),
    /// Evaluate saved weights: top-1/top-5 over every validation image once.
    Eval(rn50::train::EvalArgs),
    /// Top-5 classes of images under saved weights, with their WordNet names.
    Classify(rn50::classify::ClassifyArgs),
    /// Weights as TorchScript for PyTorch and ONNX: `rn50 export --weights W.safetensors -a resnet50 --out model.pt`.
    Export(rn50::export::ExportArgs),
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
    Doctor(rn50::doctor::DoctorArgs),
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

fn main() -> ExitCode {
    // `train --config FILE.toml`: the file's flags go before the command line's, which override them.
    let argv = match rn50::train::config::expand(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = negative_numbers_are_values(Cli::command())
        .mut_subcommand("train", |c| c.args_override_self(true))
        .get_matches_from(argv);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Command::Train(a), Some(m)) = (&mut cli.command, matches.subcommand_matches("train")) {
        a.resolved_config = Some(rn50::train::config::resolved_flags(m));
    }
    // Stop after parsing: how tests/program/help_examples.rs checks that every example in `--help` is a valid command
    // line.
    // For train, the rules between flags are checked too, and the resolved flags (the run directory's config.toml)
    // go to stdout.
    if std::env::var_os("RN50_PARSE_ONLY").is_some() {
        if let Command::Train(a) = &cli.command {
            if let Err(e) = rn50::train::check(a) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            if let Some(flags) = &a.resolved_config {
                print!("{}", rn50::train::config::document(flags, None));
            }
        }
        return ExitCode::SUCCESS;
    }
    // Log lines: UTC time stamp, level, `[rank N]` when this process is one of several ranks; RUST_LOG filters.
    let rank = rn50_distributed::WorldInfo::from_env()
        .ok()
        .filter(|w| w.is_distributed())
        .map(|w| w.rank);
    rn50_util::log::init(rank);
    rn50::alloc::keep_freed_memory();
    // libtorch's out-of-memory error reaches rn50 as a panic of tch's tensor methods: it becomes an error that
    // names the batch size (other panics keep Rust's report).
    let rust_report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if out_of_memory(info.payload()).is_none() {
            rust_report(info)
        }
    }));
    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&cli.command)))
    {
        Ok(Ok(code)) => return code,
        Ok(Err(e)) => Err(e),
        Err(panic) => match out_of_memory(&*panic) {
            Some(what) => Err(anyhow::anyhow!(
                "out of memory ({what}) {}",
                memory_advice(&cli.command)
            )),
            None => std::panic::resume_unwind(panic),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Stopped on request (Ctrl-C, SIGTERM) with the work kept or cleaned up: not an error.
        Err(e) if e.chain().any(|c| c.is::<rn50_util::stop::Stopped>()) => {
            tracing::warn!("{e:#}");
            ExitCode::from(rn50_util::stop::EXIT_STOPPED)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            // Flags that do not go together are a usage error, exit 2 like clap's for a value out of its range.
            if e.chain().any(|c| c.is::<rn50_args::UsageError>()) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Runs the subcommand; its exit code when it ends without an error.
fn run(cmd: &Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Prepare(a) => rn50_data::cli::run(a)?,
        Command::Pack(a) => rn50_pipeline::cli::pack::run(a)?,
        Command::Bench(a) => rn50::bench::run(a)?,
        Command::Train(a) => {
            return Ok(match rn50::train::run(a)? {
                Outcome::Done => ExitCode::SUCCESS,
                // Checkpointed on SIGINT/SIGTERM/SIGUSR1: the job script may requeue.
                Outcome::Preempted => ExitCode::from(rn50::train::EXIT_PREEMPTED),
            });
        }
        Command::Eval(a) => rn50::train::eval::run(a)?,
        Command::Classify(a) => rn50::classify::run(a)?,
        Command::Export(a) => rn50::export::run(a)?,
        Command::BenchLoader(a) => rn50_pipeline::cli::bench_loader::run(a)?,
        Command::Doctor(a) => rn50::doctor::run(a)?,
        Command::Launch(a) => return rn50_distributed::launch::run(a, &std::env::current_exe()?),
        Command::Report(a) => rn50_report::report::run(a)?,
        Command::Scaling(a) => rn50_report::scaling::run(a)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// What ran out, when a panic is libtorch's allocation failing ("DefaultCPUAllocator: can't allocate memory: you
/// tried to allocate 1233125376 bytes", "CUDA out of memory. Tried to allocate 2.00 GiB ..."): the message's
/// first line from there, without libtorch's C++ stack.
fn out_of_memory(panic: &(dyn std::any::Any + Send)) -> Option<String> {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())?;
    let at = [
        "can't allocate memory",
        "CUDA out of memory",
        "out of memory",
    ]
    .iter()
    .find_map(|m| text.find(m))?;
    let what = text[at..].split(['\n', '\\']).next().unwrap_or_default();
    Some(
        what.split(" Error code")
            .next()
            .unwrap_or(what)
            .trim_end_matches('.')
            .to_string(),
    )
}

/// What to lower when memory runs out in `cmd`.
fn memory_advice(cmd: &Command) -> String {
    match cmd {
        Command::Train(a) => format!(
            "at --batch-size {} per process: lower --batch-size (--accum-steps keeps the global batch) or \
             --image-size; the run directory is as it was before the step that failed",
            a.batch_size
        ),
        Command::Bench(a) => match a.batch_size {
            Some(b) => format!("at --batch-size {b}: lower --batch-size or --image-size"),
            None => "at the default batch size: set a lower --batch-size or --image-size".into(),
        },
        Command::Eval(a) => format!("at --batch-size {}: lower --batch-size", a.batch_size),
        Command::BenchLoader(a) => format!(
            "at --batch-size {}: lower --batch-size or --prefetch",
            a.batch_size
        ),
        _ => "with these inputs: free memory, or use smaller ones".into(),
    }
}
