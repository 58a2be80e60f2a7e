//! Where a step's batches come from and how they reach the device, for `bench`, `train` and `eval`: a host batch
//! from the loader ([`next_batch`], which times the wait for it) handed over as a [`DeviceBatch`] (no copy on CPU,
//! an asynchronous copy from pinned memory on GPU), and bench's [`BatchSource`]s (a constant batch on the device,
//! random bytes made on the host, or the loader itself). Which dataset and transforms `train` uses is [`crate::train::data`].
pub mod host;
pub mod source;

use std::time::{Duration, Instant};

use anyhow::Result;
use rn50_pipeline::transform::Erase;
use rn50_pipeline::{Batch, Epoch};
use tch::{Device, Kind, Tensor};

pub use host::HostBatches;
pub use source::BatchSource;

/// Queues the copy of `pinned` (page-locked host memory) to `device` behind the work already queued there, like
/// `.cuda(non_blocking=True)`: the caller keeps `pinned` alive (or lets PyTorch's caching host allocator do it)
/// until the copy has run.
pub fn to_device_async(pinned: &Tensor, device: Device) -> Result<Tensor> {
    Ok(pinned.f_to_device_(device, pinned.kind(), true, false)?)
}

/// A batch on the device, as the step takes it: uint8 NHWC images and int64 labels, with random erasing's boxes. It
/// keeps what the device may still read alive until dropped: on CPU the loader's buffer the images view, on GPU
/// bench's pinned host buffer until its copy has run.
pub struct DeviceBatch {
    pub images: Tensor,
    pub labels: Tensor,
    /// The images' random-erasing boxes (positions in the batch), zeroed by the step after normalisation.
    pub erased: Vec<(usize, Erase)>,
    /// How long the host waited for its producer (the loader, or the host thread making random bytes) to have
    /// the batch ready ([`next_batch`]): the data wait. Staging it for the device is not in it.
    pub wait: Duration,
    /// Fields drop in order, so the tensors above go first.
    keep: Keep,
}

/// What a [`DeviceBatch`] keeps alive.
enum Keep {
    Nothing,
    /// Bench's host buffer, recycled once the step that read it is done ([`BatchSource::recycle`]).
    Pinned(Tensor),
    /// On CPU the images tensor borrows the loader's buffer.
    Loader {
        _batch: Batch,
    },
}

/// The next batch of `it` and how long the host waited for the loader to have it ready: the data wait, as `train`
/// and `bench` count it. `None` at the end of the epoch.
pub fn next_batch(it: &mut Epoch) -> Option<Result<(Batch, Duration)>> {
    let t = Instant::now();
    let batch = it.next()?;
    let wait = t.elapsed();
    Some(batch.map(|b| (b, wait)))
}

impl DeviceBatch {
    /// A loader's batch on `device`. CPU: no copy, the tensor views the loader's buffer. GPU: staged through
    /// page-locked memory from PyTorch's caching host allocator and copied asynchronously, like DataLoader's
    /// pin_memory + `.cuda(non_blocking=True)`: the copy queues behind the running step while the host goes on to
    /// the next batch, and the allocator keeps the staging buffer until its copy has finished.
    pub fn new(batch: Batch, device: Device) -> Result<Self> {
        let shape = [batch.n() as i64, batch.h() as i64, batch.w() as i64, 3];
        let labels = Tensor::from_slice(batch.labels());
        let erased = batch
            .erased()
            .iter()
            .enumerate()
            .filter_map(|(image, e)| e.map(|e| (image, e)))
            .collect();
        // SAFETY: `batch` holds `shape.product()` contiguous bytes and outlives `host` (kept in `keep` on CPU; on
        // GPU `host` is copied from before `batch` is dropped here).
        let host = unsafe {
            Tensor::from_blob(
                batch.as_ptr(),
                &shape,
                &[shape[1] * shape[2] * 3, shape[2] * 3, 3, 1],
                Kind::Uint8,
                Device::Cpu,
            )
        };
        if device == Device::Cpu {
            return Ok(Self {
                images: host,
                labels,
                erased,
                wait: Duration::ZERO,
                keep: Keep::Loader { _batch: batch },
            });
        }
        let pinned = crate::shim::pin_memory(&host)?;
        drop(host);
        drop(batch);
        Ok(Self {
            images: to_device_async(&pinned, device)?,
            labels: to_device_async(&crate::shim::pin_memory(&labels)?, device)?,
            erased,
            wait: Duration::ZERO,
            keep: Keep::Nothing,
        })
    }
}
