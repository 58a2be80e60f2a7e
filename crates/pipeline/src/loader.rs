//! The multi-threaded batch loader.
//!
//! Each worker thread claims whole batches (batch `k` = positions `k*B..(k+1)*B` of this rank's
//! epoch order), decodes and augments every sample straight into a pooled batch buffer, and sends
//! it back; the consumer re-orders batches, so output is identical for any worker count. A gate
//! lets workers run at most `prefetch` batches ahead of the consumer (backpressure), and dropping
//! the epoch iterator stops and joins the workers.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Result};

use crate::sampler::{sample_rng, Sampler};
use crate::source::Dataset;
use crate::transform::{Augmenter, Transform};

/// What to do with an image that cannot be decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
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
    /// Shuffle each epoch (training); otherwise dataset order (evaluation).
    pub shuffle: bool,
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    /// Drop the last partial batch and give every rank the same number of batches (training).
    /// With `false` (evaluation) every sample is loaded exactly once across ranks.
    pub drop_last: bool,
    /// Batches decoded ahead of the consumer.
    pub prefetch: usize,
    pub on_bad_image: BadImagePolicy,
    /// Decode at 1/2, 1/4, 1/8 scale in the DCT domain when the crop is shrunk that much anyway.
    pub dct_scaling: bool,
}

impl LoaderConfig {
    /// Training defaults: RandomResizedCrop(224) + flip, shuffled, drop_last.
    pub fn train(batch_size: usize, workers: usize) -> LoaderConfig {
        LoaderConfig {
            batch_size,
            workers,
            transform: Transform::train(224),
            shuffle: true,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: true,
            prefetch: 2 * workers.max(1),
            on_bad_image: BadImagePolicy::Skip,
            dct_scaling: true,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct Buffers {
    data: Vec<u8>,
    labels: Vec<i64>,
    indices: Vec<usize>,
}

/// Recycled batch buffers: in steady state no batch allocates.
struct Pool {
    free: Mutex<Vec<Buffers>>,
    keep: usize,
}

impl Pool {
    fn take(&self, bytes: usize, batch: usize) -> Buffers {
        let mut b = lock(&self.free).pop().unwrap_or_default();
        if b.data.len() != bytes {
            b.data.resize(bytes, 0);
        }
        b.labels.clear();
        b.labels.reserve(batch);
        b.indices.clear();
        b.indices.reserve(batch);
        b
    }

    fn put(&self, b: Buffers) {
        let mut free = lock(&self.free);
        if free.len() < self.keep {
            free.push(b);
        }
    }
}

/// One batch: `n` images of `h x w x 3` bytes (NHWC, uint8, RGB) and their labels. Derefs to
/// the pixel bytes; the buffers go back to the loader's pool when dropped.
pub struct Batch {
    bufs: Option<Buffers>,
    n: usize,
    size: usize,
    index: usize,
    pool: Arc<Pool>,
}

impl Batch {
    /// Number of images (the batch size, less skipped bad images, or the last partial batch).
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn h(&self) -> usize {
        self.size
    }
    pub fn w(&self) -> usize {
        self.size
    }
    /// NHWC shape `[n, h, w, 3]`.
    pub fn shape(&self) -> [usize; 4] {
        [self.n, self.size, self.size, 3]
    }
    /// Class index of each image.
    pub fn labels(&self) -> &[i64] {
        &self.bufs.as_ref().expect("live batch").labels
    }
    /// Dataset index of each image (for debugging and resumption checks).
    pub fn indices(&self) -> &[usize] {
        &self.bufs.as_ref().expect("live batch").indices
    }
    /// Position of this batch in the epoch.
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn pixels(&self) -> &[u8] {
        &self.bufs.as_ref().expect("live batch").data[..self.n * self.size * self.size * 3]
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
        if let Some(b) = self.bufs.take() {
            self.pool.put(b);
        }
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

/// Loads batches from a [`Dataset`] according to a [`LoaderConfig`].
pub struct Loader {
    dataset: Dataset,
    config: LoaderConfig,
    counters: Arc<Counters>,
    pool: Arc<Pool>,
}

impl Loader {
    pub fn new(dataset: Dataset, config: LoaderConfig) -> Result<Loader> {
        ensure!(config.batch_size > 0, "batch size must be positive");
        ensure!(config.workers > 0, "need at least one worker");
        ensure!(
            config.world_size > 0 && config.rank < config.world_size,
            "rank {} out of range for world size {}",
            config.rank,
            config.world_size
        );
        config.transform.validate()?;
        let pool = Arc::new(Pool {
            free: Mutex::new(Vec::new()),
            keep: config.prefetch.max(1) + config.workers + 2,
        });
        Ok(Loader {
            dataset,
            config,
            counters: Arc::default(),
            pool,
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
            bad_examples: lock(&c.bad_examples).clone(),
        }
    }

    /// Iterate over `epoch`'s batches, starting at batch `start_batch` (to resume a run).
    /// Workers start immediately; dropping the iterator stops them.
    pub fn epoch(&self, epoch: u64, start_batch: usize) -> Epoch {
        let mut indices = self.sampler().indices(epoch, self.config.drop_last);
        let end = self.batches_per_epoch();
        indices.truncate(if self.config.drop_last {
            end * self.config.batch_size
        } else {
            indices.len()
        });
        let start = start_batch.min(end);
        let (tx, rx) = channel();
        let ctx = Arc::new(EpochCtx {
            dataset: self.dataset.clone(),
            config: self.config.clone(),
            epoch,
            indices,
            end,
            gate: Mutex::new(GateState {
                next_claim: start,
                next_yield: start,
                stop: false,
            }),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            counters: self.counters.clone(),
            pool: self.pool.clone(),
        });
        let mut threads = Vec::new();
        let mut spawn_error = None;
        for i in 0..self.config.workers.min(end - start).max(1) {
            let (ctx, tx) = (ctx.clone(), tx.clone());
            match std::thread::Builder::new()
                .name(format!("rn50-loader-{i}"))
                .spawn(move || worker(ctx, tx))
            {
                Ok(t) => threads.push(t),
                Err(e) => {
                    spawn_error = Some(anyhow!("cannot start loader thread: {e}"));
                    break;
                }
            }
        }
        let mut it = Epoch {
            ctx,
            rx,
            pending: BTreeMap::new(),
            next: start,
            threads,
            pre_error: spawn_error,
            done: false,
        };
        if it.pre_error.is_some() {
            it.shutdown();
        }
        it
    }
}

struct GateState {
    next_claim: usize,
    next_yield: usize,
    stop: bool,
}

struct EpochCtx {
    dataset: Dataset,
    config: LoaderConfig,
    epoch: u64,
    indices: Vec<usize>,
    end: usize,
    gate: Mutex<GateState>,
    cv: Condvar,
    stop: AtomicBool,
    counters: Arc<Counters>,
    pool: Arc<Pool>,
}

impl EpochCtx {
    /// Next batch for a worker, waiting while it would run more than `prefetch` ahead.
    fn claim(&self) -> Option<usize> {
        let mut g = lock(&self.gate);
        loop {
            if g.stop || g.next_claim >= self.end {
                return None;
            }
            if g.next_claim < g.next_yield + self.config.prefetch.max(1) {
                g.next_claim += 1;
                return Some(g.next_claim - 1);
            }
            g = self.cv.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn bad(&self, name: String, err: &anyhow::Error) {
        self.counters.bad_images.fetch_add(1, Ordering::Relaxed);
        let mut ex = lock(&self.counters.bad_examples);
        if ex.len() < MAX_BAD_EXAMPLES {
            ex.push(format!("{name}: {err:#}"));
        }
    }
}

struct Filled {
    bufs: Buffers,
    n: usize,
}

type Msg = (usize, Result<Filled>);

fn worker(ctx: Arc<EpochCtx>, tx: Sender<Msg>) {
    let mut aug: Option<Augmenter> = None;
    let mut read_buf = Vec::new();
    while let Some(k) = ctx.claim() {
        // Any panic while filling the batch becomes an error for that batch, so the consumer
        // (waiting for batch k in order) can never hang on a dead worker.
        let r = catch_unwind(AssertUnwindSafe(|| fill(&ctx, k, &mut aug, &mut read_buf)))
            .unwrap_or_else(|p| {
                aug = None;
                Err(anyhow!("loader worker panicked: {}", panic_message(&p)))
            });
        match r {
            Ok(None) => return, // stopped
            Ok(Some(f)) => {
                if tx.send((k, Ok(f))).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send((k, Err(e)));
                return;
            }
        }
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Decode batch `k`; `Ok(None)` if the epoch was stopped meanwhile.
fn fill(
    ctx: &EpochCtx,
    k: usize,
    aug: &mut Option<Augmenter>,
    read_buf: &mut Vec<u8>,
) -> Result<Option<Filled>> {
    let cfg = &ctx.config;
    let size = cfg.transform.output_size();
    let per = size * size * 3;
    if aug.is_none() {
        *aug = Some(Augmenter::new(cfg.transform.clone(), cfg.dct_scaling)?);
    }
    let mut bufs = ctx.pool.take(cfg.batch_size * per, cfg.batch_size);
    let lo = k * cfg.batch_size;
    let hi = (lo + cfg.batch_size).min(ctx.indices.len());
    let mut n = 0;
    for &idx in &ctx.indices[lo..hi] {
        if ctx.stop.load(Ordering::Relaxed) {
            ctx.pool.put(bufs);
            return Ok(None);
        }
        let t0 = Instant::now();
        let bytes = match ctx.dataset.read(idx, read_buf) {
            Ok(b) => b,
            Err(e) => {
                bad_sample(ctx, idx, e)?;
                continue;
            }
        };
        let t1 = Instant::now();
        let mut rng = sample_rng(cfg.seed, ctx.epoch, idx);
        let slot = &mut bufs.data[n * per..(n + 1) * per];
        let a = aug.as_mut().expect("augmenter initialised above");
        // Decoders see untrusted bytes: contain a panic to this one sample.
        let res = catch_unwind(AssertUnwindSafe(|| a.apply(bytes, &mut rng, slot)));
        let c = &ctx.counters;
        c.read_ns
            .fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
        match res {
            Ok(Ok(applied)) => {
                c.decode_ns
                    .fetch_add(applied.decode_time.as_nanos() as u64, Ordering::Relaxed);
                c.augment_ns
                    .fetch_add(applied.augment_time.as_nanos() as u64, Ordering::Relaxed);
                c.images.fetch_add(1, Ordering::Relaxed);
                bufs.labels.push(ctx.dataset.label(idx));
                bufs.indices.push(idx);
                n += 1;
            }
            Ok(Err(e)) => bad_sample(ctx, idx, e.into())?,
            Err(p) => {
                *aug = Some(Augmenter::new(cfg.transform.clone(), cfg.dct_scaling)?);
                bad_sample(ctx, idx, anyhow!("decoder panicked: {}", panic_message(&p)))?
            }
        }
    }
    Ok(Some(Filled { bufs, n }))
}

fn bad_sample(ctx: &EpochCtx, idx: usize, err: anyhow::Error) -> Result<()> {
    let name = ctx.dataset.name(idx);
    ctx.bad(name.clone(), &err);
    match ctx.config.on_bad_image {
        BadImagePolicy::Skip => Ok(()),
        BadImagePolicy::Fail => Err(err.context(format!("bad image {name}"))),
    }
}

/// Iterator over one epoch's batches (in order). Dropping it stops the workers.
pub struct Epoch {
    ctx: Arc<EpochCtx>,
    rx: Receiver<Msg>,
    pending: BTreeMap<usize, Result<Filled>>,
    next: usize,
    threads: Vec<JoinHandle<()>>,
    pre_error: Option<anyhow::Error>,
    done: bool,
}

impl Epoch {
    /// Batches not yet yielded.
    pub fn remaining(&self) -> usize {
        if self.done {
            0
        } else {
            self.ctx.end - self.next
        }
    }

    fn shutdown(&mut self) {
        self.ctx.stop.store(true, Ordering::Relaxed);
        lock(&self.ctx.gate).stop = true;
        self.ctx.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if let Some(e) = self.pre_error.take() {
            self.done = true;
            return Some(Err(e));
        }
        if self.done || self.next >= self.ctx.end {
            return None;
        }
        let msg = loop {
            if let Some(m) = self.pending.remove(&self.next) {
                break m;
            }
            match self.rx.recv() {
                Ok((k, m)) => {
                    self.pending.insert(k, m);
                }
                Err(_) => {
                    self.done = true;
                    return Some(Err(anyhow!("loader workers exited unexpectedly")));
                }
            }
        };
        let index = self.next;
        self.next += 1;
        lock(&self.ctx.gate).next_yield = self.next;
        self.ctx.cv.notify_all();
        match msg {
            Ok(f) => Some(Ok(Batch {
                bufs: Some(f.bufs),
                n: f.n,
                size: self.ctx.config.transform.output_size(),
                index,
                pool: self.ctx.pool.clone(),
            })),
            Err(e) => {
                self.done = true;
                self.shutdown();
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
        self.shutdown();
    }
}
