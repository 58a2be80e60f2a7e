//! Real troublesome files: every crashtest/edge JPEG decodes or is rejected with an error (no
//! panic), and the ones Pillow can read decode to the same colours.

use crate::common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::*;
use rand::SeedableRng;
use rn50_pipeline::decode::decode_rgb;
use rn50_pipeline::transform::{Augmenter, Transform};

/// Decode through every path (full, train crop with DCT scaling, val) and report panics.
fn exercise(bytes: &[u8]) -> Result<bool, String> {
    catch_unwind(AssertUnwindSafe(|| {
        let ok = decode_rgb(bytes).is_ok();
        for t in [
            Transform::train(224),
            Transform::train(32),
            Transform::val(256, 224),
        ] {
            let size = t.output_size();
            let mut aug = Augmenter::new(t, true).unwrap();
            let mut out = vec![0u8; size * size * 3];
            for seed in 0..2 {
                // Ok or Err both fine: region/scaled decoding may stop before a corrupt tail.
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                let _ = aug.apply(bytes, &mut rng, &mut out);
            }
        }
        ok
    }))
    .map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

#[test]
fn crashtest_and_edge_files_never_panic() {
    let mut files = jpeg_files("crashtest");
    assert!(files.len() >= 100, "expected the 111 crashtest files");
    files.extend(jpeg_files("edge"));
    let mut panics = Vec::new();
    let (mut decoded, mut rejected) = (0, 0);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        match exercise(&bytes) {
            Ok(true) => decoded += 1,
            Ok(false) => rejected += 1,
            Err(msg) => panics.push(format!("{}: {msg}", f.display())),
        }
    }
    eprintln!("{decoded} decoded, {rejected} rejected");
    assert!(
        panics.is_empty(),
        "decoder panicked on:\n{}",
        panics.join("\n")
    );
    assert!(decoded > 0 && rejected > 0);
}

#[test]
fn edge_files_match_pillow() {
    let files = jpeg_files("edge");
    let tmp = tempfile::tempdir().unwrap();
    let args: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let manifest = reference("decode", tmp.path(), &args);
    let mut compared = Vec::new();
    let mut failures = Vec::new();
    for (n, (f, m)) in files.iter().zip(manifest.as_array().unwrap()).enumerate() {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let ours = decode_rgb(&std::fs::read(f).unwrap());
        if !m["ok"].as_bool().unwrap() {
            // Pillow rejects it (the truncated file): so must we.
            if ours.is_ok() {
                failures.push(format!(
                    "{name}: Pillow rejects it ({}), we decoded it",
                    m["error"]
                ));
            }
            continue;
        }
        let img = match ours {
            Ok(img) => img,
            Err(e) => {
                failures.push(format!("{name}: Pillow decodes it, we fail: {e}"));
                continue;
            }
        };
        let (w, h) = (
            m["width"].as_u64().unwrap() as usize,
            m["height"].as_u64().unwrap() as usize,
        );
        if (img.width, img.height) != (w, h) {
            failures.push(format!(
                "{name}: size {}x{} vs Pillow {w}x{h}",
                img.width, img.height
            ));
            continue;
        }
        let err = mae(&img.pixels, &reference_pixels(tmp.path(), n));
        eprintln!("{name}: mean abs error {err:.3}");
        if err > 0.5 {
            failures.push(format!("{name}: mean abs error {err:.3} vs Pillow"));
        }
        compared.push(name);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for must in [
        "cmyk_from_imagenet.jpg",
        "ref_ycck.jpg",
        "png_named_as.JPEG",
        "hopper_gray.jpg",
        "progressive_imagenet.jpg",
    ] {
        assert!(
            compared.iter().any(|c| c == must),
            "{must} was not compared"
        );
    }
}

/// What one worker's Augmenter makes of `bytes` (train crop with DCT scaling, its RNG seeded by `id`): the
/// pixels, or that it was rejected.
fn verdict(aug: &mut Augmenter, bytes: &[u8], id: u64) -> Option<Vec<u8>> {
    let size = aug.transform().output_size();
    let mut out = vec![0u8; size * size * 3];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(id);
    aug.apply(bytes, &mut rng, &mut out).ok().map(|_| out)
}

/// A file's verdict never depends on what the same decoder saw before. A worker keeps one TurboJPEG handle;
/// after `crashtest/invalid-dimensions.jpg` it once rejected good photos ("Bogus marker length") and accepted
/// 2-byte `FF D8` files. Every crashtest and edge file, SOI-only files and good photos, in several orders through
/// one Augmenter, must each get what a fresh Augmenter gives it.
#[test]
fn a_files_verdict_does_not_depend_on_the_files_before_it() {
    let mut files: Vec<Vec<u8>> = jpeg_files("crashtest")
        .iter()
        .chain(&jpeg_files("edge"))
        .chain(jpeg_files("imagenet").iter().take(24))
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    files.extend([
        vec![0xFF, 0xD8],
        vec![0xFF, 0xD8, 0xFF],
        vec![0xFF, 0xD8, 0xFF, 0xD9],
    ]);
    let fresh = |bytes: &[u8], id| {
        let mut aug = Augmenter::new(Transform::train(32), true).unwrap();
        verdict(&mut aug, bytes, id)
    };
    let expected: Vec<Option<Vec<u8>>> = (0..files.len())
        .map(|i| fresh(&files[i], i as u64))
        .collect();
    let good = expected.iter().filter(|v| v.is_some()).count();
    assert!(
        good >= 24 && good < files.len(),
        "{good} of {} decode",
        files.len()
    );
    for order in 0..4u64 {
        let mut idx: Vec<usize> = (0..files.len()).collect();
        if order > 0 {
            use rand::seq::SliceRandom;
            idx.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(order));
        }
        let mut aug = Augmenter::new(Transform::train(32), true).unwrap();
        let mut differ = Vec::new();
        for (pos, &i) in idx.iter().enumerate() {
            let got = verdict(&mut aug, &files[i], i as u64);
            if got != expected[i] {
                let say = |v: &Option<Vec<u8>>| if v.is_some() { "decodes" } else { "rejected" };
                differ.push(format!(
                    "file {i} at position {pos} (after file {:?}): {} alone, {} here{}",
                    pos.checked_sub(1).map(|p| idx[p]),
                    say(&expected[i]),
                    say(&got),
                    if got.is_some() && expected[i].is_some() {
                        " (other pixels)"
                    } else {
                        ""
                    },
                ));
            }
        }
        assert!(differ.is_empty(), "order {order}:\n{}", differ.join("\n"));
    }
}

/// A 16000x16000 JPEG or PNG of a few kilobytes was decoded into 768 MB (the patched JPEGs too: libjpeg
/// fills what their data does not cover). Above Pillow's MAX_IMAGE_PIXELS (89,478,485) an image is refused,
/// by every decoding path, from its header.
#[test]
fn an_image_over_the_pixel_limit_is_refused_from_its_header() {
    for (name, bytes) in pixel_bombs() {
        assert!(bytes.len() < 100_000, "{name}: {} bytes", bytes.len());
        let (w, h) = name[..name.len() - 4].split_once('x').unwrap();
        let want = format!("{w}x{h} image has more pixels than the limit of 89478485");
        match decode_rgb(&bytes) {
            Ok(img) => panic!("{name} decoded to {}x{}", img.width, img.height),
            Err(e) => assert!(e.to_string().contains(&want), "{name}: {e}"),
        }
        for t in [Transform::train(224), Transform::val(256, 224)] {
            let mut aug = Augmenter::new(t.clone(), true).unwrap();
            let mut out = vec![0u8; 224 * 224 * 3];
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            let err = aug.apply(&bytes, &mut rng, &mut out).unwrap_err();
            assert!(err.to_string().contains(&want), "{name}, {t:?}: {err}");
        }
    }
}

/// The limit is the decoder's to set: a photo of exactly `limit` pixels decodes, one pixel more is refused;
/// JPEG and PNG alike.
#[test]
fn the_pixel_limit_is_configurable() {
    use rn50_pipeline::decode::{decode_rgb_with_limit, DecodeError};
    let edge = shared_data().join("jpeg/edge");
    for f in [
        jpeg_files("imagenet")[0].clone(),
        edge.join("png_named_as.JPEG"),
    ] {
        let bytes = std::fs::read(&f).unwrap();
        let img = decode_rgb(&bytes).unwrap();
        let n = (img.width * img.height) as u64;
        assert_eq!(decode_rgb_with_limit(&bytes, n).unwrap(), img, "{f:?}");
        match decode_rgb_with_limit(&bytes, n - 1) {
            Err(DecodeError::TooManyPixels {
                width,
                height,
                limit,
            }) => assert_eq!((width, height, limit), (img.width, img.height, n - 1)),
            other => panic!("{f:?} with a limit of {}: {other:?}", n - 1),
        }
        let mut aug = Augmenter::new(Transform::train(32), true).unwrap();
        let mut out = vec![0u8; 32 * 32 * 3];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        aug.set_max_image_pixels(n - 1);
        assert!(aug.apply(&bytes, &mut rng, &mut out).is_err(), "{f:?}");
        aug.set_max_image_pixels(n);
        aug.apply(&bytes, &mut rng, &mut out).unwrap();
    }
}

/// Property, on 2,000 seeded mutants of the crashtest, edge and small ImageNet files and of a PNG, and on
/// random bytes behind a JPEG or PNG signature: decoding never panics (nor aborts, which would end the test),
/// and a file's verdict and pixels on a decoder that has seen other files are those of a fresh decoder,
/// for the mutant and for the good photo decoded after it (issue 12, item 1).
#[test]
fn mutated_bytes_never_panic_nor_change_a_later_verdict() {
    use rand::Rng;
    use rn50_pipeline::decode::decode_rgb_with_limit;
    // Mutated headers claim all sizes; 4 Mpixel keeps every decode short (the limit is tested above).
    const LIMIT: u64 = 1 << 22;
    let small = |f: &std::path::PathBuf| std::fs::metadata(f).unwrap().len() < 40_000;
    let mut seeds: Vec<Vec<u8>> = jpeg_files("crashtest")
        .iter()
        .chain(&jpeg_files("edge"))
        .chain(&jpeg_files("imagenet"))
        .filter(|f| small(f))
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    seeds.push(blank_png(40, 30));
    let good: Vec<Vec<u8>> = jpeg_files("imagenet")
        .iter()
        .filter(|f| small(f))
        .take(8)
        .chain([&shared_data().join("jpeg/edge/png_named_as.JPEG")])
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    let fresh = || {
        let mut aug = Augmenter::new(Transform::train(32), true).unwrap();
        aug.set_max_image_pixels(LIMIT);
        aug
    };
    let expected: Vec<Option<Vec<u8>>> = (0..good.len())
        .map(|g| verdict(&mut fresh(), &good[g], g as u64))
        .collect();
    assert!(expected.iter().all(Option::is_some));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let mut shared = fresh();
    let (mut failures, mut decoded) = (Vec::new(), 0);
    for n in 0..2000u64 {
        let bytes = if n % 10 == 9 {
            let mut b: Vec<u8> = if rng.random() {
                vec![0xFF, 0xD8]
            } else {
                b"\x89PNG\r\n\x1a\n".to_vec()
            };
            let len = rng.random_range(0..2000);
            b.extend((0..len).map(|_| rng.random::<u8>()));
            b
        } else {
            mutate(&seeds[rng.random_range(0..seeds.len())], &mut rng)
        };
        let g = n as usize % good.len();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let full = decode_rgb_with_limit(&bytes, LIMIT).is_ok();
            let alone = verdict(&mut fresh(), &bytes, n);
            let here = verdict(&mut shared, &bytes, n);
            let after = verdict(&mut shared, &good[g], g as u64);
            (full, alone == here, after == expected[g])
        }));
        match r {
            Ok((full, same, after)) => {
                decoded += usize::from(full);
                if !same {
                    failures.push(format!("mutant {n}: another verdict on a used decoder"));
                }
                if !after {
                    failures.push(format!(
                        "mutant {n}: good file {g} decoded differently after it"
                    ));
                }
            }
            Err(p) => {
                shared = fresh();
                let msg = p.downcast_ref::<String>().cloned().unwrap_or_default();
                failures.push(format!("mutant {n}: panic {msg}"));
            }
        }
    }
    eprintln!("{decoded} of 2000 mutants decoded");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(decoded > 100 && decoded < 1900, "{decoded} decoded");
}

/// A file's verdict is the file's, never the random crop's. A truncated photo was good for the crops that stop
/// above its missing rows (libjpeg stops reading after the crop) and bad for the others, so bad_images changed
/// from epoch to epoch (72 to 74 of a set of truncated files). Real photos cut at a third, two thirds, nine tenths
/// and just before the end-of-image marker, and every crashtest and edge file: 48 train crops at two sizes, with
/// and without DCT scaling, and the val crop all give the full decode's verdict.
#[test]
fn a_files_verdict_does_not_depend_on_the_crop() {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for f in jpeg_files("imagenet").iter().step_by(20) {
        let bytes = std::fs::read(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        for cut in [
            bytes.len() / 3,
            bytes.len() * 2 / 3,
            bytes.len() * 9 / 10,
            bytes.len() - 2,
        ] {
            files.push((format!("{name} cut to {cut} bytes"), bytes[..cut].to_vec()));
        }
    }
    let cut_photos = files.len();
    for f in jpeg_files("crashtest")
        .into_iter()
        .chain(jpeg_files("edge"))
    {
        files.push((f.display().to_string(), std::fs::read(&f).unwrap()));
    }
    let configs = [
        (Transform::train(224), true, 48),
        (Transform::train(32), true, 48),
        (Transform::train(224), false, 16),
        (Transform::val(256, 224), true, 1),
    ];
    let mut augs: Vec<_> = configs
        .iter()
        .map(|(t, dct, _)| Augmenter::new(t.clone(), *dct).unwrap())
        .collect();
    let mut failures = Vec::new();
    for (n, (name, bytes)) in files.iter().enumerate() {
        let full = decode_rgb(bytes).is_ok();
        if n < cut_photos {
            assert!(!full, "{name}: the full decode accepts it");
        }
        for (aug, (t, dct, seeds)) in augs.iter_mut().zip(&configs) {
            let good = (0..*seeds)
                .filter(|&s| verdict(aug, bytes, s).is_some())
                .count();
            if good as u64 != if full { *seeds } else { 0 } {
                failures.push(format!(
                    "{name}, {t:?} (DCT scaling {dct}): {good} of {seeds} crops decode, the full \
                     decode {}",
                    if full { "too" } else { "fails" }
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
