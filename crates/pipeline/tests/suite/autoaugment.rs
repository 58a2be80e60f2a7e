//! TrivialAugmentWide / RandAugment against torchvision 0.28's `transforms.v2` on uint8 tensors:
//! every op's pixels on photos and edge sizes, the magnitude tables, and the policies' random
//! draws.

use crate::common;

use std::collections::HashMap;

use common::*;
use rand::{Rng, SeedableRng};
use rn50_pipeline::autoaugment::{AutoAugment, Draw, Op, OpKind, Policy};
use rn50_pipeline::decode::decode_rgb;

struct TestImage {
    name: String,
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

/// Pixels above which torch's float32 sum of a grayscale image may round (255 * pixels > 2^24),
/// so that Contrast's mean, and with it an output level, can differ from torch's, which itself
/// changes with torch's thread count and vector width.
const EXACT_MEAN_PIXELS: usize = (1 << 24) / 255;

/// Photo crops (color and grayscale, even and odd sizes), a large crop, and tiny or degenerate
/// images (seeded noise, constant, two-valued).
fn test_images() -> Vec<TestImage> {
    let photos = jpeg_files("imagenet");
    let mut images = Vec::new();
    // (photo index, x, y, width, height): index 39 is grayscale, 1 the large one.
    for (i, x, y, w, h) in [
        (0, 138, 75, 224, 224),
        (3, 10, 20, 131, 97),
        (39, 100, 50, 97, 131),
        (2, 0, 0, 64, 48),
        (1, 44, 7, 512, 384),
    ] {
        let img = decode_rgb(&std::fs::read(&photos[i]).unwrap()).unwrap();
        let mut pixels = Vec::with_capacity(w * h * 3);
        for row in y..y + h {
            pixels.extend_from_slice(&img.pixels[(row * img.width + x) * 3..][..w * 3]);
        }
        let name = photos[i].file_name().unwrap().to_string_lossy().to_string();
        images.push(TestImage {
            name: format!("{name} {w}x{h}"),
            width: w,
            height: h,
            pixels,
        });
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for (w, h) in [(1, 1), (1, 7), (7, 1), (2, 2), (3, 3), (5, 2), (4, 9)] {
        images.push(TestImage {
            name: format!("noise {w}x{h}"),
            width: w,
            height: h,
            pixels: (0..w * h * 3).map(|_| rng.random()).collect(),
        });
    }
    images.push(TestImage {
        name: "constant 9x9".into(),
        width: 9,
        height: 9,
        pixels: vec![77; 9 * 9 * 3],
    });
    images.push(TestImage {
        name: "two-valued 6x5".into(),
        width: 6,
        height: 5,
        pixels: (0..6 * 5 * 3)
            .map(|i| if i % 7 < 3 { 40 } else { 200 })
            .collect(),
    });
    images
}

/// The (op, signed magnitude) pairs tried on an image: TrivialAugmentWide's bins 0, 1, 7, 15, 20
/// (rotate: 90 degrees) and 30 and RandAugment's default bin 9, both signs where the policies use
/// both; and parameters the tables miss: 180 degrees, posterize to 0 and 1 bit, and 21 more
/// for each geometric op (`m` from -0.99 to 0.99: shear `m`, translation `32 m`, rotation
/// `135 m`), where a grid coordinate lands near a half now and then (ShearY -0.792 on the
/// 131x97 crop rounds one pixel differently unless `grid_sample`'s multiply-add is fused). On the
/// large image, fewer.
fn ops_for(img: &TestImage) -> Vec<(OpKind, f64)> {
    let large = img.width * img.height > 100_000;
    let ta_bins: &[usize] = if large {
        &[15, 30]
    } else {
        &[0, 1, 7, 15, 20, 30]
    };
    let (ta, ra) = (Policy::trivial_augment_wide(), Policy::rand_augment(9));
    let mut ops = Vec::new();
    for kind in OpKind::ALL {
        let mut magnitudes: Vec<f64> = ta_bins
            .iter()
            .filter_map(|&bin| ta.magnitude(kind, bin, img.width, img.height))
            .collect();
        magnitudes.extend(ra.magnitude(kind, 9, img.width, img.height));
        if magnitudes.is_empty() {
            magnitudes.push(0.0);
        }
        match kind {
            OpKind::Rotate => magnitudes.push(180.0),
            OpKind::Posterize => magnitudes.extend([0.0, 1.0]),
            _ => {}
        }
        for m in magnitudes {
            ops.push((kind, m));
            if kind.signed() {
                ops.push((kind, -m));
            }
        }
        let scale = match kind {
            OpKind::ShearX | OpKind::ShearY => 1.0,
            OpKind::TranslateX | OpKind::TranslateY => 32.0,
            OpKind::Rotate => 135.0,
            _ => continue,
        };
        if !large {
            // numpy.linspace(-0.99, 0.99, 21)'s values.
            ops.extend((0..21).map(|k| (kind, (k as f64 * 0.099 - 0.99) * scale)));
        }
    }
    ops
}

#[derive(Default)]
struct Tally {
    values: usize,
    differing: usize,
    max_diff: u8,
    cases: usize,
}

#[test]
fn ops_match_torchvision_pixel_for_pixel() {
    let images = test_images();
    let tmp = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    let mut ops = Vec::new();
    for (n, img) in images.iter().enumerate() {
        let file = tmp.path().join(format!("in{n}.rgb"));
        std::fs::write(&file, &img.pixels).unwrap();
        let these = ops_for(img);
        let list: Vec<_> = these
            .iter()
            .map(|(k, m)| serde_json::json!([k.name(), m]))
            .collect();
        jobs.push(serde_json::json!({
            "file": file.display().to_string(),
            "width": img.width,
            "height": img.height,
            "ops": list,
        }));
        ops.push(these);
    }
    let jobs_file = tmp.path().join("jobs.json");
    std::fs::write(&jobs_file, serde_json::to_string(&jobs).unwrap()).unwrap();
    let out_dir = tmp.path().join("out");
    let manifest = reference("autoaugment", &out_dir, &[jobs_file.display().to_string()]);
    let capability = manifest["cpu_capability"].as_str().unwrap().to_string();

    let mut tally: HashMap<(OpKind, bool), Tally> = HashMap::new();
    let mut failures = Vec::new();
    let mut n = 0;
    let mut scratch = Vec::new();
    for (img, ops) in images.iter().zip(&ops) {
        let large = img.width * img.height > EXACT_MEAN_PIXELS;
        for &(kind, magnitude) in ops {
            let op = Op::from_magnitude(kind, magnitude);
            let mut ours = img.pixels.clone();
            op.apply(&mut ours, img.width, img.height, &mut scratch);
            let theirs = reference_pixels(&out_dir, n);
            n += 1;
            assert_eq!(ours.len(), theirs.len());
            let diffs: Vec<u8> = ours
                .iter()
                .zip(&theirs)
                .map(|(a, b)| a.abs_diff(*b))
                .collect();
            let differing = diffs.iter().filter(|&&d| d > 0).count();
            let max_diff = diffs.iter().copied().max().unwrap_or(0);
            let t = tally.entry((kind, large)).or_default();
            t.values += diffs.len();
            t.differing += differing;
            t.max_diff = t.max_diff.max(max_diff);
            t.cases += 1;
            // Exact, but for Contrast above EXACT_MEAN_PIXELS: there torch's mean itself is
            // rounded (order-dependent), which may move a result across an integer by one level.
            let allowed = if kind == OpKind::Contrast && large {
                1
            } else {
                0
            };
            if max_diff > allowed {
                let at = diffs.iter().position(|&d| d > allowed).unwrap();
                failures.push(format!(
                    "{} magnitude {magnitude} ({op:?}) on {}: {differing} values differ, max {max_diff}; \
                     first at pixel ({}, {}) channel {}: ours {} torchvision {}",
                    kind.name(),
                    img.name,
                    at / 3 % img.width,
                    at / 3 / img.width,
                    at % 3,
                    ours[at],
                    theirs[at],
                ));
            }
        }
    }
    assert_eq!(n, manifest["outputs"].as_u64().unwrap() as usize);
    let mut keys: Vec<_> = tally.keys().copied().collect();
    keys.sort_by_key(|&(k, large)| (OpKind::ALL.iter().position(|&o| o == k), large));
    for key in keys {
        let t = &tally[&key];
        eprintln!(
            "{:<12} {:<28} {:>4} cases: {} of {} values differ, max {}",
            key.0.name(),
            if key.1 {
                "large (sum above 2^24)"
            } else {
                "photo crops and edge sizes"
            },
            t.cases,
            t.differing,
            t.values,
            t.max_diff
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {n} outputs differ from torchvision (torch CPU capability {capability}; its \
         non-vectorized DEFAULT kernels do not fuse multiply-adds and round differently):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every magnitude table, bit for bit, with torchvision's op order and signed flags, for both
/// policies at several bin counts and image sizes (RandAugment's translations scale with them).
#[test]
fn magnitude_tables_match_torchvision() {
    let specs = [
        (31, 224, 224),
        (31, 97, 131),
        (31, 1, 1),
        (31, 500, 375),
        (2, 224, 224),
        (3, 64, 48),
        (10, 224, 224),
        (64, 331, 7),
        (100, 224, 176),
    ];
    let args: Vec<String> = specs
        .iter()
        .map(|(b, w, h)| format!("{b}:{w}:{h}"))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let manifest = reference("autoaugment_tables", tmp.path(), &args);
    for key in ["ta_wide", "ra"] {
        let m = &manifest[key];
        let order: Vec<&str> = m["order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let ours: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(order, ours, "{key}: op order");
        for kind in OpKind::ALL {
            assert_eq!(
                m["signed"][kind.name()].as_bool().unwrap(),
                kind.signed(),
                "{key}: {} signed",
                kind.name()
            );
        }
        for (table, &(bins, w, h)) in m["tables"].as_array().unwrap().iter().zip(&specs) {
            let policy = if key == "ta_wide" {
                Policy::TrivialAugmentWide {
                    num_magnitude_bins: bins,
                }
            } else {
                Policy::RandAugment {
                    num_ops: 2,
                    magnitude: 0,
                    num_magnitude_bins: bins,
                }
            };
            for kind in OpKind::ALL {
                let theirs = &table["values"][kind.name()];
                let ours: Option<Vec<f64>> = policy.magnitude(kind, 0, w, h).map(|_| {
                    (0..bins)
                        .map(|b| policy.magnitude(kind, b, w, h).unwrap())
                        .collect()
                });
                let theirs: Option<Vec<f64>> = theirs.as_array().map(|v| {
                    v.iter()
                        .map(|x| f64::from_bits(x.as_u64().unwrap()))
                        .collect()
                });
                let bits = |v: &Option<Vec<f64>>| {
                    v.as_ref()
                        .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                };
                assert_eq!(
                    bits(&ours),
                    bits(&theirs),
                    "{key} {} table, {bins} bins, {w}x{h}:\n ours {ours:?}\n torchvision {theirs:?}",
                    kind.name()
                );
            }
        }
    }
}

/// (op, |magnitude|, negative) per drawn op.
type Drawn = Vec<(OpKind, f64, bool)>;

fn kind_named(name: &str) -> OpKind {
    *OpKind::ALL.iter().find(|k| k.name() == name).unwrap()
}

/// Checks draws against the distribution torchvision's code defines: ops uniform over the 14; per
/// op with magnitudes, each bin's value with probability (bins holding it) / bins, or always the
/// fixed bin's value (RandAugment); per signed op, negative with probability ½ (exactly
/// P(float32 uniform <= 0.5) = (2^23 + 1) / 2^24). Each count must be within `Z` binomial
/// standard deviations of its expectation: with some 400 counts checked, a correct sampler fails
/// with probability about 400 * 5.7e-7 = 2e-4 (the seeds are fixed, so it passes or fails
/// for good). Returns the counts outside.
fn check_draws(policy: &Policy, drawn: &Drawn, width: usize, height: usize) -> Vec<String> {
    const Z: f64 = 5.0;
    let mut bad = Vec::new();
    let mut check = |what: String, count: usize, n: usize, p: f64| {
        let (mean, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
        if (count as f64 - mean).abs() > Z * sd.max(1e-9) {
            bad.push(format!(
                "{what}: {count} of {n}, expected {mean:.1} ± {sd:.1} (bound {Z} sd)"
            ));
        }
    };
    let bins = policy.num_magnitude_bins();
    let fixed_bin = match *policy {
        Policy::RandAugment { magnitude, .. } => Some(magnitude),
        Policy::TrivialAugmentWide { .. } => None,
    };
    let p_negative = ((1u64 << 23) + 1) as f64 / (1u64 << 24) as f64;
    for kind in OpKind::ALL {
        let mine: Vec<&(OpKind, f64, bool)> = drawn.iter().filter(|d| d.0 == kind).collect();
        check(
            format!("{} chosen", kind.name()),
            mine.len(),
            drawn.len(),
            1.0 / 14.0,
        );
        let Some(_) = policy.magnitude(kind, 0, width, height) else {
            check(
                format!("{} with a magnitude", kind.name()),
                mine.iter().filter(|d| d.1 != 0.0 || d.2).count(),
                mine.len(),
                0.0,
            );
            continue;
        };
        // The distinct values of the table and how many bins hold each.
        let mut values: Vec<(f64, usize)> = Vec::new();
        for bin in fixed_bin.map_or(0..bins, |b| b..b + 1) {
            let v = policy.magnitude(kind, bin, width, height).unwrap();
            match values.iter_mut().find(|(x, _)| *x == v) {
                Some((_, k)) => *k += 1,
                None => values.push((v, 1)),
            }
        }
        let total: usize = values.iter().map(|v| v.1).sum();
        for &(v, k) in &values {
            check(
                format!("{} magnitude {v}", kind.name()),
                mine.iter().filter(|d| d.1 == v).count(),
                mine.len(),
                k as f64 / total as f64,
            );
        }
        check(
            format!("{} magnitude outside the table", kind.name()),
            mine.iter()
                .filter(|d| !values.iter().any(|v| v.0 == d.1))
                .count(),
            mine.len(),
            0.0,
        );
        let negative = mine.iter().filter(|d| d.2).count();
        let p = if kind.signed() { p_negative } else { 0.0 };
        check(format!("{} negative", kind.name()), negative, mine.len(), p);
    }
    bad
}

fn our_draws(policy: &Policy, calls: usize, seed: u64) -> Drawn {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut draws = Vec::new();
    let mut all = Vec::new();
    for _ in 0..calls {
        policy.draw(224, 224, &mut rng, &mut draws);
        all.extend(
            draws
                .iter()
                .map(|d| (d.kind, d.magnitude.abs(), d.magnitude.is_sign_negative())),
        );
    }
    all
}

fn torchvision_draws(args: &[&str]) -> Drawn {
    let tmp = tempfile::tempdir().unwrap();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let manifest = reference("autoaugment_draws", tmp.path(), &args);
    manifest
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                kind_named(d[0].as_str().unwrap()),
                f64::from_bits(d[1].as_u64().unwrap()),
                d[2].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Our draws (400,000 calls) and torchvision's own (50,000 calls of the real `forward`; 25,000 of
/// RandAugment's two ops) both follow the distribution its code defines, count by count, for
/// TrivialAugmentWide and RandAugment at magnitudes 9 and 15.
#[test]
fn policy_draws_follow_torchvision() {
    let cases: [(Policy, Vec<&str>); 3] = [
        (Policy::trivial_augment_wide(), vec!["ta_wide", "50000"]),
        (Policy::rand_augment(9), vec!["ra", "25000", "9"]),
        (Policy::rand_augment(15), vec!["ra", "25000", "15"]),
    ];
    for (policy, args) in cases {
        let ours = our_draws(&policy, 400_000, 1);
        let bad = check_draws(&policy, &ours, 224, 224);
        assert!(bad.is_empty(), "{policy:?}, ours:\n{}", bad.join("\n"));
        let theirs = torchvision_draws(&args);
        let bad = check_draws(&policy, &theirs, 224, 224);
        assert!(
            bad.is_empty(),
            "{policy:?}, torchvision's (so the expected distribution is wrong):\n{}",
            bad.join("\n")
        );
    }
}

/// The check above fails samplers with the mistakes one makes: a bin range one short, a sign
/// drawn with `< 0.4`, an op never chosen, a sign on an unsigned op.
#[test]
fn draw_check_has_teeth() {
    let policy = Policy::trivial_augment_wide();
    let good = our_draws(&policy, 400_000, 2);
    assert!(check_draws(&policy, &good, 224, 224).is_empty());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut short_bins = good.clone();
    for d in short_bins.iter_mut() {
        if let Some(m) = policy.magnitude(d.0, rng.random_range(0..30), 224, 224) {
            d.1 = m;
        }
    }
    let mut sign_bias = good.clone();
    for d in sign_bias.iter_mut() {
        if d.0.signed() {
            d.2 = rng.random::<f32>() < 0.45;
        }
    }
    let mut missing: Drawn = good.clone();
    for d in missing.iter_mut() {
        if d.0 == OpKind::Equalize {
            d.0 = OpKind::Identity;
        }
    }
    let mut signed_solarize = good.clone();
    for d in signed_solarize.iter_mut() {
        if d.0 == OpKind::Solarize {
            d.2 = rng.random();
        }
    }
    for (what, drawn) in [
        ("30 bins", short_bins),
        ("sign p 0.45", sign_bias),
        ("no Equalize", missing),
        ("signed Solarize", signed_solarize),
    ] {
        let bad = check_draws(&policy, &drawn, 224, 224);
        assert!(!bad.is_empty(), "{what} passed the check");
        eprintln!("{what}: {}", bad[0]);
    }
}

/// `AutoAugment::apply` applies the ops it drew, in order, and the same RNG state gives the same
/// image.
#[test]
fn auto_augment_applies_its_draws_deterministically() {
    let img = &test_images()[0];
    for policy in [Policy::trivial_augment_wide(), Policy::rand_augment(9)] {
        let mut aug = AutoAugment::new(policy);
        let mut kinds = std::collections::HashSet::new();
        for seed in 0..200 {
            let mut out = img.pixels.clone();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let draws: Vec<Draw> = aug
                .apply(&mut out, img.width, img.height, &mut rng)
                .to_vec();
            let mut expected = img.pixels.clone();
            let mut scratch = Vec::new();
            for d in &draws {
                kinds.insert(d.kind);
                d.op()
                    .apply(&mut expected, img.width, img.height, &mut scratch);
            }
            assert!(out == expected, "{policy:?} seed {seed}: {draws:?}");
            let mut again = img.pixels.clone();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            aug.apply(&mut again, img.width, img.height, &mut rng);
            assert!(again == out, "{policy:?} seed {seed} not reproducible");
        }
        assert_eq!(kinds.len(), 14, "{policy:?} drew {kinds:?}");
    }
}
