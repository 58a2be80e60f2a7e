//! `rn50 report` and `rn50 scaling` without libtorch, for trying the crate alone:
//! `cargo run -p rn50-report --example report -- scaling --images-per-sec 1252`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tables and plots from bench, sweep and train results.
    Report(rn50_report::report::ReportArgs),
    /// Predicted data-parallel scaling.
    Scaling(Box<rn50_report::scaling::ScalingArgs>),
    /// A training run's metrics.csv, summary.md and plots, written into RUN_DIR.
    RunReport { run_dir: std::path::PathBuf },
}

fn main() -> anyhow::Result<()> {
    rn50_util::log::init(None);
    match Cli::parse().command {
        Command::Report(a) => rn50_report::report::run(&a),
        Command::Scaling(a) => rn50_report::scaling::run(&a),
        Command::RunReport { run_dir } => {
            for f in rn50_report::write_run_report(&run_dir)? {
                tracing::info!("wrote {}", f.display());
            }
            print!("{}", rn50_report::summary_text(&run_dir)?);
            Ok(())
        }
    }
}
