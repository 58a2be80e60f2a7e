//! The multi-threaded batch loader.
//!
//! A [`Loader`] owns worker threads that live across epochs. [`Loader::epoch`] queues one epoch
//! (this rank's batches of it, in order) behind the epochs already queued on those threads and
//! returns its iterator. Workers take single samples in queue order, each decoded and augmented
//! straight into its slot of a pooled batch buffer: all of them help finish the oldest batch, and
//! the output is identical for any worker count. The epochs queued on the threads share one
//! window: a batch is started only while fewer than `prefetch` batches are open (being decoded, or
//! decoded and not yet taken) in all of them together, the oldest epoch first. When an epoch has
//! nothing left to hand out, the workers go on to the next one in the queue as the consumers take
//! batches and free room. So an epoch queued before the current one ends (see [`Loader::epochs`],
//! and [`Loader::share_workers`] for an evaluation pass queued between two epochs) has its first
//! batches decoded while the current one's last batches are consumed, and the batches held ahead
//! are one window however many epochs are queued. The one exception: a consumer waiting for a
//! batch not yet started always gets it started, so epochs taken out of queue order still make
//! progress. So at most the largest `prefetch` of the loaders on the threads, plus one batch per
//! consumer waiting, are open; the buffers are recycled through one pool for all those loaders.
//! Dropping an [`Epoch`] cancels what is left of it; the threads stop when the loader and its
//! epochs are all dropped.

use std::collections::BTreeMap;
use std::ops::{Deref, Range};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use clap::ValueEnum;
use rn50_util::{lock_unpoisoned, unpoisoned};

use crate::decode::MAX_IMAGE_PIXELS;
use crate::sampler::{sample_rng, Sampler};
use crate::source::Dataset;
use crate::transform::{Applied, Augmenter, Erase, TrainAugment, Transform};

/// What to do with an image that cannot be decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum BadImagePolicy {
    /// Leave the image out (its batch is one shorter) and count it.
    #[default]
    Skip,
    /// Stop with an error naming the file.
    Fail,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LoaderConfig {
    pub batch_size: usize,
    /// Decode threads.
    pub workers: usize,
    pub transform: Transform,
    /// The recipe's augmentations after the training transform's crop and flip (none by
    /// default; refused with an evaluation transform).
    pub augment: TrainAugment,
    /// Repeated augmentation: each image of the epoch's permutation `ra_reps` times in a row, the
    /// copies spread over the ranks and augmented differently ([`crate::sampler`] has the
    /// details). 1: none. Only for training (needs `shuffle` and `drop_last`).
    pub ra_reps: usize,
    /// Shuffle each epoch (training); otherwise dataset order (evaluation).
    pub shuffle: bool,
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    /// Drop the last partial batch and give every rank the same number of batches (training).
    /// With `false` (evaluation) every sample is loaded exactly once across ranks.
    pub drop_last: bool,
    /// Batches decoded or being decoded ahead of the consumers, all epochs queued on the same
    /// threads together (an evaluation pass and the next epoch share the window of the epoch
    /// before them; see the module's documentation for the exact bound).
    pub prefetch: usize,
    pub on_bad_image: BadImagePolicy,
    /// Decode at 1/2, 1/4, 1/8 scale in the DCT domain when the crop is shrunk that much anyway: faster, not
    /// torchvision's pixels, and measurably less accurate at small sizes (docs/imagenette.md). Off by default.
    pub dct_scaling: bool,
    /// An image with more pixels is a bad image, refused from its header (default: Pillow's
    /// `MAX_IMAGE_PIXELS`, a guard against decompression bombs).
    pub max_image_pixels: u64,
}

impl LoaderConfig {
    /// Training defaults: RandomResizedCrop(224) + flip, shuffled, drop_last.
    pub fn train(batch_size: usize, workers: usize) -> LoaderConfig {
        LoaderConfig {
            batch_size,
            workers,
            transform: Transform::train(224),
            augment: TrainAugment::default(),
            ra_reps: 1,
            shuffle: true,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: true,
            prefetch: 2 * workers.max(1),
            on_bad_image: BadImagePolicy::Skip,
            dct_scaling: false,
            max_image_pixels: MAX_IMAGE_PIXELS,
        }
    }

    /// Evaluation defaults: Resize(256) + CenterCrop(224), dataset order, every sample once.
    pub fn val(batch_size: usize, workers: usize) -> LoaderConfig {
        LoaderConfig {
            transform: Transform::val(256, 224),
            shuffle: false,
            drop_last: false,
            ..LoaderConfig::train(batch_size, workers)
        }
    }

    /// Rejects configurations that would make no sense (or divide by zero), with the reason.
    /// [`Loader::new`] and [`Loader::share_workers`] call it.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.batch_size > 0, "batch size must be positive");
        ensure!(
            self.max_image_pixels > 0,
            "the image pixel limit must be positive"
        );
        ensure!(
            self.world_size > 0 && self.rank < self.world_size,
            "rank {} out of range for world size {}",
            self.rank,
            self.world_size
        );
        self.transform.validate()?;
        self.augment.validate()?;
        ensure!(
            self.transform.is_train() || self.augment.is_none(),
            "auto-augment and random erasing are for training transforms, not {:?}",
            self.transform
        );
        ensure!(self.ra_reps > 0, "ra_reps must be at least 1");
        ensure!(
            self.ra_reps == 1 || (self.shuffle && self.drop_last),
            "repeated augmentation (ra_reps {}) is for training: it needs shuffle and drop_last \
             (evaluation loads each sample once)",
            self.ra_reps
        );
        Ok(())
    }
}

/// Cumulative counters over all epochs of a [`Loader`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Images decoded and augmented successfully.
    pub images: u64,
    /// Images skipped (or failed on) because they could not be read or decoded.
    pub bad_images: u64,
    /// Summed over workers: time reading bytes, decoding, resizing/flipping.
    pub read_time: Duration,
    pub decode_time: Duration,
    pub augment_time: Duration,
    /// The first few bad images with their errors.
    pub bad_examples: Vec<String>,
}

#[derive(Default)]
struct Counters {
    images: AtomicU64,
    bad_images: AtomicU64,
    read_ns: AtomicU64,
    decode_ns: AtomicU64,
    augment_ns: AtomicU64,
    bad_examples: Mutex<Vec<String>>,
}

const MAX_BAD_EXAMPLES: usize = 20;

/// Recycled pixel buffers, one pool for all the loaders sharing a set of threads (a train loader
/// and its evaluation loader reuse each other's buffers): in steady state no batch allocates.
#[derive(Default)]
struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Buffers kept: the largest window of the loaders on the threads, the batch a waiting
    /// consumer has started beyond it, and the batches a consumer holds (the one in use and the
    /// next).
    keep: AtomicUsize,
}

impl Pool {
    /// Keeps enough buffers for a loader with this `prefetch` too.
    fn serve(&self, prefetch: usize) {
        self.keep.fetch_max(prefetch.max(1) + 3, Ordering::Relaxed);
    }

    /// A buffer of `bytes`; a new one comes zeroed from the allocator (no pass over it here).
    fn take(&self, bytes: usize) -> Vec<u8> {
        let mut free = lock_unpoisoned(&self.free);
        match free.iter().position(|b| b.len() == bytes) {
            Some(i) => free.swap_remove(i),
            None => {
                // None of this size: a buffer of another size (another resolution or batch size)
                // is let go rather than kept beside the new one.
                free.pop();
                vec![0; bytes]
            }
        }
    }

    /// Allocates a buffer of `bytes` into the pool unless it has one; an error when memory runs out.
    fn reserve(&self, bytes: usize) -> Result<()> {
        let mut free = lock_unpoisoned(&self.free);
        if free.iter().any(|b| b.len() == bytes) {
            return Ok(());
        }
        let mut b = Vec::new();
        b.try_reserve_exact(bytes).map_err(|_| {
            anyhow!(
                "cannot allocate {:.1} GiB",
                bytes as f64 / (1u64 << 30) as f64
            )
        })?;
        b.resize(bytes, 0);
        free.push(b);
        Ok(())
    }

    fn put(&self, b: Vec<u8>) {
        let mut free = lock_unpoisoned(&self.free);
        if free.len() < self.keep.load(Ordering::Relaxed) {
            free.push(b);
        }
    }
}

/// One batch: `n` images of `h x w x 3` bytes (NHWC, uint8, RGB) and their labels. Derefs to
/// the pixel bytes; the buffer goes back to the loader's pool when dropped.
///
/// With random erasing ([`TrainAugment::random_erase`]), [`Batch::erased`] holds each image's
/// box: the consumer must set those pixels to 0 *after* normalizing (torchvision's recipe erases
/// after Normalize, to the mean colour, which no uint8 value represents).
pub struct Batch {
    data: Vec<u8>,
    labels: Vec<i64>,
    erased: Vec<Option<Erase>>,
    indices: Vec<usize>,
    skipped: usize,
    size: usize,
    index: usize,
    pool: Arc<Pool>,
}

impl Batch {
    /// Number of images (the batch size, less skipped bad images, or the last partial batch).
    pub fn n(&self) -> usize {
        self.labels.len()
    }
    pub fn h(&self) -> usize {
        self.size
    }
    pub fn w(&self) -> usize {
        self.size
    }
    /// NHWC shape `[n, h, w, 3]`.
    pub fn shape(&self) -> [usize; 4] {
        [self.n(), self.size, self.size, 3]
    }
    /// Class index of each image.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }
    /// Dataset index of each image (for debugging and resumption checks).
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
    /// Each image's random-erasing box, aligned with [`Batch::labels`] (all `None` without
    /// random erasing): to be zeroed after normalization.
    pub fn erased(&self) -> &[Option<Erase>] {
        &self.erased
    }
    /// Samples of this batch skipped as bad images (unreadable or undecodable).
    pub fn skipped(&self) -> usize {
        self.skipped
    }
    /// Position of this batch in the epoch.
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn pixels(&self) -> &[u8] {
        &self.data[..self.n() * self.size * self.size * 3]
    }
}

impl Deref for Batch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.pixels()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.pool.put(std::mem::take(&mut self.data));
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index)
            .field("shape", &self.shape())
            .finish()
    }
}

/// Loads batches from a [`Dataset`] according to a [`LoaderConfig`]. Clones share the workers,
/// buffers and counters.
#[derive(Clone)]
pub struct Loader {
    dataset: Dataset,
    config: LoaderConfig,
    counters: Arc<Counters>,
    pool: Arc<Pool>,
    workers: Arc<Workers>,
}

impl Loader {
    /// Starts `config.workers` threads, which wait for epochs to be queued.
    pub fn new(dataset: Dataset, config: LoaderConfig) -> Result<Loader> {
        ensure!(config.workers > 0, "need at least one worker");
        config.validate()?;
        let workers = Arc::new(Workers::spawn(config.workers)?);
        Loader::on(workers, dataset, config)
    }

    /// A loader for `dataset` and `config` whose epochs run on this loader's threads
    /// (`config.workers` is not used), queued in one line with this loader's: an evaluation pass
    /// queued behind a training epoch decodes as soon as that epoch's batches are all handed out.
    pub fn share_workers(&self, dataset: Dataset, config: LoaderConfig) -> Result<Loader> {
        config.validate()?;
        Loader::on(self.workers.clone(), dataset, config)
    }

    fn on(workers: Arc<Workers>, dataset: Dataset, config: LoaderConfig) -> Result<Loader> {
        workers.pool.serve(config.prefetch);
        // The first batch's buffer now, where running out of memory is an error: a loader thread that cannot
        // allocate one aborts the process.
        let s = config.transform.output_size();
        workers
            .pool
            .reserve(config.batch_size * s * s * 3)
            .with_context(|| {
                format!(
                    "no memory for one batch of {} images of {s}x{s}: lower the batch size",
                    config.batch_size
                )
            })?;
        Ok(Loader {
            dataset,
            config,
            counters: Arc::default(),
            pool: workers.pool.clone(),
            workers,
        })
    }

    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    fn sampler(&self) -> Sampler {
        Sampler {
            len: self.dataset.len(),
            shuffle: self.config.shuffle,
            seed: self.config.seed,
            rank: self.config.rank,
            world_size: self.config.world_size,
            reps: self.config.ra_reps,
        }
    }

    /// Samples this rank loads per epoch.
    pub fn samples_per_epoch(&self) -> usize {
        let (n, w, r) = (self.dataset.len(), self.config.world_size, self.config.rank);
        if self.config.drop_last {
            n / w
        } else {
            n / w + usize::from(r < n % w)
        }
    }

    /// Batches per epoch on this rank (the same on every rank when `drop_last`).
    pub fn batches_per_epoch(&self) -> usize {
        let s = self.samples_per_epoch();
        if self.config.drop_last {
            s / self.config.batch_size
        } else {
            s.div_ceil(self.config.batch_size)
        }
    }

    /// Counters accumulated over all epochs so far.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let ns = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        Stats {
            images: c.images.load(Ordering::Relaxed),
            bad_images: c.bad_images.load(Ordering::Relaxed),
            read_time: ns(&c.read_ns),
            decode_time: ns(&c.decode_ns),
            augment_time: ns(&c.augment_ns),
            bad_examples: lock_unpoisoned(&c.bad_examples).clone(),
        }
    }

    /// With [`BadImagePolicy::Fail`], an error naming the first bad image this loader met, in a
    /// batch taken or not. A consumer that stops before an epoch's end (a benchmark, a step limit,
    /// the last of [`Loader::epochs`]) leaves batches decoded ahead that it never takes, and a bad
    /// image in one of them was counted and never reported: "fail" must fail on any bad image
    /// seen. Call it once the epochs are dropped (dropping waits for the samples being decoded).
    /// Always `Ok` with [`BadImagePolicy::Skip`].
    pub fn check_bad_images(&self) -> Result<()> {
        if self.config.on_bad_image == BadImagePolicy::Skip {
            return Ok(());
        }
        let s = self.stats();
        match s.bad_examples.first() {
            None => Ok(()),
            Some(first) if s.bad_images > 1 => {
                Err(anyhow!("bad image {first} (and {} more)", s.bad_images - 1))
            }
            Some(first) => Err(anyhow!("bad image {first}")),
        }
    }

    /// Iterate over `epoch`'s batches, starting at batch `start_batch` (to resume a run).
    /// Queued behind the epochs already queued on the workers; dropping the iterator cancels it.
    pub fn epoch(&self, epoch: u64, start_batch: usize) -> Epoch {
        self.batches(epoch, start_batch..usize::MAX)
    }

    /// Batches `range` of `epoch` (clamped to the epoch), queued like [`Loader::epoch`]: for a
    /// consumer that takes fewer batches than the epoch has, so that nothing past them is decoded.
    pub fn batches(&self, epoch: u64, range: Range<usize>) -> Epoch {
        let b = self.config.batch_size;
        let end = range.end.min(self.batches_per_epoch());
        let start = range.start.min(end);
        let mut keys = self.sampler().keys(epoch, self.config.drop_last);
        keys.truncate(end * b);
        let job = Arc::new(Job {
            dataset: self.dataset.clone(),
            config: self.config.clone(),
            epoch,
            keys,
            counters: self.counters.clone(),
            pool: self.pool.clone(),
        });
        let shared = &self.workers.shared;
        let mut q = lock_unpoisoned(&shared.queue);
        let id = q.next_id;
        q.next_id += 1;
        q.epochs.push(Queued {
            id,
            job: job.clone(),
            next_sample: start * b,
            next_batch: start,
            open: BTreeMap::new(),
            in_flight: 0,
            cancelled: false,
            waiting: false,
        });
        drop(q);
        shared.work.notify_all();
        Epoch {
            workers: self.workers.clone(),
            job,
            id,
            next: start,
            end,
            done: false,
        }
    }

    /// Epochs `first, first + 1, …` (the first from batch `start_batch`), each queued when the one
    /// before it is handed out: the workers go on into the next epoch while the current one's last
    /// batches are consumed.
    pub fn epochs(&self, first: u64, start_batch: usize) -> Epochs {
        Epochs {
            next: self.epoch(first, start_batch),
            loader: self.clone(),
        }
    }
}

/// Endless iterator over a loader's epochs, the next one always queued (see [`Loader::epochs`]).
pub struct Epochs {
    loader: Loader,
    next: Epoch,
}

impl Iterator for Epochs {
    type Item = Epoch;

    fn next(&mut self) -> Option<Epoch> {
        let after = self.loader.epoch(self.next.epoch() + 1, 0);
        Some(std::mem::replace(&mut self.next, after))
    }
}

/// The threads and the queue of epochs they work through.
struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The batch buffers of every loader on these threads.
    pool: Arc<Pool>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Workers wait here for work: an epoch queued, a consumer taking a batch or waiting for one,
    /// an epoch leaving the queue (its batches no longer take room in the window), or the stop.
    work: Condvar,
    /// Consumers wait here for their next batch to be complete.
    done: Condvar,
}

#[derive(Default)]
struct Queue {
    /// In the order they are to be consumed.
    epochs: Vec<Queued>,
    next_id: u64,
    /// Worker threads still running.
    live: usize,
    stop: bool,
}

/// What the workers read of a queued epoch, without the lock.
struct Job {
    dataset: Dataset,
    config: LoaderConfig,
    epoch: u64,
    /// This rank's sample keys in order (see [`crate::sampler`]: the dataset index is `key %
    /// len`), up to the end of the last batch wanted.
    keys: Vec<usize>,
    counters: Arc<Counters>,
    pool: Arc<Pool>,
}

/// A queued epoch's progress (under the queue's lock).
struct Queued {
    id: u64,
    job: Arc<Job>,
    /// The next position of `job.keys` to hand out.
    next_sample: usize,
    /// The batch its consumer takes next.
    next_batch: usize,
    /// Batches with samples handed out and not yet taken by the consumer.
    open: BTreeMap<usize, Open>,
    /// Samples being decoded.
    in_flight: usize,
    cancelled: bool,
    /// Its consumer waits for batch `next_batch`: that batch may be started beyond the window.
    waiting: bool,
}

/// A batch being filled.
struct Open {
    data: Vec<u8>,
    /// Per position: decoded into its slot (else skipped as bad, or not finished).
    ok: Vec<bool>,
    /// Per position: the random-erasing box drawn for it.
    erase: Vec<Option<Erase>>,
    /// Samples not finished.
    todo: usize,
    /// The failure (on_bad_image = fail, or a panic) of the first sample that failed.
    error: Option<(usize, anyhow::Error)>,
}

/// One sample to decode into its slot of an open batch.
struct Task {
    id: u64,
    job: Arc<Job>,
    batch: usize,
    pos: usize,
    slot: *mut u8,
}

impl Workers {
    fn spawn(n: usize) -> Result<Workers> {
        let queue = Queue {
            live: n,
            ..Queue::default()
        };
        let mut workers = Workers {
            shared: Arc::new(Shared {
                queue: Mutex::new(queue),
                work: Condvar::new(),
                done: Condvar::new(),
            }),
            threads: Vec::new(),
            pool: Arc::default(),
        };
        for i in 0..n {
            let shared = workers.shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("rn50-loader-{i}"))
                .spawn(move || worker(&shared))
                .map_err(|e| anyhow!("cannot start loader thread: {e}"))?;
            workers.threads.push(t);
        }
        Ok(workers)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        lock_unpoisoned(&self.shared.queue).stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Job {
    fn image_bytes(&self) -> usize {
        let s = self.config.transform.output_size();
        s * s * 3
    }

    /// Positions of batch `k` in `keys`.
    fn span(&self, k: usize) -> Range<usize> {
        let b = self.config.batch_size;
        k * b..((k + 1) * b).min(self.keys.len())
    }

    /// The dataset index of the sample with `key`.
    fn index(&self, key: usize) -> usize {
        key % self.dataset.len()
    }

    /// Counts a bad sample; an error if it must fail the epoch.
    fn bad(&self, idx: usize, err: anyhow::Error) -> Result<Option<Applied>> {
        let name = self.dataset.name(idx);
        let c = &self.counters;
        c.bad_images.fetch_add(1, Ordering::Relaxed);
        let mut ex = lock_unpoisoned(&c.bad_examples);
        if ex.len() < MAX_BAD_EXAMPLES {
            ex.push(format!("{name}: {err:#}"));
        }
        match self.config.on_bad_image {
            BadImagePolicy::Skip => Ok(None),
            BadImagePolicy::Fail => Err(err.context(format!("bad image {name}"))),
        }
    }

    /// Batch `index` out of its finished buffer: the decoded samples moved together, in order.
    fn assemble(&self, index: usize, open: Open) -> Batch {
        let (per, mut data) = (self.image_bytes(), open.data);
        let (mut indices, mut erased) = (Vec::with_capacity(open.ok.len()), Vec::new());
        for (pos, &key) in self.keys[self.span(index)].iter().enumerate() {
            if open.ok[pos] {
                let n = indices.len();
                if n != pos {
                    data.copy_within(pos * per..(pos + 1) * per, n * per);
                }
                indices.push(self.index(key));
                erased.push(open.erase[pos]);
            }
        }
        Batch {
            data,
            labels: indices.iter().map(|&i| self.dataset.label(i)).collect(),
            erased,
            skipped: open.ok.len() - indices.len(),
            indices,
            size: self.config.transform.output_size(),
            index,
            pool: self.pool.clone(),
        }
    }
}

impl Queued {
    /// The next sample, if its batch is already open, or if `open` (the batches open in all
    /// queued epochs) leaves room in the window, or if the consumer waits for that batch.
    fn claim(&mut self, open: usize) -> Option<Task> {
        let job = &self.job;
        let k = self.next_sample / job.config.batch_size;
        if self.cancelled || self.next_sample >= job.keys.len() {
            return None;
        }
        let room = open < job.config.prefetch.max(1);
        let wanted = self.waiting && k == self.next_batch;
        if !self.open.contains_key(&k) && !room && !wanted {
            return None;
        }
        let (span, per) = (job.span(k), job.image_bytes());
        let open = self.open.entry(k).or_insert_with(|| Open {
            data: job.pool.take(job.config.batch_size * per),
            ok: vec![false; span.len()],
            erase: vec![None; span.len()],
            todo: span.len(),
            error: None,
        });
        let pos = self.next_sample - span.start;
        self.next_sample += 1;
        self.in_flight += 1;
        debug_assert!((pos + 1) * per <= open.data.len());
        Some(Task {
            id: self.id,
            job: job.clone(),
            batch: k,
            pos,
            // `as_mut_ptr`, not a slice: other slots of the buffer are being written meanwhile.
            slot: open.data.as_mut_ptr().wrapping_add(pos * per),
        })
    }

    /// Gives the buffers of batches never taken back to the pool.
    fn release(self) {
        for o in self.open.into_values() {
            self.job.pool.put(o.data);
        }
    }
}

impl Queue {
    /// A sample to decode, from the oldest epoch that has one within the shared window.
    fn claim(&mut self) -> Option<Task> {
        let open = self.epochs.iter().map(|e| e.open.len()).sum();
        self.epochs.iter_mut().find_map(|e| e.claim(open))
    }

    /// Records a finished sample; true if that completed its batch or a cancelled epoch's work.
    fn finish(&mut self, task: &Task, r: Result<Option<Applied>>) -> bool {
        let Some(i) = self.epochs.iter().position(|e| e.id == task.id) else {
            return false;
        };
        let e = &mut self.epochs[i];
        e.in_flight -= 1;
        if e.cancelled {
            let idle = e.in_flight == 0;
            if idle {
                self.epochs.remove(i).release();
            }
            return idle;
        }
        let open = e
            .open
            .get_mut(&task.batch)
            .expect("a claimed sample's batch is open");
        match r {
            Ok(applied) => {
                open.ok[task.pos] = applied.is_some();
                open.erase[task.pos] = applied.and_then(|a| a.erase);
            }
            Err(err) => {
                if open.error.as_ref().is_none_or(|(p, _)| task.pos < *p) {
                    open.error = Some((task.pos, err));
                }
            }
        }
        open.todo -= 1;
        open.todo == 0
    }

    /// Stops handing out samples of epoch `id`; it leaves the queue when none is being decoded.
    fn cancel(&mut self, id: u64) {
        if let Some(i) = self.epochs.iter().position(|e| e.id == id) {
            let e = &mut self.epochs[i];
            e.cancelled = true;
            if e.in_flight == 0 {
                self.epochs.remove(i).release();
            }
        }
    }
}

fn worker(shared: &Shared) {
    // However this thread ends, consumers waiting for its samples must hear of it.
    struct Exit<'a>(&'a Shared);
    impl Drop for Exit<'_> {
        fn drop(&mut self) {
            lock_unpoisoned(&self.0.queue).live -= 1;
            self.0.done.notify_all();
        }
    }
    let _exit = Exit(shared);
    let mut aug = None;
    let mut read_buf = Vec::new();
    let mut q = lock_unpoisoned(&shared.queue);
    while !q.stop {
        let Some(task) = q.claim() else {
            q = unpoisoned(shared.work.wait(q));
            continue;
        };
        drop(q);
        // Any panic becomes an error for the sample's batch, so its consumer never hangs.
        let r = catch_unwind(AssertUnwindSafe(|| task.run(&mut aug, &mut read_buf)))
            .unwrap_or_else(|p| {
                aug = None;
                Err(anyhow!("loader worker panicked: {}", panic_message(&p)))
            });
        q = lock_unpoisoned(&shared.queue);
        if q.finish(&task, r) {
            shared.done.notify_all();
            // A cancelled epoch that left the queue made room in the window.
            shared.work.notify_all();
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Task {
    /// Decodes the sample into its slot: what was applied when there, `None` when skipped as bad,
    /// an error when it fails the epoch. `aug` is the worker's, kept for the epoch `aug.0`.
    fn run(
        &self,
        aug: &mut Option<(u64, Augmenter)>,
        read_buf: &mut Vec<u8>,
    ) -> Result<Option<Applied>> {
        let (job, cfg) = (&*self.job, &self.job.config);
        if aug.as_ref().is_none_or(|(id, _)| *id != self.id) {
            let mut a = Augmenter::new(cfg.transform.clone(), cfg.dct_scaling)?;
            a.set_max_image_pixels(cfg.max_image_pixels);
            a.set_augment(&cfg.augment)?;
            *aug = Some((self.id, a));
        }
        let key = job.keys[job.span(self.batch).start + self.pos];
        let idx = job.index(key);
        // SAFETY: `slot` starts this sample's `image_bytes` in its open batch's buffer, which
        // holds the whole batch. The slot was handed to this task alone, and the buffer is not
        // moved, read or freed before every sample handed out for it has finished.
        let slot = unsafe { std::slice::from_raw_parts_mut(self.slot, job.image_bytes()) };
        let t0 = Instant::now();
        let bytes = match job.dataset.read(idx, read_buf) {
            Ok(b) => b,
            Err(e) => return job.bad(idx, e),
        };
        let c = &job.counters;
        c.read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut rng = sample_rng(cfg.seed, job.epoch, key);
        let a = &mut aug.as_mut().expect("made above").1;
        // Decoders see untrusted bytes: contain a panic to this one sample.
        match catch_unwind(AssertUnwindSafe(|| a.apply(bytes, &mut rng, slot))) {
            Ok(Ok(applied)) => {
                c.decode_ns
                    .fetch_add(applied.decode_time.as_nanos() as u64, Ordering::Relaxed);
                c.augment_ns
                    .fetch_add(applied.augment_time.as_nanos() as u64, Ordering::Relaxed);
                c.images.fetch_add(1, Ordering::Relaxed);
                Ok(Some(applied))
            }
            Ok(Err(e)) => job.bad(idx, e.into()),
            Err(p) => {
                *aug = None;
                job.bad(idx, anyhow!("decoder panicked: {}", panic_message(&p)))
            }
        }
    }
}

/// Iterator over one queued epoch's batches, in order. Dropping it cancels the rest.
pub struct Epoch {
    workers: Arc<Workers>,
    job: Arc<Job>,
    id: u64,
    next: usize,
    end: usize,
    done: bool,
}

impl Epoch {
    /// The epoch number (which seeds its order and augmentation).
    pub fn epoch(&self) -> u64 {
        self.job.epoch
    }

    /// Batches not yet yielded.
    pub fn remaining(&self) -> usize {
        if self.done {
            0
        } else {
            self.end - self.next
        }
    }

    /// Hands out no more of this epoch's samples and waits for those being decoded.
    fn cancel(&mut self) {
        self.done = true;
        let shared = &self.workers.shared;
        let mut q = lock_unpoisoned(&shared.queue);
        q.cancel(self.id);
        shared.work.notify_all();
        while q.live > 0 && q.epochs.iter().any(|e| e.id == self.id) {
            q = unpoisoned(shared.done.wait(q));
        }
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.done || self.next >= self.end {
            return None;
        }
        let shared = &self.workers.shared;
        let mut q = lock_unpoisoned(&shared.queue);
        let open = loop {
            let e = q
                .epochs
                .iter_mut()
                .find(|e| e.id == self.id)
                .expect("an epoch stays queued while its iterator lives");
            if e.open.get(&self.next).is_some_and(|o| o.todo == 0) {
                e.next_batch += 1;
                e.waiting = false;
                break e.open.remove(&self.next).expect("just seen");
            }
            if !e.waiting {
                // The batch may now start beyond the window: the workers must look again.
                e.waiting = true;
                shared.work.notify_all();
            }
            if q.live == 0 {
                drop(q);
                self.cancel();
                return Some(Err(anyhow!("loader workers exited unexpectedly")));
            }
            q = unpoisoned(shared.done.wait(q));
        };
        drop(q);
        shared.work.notify_all();
        let index = self.next;
        self.next += 1;
        match open.error {
            None => Some(Ok(self.job.assemble(index, open))),
            Some((_, e)) => {
                self.job.pool.put(open.data);
                self.cancel();
                Some(Err(e))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining()))
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.cancel();
    }
}
