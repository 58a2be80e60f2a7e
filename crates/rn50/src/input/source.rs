//! Where a bench step's batch comes from, by data mode (and `train --dummy`'s batch): a constant batch on the device (compute only), random
//! bytes made on the host and copied (transfer), or the real decode/augment loader over synthetic JPEGs of
//! ImageNet's size distribution or over a dataset on disk (the whole input pipeline).
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rn50_pipeline::{Dataset, Epoch, Epochs, Loader, LoaderConfig, Transform};
use tch::{Device, Kind, Tensor};

use super::{next_batch, to_device_async, DeviceBatch, HostBatches, Keep};

/// Bench's batches, by data mode (and `train --dummy`'s).
pub enum BatchSource {
    Device {
        images: Tensor,
        labels: Tensor,
    },
    Host {
        batches: HostBatches,
        on_device: Tensor,
        labels: Tensor,
    },
    Loader {
        loader: Box<Loader>,
        /// The next epoch is always queued, so the loader runs on across epoch boundaries.
        epochs: Box<Epochs>,
        it: Box<Epoch>,
    },
}

impl BatchSource {
    /// One random batch made on the device (random bytes, labels below 1000), handed out at every step.
    pub fn device(b: usize, s: usize, device: Device) -> BatchSource {
        let (b, s) = (b as i64, s as i64);
        BatchSource::Device {
            images: Tensor::randint(256, [b, s, s, 3], (Kind::Uint8, device)),
            labels: Tensor::randint(1000, [b], (Kind::Int64, device)),
        }
    }

    pub fn host(b: usize, s: usize, device: Device, seed: u64) -> Result<BatchSource> {
        let (b, s) = (b as i64, s as i64);
        Ok(BatchSource::Host {
            batches: HostBatches::new(b, s, device, 3, seed)?,
            on_device: Tensor::empty([b, s, s, 3], (Kind::Uint8, device)),
            labels: Tensor::randint(1000, [b], (Kind::Int64, device)),
        })
    }

    /// The training loader (RandomResizedCrop + flip at `size`) over `dataset`, this rank's shard.
    pub fn loader(dataset: Dataset, cfg: LoaderConfig, size: usize) -> Result<BatchSource> {
        let cfg = LoaderConfig {
            transform: Transform::train(size),
            ..cfg
        };
        let loader = Box::new(Loader::new(dataset, cfg)?);
        anyhow::ensure!(
            loader.batches_per_epoch() > 0,
            "the dataset has fewer images than one batch per process"
        );
        let mut epochs = Box::new(loader.epochs(0, 0));
        let it = Box::new(epochs.next().expect("epochs never end"));
        Ok(BatchSource::Loader { loader, epochs, it })
    }

    /// The next batch, on the device (GPU: copied asynchronously from pinned memory).
    pub fn next(&mut self, device: Device) -> Result<DeviceBatch> {
        match self {
            BatchSource::Device { images, labels } => Ok(DeviceBatch {
                images: images.shallow_clone(),
                labels: labels.shallow_clone(),
                erased: Vec::new(),
                wait: Duration::ZERO,
                keep: Keep::Nothing,
            }),
            BatchSource::Host {
                batches,
                on_device,
                labels,
            } => {
                let t = Instant::now();
                let batch = batches.next();
                let wait = t.elapsed();
                let keep = if device.is_cuda() {
                    // Queued ahead of this step's kernels; the buffer is recycled once the step is done.
                    *on_device = to_device_async(&batch, device)?;
                    Keep::Pinned(batch)
                } else {
                    // One input tensor for every batch: a CPU step has finished with the previous one.
                    on_device.copy_(&batch);
                    batches.recycle(batch);
                    Keep::Nothing
                };
                Ok(DeviceBatch {
                    images: on_device.shallow_clone(),
                    labels: labels.shallow_clone(),
                    erased: Vec::new(),
                    wait,
                    keep,
                })
            }
            BatchSource::Loader { epochs, it, .. } => {
                let (batch, wait) = loop {
                    match next_batch(it) {
                        Some(b) => break b.context("loading a batch")?,
                        None => **it = epochs.next().expect("epochs never end"),
                    }
                };
                Ok(DeviceBatch {
                    wait,
                    ..DeviceBatch::new(batch, device)?
                })
            }
        }
    }

    /// Gives a host buffer back once the step that read it is done.
    pub fn recycle(&mut self, batch: DeviceBatch) {
        if let (BatchSource::Host { batches, .. }, Keep::Pinned(t)) = (self, batch.keep) {
            batches.recycle(t);
        }
    }

    pub fn bad_images(&self) -> u64 {
        match self {
            BatchSource::Loader { loader, .. } => loader.stats().bad_images,
            _ => 0,
        }
    }
}
