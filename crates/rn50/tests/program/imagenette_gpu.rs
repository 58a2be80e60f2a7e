//! benches/imagenette_gpu.sh, the driver of a device session's Imagenette runs (docs/imagenette.md), run here on
//! the CPU with tiny runs: its lanes (`JOBS`) take each job of the queue once, several at a time, and its tarball
//! holds every run that ended.
use std::path::Path;
use std::process::{Command, Output};

use crate::common;

fn imagenette_gpu(data: &Path, out: &Path, jobs: &str, queue: &str, flags: &[&str]) -> Output {
    Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../benches/imagenette_gpu.sh"
    ))
    .arg(data)
    .arg(out)
    .args(["300", queue])
    .args(flags)
    .env("RN50", env!("CARGO_BIN_EXE_rn50"))
    .env("PYTHON", common::python())
    .env("JOBS", jobs)
    .env("WORKERS", "1")
    .output()
    .unwrap()
}

/// Two lanes on a queue of four jobs (rn50 and the reference, one job whose flags rn50 refuses): both lanes start
/// before either's first run ends, every job runs once, each run's folder and log are where the script says, and
/// the tarball holds them all but the weights.
#[test]
fn two_lanes_run_each_job_of_the_queue_once() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (dir.path().join("data"), dir.path().join("out"));
    common::image_tree(&data, "train", 3, 3);
    common::image_tree(&data, "val", 3, 1);
    let queue = [
        "ref:5ep:1",
        "rn50:5ep:1",
        "rn50:5ep:2:--lr=0.1",
        "rn50:5ep:3:--warmup-epochs=1",
    ];
    let tiny = [
        "--epochs",
        "1",
        "--warmup-epochs",
        "0",
        "--image-size",
        "32",
        "-a",
        "resnet18",
        "-b",
        "4",
        "--threads",
        "1",
    ];
    let run = imagenette_gpu(&data, &out, "2", &queue.join(" "), &tiny);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for job in queue {
        let starts = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("=== {job} at ")))
            .count();
        let ends = stdout
            .lines()
            .filter(|l| l.starts_with(&format!("--- {job} took ")))
            .count();
        assert_eq!(
            (starts, ends),
            (1, 1),
            "{job}: started and ended once\n{stdout}"
        );
    }
    let lines: Vec<&str> = stdout.lines().collect();
    let first_end = lines.iter().position(|l| l.starts_with("--- ")).unwrap();
    let starts_before = lines[..first_end]
        .iter()
        .filter(|l| l.starts_with("=== "))
        .count();
    assert_eq!(starts_before, 2, "two lanes run at once:\n{stdout}");
    assert!(stdout.contains("queue done in "), "{stdout}");

    let runs = ["ref-5ep-s1", "rn50-5ep-s1", "rn50-5ep-s2-lr=0.1"];
    for name in runs {
        let epochs = common::json_lines(&out.join(name).join("metrics.jsonl"));
        assert_eq!(epochs.len(), 1, "{name}: one epoch");
    }
    let own_flags = std::fs::read_to_string(out.join("rn50-5ep-s2-lr=0.1/summary.json")).unwrap();
    let own_flags: serde_json::Value = serde_json::from_str(&own_flags).unwrap();
    assert_eq!(own_flags["lr"], 0.1, "a job's own flags reach its run");
    let refused = "rn50-5ep-s3-warmup-epochs=1";
    assert!(!out.join(refused).exists());
    let log = std::fs::read_to_string(out.join(format!("{refused}.log"))).unwrap();
    assert!(
        log.contains("--warmup-epochs 1 must be below --epochs 1"),
        "{log}"
    );

    let listed = Command::new("tar")
        .arg("tzf")
        .arg(out.join("runs.tgz"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for name in runs {
        for file in [
            format!("{name}/metrics.jsonl"),
            format!("{name}/summary.json"),
            format!("{name}.log"),
        ] {
            assert!(
                listed.lines().any(|l| l == file),
                "runs.tgz lacks {file}:\n{listed}"
            );
        }
    }
    assert!(
        listed.lines().any(|l| l == format!("{refused}.log")),
        "{listed}"
    );
    assert!(!listed.contains(".safetensors"), "{listed}");
    assert!(
        std::fs::read_dir(&out).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".claims")),
        "the lanes' claims are removed"
    );
}

/// `JOBS` out of 1..=99 is refused (exit 2) before anything is written.
#[test]
fn jobs_out_of_range_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for jobs in ["0", "100", "two", "-1"] {
        let out = dir.path().join("out");
        let run = imagenette_gpu(dir.path(), &out, jobs, "rn50:5ep:1", &[]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "JOBS={jobs:?}: {stderr}");
        assert!(stderr.contains("give 1 to 99 runs at once"), "{stderr}");
        assert!(!out.exists(), "JOBS={jobs:?} made {}", out.display());
    }
}
