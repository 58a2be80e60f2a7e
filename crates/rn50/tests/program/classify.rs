//! `rn50 classify` on the shared ImageNet photos with torchvision-format weights, against torchvision itself
//! (tests/reference/classify_reference.py: a seeded random ResNet-18, so the classes mean nothing, but each image's
//! probabilities differ and must be torchvision's): the output's layout, the class names, the top-1 class, and
//! its probability; and the class folder names a trained model records.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;

/// (rank, percent, class index, rest of the line) of each class line, grouped by image.
type Top = Vec<(usize, f64, usize, String)>;

fn parse(stdout: &str, images: &[PathBuf]) -> Vec<Top> {
    let mut out: Vec<Top> = Vec::new();
    for line in stdout.lines() {
        if let Some(i) = images.iter().position(|p| p.to_str() == Some(line)) {
            assert_eq!(i, out.len(), "images out of order:\n{stdout}");
            out.push(Vec::new());
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let rank = words[0].strip_suffix('.').unwrap().parse().unwrap();
        let pct = words[1].strip_suffix('%').unwrap().parse().unwrap();
        let class = words[2].parse().unwrap();
        let rest = words[3..].join(" ");
        out.last_mut()
            .unwrap_or_else(|| panic!("a class line before any image:\n{stdout}"))
            .push((rank, pct, class, rest));
    }
    out
}

#[test]
fn top5_of_photos_matches_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    let images = common::imagenet_photos();
    let mut script_args = vec![dir.path().to_path_buf()];
    script_args.extend(images.iter().cloned());
    common::reference_script("classify_reference.py", &script_args);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("top5.json")).unwrap())
            .unwrap();

    let weights = dir.path().join("resnet18.safetensors");
    let mut args = vec![
        "classify".into(),
        "--weights".into(),
        weights.into_os_string(),
        "-a".into(),
        "resnet18".into(),
        "--device".into(),
        "cpu".into(),
        "--precision".into(),
        "fp32".into(),
    ];
    args.extend(images.iter().map(|p| p.clone().into_os_string()));
    let out = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(&args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tops = parse(&stdout, &images);
    assert_eq!(tops.len(), images.len(), "{stdout}");
    let synsets = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipeline/assets/synsets.txt"),
    )
    .unwrap();
    let synsets: Vec<&str> = synsets.lines().collect();
    for (image, top) in images.iter().zip(&tops) {
        let want = &reference[image.to_str().unwrap()];
        assert_eq!(top.len(), 5, "{stdout}");
        for (k, (rank, pct, class, name)) in top.iter().enumerate() {
            assert_eq!(*rank, k + 1);
            // The WordNet id and names of that class index.
            assert_eq!(name, synsets[*class], "{stdout}");
            if k > 0 {
                assert!(*pct <= top[k - 1].1, "not in descending order:\n{stdout}");
            }
        }
        assert_eq!(
            top[0].2 as u64,
            want["index"][0].as_u64().unwrap(),
            "{}: top-1 against torchvision's {want}\n{stdout}",
            image.display()
        );
        // The resize differs slightly from PIL's; the probabilities (the top-1 varies tenfold between these
        // images) must still be torchvision's within 5% of themselves, rank by rank.
        for (k, (_, pct, _, _)) in top.iter().enumerate() {
            let p = want["prob"][k].as_f64().unwrap() * 100.0;
            assert!(
                (pct - p).abs() <= 0.05 * p + 0.005,
                "{}: rank {} {pct}% against torchvision's {p}%\n{stdout}",
                image.display(),
                k + 1
            );
        }
    }
}

#[test]
fn unreadable_image_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("not-a-photo.JPEG");
    std::fs::write(&bad, b"hello").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(["classify", "--weights"])
        .arg(dir.path().join("missing.safetensors"))
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.safetensors"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Issue 26: a model fine-tuned on other classes printed `class 1`. Training records the class folder names in
/// best/final.safetensors' metadata (a JSON list under "classes", which Python's safetensors reads), and classify
/// prints them.
#[test]
fn classify_prints_the_class_folder_names_recorded_at_training() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cifar");
    std::fs::create_dir_all(&data).unwrap();
    // Four training and two test images of each of CIFAR-10's classes.
    let ok = Command::new("tar")
        .arg("xzf")
        .arg(common::shared_data().join("cifar10-jpeg.tar.gz"))
        .arg("-C")
        .arg(&data)
        .args(["--wildcards", "train/*/000[0-3].jpg", "test/*/000[01].jpg"])
        .status()
        .unwrap();
    assert!(ok.success());
    let mut classes: Vec<String> = std::fs::read_dir(data.join("train"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    classes.sort();
    assert_eq!(classes.len(), 10);

    let run = dir.path().join("run");
    let r = common::TinyTrain::on(&data, &run)
        .flags("--width 8 --augment cifar --image-size 32 -b 8 -j 1 --epochs 1 --steps-per-epoch 2 --precision fp32")
        .output();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    for weights in ["best.safetensors", "final.safetensors"] {
        let path = run.join(weights);
        let py = common::python_output(
            &[
                "-c".as_ref(),
                "import sys; from safetensors import safe_open; print(safe_open(sys.argv[1], 'pt').metadata()['classes'])"
                    .as_ref(),
                path.as_os_str(),
            ],
            None,
            &[],
        );
        assert!(
            py.status.success(),
            "{}",
            String::from_utf8_lossy(&py.stderr)
        );
        let recorded: Vec<String> = serde_json::from_slice(&py.stdout).unwrap();
        assert_eq!(recorded, classes, "{weights}");
    }

    let cat = data.join("test/cat/0000.jpg");
    let stdout = classify_32px(&run.join("final.safetensors"), 10, &cat);
    let tops = parse(&stdout, &[cat]);
    assert_eq!(tops[0].len(), 10, "{stdout}");
    for (_, _, index, name) in &tops[0] {
        assert_eq!(name, &classes[*index], "{stdout}");
    }
}

/// What `rn50 classify` prints of `image` at 32 px with the ResNet-18 `weights`, its `top` classes; it must succeed.
fn classify_32px(weights: &Path, top: usize, image: &Path) -> String {
    let top = top.to_string();
    let out = common::rn50(&[
        "classify",
        "--weights",
        weights.to_str().unwrap(),
        "-a",
        "resnet18",
        "--resize",
        "32",
        "--crop",
        "32",
        "--top",
        &top,
        "--device",
        "cpu",
        image.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 34: class names come from a weights file's metadata, which anyone can write: `classify` printed them raw,
/// so a name holding a terminal escape and a newline coloured the terminal and forged an output line. Control
/// characters are printed escaped (`\u{1b}`, `\n`) by `classify`, in `eval`'s mismatch message, and in `export
/// --json`, which is all printable ASCII.
#[test]
fn class_names_from_a_file_print_with_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = [
        "\u{1b}[31mred\u{1b}[0m",
        "cat\n   1. 100.00%     0  forged",
        "dog\u{9b}2J",
    ]
    .map(String::from)
    .to_vec();
    let mut cfg = rn50::model::ResNetConfig::new(rn50::model::Arch::ResNet18);
    (cfg.width, cfg.num_classes) = (8, 3);
    let model = rn50::model::Model::new(cfg, tch::Device::Cpu);
    let weights = dir.path().join("w.safetensors");
    let recorded = rn50::model::weights::Recorded::with_classes(Some(&names));
    rn50::model::weights::save(&model, &weights, &recorded).unwrap();
    let w = weights.to_str().unwrap();
    let photo = common::imagenet_photos()[0].clone();
    let raw = |text: &str| text.contains('\u{1b}') || text.contains('\u{9b}');

    let stdout = classify_32px(&weights, 3, &photo);
    assert_eq!(
        stdout.lines().count(),
        4,
        "the photo and three classes:\n{stdout}"
    );
    assert!(!raw(&stdout), "{stdout:?}");
    for escaped in [
        r"\u{1b}[31mred\u{1b}[0m",
        r"cat\n   1. 100.00%",
        r"dog\u{9b}2J",
    ] {
        assert!(stdout.contains(escaped), "{escaped} in {stdout}");
    }

    let data = dir.path().join("data");
    common::image_tree(&data, "val", 3, 1);
    let out = common::rn50(&[
        "eval",
        "-a",
        "resnet18",
        "--weights",
        w,
        "--device",
        "cpu",
        "--resize",
        "32",
        "--crop",
        "32",
        data.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(r#"trained with "\u{1b}[31mred\u{1b}[0m" there"#),
        "{err}"
    );
    assert!(!raw(&err) && err.trim_end().lines().count() == 1, "{err:?}");

    let json = dir.path().join("export.json");
    let out = common::rn50(&[
        "export",
        "--weights",
        w,
        "-a",
        "resnet18",
        "--out",
        dir.path().join("m.pt").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read(&json).unwrap();
    assert!(
        text.iter()
            .all(|&b| (b' '..=b'~').contains(&b) || b == b'\n'),
        "{:?}",
        String::from_utf8_lossy(&text)
    );
    let j: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(j["class_names"], serde_json::json!(names));
}

/// Issue 43: a weights file's recorded evaluation is anyone's to write, and `classify` and `export` took it
/// unchecked where `eval` checked some of it: a recorded crop of 0 panicked `classify` (exit 101), 10^6 aborted it
/// (134), `export` wrote crop 0 into its JSON with exit 0, a resize of 10^9 was taken everywhere, and a std of 0
/// gave `NaN%`. Every one of the three commands now refuses each such file, exit 1, with one line naming the file
/// and the key, and `export` writes nothing.
#[test]
fn recorded_sizes_and_stats_outside_the_flags_ranges_are_refused_by_every_command() {
    use rn50::model::weights::{save, EvalTransform, Interpolation, Recorded};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = rn50::model::ResNetConfig::new(rn50::model::Arch::ResNet18);
    (cfg.width, cfg.num_classes) = (8, 3);
    let model = rn50::model::Model::new(cfg.clone(), tch::Device::Cpu);
    let good = EvalTransform {
        resize: 36,
        crop: 32,
        interpolation: Interpolation::Bilinear,
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };
    let data = dir.path().join("data");
    common::image_tree(&data, "val", 3, 1);
    let photo = common::imagenet_photos()[0].clone();
    let cases = [
        (
            "crop0",
            EvalTransform { crop: 0, ..good },
            "\"eval_crop\" is 0",
        ),
        (
            "huge",
            EvalTransform {
                resize: 1_000_000,
                crop: 1_000_000,
                ..good
            },
            "\"eval_resize\" is 1000000",
        ),
        (
            "magnified",
            EvalTransform {
                resize: 1_000_000_000,
                ..good
            },
            "\"eval_resize\" is 1000000000",
        ),
        (
            "std0",
            EvalTransform {
                std: [0.0; 3],
                ..good
            },
            "\"std\" is [0.0, 0.0, 0.0]",
        ),
        (
            "negative",
            EvalTransform {
                std: [0.229, -0.224, 0.225],
                ..good
            },
            "\"std\" is [0.229, -0.224, 0.225]",
        ),
    ];
    let good_file = dir.path().join("good.safetensors");
    save(&model, &good_file, &Recorded::of_run(&cfg, None, 32, good)).unwrap();
    for (name, eval, want) in cases {
        let weights = dir.path().join(format!("{name}.safetensors"));
        save(&model, &weights, &Recorded::of_run(&cfg, None, 32, eval)).unwrap();
        let w = weights.to_str().unwrap();
        let exported = dir.path().join(format!("{name}.pt"));
        let json = dir.path().join(format!("{name}.json"));
        let runs: [(&str, Vec<&str>); 3] = [
            (
                "classify",
                vec![
                    "classify",
                    "--weights",
                    w,
                    "--device",
                    "cpu",
                    photo.to_str().unwrap(),
                ],
            ),
            (
                "export",
                vec![
                    "export",
                    "--weights",
                    w,
                    "--out",
                    exported.to_str().unwrap(),
                    "--json",
                    json.to_str().unwrap(),
                ],
            ),
            (
                "eval",
                vec![
                    "eval",
                    "--weights",
                    w,
                    "--device",
                    "cpu",
                    data.to_str().unwrap(),
                ],
            ),
        ];
        for (command, args) in runs {
            let out = common::rn50(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command} of {name}: {err}");
            let line = err.trim_end().lines().last().unwrap_or_default();
            assert!(
                line.contains(&format!("{name}.safetensors: the metadata's {want}")),
                "{command} of {name}: {err}"
            );
        }
        assert!(
            !exported.exists() && !json.exists(),
            "export of {name} wrote"
        );
    }
    // The same network with the sizes in range runs in all three.
    let out = common::rn50(&[
        "classify",
        "--weights",
        good_file.to_str().unwrap(),
        "--device",
        "cpu",
        photo.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 44, item 6: a directory stands for the JPEG and PNG files directly in it, in name order (its
/// subdirectories not entered, other files skipped, the log line counting both), and `--json FILE` has each
/// image's path, top classes (index, name, probability, as printed) and logits (whose softmax they are).
/// `--json -` writes the JSON to stdout instead of the table; a directory without images is an error.
#[test]
fn directories_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = ["cat", "dog", "eel"].map(String::from).to_vec();
    let mut cfg = rn50::model::ResNetConfig::new(rn50::model::Arch::ResNet18);
    (cfg.width, cfg.num_classes) = (8, 3);
    let model = rn50::model::Model::new(cfg, tch::Device::Cpu);
    let weights = dir.path().join("w.safetensors");
    let recorded = rn50::model::weights::Recorded::with_classes(Some(&names));
    rn50::model::weights::save(&model, &weights, &recorded).unwrap();

    let photos = common::imagenet_photos();
    let images = dir.path().join("images");
    std::fs::create_dir_all(images.join("sub")).unwrap();
    for (name, photo) in [
        ("b.JPEG", &photos[0]),
        ("a.jpg", &photos[1]),
        ("sub/c.jpg", &photos[2]),
    ] {
        std::fs::copy(photo, images.join(name)).unwrap();
    }
    std::fs::write(images.join("notes.txt"), "not an image").unwrap();
    let json = dir.path().join("out.json");
    let classify = |extra: &[&str]| {
        let mut args = vec![
            "classify",
            "--weights",
            weights.to_str().unwrap(),
            "-a",
            "resnet18",
            "--resize",
            "32",
            "--crop",
            "32",
            "--top",
            "2",
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ];
        args.extend_from_slice(extra);
        common::rn50(&args)
    };
    let single = photos[3].to_str().unwrap();
    let out = classify(&[
        "--json",
        json.to_str().unwrap(),
        images.to_str().unwrap(),
        single,
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    let listed = vec![
        images.join("a.jpg"),
        images.join("b.JPEG"),
        photos[3].clone(),
    ];
    let tops = parse(&stdout, &listed);
    assert_eq!(tops.len(), 3, "{stdout}");
    assert!(
        stderr.contains("2 images (1 subdirectories not entered, 1 other files skipped)"),
        "{stderr}"
    );
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(
        (j["classes"].as_u64(), j["crop"].as_u64()),
        (Some(3), Some(32))
    );
    let results = j["images"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{j}");
    for ((r, path), top) in results.iter().zip(&listed).zip(&tops) {
        assert_eq!(r["path"].as_str(), path.to_str());
        let logits: Vec<f64> = r["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(logits.len(), 3, "{r}");
        let sum: f64 = logits.iter().map(|l| l.exp()).sum();
        let classes = r["top"].as_array().unwrap();
        assert_eq!(classes.len(), 2, "{r}");
        for (c, (_, pct, index, name)) in classes.iter().zip(top) {
            let i = c["index"].as_u64().unwrap() as usize;
            let p = c["probability"].as_f64().unwrap();
            assert_eq!((i, c["name"].as_str().unwrap()), (*index, name.as_str()));
            assert!((100.0 * p - pct).abs() <= 0.006, "{p} printed as {pct}%");
            assert!((logits[i].exp() / sum - p).abs() < 1e-5, "{r}");
        }
    }

    // To stdout: the same JSON, and no table.
    let out = classify(&["--json", "-", images.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j2: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j2["images"][1], j["images"][1]);

    // A directory of no images (only a subdirectory of them): an error naming it and why.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("sub")).unwrap();
    std::fs::copy(&photos[0], empty.join("sub/x.jpg")).unwrap();
    let out = classify(&[empty.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("has no image files") && err.contains("1 subdirectories are not entered"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}
