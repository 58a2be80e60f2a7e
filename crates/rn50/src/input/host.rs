//! Synthetic batches made on the host every step, as a data loader would hand them over: uint8 NHWC in
//! page-locked (pinned) memory when the device is a GPU, so the copy can run asynchronously.
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use anyhow::Result;
use rand::{RngCore, SeedableRng};
use tch::{Device, Kind, Tensor};

/// A producer thread filling a small ring of reusable host buffers with random pixels.
pub struct HostBatches {
    full: Option<Receiver<Tensor>>,
    empty: Option<SyncSender<Tensor>>,
    worker: Option<JoinHandle<()>>,
}

impl HostBatches {
    /// `depth` buffers of `[batch, size, size, 3]` uint8; pinned for `device` when it is CUDA.
    pub fn new(batch: i64, size: i64, device: Device, depth: usize, seed: u64) -> Result<Self> {
        let (full_tx, full_rx) = mpsc::sync_channel::<Tensor>(depth);
        let (empty_tx, empty_rx) = mpsc::sync_channel::<Tensor>(depth);
        for _ in 0..depth {
            let t = Tensor::empty([batch, size, size, 3], (Kind::Uint8, Device::Cpu));
            let t = if device.is_cuda() {
                crate::shim::pin_memory(&t)?
            } else {
                t
            };
            empty_tx.send(t).expect("ring has room for every buffer");
        }
        let worker = std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            while let Ok(t) = empty_rx.recv() {
                // SAFETY: t is a contiguous uint8 CPU tensor owned by this thread until sent back.
                let bytes =
                    unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut u8, t.numel()) };
                rng.fill_bytes(bytes);
                if full_tx.send(t).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            full: Some(full_rx),
            empty: Some(empty_tx),
            worker: Some(worker),
        })
    }

    /// The next filled buffer (blocks while the producer is behind: that is the data wait).
    pub fn next(&self) -> Tensor {
        self.full
            .as_ref()
            .expect("open")
            .recv()
            .expect("producer thread alive")
    }

    /// Gives a buffer back for refilling once the device no longer reads it.
    pub fn recycle(&self, t: Tensor) {
        let _ = self.empty.as_ref().expect("open").send(t);
    }
}

impl Drop for HostBatches {
    fn drop(&mut self) {
        // Closing both channels stops the producer wherever it waits.
        self.empty.take();
        self.full.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
