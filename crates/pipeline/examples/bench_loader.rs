//! Stand-alone `bench-loader` (the same as `rn50 bench-loader`) without building libtorch:
//! `cargo run --release -p rn50-pipeline --example bench_loader -- DATA -j 2 -b 64`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "bench-loader")]
struct Args {
    #[command(flatten)]
    cmd: rn50_pipeline::cli::bench_loader::BenchLoaderArgs,
}

fn main() {
    let args = Args::parse();
    rn50_util::log::init(None);
    if let Err(e) = rn50_pipeline::cli::bench_loader::run(&args.cmd) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
