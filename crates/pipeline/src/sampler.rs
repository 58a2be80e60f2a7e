//! Sample order per epoch and per rank, with `torch.utils.data.DistributedSampler` semantics
//! minus its padding: the epoch's permutation depends only on (seed, epoch); rank `r` of `W`
//! takes positions `r, r + W, r + 2W, …` of it. Every sample thus goes to exactly one rank per
//! epoch (no duplicated padding samples, which would skew evaluation). When ranks must run the
//! same number of steps (training), [`Sampler::indices`] with `equal_split` truncates every rank
//! to `len / W` samples, like DistributedSampler's `drop_last=True`.
//!
//! Repeated augmentation (`reps > 1`, torchvision's `RASampler`, timm's `RepeatAugSampler`):
//! each entry of the permutation is repeated `reps` times in a row before the split, so the
//! copies of an image go to consecutive ranks (with `reps = 4` and 2 ranks, two on each) and an
//! epoch of the same length shows about `len / reps` distinct images, each `reps` times. Each
//! copy is a distinct *key*: position `p` of the repeated list is copy `c = p % reps` of image
//! `i = perm[p / reps]`, key `c * len + i`. The loader reads dataset index `key % len` and seeds
//! the sample's augmentation with the key, so the copies are augmented differently; with
//! `reps = 1` keys are the dataset indices. Unlike `RASampler`, which keeps the first
//! `len // 256 * 256 / W` positions of each rank, every rank keeps `len / W`, as without
//! repetition.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampler {
    pub len: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub rank: usize,
    pub world_size: usize,
    /// Copies of each image per epoch (repeated augmentation); 1: none.
    pub reps: usize,
}

impl Sampler {
    /// This rank's dataset indices for `epoch`, in the order they are to be loaded.
    pub fn indices(&self, epoch: u64, equal_split: bool) -> Vec<usize> {
        let mut keys = self.keys(epoch, equal_split);
        keys.iter_mut().for_each(|k| *k %= self.len.max(1));
        keys
    }

    /// This rank's sample keys for `epoch` (see the module's documentation), in order: the
    /// dataset index is `key % len`; with `reps == 1`, the key.
    pub fn keys(&self, epoch: u64, equal_split: bool) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            order.shuffle(&mut rng_for(self.seed, epoch, u64::MAX, b"shuffle!"));
        }
        let (world, reps) = (self.world_size.max(1), self.reps.max(1));
        let mut mine: Vec<usize> = (self.rank..self.len * reps)
            .step_by(world)
            .map(|p| p % reps * self.len + order[p / reps])
            .collect();
        if equal_split {
            mine.truncate(self.len / world);
        }
        mine
    }
}

/// A ChaCha8 stream keyed by (seed, epoch, index, purpose): independent of thread count,
/// rank and world size. ChaCha is a PRF, so structured keys are fine.
pub fn rng_for(seed: u64, epoch: u64, index: u64, purpose: &[u8; 8]) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..24].copy_from_slice(&index.to_le_bytes());
    key[24..].copy_from_slice(purpose);
    ChaCha8Rng::from_seed(key)
}

/// The RNG driving the augmentation of the sample with `key` (its dataset index, without
/// repeated augmentation) in `epoch`.
pub fn sample_rng(seed: u64, epoch: u64, key: usize) -> ChaCha8Rng {
    rng_for(seed, epoch, key as u64, b"augment!")
}
