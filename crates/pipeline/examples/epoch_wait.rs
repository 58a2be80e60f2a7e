//! Data wait at epoch boundaries, with the loader restarted for every epoch and evaluation pass (as
//! `rn50 train` did before) and with the work queued ahead (as it does now), against a consumer
//! that holds each batch for a simulated step:
//! `cargo run --release -p rn50-pipeline --example epoch_wait -- DATA [-j 2] [-b 32] [--step-ms 90]`.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use rn50_pipeline::{Dataset, Epoch, Loader, LoaderConfig, Transform};

#[derive(Parser)]
struct Args {
    /// ImageFolder directory, shard directory or shard file (used for training and evaluation).
    data: std::path::PathBuf,
    #[arg(short = 'j', default_value_t = 2)]
    workers: usize,
    #[arg(short = 'b', default_value_t = 32)]
    batch_size: usize,
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// A step (training or evaluation).
    #[arg(long, default_value_t = 90)]
    step_ms: u64,
}

/// Consumes `pass`, sleeping `step` per batch; returns the wait for the first batch and for the rest.
fn consume(mut pass: Epoch, step: Duration) -> Result<(Duration, Duration)> {
    let (mut first, mut rest) = (None, Duration::ZERO);
    loop {
        let t = Instant::now();
        let Some(b) = pass.next() else { break };
        b?;
        match first {
            None => first = Some(t.elapsed()),
            Some(_) => rest += t.elapsed(),
        }
        std::thread::sleep(step);
    }
    Ok((first.unwrap_or_default(), rest))
}

fn main() -> Result<()> {
    let a = Args::parse();
    let ds = Dataset::open(&a.data)?;
    let train_cfg = LoaderConfig {
        transform: Transform::train(224),
        ..LoaderConfig::train(a.batch_size, a.workers)
    };
    let val_cfg = LoaderConfig::val(a.batch_size, a.workers);
    let step = Duration::from_millis(a.step_ms);
    for queued in [false, true] {
        let train = Loader::new(ds.clone(), train_cfg.clone())?;
        let val = train.share_workers(ds.clone(), val_cfg.clone())?;
        let (mut cold, mut boundary, mut within) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let start = Instant::now();
        let mut next = queued.then(|| train.epoch(0, 0));
        for e in 0..a.epochs {
            let this = next.take().unwrap_or_else(|| train.epoch(e, 0));
            let pass = queued.then(|| val.epoch(0, 0));
            next = queued.then(|| train.epoch(e + 1, 0));
            let (f, r) = consume(this, step)?;
            let (vf, vr) = consume(pass.unwrap_or_else(|| val.epoch(0, 0)), step)?;
            match e {
                0 => (cold, boundary) = (f, vf),
                _ => boundary += f + vf,
            }
            within += r + vr;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{}: {:.2} s in all; data wait for the first batch {:.0} ms, at the {} later epoch and \
             evaluation starts {:.0} ms, within passes {:.0} ms",
            if queued { "queued ahead" } else { "restarted per pass" },
            start.elapsed().as_secs_f64(),
            ms(cold),
            2 * a.epochs - 1,
            ms(boundary),
            ms(within)
        );
    }
    Ok(())
}
