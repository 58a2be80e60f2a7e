//! Issue 27: the batch-level augmentations on the device against torchvision. Mixup and CutMix give the same mixed
//! batch and soft targets as `torchvision.transforms.v2.MixUp` / `CutMix` given the same λ and box (bit for bit, on
//! a contiguous and a channels_last batch); random erasing's boxes are zeroed where `v2.functional.erase` zeroes
//! them; the soft targets with label smoothing give `torch.nn.CrossEntropyLoss(label_smoothing=0.1)`'s loss; and
//! the draws (which of the two, λ, the box) follow the distributions torchvision draws from.
mod common;

use std::path::Path;

use rand::SeedableRng;
use rn50::model::memory_format::{channels_last, is_channels_last};
use rn50::step::erase::erase;
use rn50::step::mix::{BatchMix, Mix};
use rn50_pipeline::transform::Erase;
use tch::{Device, Kind, Reduction, Tensor};

fn reference(args: &[&str]) {
    common::reference_script("mix_reference.py", args);
}

fn read(path: &Path) -> std::collections::HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn mixup_cutmix_and_erasing_match_torchvision_given_the_same_parameters() {
    let dir = tempfile::tempdir().unwrap();
    tch::manual_seed(27);
    // Odd sides, and a batch whose labels repeat (image 2 and 3).
    let x = Tensor::randn([6, 3, 11, 13], (Kind::Float, Device::Cpu));
    let labels = Tensor::from_slice(&[3i64, 0, 7, 7, 9, 1]);
    let logits = Tensor::randn([6, 10], (Kind::Float, Device::Cpu));
    Tensor::write_safetensors(
        &[("x", &x), ("labels", &labels), ("logits", &logits)],
        dir.path().join("input.safetensors"),
    )
    .unwrap();
    let cutmix = |x1, y1, x2, y2| Mix::Cutmix {
        x1,
        y1,
        x2,
        y2,
        lam: 1.0 - ((x2 - x1) * (y2 - y1)) as f64 / (11.0 * 13.0),
    };
    let cases = [
        Mix::Mixup { lam: 0.317_293_5 },
        Mix::Mixup { lam: 0.999_8 },
        cutmix(2, 0, 9, 5),
        cutmix(0, 3, 13, 11),
        cutmix(4, 4, 4, 9), // an empty box: CutMix's clipping makes them
    ];
    let erased = [
        (
            0,
            Erase {
                top: 1,
                left: 2,
                height: 5,
                width: 3,
            },
        ),
        (
            4,
            Erase {
                top: 0,
                left: 0,
                height: 10,
                width: 12,
            },
        ),
        (
            5,
            Erase {
                top: 10,
                left: 12,
                height: 1,
                width: 1,
            },
        ),
    ];
    let json = serde_json::json!({
        "mix": cases.iter().map(|c| match *c {
            Mix::Mixup { lam } => serde_json::json!({"kind": "mixup", "lam": lam}),
            Mix::Cutmix { x1, y1, x2, y2, lam } =>
                serde_json::json!({"kind": "cutmix", "box": [x1, y1, x2, y2], "lam": lam}),
        }).collect::<Vec<_>>(),
        "erase": erased.iter().map(|(i, e)| [*i, e.top, e.left, e.height, e.width]).collect::<Vec<_>>(),
    });
    std::fs::write(dir.path().join("cases.json"), json.to_string()).unwrap();
    reference(&["apply", dir.path().to_str().unwrap()]);
    let want = read(&dir.path().join("out.safetensors"));

    for cl in [false, true] {
        let layout = |t: &Tensor| match cl {
            true => channels_last(t),
            false => t.copy(), // a new tensor: the ops work in place
        };
        for (i, case) in cases.iter().enumerate() {
            let mut xi = layout(&x);
            assert_eq!(is_channels_last(&xi), cl);
            let t = case.apply(&mut xi, &labels, 10);
            assert!(
                xi.equal(&want[&format!("x_{i}")]),
                "{case:?} (channels_last {cl}): images"
            );
            assert!(t.equal(&want[&format!("t_{i}")]), "{case:?}: targets");
            let loss = logits.cross_entropy_loss(&t, None::<Tensor>, Reduction::Mean, -100, 0.1);
            let want_loss = want[&format!("loss_{i}")].view([]);
            let diff = (loss - want_loss).abs().double_value(&[]);
            assert!(diff < 1e-6, "{case:?}: loss differs by {diff}");
        }
        let mut xe = layout(&x);
        erase(&mut xe, &erased);
        assert!(xe.equal(&want["erased"]), "erasing (channels_last {cl})");
    }
}

/// Quantiles 10, 25, 50, 75, 90% and the mean.
fn summary(mut v: Vec<f64>) -> [f64; 6] {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    [q(0.1), q(0.25), q(0.5), q(0.75), q(0.9), mean]
}

fn close(what: &str, ours: Vec<f64>, theirs: &serde_json::Value, tol: f64) {
    let theirs: Vec<f64> = serde_json::from_value(theirs.clone()).unwrap();
    let (a, b) = (summary(ours), summary(theirs));
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= tol,
            "{what}: quantiles/mean {a:?} vs torchvision's {b:?}"
        );
    }
}

#[test]
fn draws_follow_torchvisions_distributions() {
    const N: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    reference(&["draws", dir.path().to_str().unwrap(), &N.to_string()]);
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("draws.json")).unwrap()).unwrap();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(27);

    for alpha in [0.2, 1.0] {
        let mix = BatchMix::new(alpha, 0.0).unwrap();
        let lams = (0..N)
            .map(|_| match mix.draw(&mut rng, 8, 8) {
                Mix::Mixup { lam } => lam,
                m => panic!("only mixup has an alpha: {m:?}"),
            })
            .collect();
        close(
            &format!("MixUp λ, alpha {alpha}"),
            lams,
            &want[format!("mixup_lam_{alpha:?}")],
            0.02,
        );
    }
    let mix = BatchMix::new(0.0, 1.0).unwrap();
    for (h, w, px) in [(176, 176, 3.0), (13, 11, 0.25)] {
        let (mut lams, mut widths, mut heights) = (vec![], vec![], vec![]);
        for _ in 0..N {
            let Mix::Cutmix {
                x1,
                y1,
                x2,
                y2,
                lam,
            } = mix.draw(&mut rng, h, w)
            else {
                panic!("only cutmix has an alpha")
            };
            lams.push(lam);
            widths.push((x2 - x1) as f64);
            heights.push((y2 - y1) as f64);
        }
        let theirs = &want[format!("cutmix_{h}x{w}")];
        close(&format!("CutMix λ on {h}x{w}"), lams, &theirs["lam"], 0.02);
        // Integer sides on the small image: the quantiles agree exactly or by a pixel at a step, the means closely.
        let px_q = if h < 20 { 1.0 } else { px };
        let check = |what: &str, ours: Vec<f64>, theirs: &serde_json::Value| {
            let t: Vec<f64> = serde_json::from_value(theirs.clone()).unwrap();
            let (a, b) = (summary(ours), summary(t));
            for (x, y) in a[..5].iter().zip(&b[..5]) {
                assert!(
                    (x - y).abs() <= px_q,
                    "{what}: {a:?} vs torchvision's {b:?}"
                );
            }
            assert!(
                (a[5] - b[5]).abs() <= px,
                "{what} mean: {a:?} vs torchvision's {b:?}"
            );
        };
        check(
            &format!("CutMix box width on {h}x{w}"),
            widths,
            &theirs["width"],
        );
        check(
            &format!("CutMix box height on {h}x{w}"),
            heights,
            &theirs["height"],
        );
    }

    // Both alphas: one of the two per batch, each with probability ½ (3.5σ for N draws: ±0.0124).
    let both = BatchMix::new(0.2, 1.0).unwrap();
    let mixups = (0..N)
        .filter(|_| matches!(both.draw(&mut rng, 8, 8), Mix::Mixup { .. }))
        .count();
    let share = mixups as f64 / N as f64;
    assert!(
        (share - 0.5).abs() < 0.0124,
        "MixUp chosen for {share} of the batches"
    );
}
