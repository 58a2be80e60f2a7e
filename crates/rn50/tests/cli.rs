//! The `rn50` binary end to end: bench output and JSON, doctor, and clear errors on bad input.
use std::process::{Command, Output};

fn rn50(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run rn50")
}

/// Fails with a message on stderr, an exit code of 1, and no panic.
fn assert_clean_error(args: &[&str], needle: &str) {
    let out = rn50(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        !err.contains("panicked") && !err.contains("stack backtrace"),
        "{args:?} panicked:\n{err}"
    );
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in:\n{err}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    assert_clean_error(&["bench", "-a", "resnet51"], "unknown architecture");
    assert_clean_error(&["bench", "-b", "0"], "0 is not in 1..=65536");
    assert_clean_error(&["bench", "--device", "tpu"], "unknown device");
    assert_clean_error(
        &["bench", "--device", "cpu", "--precision", "fp16"],
        "fp16 is for CUDA",
    );
    let missing_gpu = if tch::Cuda::device_count() == 0 {
        "cuda"
    } else {
        "cuda:99"
    };
    assert_clean_error(&["bench", "--device", missing_gpu], "CUDA device");
}

#[test]
fn bench_writes_the_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    for data in ["device", "host"] {
        let json = dir.path().join(format!("{data}.json"));
        let out = rn50(&[
            "bench",
            "-a",
            "resnet18",
            "-b",
            "2",
            "--image-size",
            "64",
            "--warmup",
            "1",
            "--steps",
            "3",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--data",
            data,
            "--json",
            json.to_str().unwrap(),
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("img/s (median)"), "{stdout}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for key in [
            "images_per_sec",
            "images_per_sec_p10",
            "images_per_sec_p90",
            "step_ms",
            "data_wait_ms",
            "peak_rss_bytes",
        ] {
            assert!(v[key].as_f64().is_some_and(|x| x >= 0.0), "{key} in {v}");
        }
        assert!(v["images_per_sec"].as_f64().unwrap() > 0.0);
        assert!(v["images_per_sec_p10"].as_f64() <= v["images_per_sec_p90"].as_f64());
        assert_eq!(v["step_times_ms"].as_array().unwrap().len(), 3);
        assert_eq!(v["config"]["arch"], "resnet18");
        assert_eq!(v["config"]["data"], data);
        assert_eq!(v["config"]["threads"], 1);
        assert!(v["machine"]["cpu"]["model"]
            .as_str()
            .is_some_and(|s| !s.is_empty()));
        assert_eq!(v["machine"]["torch_version"], rn50::shim::torch_version());
        assert!(v["final_loss"].as_f64().unwrap().is_finite());
    }
}

#[test]
fn doctor_reports_json_checks() {
    let out = rn50(&["doctor", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for want in ["libtorch", "cpu", "cpu bf16", "gpus", "gloo", "launcher"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(checks
        .iter()
        .all(|c| ["OK", "WARN", "FAIL"].contains(&c["status"].as_str().unwrap())));
}

/// `rn50 scaling` is the scaling model; `predict`, its old name, is a visible alias that does the same.
#[test]
fn predict_is_an_alias_of_scaling() {
    let args = ["--step-ms", "100", "--gpus", "1,8"];
    let scaling = rn50(&[&["scaling"], &args[..]].concat());
    let predict = rn50(&[&["predict"], &args[..]].concat());
    assert!(
        scaling.status.success(),
        "{}",
        String::from_utf8_lossy(&scaling.stderr)
    );
    assert!(String::from_utf8_lossy(&scaling.stdout).contains("one worker: 100.0 ms/step"));
    assert_eq!(scaling.stdout, predict.stdout);
    let help = String::from_utf8(rn50(&["--help"]).stdout).unwrap();
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let (_, entry) = flat
        .split_once(" scaling ")
        .unwrap_or_else(|| panic!("{help}"));
    assert!(
        entry
            .split(" doctor ")
            .next()
            .unwrap()
            .ends_with("[alias: predict]"),
        "{help}"
    );
}
