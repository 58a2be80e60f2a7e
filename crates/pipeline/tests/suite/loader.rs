//! Loader behaviour: sharding, determinism, resumption, backpressure, clean shutdown and bad
//! images, on the real ImageNet samples and crashtest files.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use rn50_pipeline::sampler::Sampler;
use rn50_pipeline::{BadImagePolicy, Dataset, Loader, LoaderConfig, Transform};

#[test]
fn every_sample_once_per_epoch_across_ranks() {
    for len in [0usize, 1, 7, 100, 1001] {
        for world in 1..=8 {
            for epoch in [0u64, 3] {
                let mut seen = vec![0u32; len];
                let mut equal = Vec::new();
                for rank in 0..world {
                    let s = Sampler {
                        len,
                        shuffle: true,
                        seed: 5,
                        rank,
                        world_size: world,
                        reps: 1,
                    };
                    for i in s.indices(epoch, false) {
                        seen[i] += 1;
                    }
                    let eq = s.indices(epoch, true);
                    assert_eq!(eq.len(), len / world);
                    equal.extend(eq);
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "len {len} world {world}: {seen:?}"
                );
                equal.sort();
                equal.dedup();
                assert_eq!(
                    equal.len(),
                    len / world * world,
                    "equal split repeats samples"
                );
            }
        }
    }
}

#[test]
fn order_depends_on_seed_and_epoch_only() {
    let s = |seed, rank| Sampler {
        len: 500,
        shuffle: true,
        seed,
        rank,
        world_size: 4,
        reps: 1,
    };
    assert_eq!(s(1, 2).indices(0, false), s(1, 2).indices(0, false));
    assert_ne!(s(1, 2).indices(0, false), s(1, 2).indices(1, false));
    assert_ne!(s(1, 2).indices(0, false), s(2, 2).indices(0, false));
    let ordered = Sampler {
        len: 10,
        shuffle: false,
        seed: 0,
        rank: 1,
        world_size: 3,
        reps: 1,
    };
    assert_eq!(ordered.indices(9, false), vec![1, 4, 7]);
}

fn small_train(batch: usize, workers: usize) -> LoaderConfig {
    LoaderConfig {
        transform: Transform::train(48),
        seed: 11,
        ..LoaderConfig::train(batch, workers)
    }
}

type Run = Vec<(Vec<u8>, Vec<i64>, Vec<usize>)>;

fn collect(loader: &Loader, epoch: u64, start: usize) -> Run {
    loader
        .epoch(epoch, start)
        .map(|b| {
            let b = b.unwrap();
            assert_eq!(b.shape(), [b.n(), 48, 48, 3]);
            assert_eq!(b.len(), b.n() * 48 * 48 * 3);
            (b.to_vec(), b.labels().to_vec(), b.indices().to_vec())
        })
        .collect()
}

#[test]
fn identical_batches_for_any_worker_count_and_resumable() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    assert_eq!(ds.len(), 220);
    let one = Loader::new(ds.clone(), small_train(16, 1)).unwrap();
    let three = Loader::new(
        ds.clone(),
        LoaderConfig {
            prefetch: 5,
            ..small_train(16, 3)
        },
    )
    .unwrap();
    assert_eq!(one.batches_per_epoch(), 13); // 220 / 16, last partial batch dropped
    let a = collect(&one, 0, 0);
    let b = collect(&three, 0, 0);
    assert_eq!(a.len(), 13);
    assert!(a == b, "batches differ between 1 and 3 workers");
    for (_, labels, idx) in &a {
        assert_eq!(labels.len(), 16);
        for (l, i) in labels.iter().zip(idx) {
            assert_eq!(*l, ds.label(*i));
        }
    }
    // Resuming at batch 9 gives exactly the tail of the epoch.
    assert!(collect(&three, 0, 9) == a[9..], "resumed epoch differs");
    assert!(collect(&one, 0, 13).is_empty());
    // Another epoch: another order and other crops.
    let e1 = collect(&one, 1, 0);
    assert_ne!(e1[0].2, a[0].2);
}

#[test]
fn eval_sharding_loads_every_sample_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    for world in [1usize, 3, 8] {
        let mut seen = vec![0u32; ds.len()];
        for rank in 0..world {
            let cfg = LoaderConfig {
                transform: Transform::val(40, 32),
                rank,
                world_size: world,
                ..LoaderConfig::val(32, 2)
            };
            let loader = Loader::new(ds.clone(), cfg).unwrap();
            let mut n = 0;
            for b in loader.epoch(0, 0) {
                let b = b.unwrap();
                for (l, &i) in b.labels().iter().zip(b.indices()) {
                    assert_eq!(*l, ds.label(i));
                    seen[i] += 1;
                }
                n += b.n();
            }
            assert_eq!(n, loader.samples_per_epoch());
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "world {world}: not every sample exactly once"
        );
    }
}

#[test]
fn backpressure_buffer_reuse_and_clean_drop() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let cfg = LoaderConfig {
        prefetch: 2,
        ..small_train(8, 2)
    };
    let loader = Loader::new(ds, cfg).unwrap();
    {
        let mut it = loader.epoch(0, 0);
        let first = it.next().unwrap().unwrap();
        drop(first);
        // Dropped with work outstanding: must stop and join without hanging.
    }
    // Workers may run at most `prefetch` batches ahead of the one consumed.
    let decoded = loader.stats().images;
    assert!(
        decoded <= 8 * (1 + 2),
        "decoded {decoded} images with only one batch consumed"
    );
    // A full epoch recycles a bounded set of buffers.
    let mut ptrs = std::collections::HashSet::new();
    let mut batches = 0;
    for b in loader.epoch(1, 0) {
        ptrs.insert(b.unwrap().as_ptr() as usize);
        batches += 1;
    }
    assert_eq!(batches, 27);
    assert!(
        ptrs.len() <= 2 + 2 + 2,
        "{} distinct buffers for {batches} batches",
        ptrs.len()
    );
}

/// A loader sharing the threads (the evaluation pass's) recycles the same buffers as the train
/// loader when their batches have the same size: a train epoch, a pass and another epoch use one
/// bounded set, not a set each.
#[test]
fn loaders_sharing_threads_share_their_buffers() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let cfg = LoaderConfig {
        prefetch: 2,
        ..small_train(8, 2)
    };
    let train = Loader::new(ds.clone(), cfg).unwrap();
    let val_cfg = LoaderConfig {
        transform: Transform::val(56, 48),
        prefetch: 2,
        ..LoaderConfig::val(8, 2)
    };
    let val = train.share_workers(ds, val_cfg).unwrap();
    let mut ptrs = std::collections::HashSet::new();
    let mut batches = 0;
    for pass in [train.epoch(0, 0), val.epoch(0, 0), train.epoch(1, 0)] {
        for b in pass {
            ptrs.insert(b.unwrap().as_ptr() as usize);
            batches += 1;
            // A slow consumer: the window fills.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    assert_eq!(batches, 27 + 28 + 27);
    // Live at once: the window (2), a batch started for a waiting consumer, the batch held.
    assert!(
        ptrs.len() <= 2 + 2,
        "{} distinct buffers for {batches} batches",
        ptrs.len()
    );
}

/// A folder with 12 good ImageNet files and every crashtest file plus two sure failures.
fn mixed_folder(root: &std::path::Path) -> (std::path::PathBuf, usize) {
    let good = root.join("mixed/good");
    let bad = root.join("mixed/odd");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    for f in jpeg_files("imagenet").iter().take(12) {
        std::fs::copy(f, good.join(f.file_name().unwrap())).unwrap();
    }
    let mut n = 12;
    for f in jpeg_files("crashtest") {
        std::fs::copy(&f, bad.join(f.file_name().unwrap())).unwrap();
        n += 1;
    }
    let edge = shared_data().join("jpeg/edge/truncated_jpeg.jpg");
    std::fs::copy(edge, bad.join("zz_truncated.jpg")).unwrap();
    std::fs::write(bad.join("zz_text.JPEG"), "not an image").unwrap();
    (root.join("mixed"), n + 2)
}

#[test]
fn bad_images_are_skipped_and_counted_or_fail_with_the_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, total) = mixed_folder(tmp.path());
    let ds = Dataset::open(&root).unwrap();
    assert_eq!(ds.len(), total);
    for t in [Transform::train(32), Transform::val(40, 32)] {
        let cfg = LoaderConfig {
            transform: t.clone(),
            ..LoaderConfig::val(16, 2)
        };
        let loader = Loader::new(ds.clone(), cfg).unwrap();
        let mut labels = BTreeMap::new();
        for b in loader.epoch(0, 0) {
            for l in b.unwrap().labels() {
                *labels.entry(*l).or_insert(0) += 1;
            }
        }
        let s = loader.stats();
        assert_eq!(s.images + s.bad_images, total as u64, "{t:?}");
        assert!(s.bad_images >= 2, "{t:?}: {s:?}");
        assert_eq!(labels[&0], 12, "all good images delivered with their label");
        assert_eq!(s.bad_examples.len() as u64, s.bad_images.min(20));
        assert!(
            s.bad_examples.iter().all(|e| e.contains("/mixed/odd/")),
            "{s:?}"
        );
    }
    // Without the crashtest files exactly the two sure failures are counted.
    for f in jpeg_files("crashtest") {
        std::fs::remove_file(root.join("odd").join(f.file_name().unwrap())).unwrap();
    }
    let ds = Dataset::open(&root).unwrap();
    let loader = Loader::new(ds.clone(), LoaderConfig::val(16, 2)).unwrap();
    let n: usize = loader.epoch(0, 0).map(|b| b.unwrap().n()).sum();
    let s = loader.stats();
    assert_eq!((n, s.bad_images), (12, 2), "{s:?}");
    let cfg = LoaderConfig {
        on_bad_image: BadImagePolicy::Fail,
        ..LoaderConfig::val(16, 2)
    };
    let loader = Loader::new(ds, cfg).unwrap();
    let mut it = loader.epoch(0, 0);
    let err = loop {
        match it.next() {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break format!("{e:#}"),
            None => panic!("epoch ended without reporting the bad images"),
        }
    };
    assert!(
        err.contains("bad image") && err.contains("/mixed/odd/"),
        "{err}"
    );
    assert!(it.next().is_none(), "iteration continues after a failure");
}

#[test]
fn image_folder_matches_torchvision() {
    // Nested directories, mixed-case and non-image extensions, a symlinked class, an empty class.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tree");
    let img = jpeg_files("imagenet")[0].clone();
    for rel in [
        "b/x.JPEG",
        "b/a.jpg",
        "b/sub/z.png",
        "b/sub-dir/y.Jpeg",
        "b/sub/deeper/w.webp",
        "a/1.jpeg",
        "a/notes.txt",
        "a/2.JPG",
        "C/upper.PNG",
        "c_/q.bmp",
        "ext/e.jpg",
    ] {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::copy(&img, &p).unwrap();
    }
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::os::unix::fs::symlink(root.join("ext"), root.join("linked")).unwrap();
    std::fs::write(root.join("stray.jpg"), b"not in a class").unwrap();

    // torchvision rejects a class without images, and so do we.
    let err = Dataset::open(&root).unwrap_err();
    assert!(
        format!("{err:#}").contains("no image files for the classes empty"),
        "{err:#}"
    );
    std::fs::remove_dir(root.join("empty")).unwrap();
    let manifest = reference(
        "imagefolder",
        &tmp.path().join("ref"),
        &[root.display().to_string()],
    );
    let ds = Dataset::open(&root).unwrap();
    let classes: Vec<String> = manifest["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ds.classes(), classes.as_slice());
    let samples = manifest["samples"].as_array().unwrap();
    assert_eq!(ds.len(), samples.len());
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(ds.name(i), s[0].as_str().unwrap(), "sample {i}");
        assert_eq!(ds.label(i), s[1].as_i64().unwrap(), "sample {i}");
    }
}

/// Copies `photos[i]` to `dir/rels[i]`, making the folders.
fn copy_photos(dir: &std::path::Path, photos: &[std::path::PathBuf], rels: &[&str]) {
    for (photo, rel) in photos.iter().zip(rels) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::copy(photo, &p).unwrap();
    }
}

/// `loops` (an ImageFolder's report) says that `link` was cut because it leads back to `back_to`.
fn assert_cut(loops: &[String], link: &std::path::Path, back_to: &std::path::Path) {
    let said = format!("{} leads back to {} ", link.display(), back_to.display());
    assert!(
        loops.iter().any(|l| l.starts_with(&said)),
        "{link:?} not reported: {loops:?}"
    );
}

/// A symlink back into the class (`a/self -> .`) made the walk go round until the path was too long: 80
/// images became 36,080. Loops are now cut where they close, as `find -L` cuts them, and reported; every real
/// file is listed once, and symlinks to files and to directories outside the class still count.
#[test]
fn a_symlink_loop_lists_each_file_once_and_is_reported() {
    use rn50_pipeline::source::folder::ImageFolder;
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tree");
    let photos = jpeg_files("imagenet");
    copy_photos(
        tmp.path(),
        &photos,
        &[
            "tree/a/1.jpg",
            "tree/a/2.jpg",
            "tree/b/3.jpg",
            "tree/b/sub/4.jpg",
            "outside/5.jpg",
        ],
    );
    // One loop a class: with two in one class the unfixed walk branches at every level and never ends.
    symlink(".", root.join("a/self")).unwrap();
    symlink("..", root.join("b/sub/up")).unwrap();
    // Outside any loop: a link to a file, one to a directory, and class c, a link to class b.
    symlink(&photos[5], root.join("a/6.jpg")).unwrap();
    symlink(tmp.path().join("outside"), root.join("b/more")).unwrap();
    symlink("b", root.join("c")).unwrap();
    let want: Vec<String> = [
        "a/1.jpg",
        "a/2.jpg",
        "a/6.jpg",
        "b/3.jpg",
        "b/more/5.jpg",
        "b/sub/4.jpg",
        "c/3.jpg",
        "c/more/5.jpg",
        "c/sub/4.jpg",
    ]
    .iter()
    .map(|rel| root.join(rel).display().to_string())
    .collect();
    let ds = Dataset::open(&root).unwrap();
    let names: Vec<String> = (0..ds.len()).map(|i| ds.name(i)).collect();
    assert_eq!(names, want);
    let labels: Vec<i64> = (0..ds.len()).map(|i| ds.label(i)).collect();
    assert_eq!(labels, [0, 0, 0, 1, 1, 1, 2, 2, 2]);
    let loops = ImageFolder::open(&root).unwrap().loops().to_vec();
    assert_eq!(loops.len(), 3, "{loops:?}");
    for (link, back_to) in [("a/self", "a"), ("b/sub/up", "b"), ("c/sub/up", "c")] {
        assert_cut(&loops, &root.join(link), &root.join(back_to));
    }
}

/// A link inside a class to a directory above it (`n02979186/up -> ..`, the dataset root) listed every other
/// class's photos again under that class (24 images became 40); `find -L` stops there. Links to the root, to the
/// folder holding it, and to the parent of a class that is a link to a folder elsewhere are cut and reported like
/// the loops within a class; each photo is listed once, under its own class.
#[test]
fn a_symlink_to_a_folder_above_its_class_is_cut_and_reported() {
    use rn50_pipeline::source::folder::ImageFolder;
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("tree");
    let photos = jpeg_files("imagenet");
    copy_photos(
        tmp.path(),
        &photos,
        &[
            "tree/a/1.jpg",
            "tree/a/2.jpg",
            "tree/b/3.jpg",
            "tree/b/deep/4.jpg",
            "outside/c/5.jpg",
        ],
    );
    symlink("..", root.join("a/up")).unwrap();
    symlink(&root, root.join("b/deep/root")).unwrap();
    symlink("../../..", root.join("b/deep/above")).unwrap();
    // Class c is a link to outside/c, whose `..` is outside.
    symlink(tmp.path().join("outside/c"), root.join("c")).unwrap();
    symlink("..", tmp.path().join("outside/c/parent")).unwrap();
    let want: Vec<String> = ["a/1.jpg", "a/2.jpg", "b/3.jpg", "b/deep/4.jpg", "c/5.jpg"]
        .iter()
        .map(|rel| root.join(rel).display().to_string())
        .collect();
    let ds = Dataset::open(&root).unwrap();
    let names: Vec<String> = (0..ds.len()).map(|i| ds.name(i)).collect();
    assert_eq!(names, want);
    let labels: Vec<i64> = (0..ds.len()).map(|i| ds.label(i)).collect();
    assert_eq!(labels, [0, 0, 1, 1, 2]);
    let loops = ImageFolder::open(&root).unwrap().loops().to_vec();
    let outside = std::fs::canonicalize(tmp.path().join("outside")).unwrap();
    let tmp_real = std::fs::canonicalize(tmp.path()).unwrap();
    for (link, back_to) in [
        (root.join("a/up"), root.clone()),
        (root.join("b/deep/root"), root.clone()),
        (root.join("b/deep/above"), tmp_real),
        (root.join("c/parent"), outside),
    ] {
        assert_cut(&loops, &link, &back_to);
    }
    assert_eq!(loops.len(), 4, "{loops:?}");
}

/// Images over the pixel limit (Pillow's MAX_IMAGE_PIXELS unless `max_image_pixels` says otherwise) are bad
/// images: skipped, counted and named like unreadable ones. A 16000x16000 PNG was loaded (768 MB a decode).
#[test]
fn images_over_the_pixel_limit_are_counted_bad() {
    let tmp = tempfile::tempdir().unwrap();
    let (good, bad) = (tmp.path().join("x/a"), tmp.path().join("x/b"));
    std::fs::create_dir_all(&good).unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    let photos = &jpeg_files("imagenet")[..6];
    for f in photos {
        std::fs::copy(f, good.join(f.file_name().unwrap())).unwrap();
    }
    for (name, bytes) in pixel_bombs() {
        std::fs::write(bad.join(name), bytes).unwrap();
    }
    let ds = Dataset::open(tmp.path().join("x")).unwrap();
    let load = |max_image_pixels| {
        let cfg = LoaderConfig {
            transform: Transform::train(32),
            max_image_pixels,
            ..LoaderConfig::val(4, 2)
        };
        let loader = Loader::new(ds.clone(), cfg).unwrap();
        let labels: Vec<i64> = loader
            .epoch(0, 0)
            .flat_map(|b| b.unwrap().labels().to_vec())
            .collect();
        (labels, loader.stats())
    };
    let (labels, s) = load(rn50_pipeline::decode::MAX_IMAGE_PIXELS);
    assert_eq!(labels, [0; 6]);
    assert_eq!((s.images, s.bad_images), (6, 3), "{s:?}");
    assert!(
        s.bad_examples
            .iter()
            .all(|e| e.contains("/x/b/") && e.contains("more pixels than the limit of 89478485")),
        "{s:?}"
    );
    // A lower limit: the photos above it are bad images too.
    let pixels: Vec<u64> = photos
        .iter()
        .map(|f| {
            let img = rn50_pipeline::decode::decode_rgb(&std::fs::read(f).unwrap()).unwrap();
            (img.width * img.height) as u64
        })
        .collect();
    let limit = pixels[0];
    let over = pixels.iter().filter(|&&p| p > limit).count();
    assert!(over > 0 && over < 6, "{pixels:?}");
    let (labels, s) = load(limit);
    assert_eq!(labels.len(), 6 - over);
    assert_eq!(s.bad_images, 3 + over as u64, "{s:?}");
}

/// The reported case of one bad JPEG poisoning a worker: 40 photos, `crashtest/invalid-dimensions.jpg` and
/// 20 files holding only `FF D8`, read by 1 and 2 threads in several epochs (orders). Before the fix one thread
/// counted 57 images and 4 bad; the truth is 40 and 21, whatever the order.
#[test]
fn bad_files_do_not_change_the_verdict_on_the_files_after_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (good, bad) = (tmp.path().join("x/a"), tmp.path().join("x/z"));
    std::fs::create_dir_all(&good).unwrap();
    std::fs::create_dir_all(&bad).unwrap();
    for f in jpeg_files("imagenet").iter().take(40) {
        std::fs::copy(f, good.join(f.file_name().unwrap())).unwrap();
    }
    let poison = shared_data().join("jpeg/crashtest/invalid-dimensions.jpg");
    std::fs::copy(poison, bad.join("invalid-dimensions.jpg")).unwrap();
    for i in 0..20 {
        std::fs::write(bad.join(format!("soi-{i:02}.jpg")), [0xFF, 0xD8]).unwrap();
    }
    let ds = Dataset::open(tmp.path().join("x")).unwrap();
    for workers in [1, 2] {
        let cfg = LoaderConfig {
            transform: Transform::train(64),
            ..LoaderConfig::train(61, workers)
        };
        let loader = Loader::new(ds.clone(), cfg).unwrap();
        for epoch in 0..3 {
            let mut labels = BTreeMap::new();
            for b in loader.epoch(epoch, 0) {
                for l in b.unwrap().labels() {
                    *labels.entry(*l).or_insert(0) += 1;
                }
            }
            assert_eq!(
                labels,
                BTreeMap::from([(0, 40)]),
                "{workers} threads, epoch {epoch}: only the 40 photos, each once"
            );
        }
        let s = loader.stats();
        assert_eq!(
            (s.images, s.bad_images),
            (120, 63),
            "{workers} threads: {s:?}"
        );
    }
}

/// `bench-loader --on-bad-image fail` exited 0 reporting "bad images: 1" when the bad image was in a batch decoded
/// ahead of the last one timed. Here the timed batch is one photo and the junk file is the next batch; both are
/// named pipes, fed in turn, so the junk is known to be decoded (by the second worker) before the photo's batch
/// is complete and the benchmark stops. Then each pipe is replaced by a plain file, for the epoch queued next.
#[test]
fn bench_loader_fails_on_a_bad_image_decoded_ahead_with_on_bad_image_fail() {
    use clap::Parser;
    use rn50_pipeline::cli::bench_loader::{run, BenchLoaderArgs};
    use std::io::Write;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cmd: BenchLoaderArgs,
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("data");
    let photo = std::fs::read(&jpeg_files("imagenet")[0]).unwrap();
    let (good, junk) = (root.join("a/photo.jpg"), root.join("b/junk.jpg"));
    for (fifo, bytes) in [(&good, &photo[..]), (&junk, b"not a JPEG" as &[u8])] {
        std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
        mkfifo(fifo);
        std::fs::write(fifo.with_extension("plain"), bytes).unwrap();
    }
    let feeder = {
        let (good, junk, photo) = (good.clone(), junk.clone(), photo.clone());
        std::thread::spawn(move || {
            for (fifo, bytes) in [(&junk, &b"not a JPEG"[..]), (&good, &photo[..])] {
                // Returns once a worker has opened the pipe to read it.
                let mut w = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
                std::fs::rename(fifo.with_extension("plain"), fifo).unwrap();
                let _ = w.write_all(bytes); // the reader may be the test below, gone
            }
        })
    };
    let args = Cli::try_parse_from([
        "bench-loader",
        root.to_str().unwrap(),
        "--val",
        "--size=32",
        "--val-resize=32",
        "-j2",
        "-b1",
        "--prefetch=2",
        "--steps=1",
        "--warmup=0",
        "--on-bad-image=fail",
    ])
    .unwrap();
    let result = run(&args.cmd);
    // Had the run not read both pipes, the feeder would wait for a reader: be it.
    for fifo in [&junk, &good] {
        drop(std::fs::File::open(fifo).unwrap());
    }
    feeder.join().unwrap();
    let err = format!("{:#}", result.expect_err("bench-loader succeeded"));
    assert!(
        err.contains("bad image") && err.contains("b/junk.jpg"),
        "{err}"
    );
}

/// Issue 43: a file that says it is 9 GiB (a sparse file, a few kilobytes on disk) in an ImageFolder is a bad image
/// refused from its size, as a shard's or a WebDataset member's is: it was read whole, 9 GiB of zeros into memory,
/// before the decoder refused it.
#[test]
fn a_file_larger_than_an_image_may_be_is_a_bad_image_refused_from_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let class = tmp.path().join("x/a");
    std::fs::create_dir_all(&class).unwrap();
    let photos = &jpeg_files("imagenet")[..3];
    for f in photos {
        std::fs::copy(f, class.join(f.file_name().unwrap())).unwrap();
    }
    let huge = class.join("zz_sparse.JPEG");
    std::fs::copy(&photos[0], &huge).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&huge).unwrap();
    f.set_len(9 << 30).unwrap();
    assert!(
        std::fs::metadata(&huge).unwrap().len() > rn50_pipeline::source::wds::MAX_IMAGE_BYTES,
        "a sparse file of 9 GiB"
    );
    let ds = Dataset::open(tmp.path().join("x")).unwrap();
    let cfg = LoaderConfig {
        transform: Transform::train(32),
        ..LoaderConfig::val(2, 2)
    };
    let loader = Loader::new(ds, cfg).unwrap();
    let images: usize = loader.epoch(0, 0).map(|b| b.unwrap().labels().len()).sum();
    let s = loader.stats();
    assert_eq!((images, s.bad_images), (3, 1), "{s:?}");
    assert!(
        s.bad_examples
            .iter()
            .any(|e| e.contains("zz_sparse.JPEG") && e.contains("more than an image may have")),
        "{s:?}"
    );
}
