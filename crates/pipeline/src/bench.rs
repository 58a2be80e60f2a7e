//! Loader throughput measurement behind `rn50 bench-loader`.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::loader::{Loader, LoaderConfig};
use crate::source::{Dataset, Source};
use std::sync::Arc;

/// What `rn50 bench-loader` measured (its line on stdout, and `--json FILE`); `rn50 bench`'s result, a
/// training step's throughput, is `rn50_report::schema::BenchResult`.
#[derive(Clone, Debug, Serialize)]
pub struct LoaderBenchResult {
    pub dataset: String,
    pub transform: String,
    pub threads: usize,
    pub batch_size: usize,
    /// Timed batches and the images in them (after `warmup` untimed batches).
    pub steps: usize,
    pub warmup: usize,
    pub images: u64,
    pub seconds: f64,
    /// Images decoded (or found bad) by the workers per second while the timed batches were taken.
    pub images_per_sec: f64,
    pub images_per_sec_per_core: f64,
    /// Images that could not be decoded (in every batch decoded: warmup, timed, and those decoded
    /// ahead and never taken).
    pub bad_images: u64,
    /// Per-image worker time, averaged over all loaded images.
    pub read_ms_per_image: f64,
    pub decode_ms_per_image: f64,
    pub augment_ms_per_image: f64,
    pub dct_scaling: bool,
    pub bad_examples: Vec<String>,
}

/// The dataset repeated `times` times as one epoch, so a benchmark over a small set measures
/// steady-state throughput rather than epoch-boundary pipeline drains.
struct Repeated {
    inner: Dataset,
    times: usize,
}

impl Source for Repeated {
    fn len(&self) -> usize {
        self.inner.len() * self.times
    }
    fn label(&self, i: usize) -> i64 {
        self.inner.label(i % self.inner.len())
    }
    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        self.inner.read(i % self.inner.len(), buf)
    }
    fn name(&self, i: usize) -> String {
        self.inner.name(i % self.inner.len())
    }
}

/// Run `warmup` untimed then `steps` timed batches (the dataset repeated as needed, so that
/// most are in one epoch).
pub fn run(
    dataset: Dataset,
    config: LoaderConfig,
    steps: usize,
    warmup: usize,
) -> Result<LoaderBenchResult> {
    let transform = format!("{:?}", config.transform);
    let (threads, batch_size, dct_scaling) =
        (config.workers, config.batch_size, config.dct_scaling);
    let description = dataset.description().to_string();
    anyhow::ensure!(!dataset.is_empty(), "{description} is empty");
    let needed = (steps + warmup) * batch_size;
    let times = needed.div_ceil(dataset.len()).max(1);
    let classes = dataset.classes().to_vec();
    let dataset = Dataset::from_source(
        Arc::new(Repeated {
            inner: dataset,
            times,
        }),
        classes,
        description.clone(),
    );
    let loader = Loader::new(dataset, config)?;
    anyhow::ensure!(
        loader.batches_per_epoch() > 0,
        "dataset has {} images, fewer than one batch of {batch_size}",
        loader.dataset().len()
    );
    // The rate is what the workers decode while the timed batches are taken, not the batches
    // taken: those were partly decoded before the clock started, up to `prefetch` batches ahead.
    let decoded = || {
        let s = loader.stats();
        s.images + s.bad_images
    };
    let (mut done, mut images) = (0, 0u64);
    let (mut start, mut decoded_before) = (Instant::now(), 0);
    'outer: for epoch in loader.epochs(0, 0) {
        for batch in epoch {
            let batch = batch?;
            done += 1;
            if done == warmup {
                (start, decoded_before) = (Instant::now(), decoded());
            } else if done > warmup {
                images += batch.n() as u64;
            }
            if done >= warmup + steps {
                break 'outer;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    // The epochs are dropped: a bad image in a batch decoded ahead and never taken counts too.
    loader.check_bad_images()?;
    let ips = (decoded() - decoded_before) as f64 / seconds;
    let stats = loader.stats();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / stats.images.max(1) as f64;
    Ok(LoaderBenchResult {
        dataset: description,
        transform,
        threads,
        batch_size,
        steps,
        warmup,
        images,
        seconds,
        images_per_sec: ips,
        images_per_sec_per_core: ips / threads as f64,
        bad_images: stats.bad_images,
        read_ms_per_image: per(stats.read_time),
        decode_ms_per_image: per(stats.decode_time),
        augment_ms_per_image: per(stats.augment_time),
        dct_scaling,
        bad_examples: stats.bad_examples,
    })
}
