//! benches/imagenette_gpu.sh, the driver of a device session's Imagenette runs (docs/imagenette.md), run here on
//! the CPU with tiny runs: its lanes (`JOBS`) take each job of the queue once, several at a time, and its tarball
//! holds every run that ended; a queue with a job it would refuse runs nothing; the queues the docs give pass.
use std::path::{Path, PathBuf};
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

/// The flags that make every run of these tests tiny (one epoch at 32 px).
const TINY: [&str; 12] = [
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

/// Three lanes' worth of photos: DATA/train and DATA/val of 3 classes.
fn tiny_data(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    common::image_tree(&data, "train", 3, 3);
    common::image_tree(&data, "val", 3, 1);
    data
}

/// Two lanes on a queue of three jobs (rn50 and the reference): both lanes start before either's first run ends,
/// every job runs once, each run's folder and log are where the script says, and the tarball holds them all but
/// the weights.
#[test]
fn two_lanes_run_each_job_of_the_queue_once() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (tiny_data(dir.path()), dir.path().join("out"));
    let queue = ["ref:5ep:1", "rn50:5ep:1", "rn50:5ep:2:--lr=0.1"];
    let run = imagenette_gpu(&data, &out, "2", &queue.join(" "), &TINY);
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

/// A queue with one job of each kind the check refuses (WHO, RECIPE, SEED, the same run twice, a flag out of
/// range for the reference, a rule between the run's own and the shared flags) is refused whole (exit 2), each
/// refused job named with its reason, and nothing runs or is written: not even OUT.
#[test]
fn a_queue_with_a_refused_job_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (data, out) = (tiny_data(dir.path()), dir.path().join("out"));
    let refused = [
        ("rnn50:5ep:1", "WHO is rn50 or ref"),
        ("rn50:7ep:1", "no recipes/imagenette-7ep.toml"),
        ("rn50:5ep:one", "SEED is a number"),
        ("rn50:5ep:1", "the same run as rn50:5ep:1 (OUT/rn50-5ep-s1)"),
        ("ref:5ep:2:--lr=-1", "--lr"),
        (
            "rn50:5ep:3:--warmup-epochs=1",
            "--warmup-epochs 1 must be below --epochs 1",
        ),
    ];
    let queue: Vec<&str> = std::iter::once("rn50:5ep:1")
        .chain(refused.iter().map(|(job, _)| *job))
        .collect();
    let run = imagenette_gpu(&data, &out, "2", &queue.join(" "), &TINY);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), refused.len() + 1, "{stderr}");
    for ((job, why), line) in refused.iter().zip(&lines) {
        assert!(
            line.starts_with(&format!("refused {job}: ")) && line.contains(why),
            "{job}: {why:?} in {line:?}"
        );
    }
    assert_eq!(lines[refused.len()], "6 of 7 job(s) refused: nothing ran");
    assert!(!out.exists(), "{}", out.display());
    assert_eq!(String::from_utf8_lossy(&run.stdout), "");
}

/// Every `benches/imagenette_gpu.sh` command of docs/imagenette.md, with the variables its block sets, run as the
/// docs write it but with BUDGET 0 (only the check): every job of its queue passes, so a device session can paste
/// it as it is.
#[test]
fn the_docs_queues_pass_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_data(dir.path());
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/imagenette.md");
    let docs = std::fs::read_to_string(docs).unwrap();
    let blocks = docs
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap());
    let mut checked = 0;
    for block in blocks.filter(|b| b.contains("benches/imagenette_gpu.sh")) {
        let mut script = String::new();
        let mut in_command = false;
        for line in block.lines() {
            in_command |= line.contains("benches/imagenette_gpu.sh");
            let assignment = line.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase())
            });
            if in_command || assignment {
                script.push_str(line);
                script.push('\n');
            }
            in_command &= line.ends_with('\\');
        }
        let (head, tail) = script.split_once("benches/imagenette_gpu.sh ").unwrap();
        let [_data, _out, _budget, queue] = tail.splitn(4, ' ').collect::<Vec<_>>()[..] else {
            panic!("DATA OUT BUDGET QUEUE after the script's name: {tail}")
        };
        let out = dir.path().join(format!("out{checked}"));
        let script = format!(
            "{}benches/imagenette_gpu.sh {} {} 0 {queue}",
            head.replace("RN50=path/to/rn50 ", ""),
            data.display(),
            out.display()
        );
        let run = Command::new("bash")
            .args(["-c", &script])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .env("RN50", env!("CARGO_BIN_EXE_rn50"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{script}\n{stdout}\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert!(stdout.contains("queue done in"), "{stdout}");
        assert!(!stdout.contains("==="), "BUDGET 0 runs nothing: {stdout}");
        checked += 1;
    }
    assert_eq!(checked, 3, "the docs' imagenette_gpu.sh commands");
}
