//! The rn50 input pipeline: JPEG → augmented uint8 NHWC batches, in pure Rust (no libtorch).
//!
//! # Trainer interface
//!
//! ```no_run
//! use rn50_pipeline::{Dataset, Loader, LoaderConfig, Policy, TrainAugment, Transform};
//!
//! # fn main() -> anyhow::Result<()> {
//! // A folder (root/<class>/<image>), a shard directory or one shard file: auto-detected.
//! let train = Dataset::open("/data/imagenet/train")?;
//! assert_eq!(train.classes().len(), 1000);
//! let config = LoaderConfig {
//!     transform: Transform::train(176), // progressive resizing: any size
//!     augment: TrainAugment {
//!         auto_augment: Some(Policy::trivial_augment_wide()), // or Policy::rand_augment(9)
//!         random_erase: 0.1, // RandomErasing's p: boxes drawn, erased on the device
//!     },
//!     ra_reps: 4, // repeated augmentation (RASampler): each image 4 times an epoch
//!     seed: 42,
//!     rank: 0,
//!     world_size: 1,
//!     ..LoaderConfig::train(256, 8) // batch size, decode threads
//! };
//! let loader = Loader::new(train, config)?;
//! // Each epoch is queued as the one before it is handed out: no wait at epoch boundaries.
//! for epoch in loader.epochs(0, 0).take(90) {
//!     for batch in epoch {
//!         let batch = batch?; // a bad image is skipped and counted, or an error (on_bad_image)
//!         let [n, h, w, c] = batch.shape(); // NHWC, c == 3, uint8 RGB
//!         let pixels: &[u8] = &batch; // n*h*w*3 bytes, contiguous
//!         let labels: &[i64] = batch.labels(); // n class indices
//!         for (i, erase) in batch.erased().iter().enumerate() {
//!             // Some(Erase { top, left, height, width }): zero those pixels of image i on the
//!             // device *after* normalizing (torchvision erases to 0 after Normalize)
//!             # let _ = (i, erase);
//!         }
//!         # let _ = (n, h, w, c, pixels, labels);
//!         // copy to the device, normalize there; dropping `batch` recycles its buffer
//!     }
//! }
//! println!("bad images so far: {}", loader.stats().bad_images);
//! # Ok(()) }
//! ```
//!
//! * Determinism: sample order depends on (seed, epoch) and each sample's augmentation on
//!   (seed, epoch, key) only, so batches are identical for any worker count. The key is the
//!   dataset index, or with repeated augmentation `copy * len + index` (see [`sampler`]).
//! * Training augmentations ([`TrainAugment`], torchvision's recipe order): RandomResizedCrop (or
//!   RandomCrop), the flip, the auto-augment policy on the output image, then a random-erasing
//!   box that [`Batch::erased`] reports and the consumer zeroes after normalization.
//! * Repeated augmentation (`ra_reps`, torchvision's RASampler): each image of the permutation
//!   `ra_reps` times in a row, copies spread over ranks, each copy augmented differently; an
//!   epoch keeps its length. Training only (refused without `shuffle` and `drop_last`).
//! * Resuming: `loader.epoch(epoch, start_batch)` (or `epochs(epoch, start_batch)`) skips the
//!   first `start_batch` batches.
//! * Across epochs: the worker threads belong to the loader and work through the epochs queued
//!   on them in order (`epoch`, `batches`, `epochs`; [`Loader::share_workers`] puts an evaluation
//!   pass in the same line), at most `prefetch` batches open ahead of the consumers in all.
//! * Distributed: rank r of W gets positions r, r+W, … of the epoch permutation; with
//!   `drop_last` (training) all ranks get `len / W` samples and the same number of batches;
//!   without it (evaluation, [`LoaderConfig::val`]) every sample is loaded exactly once.
//! * Dropping an [`Epoch`] mid-way cancels the rest of it; the threads stop with the loader.
//! * Normalization (ImageNet mean/std) is left to the device: hosts move uint8.
//!
//! Shared helpers: [`decode::decode_rgb`] (any supported bytes → RGB8) and
//! [`decode::encode_jpeg`]; [`synthetic`] makes ImageNet-sized JPEGs for benchmarks;
//! [`autoaugment`] has TrivialAugmentWide and RandAugment on RGB8 images, as torchvision computes
//! them on uint8 tensors.

pub mod autoaugment;
mod bench;
pub mod cli;
pub mod crop;
pub mod decode;
pub mod imagenet;
mod loader;
pub mod pack;
pub mod sampler;
pub mod source;
pub mod synthetic;
pub mod transform;

pub use autoaugment::{AutoAugment, Draw, Op, OpKind, Policy};
pub use loader::{BadImagePolicy, Batch, Epoch, Epochs, Loader, LoaderConfig, Stats};
pub use source::Dataset;
pub use transform::{Erase, TrainAugment, Transform};
