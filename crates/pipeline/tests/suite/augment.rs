//! Augmentations against torchvision: crop-box statistics (RandomResizedCrop.get_params) and
//! pixels (Resize + CenterCrop, resized_crop + hflip) on the real ImageNet samples.

use crate::common;

use common::*;
use rand::SeedableRng;
use rn50_pipeline::crop::random_resized_crop;
use rn50_pipeline::transform::{Augmenter, Transform};

/// torchvision's default ranges, fast.ai's Imagenette scale (`--scale 0.35,1`) and a wide ratio range with a narrow
/// scale one, each on a landscape, a tall and a small image.
#[test]
fn crop_boxes_follow_torchvision_distribution() {
    for (scale, ratio) in [
        ([0.08, 1.0], [0.75, 4.0 / 3.0]),
        ([0.35, 1.0], [0.75, 4.0 / 3.0]),
        ([0.5, 0.6], [0.2, 5.0]),
    ] {
        crop_boxes_follow_torchvision(scale, ratio);
    }
}

fn crop_boxes_follow_torchvision(scale: [f64; 2], ratio: [f64; 2]) {
    const N: usize = 20_000;
    let dims = [(500usize, 375usize), (120, 1000), (64, 48)];
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec![N.to_string()];
    args.extend(scale.iter().chain(&ratio).map(|v| format!("{v:?}")));
    for (w, h) in dims {
        args.push(w.to_string());
        args.push(h.to_string());
    }
    let manifest = reference("rrc_params", tmp.path(), &args);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // alpha = 0.001 critical value for two samples of N.
    let crit = ks_critical(N, N);
    for ((w, h), m) in dims.iter().zip(manifest.as_array().unwrap()) {
        let theirs: Vec<[f64; 4]> = m["boxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                let v: Vec<f64> = b
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                [v[0], v[1], v[2], v[3]]
            })
            .collect();
        let ours: Vec<[f64; 4]> = (0..N)
            .map(|_| {
                let c = random_resized_crop(*w, *h, scale, ratio, &mut rng);
                [c.x as f64, c.y as f64, c.w as f64, c.h as f64]
            })
            .collect();
        type Feature = (&'static str, fn(&[f64; 4]) -> f64);
        let features: [Feature; 6] = [
            ("x", |b| b[0]),
            ("y", |b| b[1]),
            ("w", |b| b[2]),
            ("h", |b| b[3]),
            ("area", |b| b[2] * b[3]),
            ("aspect", |b| b[2] / b[3]),
        ];
        for (name, f) in features {
            let d = ks(ours.iter().map(f).collect(), theirs.iter().map(f).collect());
            eprintln!(
                "scale {scale:?} ratio {ratio:?}, {w}x{h} {name}: KS {d:.4} (critical {crit:.4})"
            );
            assert!(
                d < crit,
                "scale {scale:?} ratio {ratio:?}, {w}x{h}: {name} distribution differs from torchvision (KS {d:.4})"
            );
        }
    }
}

#[test]
fn ks_detects_a_different_distribution() {
    // The statistical test above has teeth: uniform (not log-uniform) aspect ratios fail it.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let n = 20_000;
    let log_uniform: Vec<f64> = (0..n)
        .map(|_| rand::Rng::random_range(&mut rng, 0.75f64.ln()..(4.0f64 / 3.0).ln()).exp())
        .collect();
    let uniform: Vec<f64> = (0..n)
        .map(|_| rand::Rng::random_range(&mut rng, 0.75..4.0 / 3.0))
        .collect();
    assert!(ks(log_uniform, uniform) > ks_critical(n, n));
}

fn imagenet_files() -> Vec<String> {
    jpeg_files("imagenet")
        .iter()
        .map(|f| f.display().to_string())
        .collect()
}

#[test]
fn val_transform_matches_torchvision() {
    let files = imagenet_files();
    assert!(files.len() >= 200);
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["256".to_string(), "224".to_string()];
    args.extend(files.iter().cloned());
    reference("val", tmp.path(), &args);
    for dct in [false, true] {
        let mut aug = Augmenter::new(Transform::val(256, 224), dct).unwrap();
        let mut out = vec![0u8; 224 * 224 * 3];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let (mut sum, mut worst, mut scaled) = (0.0, 0.0f64, 0);
        for (n, f) in files.iter().enumerate() {
            let applied = aug
                .apply(&std::fs::read(f).unwrap(), &mut rng, &mut out)
                .unwrap();
            scaled += usize::from(applied.downscale > 1);
            let e = mae(&out, &reference_pixels(tmp.path(), n));
            sum += e;
            worst = worst.max(e);
        }
        let mean = sum / files.len() as f64;
        eprintln!("val, dct scaling {dct}: mean abs error {mean:.3}, worst image {worst:.3}, {scaled} decoded downscaled");
        if dct {
            assert!(scaled > 0, "no image exercised DCT downscaling");
            assert!(
                mean < 2.0 && worst < 6.0,
                "mean {mean:.3}, worst {worst:.3}"
            );
        } else {
            assert_eq!(scaled, 0);
            assert!(
                mean < 0.5 && worst < 1.0,
                "mean {mean:.3}, worst {worst:.3}"
            );
        }
    }
}

/// ImageNet's 224 px, and the 64 px of the CPU's Imagenette runs, where the crops shrink several times over and
/// the antialiasing filter's support is at its widest.
#[test]
fn train_transform_matches_torchvision_resized_crop() {
    let files: Vec<String> = imagenet_files().into_iter().step_by(4).collect();
    for (size, dct) in [(224, false), (224, true), (64, false)] {
        let mut aug = Augmenter::new(Transform::train(size), dct).unwrap();
        let mut outs = Vec::new();
        let mut jobs = Vec::new();
        for (n, f) in files.iter().enumerate() {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(n as u64);
            let mut out = vec![0u8; size * size * 3];
            let a = aug
                .apply(&std::fs::read(f).unwrap(), &mut rng, &mut out)
                .unwrap();
            let [x, y, w, h] = a.crop;
            jobs.push(
                serde_json::json!({"file": f, "x": x, "y": y, "w": w, "h": h, "flip": a.flipped}),
            );
            outs.push(out);
        }
        assert!(jobs.iter().any(|j| j["flip"] == true) && jobs.iter().any(|j| j["flip"] == false));
        let tmp = tempfile::tempdir().unwrap();
        let jobs_file = tmp.path().join("jobs.json");
        std::fs::write(&jobs_file, serde_json::to_string(&jobs).unwrap()).unwrap();
        let out_dir = tmp.path().join("out");
        reference(
            "resized_crop",
            &out_dir,
            &[size.to_string(), jobs_file.display().to_string()],
        );
        let errs: Vec<f64> = outs
            .iter()
            .enumerate()
            .map(|(n, o)| mae(o, &reference_pixels(&out_dir, n)))
            .collect();
        let mean = errs.iter().sum::<f64>() / errs.len() as f64;
        let worst = errs.iter().cloned().fold(0.0, f64::max);
        eprintln!("train {size} px, dct scaling {dct}: mean abs error {mean:.3}, worst {worst:.3}");
        if dct {
            assert!(
                mean < 2.0 && worst < 6.0,
                "mean {mean:.3}, worst {worst:.3}"
            );
        } else {
            assert!(
                mean < 0.5 && worst < 1.0,
                "mean {mean:.3}, worst {worst:.3}"
            );
        }
    }
}

/// `RandomCrop(size, padding)` + flip: every output pixel is the decoded pixel at the reported
/// offset (or zero padding), offsets cover 0..=2·padding evenly, and about half are flipped.
#[test]
fn pad_crop_matches_padded_image() {
    use rn50_pipeline::decode::{decode_rgb, encode_jpeg};
    let (size, pad) = (32usize, 4usize);
    // A real photo shrunk to CIFAR's size, so the pixels are not trivially uniform.
    let mut aug = Augmenter::new(Transform::val(32, 32), false).unwrap();
    let photo = std::fs::read(&jpeg_files("imagenet")[0]).unwrap();
    let mut small = vec![0u8; 32 * 32 * 3];
    aug.apply(&photo, &mut rand::rng(), &mut small).unwrap();
    let jpeg = encode_jpeg(32, 32, &small, 95).unwrap();
    let img = decode_rgb(&jpeg).unwrap();

    let mut aug = Augmenter::new(Transform::pad_crop(size, pad), false).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut out = vec![0u8; size * size * 3];
    let mut offsets = vec![0usize; 2 * pad + 1];
    let mut flips = 0;
    const N: usize = 900;
    for _ in 0..N {
        let a = aug.apply(&jpeg, &mut rng, &mut out).unwrap();
        let (left, top) = (a.crop[0] as isize, a.crop[1] as isize);
        offsets[(left + pad as isize) as usize] += 1;
        flips += a.flipped as usize;
        for y in 0..size {
            for x in 0..size {
                let ox = if a.flipped { size - 1 - x } else { x };
                let (sx, sy) = (left + ox as isize, top + y as isize);
                let inside = (0..32).contains(&sx) && (0..32).contains(&sy);
                for c in 0..3 {
                    let want = if inside {
                        img.pixels[(sy as usize * 32 + sx as usize) * 3 + c]
                    } else {
                        0
                    };
                    assert_eq!(out[(y * size + x) * 3 + c], want, "pixel ({x},{y}) {a:?}");
                }
            }
        }
    }
    // 100 expected per offset: a binomial sd of ~9.4, so 50..150 only fails on a real bias.
    assert!(
        offsets.iter().all(|&n| (50..150).contains(&n)),
        "{offsets:?}"
    );
    assert!((N / 2 - 75..N / 2 + 75).contains(&flips), "{flips} flips");
}

#[test]
fn pad_crop_rejects_too_small_images() {
    use rn50_pipeline::decode::encode_jpeg;
    let jpeg = encode_jpeg(16, 16, &[128u8; 16 * 16 * 3], 90).unwrap();
    let mut aug = Augmenter::new(Transform::pad_crop(32, 4), false).unwrap();
    let mut out = vec![0u8; 32 * 32 * 3];
    let err = aug.apply(&jpeg, &mut rand::rng(), &mut out).unwrap_err();
    assert!(err.to_string().contains("smaller than"), "{err}");
}

/// CIFAR evaluates on the images as they are: Resize(32) + CenterCrop(32) of a 32x32 image must be the
/// decoded pixels, not a resampled copy.
#[test]
fn val_transform_at_the_image_size_is_the_identity() {
    use rn50_pipeline::decode::{decode_rgb, encode_jpeg};
    let mut aug = Augmenter::new(Transform::val(32, 32), false).unwrap();
    let photo = std::fs::read(&jpeg_files("imagenet")[1]).unwrap();
    let mut small = vec![0u8; 32 * 32 * 3];
    aug.apply(&photo, &mut rand::rng(), &mut small).unwrap();
    let jpeg = encode_jpeg(32, 32, &small, 90).unwrap();
    let mut out = vec![0u8; 32 * 32 * 3];
    aug.apply(&jpeg, &mut rand::rng(), &mut out).unwrap();
    assert_eq!(out, decode_rgb(&jpeg).unwrap().pixels);
}
