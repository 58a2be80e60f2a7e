use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Prepare(rn50_data::cli::PrepareCmd),
    /// Pack an image folder into a few large shard files for fast sequential reading.
    Pack(rn50_pipeline::cli::PackCmd),
    /// Training throughput on synthetic data (images/s, step time, data wait, memory).
    Bench(rn50::bench::BenchArgs),
    /// Train on DATA/train with per-epoch evaluation on DATA/val; checkpoints, resume, preemption-safe.
    Train(rn50::train::run::TrainArgs),
    /// Evaluate saved weights: top-1/top-5 over every validation image once.
    Eval(rn50::train::eval::EvalArgs),
    /// Input-pipeline throughput: decode + augment + batch, without the model.
    BenchLoader(rn50_pipeline::cli::BenchLoaderCmd),
    /// Start N data-parallel workers on this node (like torchrun): `rn50 launch --nproc-per-node 2 -- train …`.
    Launch(rn50_distributed::launch::LaunchArgs),
    /// Tables (Markdown, CSV) and PNG plots from bench, sweep and train results.
    Report(rn50_report::ReportArgs),
    /// Predict throughput and scaling efficiency at N workers from a measured single-worker step.
    Predict(Box<rn50_report::PredictArgs>),
    /// Check this node: libtorch, CPU features, GPUs, cuDNN/NCCL, Gloo, launcher environment.
    Doctor(rn50::doctor::DoctorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rn50::alloc::keep_freed_memory();
    let result = match &cli.command {
        Command::Prepare(a) => rn50_data::cli::run(a),
        Command::Pack(a) => rn50_pipeline::cli::run_pack(a),
        Command::Bench(a) => rn50::bench::command(a),
        Command::Train(a) => rn50::train::run::command(a),
        Command::Eval(a) => rn50::train::eval::command(a),
        Command::BenchLoader(a) => rn50_pipeline::cli::run_bench_loader(a),
        Command::Doctor(a) => rn50::doctor::command(a),
        Command::Launch(a) => std::env::current_exe()
            .map_err(anyhow::Error::from)
            .and_then(|exe| rn50_distributed::launch::run(a, &exe))
            .map(|code| {
                if code != 0 {
                    std::process::exit(code)
                }
            }),
        Command::Report(a) => rn50_report::report_command(a),
        Command::Predict(a) => rn50_report::predict_command(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
