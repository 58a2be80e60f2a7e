//! Where a step's batches come from and how they reach the device, for `bench`, `train` and `eval`: a host batch
//! from the loader handed over as a [`DeviceBatch`] (no copy on CPU, an asynchronous copy from pinned memory on
//! GPU), and bench's synthetic [`Source`]s (a constant batch on the device, random bytes made on the host, or the
//! loader itself). Which dataset and transforms `train` uses is [`crate::train::data`].
pub mod host;
pub mod source;

use anyhow::Result;
use rn50_pipeline::transform::Erase;
use rn50_pipeline::Batch;
use tch::{Device, Kind, Tensor};

pub use host::HostBatches;
pub use source::{Source, Staged};

/// Queues the copy of `pinned` (page-locked host memory) to `device` behind the work already queued there, like
/// `.cuda(non_blocking=True)`: the caller keeps `pinned` alive (or lets PyTorch's caching host allocator do it)
/// until the copy has run.
pub fn to_device_async(pinned: &Tensor, device: Device) -> Result<Tensor> {
    Ok(pinned.f_to_device_(device, pinned.kind(), true, false)?)
}

/// A batch on the device: uint8 NHWC images and int64 labels.
pub struct DeviceBatch {
    pub images: Tensor,
    pub labels: Tensor,
    /// The images' random-erasing boxes (positions in the batch), zeroed by the step after normalisation.
    pub erased: Vec<(usize, Erase)>,
    /// On CPU the images tensor borrows the loader's buffer: keep it until the tensors are dropped
    /// (fields drop in order, so the tensors go first).
    _host: Option<Batch>,
}

impl DeviceBatch {
    /// CPU: no copy, the tensor views the loader's buffer. GPU: staged through page-locked memory from
    /// PyTorch's caching host allocator and copied asynchronously, like DataLoader's pin_memory +
    /// `.cuda(non_blocking=True)`: the copy queues behind the running step while the host goes on to the
    /// next batch, and the allocator keeps the staging buffer until its copy has finished.
    pub fn new(batch: Batch, device: Device) -> Result<Self> {
        let shape = [batch.n() as i64, batch.h() as i64, batch.w() as i64, 3];
        let labels = Tensor::from_slice(batch.labels());
        let erased = batch
            .erased()
            .iter()
            .enumerate()
            .filter_map(|(image, e)| e.map(|e| (image, e)))
            .collect();
        // SAFETY: `batch` holds `shape.product()` contiguous bytes and outlives `host` (kept in `_host`
        // on CPU; on GPU `host` is copied from before `batch` is dropped here).
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
                _host: Some(batch),
            });
        }
        let pinned = crate::shim::pin_memory(&host)?;
        drop(host);
        drop(batch);
        Ok(Self {
            images: to_device_async(&pinned, device)?,
            labels: to_device_async(&crate::shim::pin_memory(&labels)?, device)?,
            erased,
            _host: None,
        })
    }
}
