//! Where a bench step's batch comes from, by data mode (and `train --dummy`'s batch): a constant batch on the device (compute only), random
//! bytes made on the host and copied (transfer), or the real decode/augment loader over synthetic JPEGs of
//! ImageNet's size distribution or over a dataset on disk (the whole input pipeline).
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rn50_pipeline::transform::Erase;
use rn50_pipeline::{Dataset, Epoch, Epochs, Loader, LoaderConfig, Transform};
use tch::{Device, Kind, Tensor};

use super::{to_device_async, DeviceBatch, HostBatches};

pub enum Source {
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

/// A batch handed to the step: keeps what the device may still read alive until dropped.
pub struct Staged {
    pub images: Tensor,
    pub labels: Tensor,
    /// How long the host waited for its producer (the loader, or the host thread making random bytes) to
    /// have the batch ready: the data wait, as `train` counts it. Staging it for the device is not in it.
    pub wait: Duration,
    /// Random erasing's boxes (the loader's `--random-erase` draws), to zero after normalisation.
    pub erased: Vec<(usize, Erase)>,
    _keep: Keep,
}

enum Keep {
    Nothing,
    Pinned(Tensor),
    /// Holds the loader's buffer (viewed by `images` on CPU) until the step is done.
    Loader {
        _batch: DeviceBatch,
    },
}

impl From<DeviceBatch> for Staged {
    /// A loader's batch on the device, kept whole: on CPU its tensors view the loader's buffer.
    fn from(mut b: DeviceBatch) -> Staged {
        Staged {
            images: b.images.shallow_clone(),
            labels: b.labels.shallow_clone(),
            wait: Duration::ZERO,
            erased: std::mem::take(&mut b.erased),
            _keep: Keep::Loader { _batch: b },
        }
    }
}

impl Source {
    /// One random batch made on the device (random bytes, labels below 1000), handed out at every step.
    pub fn device(b: usize, s: usize, device: Device) -> Source {
        let (b, s) = (b as i64, s as i64);
        Source::Device {
            images: Tensor::randint(256, [b, s, s, 3], (Kind::Uint8, device)),
            labels: Tensor::randint(1000, [b], (Kind::Int64, device)),
        }
    }

    pub fn host(b: usize, s: usize, device: Device, seed: u64) -> Result<Source> {
        let (b, s) = (b as i64, s as i64);
        Ok(Source::Host {
            batches: HostBatches::new(b, s, device, 3, seed)?,
            on_device: Tensor::empty([b, s, s, 3], (Kind::Uint8, device)),
            labels: Tensor::randint(1000, [b], (Kind::Int64, device)),
        })
    }

    /// The training loader (RandomResizedCrop + flip at `size`) over `dataset`, this rank's shard.
    pub fn loader(dataset: Dataset, cfg: LoaderConfig, size: usize) -> Result<Source> {
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
        Ok(Source::Loader { loader, epochs, it })
    }

    /// The next batch, on the device (GPU: copied asynchronously from pinned memory).
    pub fn next(&mut self, device: Device) -> Result<Staged> {
        match self {
            Source::Device { images, labels } => Ok(Staged {
                images: images.shallow_clone(),
                labels: labels.shallow_clone(),
                wait: Duration::ZERO,
                erased: Vec::new(),
                _keep: Keep::Nothing,
            }),
            Source::Host {
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
                Ok(Staged {
                    images: on_device.shallow_clone(),
                    labels: labels.shallow_clone(),
                    wait,
                    erased: Vec::new(),
                    _keep: keep,
                })
            }
            Source::Loader { epochs, it, .. } => {
                let t = Instant::now();
                let batch = loop {
                    match it.next() {
                        Some(b) => break b.context("loading a batch")?,
                        None => **it = epochs.next().expect("epochs never end"),
                    }
                };
                let wait = t.elapsed();
                Ok(Staged {
                    wait,
                    ..Staged::from(DeviceBatch::new(batch, device)?)
                })
            }
        }
    }

    /// Gives a host buffer back once the step that read it is done.
    pub fn recycle(&mut self, staged: Staged) {
        if let (Source::Host { batches, .. }, Keep::Pinned(t)) = (self, staged._keep) {
            batches.recycle(t);
        }
    }

    pub fn bad_images(&self) -> u64 {
        match self {
            Source::Loader { loader, .. } => loader.stats().bad_images,
            _ => 0,
        }
    }
}
