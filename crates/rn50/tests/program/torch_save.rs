//! torch.save files as weights (issue 26): torchvision's `.pth` state_dicts, pytorch/examples' checkpoint.pth.tar
//! (DDP's `module.` prefixes, optimizer and scheduler state; saved from the CPU or a GPU) and timm's checkpoints
//! (an EMA copy beside the weights, the run's argparse.Namespace) give the logits torchvision gives with the same
//! weights (tests/reference/torch_save_reference.py), and `rn50 eval`, `classify` and `train --init-weights` take
//! them as they take the same weights in safetensors. The legacy format is an error carrying a conversion that
//! works; TorchScript and damaged files are one-line errors.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use common::{image_tree, max_abs_rel_err, rn50};
use rn50::model::weights::WeightsFile;
use rn50::model::{Arch, Model, ResNetConfig};
use tch::{Device, Tensor};

/// Runs the reference script once per test binary.
fn reference() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::run_dir("torch_save");
        common::reference_script("torch_save_reference.py", &[&dir]);
        dir
    })
}

fn file(name: &str) -> String {
    reference().join(name).to_str().unwrap().to_string()
}

/// An `arch` model with the weights of `path`, as `rn50 eval` builds it.
fn model(arch: Arch, path: &Path) -> anyhow::Result<Model> {
    let w = WeightsFile::read(path)?;
    let mut cfg = ResNetConfig::new(arch);
    w.shape()?.apply(&mut cfg);
    let model = Model::new(cfg, Device::Cpu);
    w.load(&model)?;
    Ok(model)
}

#[test]
fn state_dicts_and_checkpoints_give_torchvisions_logits() {
    let r: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(reference().join("ref.safetensors"))
            .unwrap()
            .into_iter()
            .collect();
    for (name, arch, logits) in [
        ("resnet18.pth", Arch::ResNet18, "logits_resnet18"),
        ("resnet50.pth", Arch::ResNet50, "logits_resnet50"),
        ("checkpoint.pth.tar", Arch::ResNet18, "logits_checkpoint"),
        ("cuda.pth.tar", Arch::ResNet18, "logits_checkpoint"),
        ("timm.pth.tar", Arch::ResNet18, "logits_resnet18"),
    ] {
        let m = model(arch, &reference().join(name)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let got = tch::no_grad(|| m.forward_t(&r["x"], false));
        let e = max_abs_rel_err(&got, &r[logits]);
        assert!(e < 1e-4, "{name}: logits rel err {e:e}");
    }
    // Another architecture's weights: the error safetensors get.
    let err = model(Arch::ResNet34, &reference().join("checkpoint.pth.tar"))
        .err()
        .unwrap();
    assert!(
        format!("{err:#}").contains("does not match resnet34"),
        "{err:#}"
    );
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `rn50 classify` of the shared photos with `weights` (a 1000-class ResNet-18).
fn classify(weights: &str) -> Output {
    let mut args = vec![
        "classify".to_string(),
        "--weights".into(),
        weights.into(),
        "-a".into(),
        "resnet18".into(),
        "--device".into(),
        "cpu".into(),
        "--precision".into(),
        "fp32".into(),
    ];
    args.extend(
        common::imagenet_photos()
            .iter()
            .map(|p| p.to_str().unwrap().to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    rn50(&args)
}

#[test]
fn eval_classify_and_init_weights_take_torch_save_files() {
    // classify: a torchvision .pth prints what the same weights in safetensors print.
    let want = ok(classify(&file("resnet18.safetensors")));
    assert_eq!(ok(classify(&file("resnet18.pth"))), want);

    // eval: main.py's checkpoint of a 4-class model scores what its safetensors copy scores, to the last digit.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    image_tree(&data, "train", 4, 2);
    image_tree(&data, "val", 4, 2);
    let d = data.to_str().unwrap();
    let eval = |weights: &str| -> serde_json::Value {
        let json = dir.path().join("eval.json");
        ok(rn50(&[
            "eval",
            d,
            "-a",
            "resnet18",
            "--weights",
            weights,
            "-b",
            "4",
            "-j",
            "1",
            "--resize",
            "72",
            "--crop",
            "64",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--json",
            json.to_str().unwrap(),
        ]));
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        for timing in ["seconds", "images_per_sec"] {
            v.as_object_mut().unwrap().remove(timing);
        }
        v
    };
    let want = eval(&file("checkpoint.safetensors"));
    assert_eq!(want["images"], 8);
    assert_eq!(eval(&file("checkpoint.pth.tar")), want);
    assert_eq!(eval(&file("cuda.pth.tar")), want);

    // train --init-weights: the checkpoint saved from a GPU, loaded whole (same classes) and evaluated at once.
    let out = dir.path().join("run");
    let r = rn50(&[
        "train",
        d,
        "--out",
        out.to_str().unwrap(),
        "-a",
        "resnet18",
        "-b",
        "4",
        "-j",
        "1",
        "--image-size",
        "64",
        "--val-resize",
        "72",
        "--val-crop",
        "64",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "-e",
        "--init-weights",
        &file("cuda.pth.tar"),
    ]);
    let stderr = String::from_utf8_lossy(&r.stderr).into_owned();
    let stdout = ok(r);
    assert!(stderr.contains("initialised from"), "{stderr}");
    let acc1 = format!("Acc@1 {:.3}", want["acc1"].as_f64().unwrap());
    assert!(stdout.contains(&acc1), "{acc1} in {stdout}");
}

/// The failure of `rn50 classify --weights PATH`: exit 1 with a message naming PATH, on one line, no panic.
fn refused(path: &Path) -> String {
    let r = classify(path.to_str().unwrap());
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert_eq!(r.status.code(), Some(1), "{}: {err}", path.display());
    assert!(
        err.contains(path.to_str().unwrap()) && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    err
}

#[test]
fn legacy_format_gives_a_conversion_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("resnet18-19c8e357.pth");
    std::fs::copy(reference().join("legacy.pth"), &legacy).unwrap();
    let err = refused(&legacy);
    assert!(err.contains("legacy format"), "{err}");
    // The command the message gives, run as a user would: it writes a file rn50 reads, with the same weights.
    let code = err
        .split_once("python -c \"")
        .and_then(|(_, rest)| rest.trim_end().strip_suffix('"'))
        .unwrap_or_else(|| panic!("no python -c \"...\" in {err}"));
    let conv = common::python_output(&["-c", code], None, &[]);
    assert!(
        conv.status.success(),
        "{code}: {}",
        String::from_utf8_lossy(&conv.stderr)
    );
    let converted: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| *p != legacy)
        .collect();
    assert_eq!(converted.len(), 1, "{converted:?}");
    assert!(err.contains(converted[0].to_str().unwrap()), "{err}");
    assert_eq!(
        ok(classify(converted[0].to_str().unwrap())),
        ok(classify(&file("resnet18.safetensors")))
    );
}

#[test]
fn torchscript_and_damaged_files_are_one_line_errors() {
    let err = refused(&reference().join("scripted.pt"));
    assert!(err.contains("TorchScript"), "{err}");
    let err = refused(&reference().join("elsewhere.pth"));
    assert!(
        err.contains("holds no state_dict") && err.contains("net/fc.bias"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read(reference().join("checkpoint.pth.tar")).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    // Cut short (a copy that stopped half way): the zip's directory at the end is missing.
    let err = refused(&write("truncated.pth.tar", &whole[..whole.len() / 2]));
    assert!(err.contains("not a whole zip archive"), "{err}");
    // Whole, with bytes overwritten in a tensor (which libtorch and torch.load read as other numbers), or in the
    // pickle: the CRC-32 the archive recorded for that part no longer matches.
    let mid = whole.len() / 2;
    for (name, at) in [("in-a-tensor.pth.tar", mid), ("in-the-pickle.pth.tar", 100)] {
        let mut damaged = whole.clone();
        damaged[at..at + 64].fill(0x5a);
        let err = refused(&write(name, &damaged));
        assert!(err.contains("is damaged: its CRC-32 is"), "{err}");
    }
    // Neither format.
    let err = refused(&write("notes.pth", b"these are not weights\n"));
    assert!(err.contains("not a weights file"), "{err}");
    refused(&write("empty.pth", b""));
}

/// Issue 34: a storage record shorter than the tensor its pickle describes (4 bytes where `fc.weight` claims 192
/// floats; one float short) loaded with exit 0 in `classify`, `eval`, `export` and `--init-weights`, the missing
/// bytes read from the heap past the record's end. Refused, naming the tensor and both sizes.
#[test]
fn a_record_shorter_than_its_tensor_is_refused() {
    for (name, have) in [("short-record.pth", 4), ("one-float-short.pth", 764)] {
        let path = reference().join(name);
        let err = refused(&path);
        assert!(
            err.contains("fc.weight: its storage is 192 x 4-byte float (768 bytes)")
                && err.contains(&format!("holds {have} bytes")),
            "{err}"
        );
        let err = WeightsFile::read(&path).err().unwrap();
        assert!(format!("{err:#}").contains("fc.weight"), "{err:#}");
    }
    WeightsFile::read(&reference().join("one-tensor.pth")).unwrap();
}

/// Issue 34: a torch.save file whose pickle nests a million lists, or a million dicts, aborted `classify` ("fatal
/// runtime error: stack overflow", exit 134). Refused before libtorch unpickles it: one line, exit 1.
#[test]
fn a_pickle_nested_too_deep_is_refused() {
    for name in ["deep-lists.pth", "deep-dicts.pth"] {
        let err = refused(&reference().join(name));
        assert!(err.contains("nests values more than 1000 deep"), "{err}");
    }
}
