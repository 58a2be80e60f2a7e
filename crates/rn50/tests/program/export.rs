//! `rn50 export` against torchvision (tests/reference/export_reference.py): the TorchScript it writes, loaded
//! with `torch.jit.load`, gives torchvision's logits for the same torchvision-format weights, on the shared
//! ImageNet photos and on batch and image sizes other than the traced one; and the command's refusals (an
//! existing --out, weights of another architecture) leave the file system as it was.
use crate::common;

use std::path::{Path, PathBuf};

use common::rn50;

fn reference(args: &[&std::ffi::OsStr]) {
    common::reference_script("export_reference.py", args);
}

/// `rn50 export --weights WEIGHTS -a ARCH --out MODEL EXTRA…`.
fn export(weights: &Path, arch: &str, model: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "export",
        "--weights",
        weights.to_str().unwrap(),
        "-a",
        arch,
        "--out",
        model.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    rn50(&args)
}

/// Weights of a fresh rn50 `arch` (torchvision's names), written by rn50 itself: for the tests that need a valid
/// file but no torchvision.
fn rn50_weights(arch: rn50::model::Arch, path: &Path) {
    let model = rn50::model::Model::new(rn50::model::ResNetConfig::new(arch), tch::Device::Cpu);
    rn50::model::weights::save(&model, path, &Default::default()).unwrap();
}

/// Exports torchvision-made `arch` weights and compares the module with torchvision on `images` and random
/// batches: every logit within 1e-4 of the largest |logit|.
fn matches_torchvision(arch: &str, images: &[PathBuf]) {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join(format!("{arch}.safetensors"));
    reference(&["weights".as_ref(), arch.as_ref(), weights.as_os_str()]);
    let model = dir.path().join("model.pt");
    let out = export(&weights, arch, &model, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!(
            "wrote {}: TorchScript {arch}, 1000 classes",
            model.display()
        )),
        "{stdout}"
    );
    let json = dir.path().join("diff.json");
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "compare".as_ref(),
        arch.as_ref(),
        weights.as_os_str(),
        model.as_os_str(),
        json.as_os_str(),
    ];
    args.extend(images.iter().map(|p| p.as_os_str()));
    reference(&args);
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let result = result.as_object().unwrap();
    assert_eq!(
        result.len(),
        2 + usize::from(!images.is_empty()),
        "{result:?}"
    );
    for (input, r) in result {
        assert_eq!(
            r["shape"],
            serde_json::json!([r["batch"], 1000]),
            "{input}: {r}"
        );
        let (max_abs, diff) = (
            r["max_abs"].as_f64().unwrap(),
            r["max_diff"].as_f64().unwrap(),
        );
        assert!(max_abs > 0.1, "{input}: logits too small to compare: {r}");
        assert!(diff <= 1e-4 * max_abs, "{arch} {input}: {r}");
    }
}

#[test]
fn resnet18_matches_torchvision_on_photos_and_other_sizes() {
    matches_torchvision("resnet18", &common::imagenet_photos());
}

#[test]
fn resnet50_matches_torchvision() {
    matches_torchvision("resnet50", &[]);
}

/// Mish traces as `aten::mish`: the module of `-a resnet18_mish` is timm's ResNet-18 with `act_layer="mish"`
/// (torchvision's keys).
#[test]
fn resnet18_mish_matches_timm_s_mish_network() {
    matches_torchvision("resnet18_mish", &[]);
}

/// Squeeze-and-excitation and grouped convolutions trace too: the module of `-a seresnext50_32x4d` is timm's.
#[test]
fn seresnext50_matches_timm_s_network() {
    matches_torchvision("seresnext50_32x4d", &[]);
}

/// fast.ai's self-attention traces too, its spectral normalisation from the saved `weight_u` and `weight_v` as in
/// eval mode: the module of `-a resnet18_sa` is the reference trainer's network.
#[test]
fn resnet18_sa_matches_fast_ai_s_self_attention() {
    matches_torchvision("resnet18_sa", &[]);
}

/// fast.ai's max-blur pool traces with its scale (0.5), not the traced input's sides, so the module takes other
/// sizes too (160x192 against the traced 224): the module of `-a resnet18d_maxblur` is the reference trainer's.
#[test]
fn resnet18d_maxblur_matches_fast_ai_s_max_blur_pool_at_other_sizes() {
    matches_torchvision("resnet18d_maxblur", &[]);
}

/// fast.ai's max-pool shortcuts (`-a resnet18d_maxdown`) export as the reference trainer's network.
#[test]
fn resnet18d_maxdown_matches_fast_ai_s_max_pool_shortcuts() {
    matches_torchvision("resnet18d_maxdown", &[]);
}

#[test]
fn existing_out_is_refused_without_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w.safetensors");
    // Weights that record their classes' names: the module cannot carry them, --json lists them.
    let classes: Vec<String> = (0..1000).map(|i| format!("class-{i}")).collect();
    let m = rn50::model::Model::new(
        rn50::model::ResNetConfig::new(rn50::model::Arch::ResNet18),
        tch::Device::Cpu,
    );
    let recorded = rn50::model::weights::Recorded::with_classes(Some(&classes));
    rn50::model::weights::save(&m, &weights, &recorded).unwrap();
    let model = dir.path().join("model.pt");
    std::fs::write(&model, b"keep me").unwrap();
    let export = |extra: &[&str]| export(&weights, "resnet18", &model, extra);
    let out = export(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read(&model).unwrap(), b"keep me");

    let json = dir.path().join("export.json");
    let out = export(&["--overwrite", "--json", json.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&model).unwrap();
    assert!(bytes.starts_with(b"PK"), "TorchScript is a zip archive");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["arch"], "resnet18");
    assert_eq!(j["num_classes"], 1000);
    assert_eq!(j["class_names"], serde_json::json!(classes));
    assert_eq!(j["parameters"], 11_689_512);
    assert_eq!(j["bytes"], bytes.len() as u64);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 3, "no temporary file left: {names:?}");
}

#[test]
fn weights_of_another_arch_are_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("r18.safetensors");
    rn50_weights(rn50::model::Arch::ResNet18, &weights);
    let model = dir.path().join("model.pt");
    let out = export(&weights, "resnet50", &model, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not match resnet50"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "nothing written: {names:?}");
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Issue 25: an --out (or --json) whose folder is missing, is a file, or cannot be written (/sys: not even root
/// may create a file there) is a one-line error naming the path, found before the tracing: not libtorch's C++
/// stack frames.
#[test]
fn an_out_that_cannot_be_written_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w.safetensors");
    rn50_weights(rn50::model::Arch::ResNet18, &weights);
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let good = dir.path().join("model.pt");
    let cases = [
        (dir.path().join("missing/model.pt"), None),
        (file.join("model.pt"), None),
        (PathBuf::from("/sys/rn50-export-test.pt"), None),
        (good.clone(), Some(dir.path().join("missing/export.json"))),
    ];
    for (model, json) in &cases {
        let extra: Vec<&str> = json
            .iter()
            .flat_map(|j| ["--json", j.to_str().unwrap()])
            .collect();
        let out = export(&weights, "resnet18", model, &extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", model.display());
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{}: one line: {err}",
            model.display()
        );
        let named = json.as_ref().unwrap_or(model);
        assert!(
            err.contains(named.to_str().unwrap()),
            "the error names {}: {err}",
            named.display()
        );
        assert!(!err.contains("frame #"), "{err}");
    }
    assert_eq!(
        names(dir.path()),
        ["file", "w.safetensors"],
        "nothing written"
    );
    assert!(!Path::new("/sys/rn50-export-test.pt").exists());
}

/// Issue 34: an export onto a disk that fills up (a real 1 MiB tmpfs; ResNet-18's module is 45 MB) is a one-line
/// error naming --out and the full disk, exit 1, with no temporary file left: libtorch's writer aborted the
/// process ("terminate called after throwing an instance of 'c10::Error' ... unexpected pos", exit 134) and left
/// `.model.pt.tmpPID`.
#[test]
fn an_export_onto_a_full_disk_is_a_one_line_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w.safetensors");
    rn50_weights(rn50::model::Arch::ResNet18, &weights);
    let disk = dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let full = rn50_util::tmpfs::Tmpfs::mount(&disk, 1 << 20).unwrap();
    let model = full.path().join("model.pt");
    let out = export(&weights, "resnet18", &model, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // The error is one line (after the INFO line that says which network and transform the export used).
    let errors: Vec<&str> = err.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert_eq!(errors.len(), 1, "one line: {err}");
    assert!(
        errors[0].contains(model.to_str().unwrap())
            && errors[0].contains("No space left on device"),
        "{err}"
    );
    assert_eq!(names(full.path()), Vec::<String>::new());
}

/// Issue 25: an export killed mid-write (kill -9) leaves its temporary `.model.pt.tmpPID`: the next export to
/// that name removes it, and keeps another running process's, and other files' temporaries (the folder is the
/// user's, not rn50's).
#[test]
fn temporary_files_of_killed_exports_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("w.safetensors");
    rn50_weights(rn50::model::Arch::ResNet18, &weights);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let live = std::process::id();
    let stale = format!(".model.pt.tmp{dead}");
    let kept = [
        format!(".model.pt.tmp{live}"),
        format!(".notes.txt.tmp{dead}"),
        format!(".model.pt.tmp{dead}x"),
    ];
    for f in kept.iter().chain([&stale]) {
        std::fs::write(dir.path().join(f), b"half a module").unwrap();
    }
    let model = dir.path().join("model.pt");
    let out = export(&weights, "resnet18", &model, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want: Vec<String> = kept.to_vec();
    want.extend(["model.pt".into(), "w.safetensors".into()]);
    want.sort();
    assert_eq!(names(dir.path()), want);
}

/// Issue 26: docs/train.md's ONNX export, run exactly as the docs give it on a model `rn50 export` wrote, makes a
/// graph with a named input and a free batch dimension: onnxruntime (pinned in scripts/requirements.txt) gives
/// torchvision's logits for batches of 3 and 5, within 1e-4 of the largest |logit|.
#[test]
fn the_docs_onnx_export_takes_any_batch_and_matches_torchvision() {
    let dir = tempfile::tempdir().unwrap();
    let weights = dir.path().join("resnet18.safetensors");
    reference(&["weights".as_ref(), "resnet18".as_ref(), weights.as_os_str()]);
    let out = export(&weights, "resnet18", &dir.path().join("model.pt"), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/train.md");
    let json = dir.path().join("onnx.json");
    common::reference_script(
        "onnx_reference.py",
        &[
            docs.as_os_str(),
            "resnet18".as_ref(),
            weights.as_os_str(),
            dir.path().as_os_str(),
            json.as_os_str(),
        ],
    );
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for (batch, r) in result.as_object().unwrap() {
        assert_eq!(
            r["shape"],
            serde_json::json!([r["batch"], 1000]),
            "{batch}: {r}"
        );
        assert_eq!(r["output"], "logits", "{batch}: {r}");
        let (max_abs, diff) = (
            r["max_abs"].as_f64().unwrap(),
            r["max_diff"].as_f64().unwrap(),
        );
        assert!(max_abs > 0.1 && diff <= 1e-4 * max_abs, "{batch}: {r}");
    }
    assert_eq!(result.as_object().unwrap().len(), 2);
}
