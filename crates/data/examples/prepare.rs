//! `rn50 prepare` without the rest of rn50 (no libtorch needed): the same command surface,
//! for benchmarking and for machines that only prepare data.
//!
//!     cargo run --release -p rn50-data --example prepare -- --train-tar T --out DIR -j 2

use clap::Parser;
use rn50_data::cli::{run, PrepareArgs};

#[derive(Parser)]
#[command(name = "prepare")]
struct Cli {
    #[command(flatten)]
    cmd: PrepareArgs,
}

fn main() {
    let cli = Cli::parse();
    rn50_util::log::init(None);
    if let Err(e) = run(&cli.cmd) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
