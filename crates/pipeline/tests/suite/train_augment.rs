//! The recipe's training augmentations in the loader, against torchvision: auto-augment after
//! the crop and flip (pixels), random-erasing boxes (their distribution and probability), and
//! repeated augmentation (RASampler's placement of the copies, one augmentation per copy).

use crate::common;

use std::collections::HashMap;

use common::*;
use rand::SeedableRng;
use rn50_pipeline::autoaugment::Policy;
use rn50_pipeline::sampler::{sample_rng, Sampler};
use rn50_pipeline::transform::{random_erase, Augmenter, Erase, TrainAugment};
use rn50_pipeline::{Dataset, Loader, LoaderConfig, Transform};

const SIZE: usize = 48;

fn train(batch: usize, workers: usize, augment: TrainAugment, ra_reps: usize) -> LoaderConfig {
    LoaderConfig {
        transform: Transform::train(SIZE),
        augment,
        ra_reps,
        seed: 7,
        ..LoaderConfig::train(batch, workers)
    }
}

/// Each batch as (pixels per image, dataset indices, erase boxes).
type Run = Vec<(Vec<Vec<u8>>, Vec<usize>, Vec<Option<Erase>>)>;

fn collect(loader: &Loader, epoch: u64, start: usize) -> Run {
    loader
        .epoch(epoch, start)
        .map(|b| {
            let b = b.unwrap();
            assert_eq!(b.erased().len(), b.labels().len());
            let images = b.chunks(SIZE * SIZE * 3).map(<[u8]>::to_vec).collect();
            (images, b.indices().to_vec(), b.erased().to_vec())
        })
        .collect()
}

/// The 220 photos and one file that is no image, so that a batch skips it.
fn photos_and_a_bad_file(tmp: &std::path::Path) -> Dataset {
    let root = imagenet_folder(tmp);
    std::fs::create_dir(root.join("zz_bad")).unwrap();
    std::fs::write(root.join("zz_bad/text.JPEG"), "not an image").unwrap();
    Dataset::open(root).unwrap()
}

/// A loader with TrivialAugmentWide or RandAugment and random erasing gives, for every sample,
/// torchvision's ops (applied by `_apply_image_or_video_transform` one after the other) on the
/// RandomResizedCrop + flip output of the sample's RNG, with the ops and then the erase box drawn
/// from that RNG where the crop and flip left it. A skipped bad image takes its box with it.
#[test]
fn loader_applies_the_policy_to_the_crop_as_torchvision_and_draws_the_box_after() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = photos_and_a_bad_file(tmp.path());
    for policy in [Policy::trivial_augment_wide(), Policy::rand_augment(9)] {
        let augment = TrainAugment {
            auto_augment: Some(policy),
            random_erase: 0.5,
        };
        let cfg = train(16, 2, augment, 1);
        let run = collect(&Loader::new(ds.clone(), cfg.clone()).unwrap(), 0, 0);
        let (mut jobs, mut ours, mut boxes) = (Vec::new(), Vec::new(), 0);
        let mut crop = Augmenter::new(cfg.transform.clone(), cfg.dct_scaling).unwrap();
        let (mut draws, mut buf) = (Vec::new(), Vec::new());
        let mut kinds = std::collections::HashSet::new();
        for (images, indices, erased) in &run {
            for ((image, &idx), &erase) in images.iter().zip(indices).zip(erased) {
                let mut rng = sample_rng(cfg.seed, 0, idx);
                let mut cropped = vec![0u8; SIZE * SIZE * 3];
                let bytes = ds.read(idx, &mut buf).unwrap();
                crop.apply(bytes, &mut rng, &mut cropped).unwrap();
                policy.draw(SIZE, SIZE, &mut rng, &mut draws);
                assert_eq!(
                    erase,
                    random_erase(0.5, SIZE, SIZE, &mut rng),
                    "image {idx}"
                );
                boxes += usize::from(erase.is_some());
                let file = tmp.path().join(format!("{}.rgb", jobs.len()));
                std::fs::write(&file, &cropped).unwrap();
                let ops: Vec<_> = draws
                    .iter()
                    .map(|d| serde_json::json!([d.kind.name(), d.magnitude]))
                    .collect();
                kinds.extend(draws.iter().map(|d| d.kind));
                jobs.push(serde_json::json!({
                    "file": file.display().to_string(), "width": SIZE, "height": SIZE,
                    "ops": ops, "chain": true,
                }));
                ours.push(image);
            }
        }
        assert_eq!(
            ours.len(),
            13 * 16 - 1,
            "{policy:?}: the bad file, in this epoch, skipped"
        );
        assert_eq!(kinds.len(), 14, "{policy:?}: not every op drawn");
        assert!((60..150).contains(&boxes), "{boxes} of 207 images erased");
        let jobs_file = tmp.path().join("jobs.json");
        std::fs::write(&jobs_file, serde_json::to_string(&jobs).unwrap()).unwrap();
        let out = tmp
            .path()
            .join(format!("out-{}", policy.num_magnitude_bins()));
        reference("autoaugment", &out, &[jobs_file.display().to_string()]);
        for (n, image) in ours.iter().enumerate() {
            assert!(
                **image == reference_pixels(&out, n),
                "{policy:?}: sample {n} differs from torchvision"
            );
        }
    }
}

/// (top, left, height, width) per box, `None` where none was drawn.
type Boxes = Vec<Option<[f64; 4]>>;

fn torchvision_boxes(n: usize, p: f64, sizes: &[usize]) -> HashMap<usize, Boxes> {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec![n.to_string(), p.to_string()];
    args.extend(sizes.iter().map(usize::to_string));
    let manifest = reference("random_erasing", tmp.path(), &args);
    sizes
        .iter()
        .map(|&s| {
            let boxes = manifest[s.to_string()]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| {
                    let b = b.as_array()?;
                    Some(std::array::from_fn(|k| b[k].as_f64().unwrap()))
                })
                .collect();
            (s, boxes)
        })
        .collect()
}

fn our_boxes(n: usize, p: f64, size: usize, seed: u64) -> Boxes {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            random_erase(p, size, size, &mut rng)
                .map(|e| [e.top, e.left, e.height, e.width].map(|v| v as f64))
        })
        .collect()
}

/// Differences between two samples of boxes beyond chance: the share without a box (two-sample
/// binomial test, 5 standard deviations) and, among the boxes, the distributions of top, left,
/// height, width, area and aspect ratio (two-sample KS, α = 0.001).
fn box_differences(size: usize, ours: &Boxes, theirs: &Boxes) -> Vec<String> {
    let mut failures = Vec::new();
    let none = |b: &Boxes| b.iter().filter(|b| b.is_none()).count() as f64 / b.len() as f64;
    let (a, b) = (none(ours), none(theirs));
    let pooled =
        (a * ours.len() as f64 + b * theirs.len() as f64) / (ours.len() + theirs.len()) as f64;
    let sd =
        (pooled * (1.0 - pooled) * (1.0 / ours.len() as f64 + 1.0 / theirs.len() as f64)).sqrt();
    eprintln!("{size}: no box {a:.4} (torchvision {b:.4})");
    if (a - b).abs() > 5.0 * sd.max(1e-9) {
        failures.push(format!(
            "{size}: no box in {a:.4} of ours, {b:.4} of torchvision's"
        ));
    }
    let found = |b: &Boxes| b.iter().flatten().copied().collect::<Vec<[f64; 4]>>();
    let (ours, theirs) = (found(ours), found(theirs));
    type Feature = (&'static str, fn(&[f64; 4]) -> f64);
    let features: [Feature; 6] = [
        ("top", |b| b[0]),
        ("left", |b| b[1]),
        ("height", |b| b[2]),
        ("width", |b| b[3]),
        ("area", |b| b[2] * b[3]),
        ("aspect", |b| (b[2] + 0.5) / (b[3] + 0.5)),
    ];
    let crit = ks_critical(ours.len(), theirs.len());
    for (name, f) in features {
        let mean = |v: &[[f64; 4]]| v.iter().map(f).sum::<f64>() / v.len() as f64;
        let d = ks(ours.iter().map(f).collect(), theirs.iter().map(f).collect());
        eprintln!(
            "{size}: {name} mean {:.3} (torchvision {:.3}), KS {d:.4} (critical {crit:.4})",
            mean(&ours),
            mean(&theirs)
        );
        if d >= crit {
            failures.push(format!("{size}: {name} distribution differs (KS {d:.4})"));
        }
    }
    failures
}

/// 20,000 boxes each from ours and from torchvision's own `RandomErasing(p=1)` forward, on square
/// images of 224, 32, 7, 2 and 1 pixels (where sides round to 0, and most tries do not fit).
#[test]
fn erase_boxes_follow_torchvision_distribution() {
    const N: usize = 20_000;
    let sizes = [224, 32, 7, 2, 1];
    let theirs = torchvision_boxes(N, 1.0, &sizes);
    let mut failures = Vec::new();
    for (k, &size) in sizes.iter().enumerate() {
        failures.extend(box_differences(
            size,
            &our_boxes(N, 1.0, size, k as u64),
            &theirs[&size],
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// With p = 0.3, a box in 30% of the images (less the rare 10 failed tries), as torchvision.
#[test]
fn erase_probability_is_honoured() {
    const N: usize = 20_000;
    let theirs = &torchvision_boxes(N, 0.3, &[224])[&224];
    let ours = our_boxes(N, 0.3, 224, 9);
    let failures = box_differences(224, &ours, theirs);
    assert!(failures.is_empty(), "{failures:#?}");
    let erased = ours.iter().flatten().count() as f64 / N as f64;
    let sd = (0.3f64 * 0.7 / N as f64).sqrt();
    assert!((erased - 0.3).abs() < 5.0 * sd, "{erased} erased");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    assert!((0..1000).all(|_| random_erase(0.0, 224, 224, &mut rng).is_none()));
}

/// Our rank lists with repetition, against torchvision's `RASampler` index arithmetic applied to
/// our epoch permutation: the same dataset indices on every rank, up to our per-rank length
/// `len / W`; and every key (copy) at most once over the ranks.
#[test]
fn repeated_augmentation_places_copies_as_ra_sampler() {
    let len = 220;
    let tmp = tempfile::tempdir().unwrap();
    for reps in [2, 3, 4] {
        for world in [1, 2, 3] {
            for epoch in [0, 5] {
                let sampler = |rank, world_size, reps| Sampler {
                    len,
                    shuffle: true,
                    seed: 4,
                    rank,
                    world_size,
                    reps,
                };
                let perm = sampler(0, 1, 1).indices(epoch, false);
                let mut args = vec![reps.to_string(), world.to_string(), len.to_string()];
                args.extend(perm.iter().map(usize::to_string));
                let out = tmp.path().join(format!("{reps}-{world}-{epoch}"));
                let manifest = reference("ra_sampler", &out, &args);
                let mut keys = std::collections::HashSet::new();
                for rank in 0..world {
                    let s = sampler(rank, world, reps);
                    let theirs: Vec<usize> = manifest[rank]["indices"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as usize)
                        .collect();
                    let ours = s.indices(epoch, true);
                    assert_eq!(ours.len(), len / world);
                    assert_eq!(
                        ours,
                        theirs[..len / world],
                        "reps {reps} rank {rank}/{world}"
                    );
                    for (k, i) in s.keys(epoch, true).into_iter().zip(ours) {
                        assert_eq!(k % len, i);
                        assert!(keys.insert(k), "key {k} twice");
                    }
                }
            }
        }
    }
}

/// The loader with `ra_reps` 3 over 1, 2 and 3 ranks: over the ranks, an epoch has each image of
/// the first `W * (len / W)` positions of the repeated permutation as often as its copies lie
/// there (`reps` times, but for one cut at the end), the copies of a photo all augmented
/// differently; a resumed epoch is the tail of the full one.
#[test]
fn repeated_augmentation_loads_every_copy_with_its_own_augmentation() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let (len, reps, epoch) = (ds.len(), 3, 1);
    let perm = Sampler {
        len,
        shuffle: true,
        seed: 7,
        rank: 0,
        world_size: 1,
        reps: 1,
    }
    .indices(epoch, false);
    for world in [1, 2, 3] {
        let mut copies: HashMap<usize, Vec<Vec<u8>>> = HashMap::new();
        for rank in 0..world {
            let cfg = LoaderConfig {
                rank,
                world_size: world,
                ..train(8, 2, TrainAugment::default(), reps)
            };
            let loader = Loader::new(ds.clone(), cfg).unwrap();
            assert_eq!(loader.samples_per_epoch(), len / world);
            let run = collect(&loader, epoch, 0);
            assert!(
                collect(&loader, epoch, 5) == run[5..],
                "resumed epoch differs"
            );
            for (images, indices, _) in run {
                for (image, i) in images.into_iter().zip(indices) {
                    copies.entry(i).or_default().push(image);
                }
            }
        }
        // Positions loaded: the first `len / W` of each rank, i.e. the first `W * (len / W)`
        // less those cut from the ranks' last partial batches.
        let loaded = world * (len / world / 8 * 8);
        for (j, &i) in perm.iter().enumerate() {
            let expected = (j * reps..(j + 1) * reps).filter(|&p| p < loaded).count();
            let got = copies.get(&i).map_or(0, Vec::len);
            assert_eq!(got, expected, "world {world}: image {i} at {j}");
        }
        for (i, images) in &copies {
            for a in 0..images.len() {
                for b in a + 1..images.len() {
                    assert!(images[a] != images[b], "copies of image {i} identical");
                }
            }
        }
    }
}

/// Repetition is for training: an evaluation loader (dataset order, every sample once) refuses
/// it, and so does one without drop_last.
#[test]
fn repeated_augmentation_needs_shuffle_and_drop_last() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let refused = |cfg: LoaderConfig| format!("{:#}", Loader::new(ds.clone(), cfg).err().unwrap());
    let val = LoaderConfig {
        transform: Transform::train(SIZE),
        ra_reps: 2,
        ..LoaderConfig::val(8, 1)
    };
    assert!(refused(val).contains("needs shuffle and drop_last"));
    let unshuffled = LoaderConfig {
        shuffle: false,
        ..train(8, 1, TrainAugment::default(), 2)
    };
    assert!(refused(unshuffled).contains("needs shuffle and drop_last"));
    let partial = LoaderConfig {
        drop_last: false,
        ..train(8, 1, TrainAugment::default(), 2)
    };
    assert!(refused(partial).contains("needs shuffle and drop_last"));
    assert!(refused(train(8, 1, TrainAugment::default(), 0)).contains("at least 1"));
}

/// Bad augmentation settings are refused with the reason, and so is any with an evaluation
/// transform.
#[test]
fn train_augment_settings_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let refused = |augment: TrainAugment, transform: Transform| {
        let cfg = LoaderConfig {
            transform,
            ..train(8, 1, augment, 1)
        };
        format!("{:#}", Loader::new(ds.clone(), cfg).err().unwrap())
    };
    for p in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
        let augment = TrainAugment {
            random_erase: p,
            ..TrainAugment::default()
        };
        assert!(
            refused(augment, Transform::train(SIZE)).contains("in [0, 1]"),
            "{p}"
        );
    }
    let augment = TrainAugment {
        auto_augment: Some(Policy::rand_augment(31)),
        ..TrainAugment::default()
    };
    assert!(refused(augment, Transform::train(SIZE)).contains("magnitude"));
    let augment = TrainAugment {
        auto_augment: Some(Policy::trivial_augment_wide()),
        ..TrainAugment::default()
    };
    assert!(refused(augment, Transform::val(56, SIZE)).contains("training transforms"));
}

/// Without repetition or augmentation settings, a batch holds what the loader always gave:
/// sample `i` of the rank's order augmented with `sample_rng(seed, epoch, i)`, no erase boxes.
#[test]
fn without_repetition_the_sample_key_is_its_dataset_index() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let cfg = LoaderConfig {
        rank: 1,
        world_size: 2,
        ..train(16, 2, TrainAugment::default(), 1)
    };
    let run = collect(&Loader::new(ds.clone(), cfg.clone()).unwrap(), 3, 0);
    let order = Sampler {
        len: ds.len(),
        shuffle: true,
        seed: cfg.seed,
        rank: 1,
        world_size: 2,
        reps: 1,
    }
    .indices(3, true);
    let mut aug = Augmenter::new(cfg.transform.clone(), cfg.dct_scaling).unwrap();
    let (mut expected, mut buf) = (vec![0u8; SIZE * SIZE * 3], Vec::new());
    let mut n = 0;
    for (images, indices, erased) in run {
        assert!(erased.iter().all(Option::is_none));
        for (image, i) in images.iter().zip(indices) {
            assert_eq!(i, order[n]);
            n += 1;
            let bytes = ds.read(i, &mut buf).unwrap();
            aug.apply(bytes, &mut sample_rng(cfg.seed, 3, i), &mut expected)
                .unwrap();
            assert!(*image == expected, "sample {i}");
        }
    }
    assert_eq!(n, ds.len() / 2 / 16 * 16);
}
