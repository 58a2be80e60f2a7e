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
    /// Training throughput on synthetic data (images/s, step time, data wait, memory).
    Bench(rn50::bench::BenchArgs),
    /// Check this node: libtorch, CPU features, GPUs, cuDNN/NCCL, Gloo, launcher environment.
    Doctor(rn50::doctor::DoctorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Bench(a) => rn50::bench::command(a),
        Command::Doctor(a) => rn50::doctor::command(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
