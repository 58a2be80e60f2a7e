//! Report tables from fixture JSONs compared with golden Markdown/CSV/text, byte for byte.
//! `RN50_UPDATE_GOLDEN=1` rewrites the golden files instead (review the diff before committing).

use std::fs;
use std::path::{Path, PathBuf};

use rn50_report::report::{collect, json, markdown, write_report};
use rn50_report::run_report::{metrics_table, summary_markdown};
use rn50_report::schema::{read_input, read_inputs, read_train_run, Input};
use rn50_report::table::{throughput_table, train_row, train_table, TrainRow};
use rn50_report::{summary_text, write_run_report, TrainSummary};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn check_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("RN50_UPDATE_GOLDEN").is_some() {
        fs::write(&path, actual).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (RN50_UPDATE_GOLDEN=1 creates it)", path.display()));
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the golden file at line {}:\n--- golden\n{}\n--- actual\n{}\n",
            name,
            first + 1,
            expected.lines().nth(first).unwrap_or("<end>"),
            actual.lines().nth(first).unwrap_or("<end>")
        );
    }
}

fn all_inputs() -> Vec<PathBuf> {
    let f = fixtures();
    vec![
        f.join("bench-fixture-a100-8gpu.json"),
        f.join("bench-fixture-a100-1gpu.json"),
        f.join("bench-fixture-a100-4gpu.json"),
        f.join("bench-fixture-cpu.json"),
        f.join("sweep-fixture-cpu.json"),
        f.join("runs/fixture-r50-1gpu"),
        f.join("runs/fixture-r50-4gpu/summary.json"),
        f.join("runs/fixture-r18-cpu-nosummary"),
    ]
}

#[test]
fn report_markdown_and_csv_match_golden() {
    let c = collect(&all_inputs()).unwrap();
    assert_eq!(c.throughput.len(), 6);
    assert_eq!(c.runs.len(), 3);
    check_golden("report.md", &markdown(&c));
    check_golden("throughput.csv", &throughput_table(&c.throughput).to_csv());
    check_golden("throughput.txt", &throughput_table(&c.throughput).to_text());
    let rows: Vec<TrainRow> = c.runs.iter().map(train_row).collect();
    check_golden("train.csv", &train_table(&rows, true).to_csv());
}

#[test]
fn efficiencies_are_the_hand_computed_ones() {
    let c = collect(&all_inputs()).unwrap();
    let j = json(&c, vec![]);
    let a100: Vec<_> = j
        .throughput
        .iter()
        .filter(|t| t.hardware == "NVIDIA A100-SXM4-40GB")
        .collect();
    assert_eq!(
        a100.iter().map(|t| t.workers).collect::<Vec<_>>(),
        [1, 4, 8]
    );
    // 8 GPUs: 18310 / (8 · 2450) = 0.934183…; time-based from step ms per image:
    // (104.49/256) / (8 · 111.85/2048) = 0.934197…
    let e8 = a100[2];
    assert!((e8.efficiency_throughput.unwrap() - 18310.0 / 19600.0).abs() < 1e-12);
    let t = (104.49 / 256.0) / (8.0 * 111.85 / 2048.0);
    assert!((e8.efficiency_time.unwrap() - t).abs() < 1e-12);
    // The CPU sweep: 2 ranks 18.2 vs 1 rank 10.1 img/s → 90.1 %.
    let sweep2 = j
        .throughput
        .iter()
        .find(|t| t.source == "sweep-fixture-cpu.json" && t.workers == 2)
        .unwrap();
    assert!((sweep2.efficiency_throughput.unwrap() - 18.2 / 20.2).abs() < 1e-12);
    assert_eq!(sweep2.repeats, Some(3));
    // Train: 4 GPUs vs 1 by wall clock: 7222.0 / (4 · 1956.6).
    let md = markdown(&c);
    assert!(md.contains("| 92.3% |"), "{md}");
    assert!((7222.0f64 / (4.0 * 1956.6) - 0.92277).abs() < 1e-5);
}

#[test]
fn run_report_writes_csv_markdown_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("fixture-r50-1gpu");
    fs::create_dir(&run).unwrap();
    for f in ["metrics.jsonl", "summary.json"] {
        fs::copy(
            fixtures().join("runs/fixture-r50-1gpu").join(f),
            run.join(f),
        )
        .unwrap();
    }
    let written = write_run_report(&run).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "metrics.csv",
            "summary.md",
            "loss.png",
            "accuracy.png",
            "lr.png"
        ]
    );
    check_golden(
        "run-metrics.csv",
        &fs::read_to_string(run.join("metrics.csv")).unwrap(),
    );
    check_golden(
        "run-summary.md",
        &fs::read_to_string(run.join("summary.md")).unwrap(),
    );
    check_golden("run-summary.txt", &summary_text(&run).unwrap());
    for png in ["loss.png", "accuracy.png", "lr.png"] {
        if let Some(keep) = std::env::var_os("RN50_KEEP_REPORT") {
            let keep = PathBuf::from(keep);
            fs::create_dir_all(&keep).unwrap();
            fs::copy(run.join(png), keep.join(format!("run-{png}"))).unwrap();
        }
        let bytes = fs::read(run.join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
        assert!(bytes.len() > 10_000, "{png} is suspiciously small");
    }
}

#[test]
fn run_without_summary_uses_metrics_and_dedups_resumed_epochs() {
    let run = read_train_run(&fixtures().join("runs/fixture-r18-cpu-nosummary")).unwrap();
    assert_eq!(run.epochs.len(), 3);
    assert_eq!(run.epochs[1].acc1, Some(38.5)); // the later record of epoch 1 wins
    assert_eq!(run.epochs[0].acc1, None); // NaN written as null
    let r = train_row(&run);
    assert_eq!(r.workers, None);
    assert_eq!(r.epochs, 3);
    assert!((r.wall_clock_s - (95.1 + 96.4 + 96.0)).abs() < 1e-9);
    assert_eq!(r.best_acc1, Some(49.75));
    check_golden(
        "nosummary-metrics.csv",
        &metrics_table(&run.epochs).to_csv(),
    );
    check_golden("nosummary-summary.md", &summary_markdown(&run));
}

#[test]
fn write_report_produces_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let c = collect(&all_inputs()).unwrap();
    let files = write_report(&c, &out).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "report.md",
            "throughput.csv",
            "train.csv",
            "throughput.png",
            "efficiency.png",
            "train_loss.png",
            "train_accuracy.png"
        ]
    );
    for f in &files {
        assert!(fs::metadata(f).unwrap().len() > 100, "{}", f.display());
    }
    // Keep a copy for eyeballing when asked to.
    if let Some(keep) = std::env::var_os("RN50_KEEP_REPORT") {
        let keep = PathBuf::from(keep);
        fs::create_dir_all(&keep).unwrap();
        for f in &files {
            fs::copy(f, keep.join(f.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn inputs_are_told_apart() {
    let f = fixtures();
    assert!(matches!(
        read_input(&f.join("bench-fixture-cpu.json")).unwrap(),
        Input::Bench { .. }
    ));
    assert!(matches!(
        read_input(&f.join("sweep-fixture-cpu.json")).unwrap(),
        Input::Sweep { .. }
    ));
    assert!(matches!(
        read_input(&f.join("runs/fixture-r50-1gpu")).unwrap(),
        Input::Train(_)
    ));
    match read_input(&f.join("runs/fixture-r50-4gpu/summary.json")).unwrap() {
        Input::Train(r) => assert_eq!(r.name, "fixture-r50-4gpu"),
        other => panic!("{other:?}"),
    }
    // The real bench JSON's extra fields (warmup, seed, optimizer, libtorch_path…) are ignored.
    let Input::Bench { result, .. } = read_input(&f.join("bench-fixture-cpu.json")).unwrap() else {
        unreachable!()
    };
    assert_eq!(result.config.world_size(), 1);
    assert_eq!(result.config.global_batch(), 32);
    assert_eq!(result.step_times_ms.len(), 3);
}

#[test]
fn a_run_that_just_started() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("fresh");
    fs::create_dir(&run).unwrap();
    // No epoch finished yet, and then one epoch plus a record still being written (no newline).
    fs::write(run.join("metrics.jsonl"), "").unwrap();
    write_run_report(&run).unwrap();
    assert!(summary_text(&run).unwrap().contains("0:00:00"));
    fs::write(
        run.join("metrics.jsonl"),
        "{\"epoch\":0,\"train_loss\":2.0,\"seconds\":10.0}\n{\"epoch\":1,\"train_lo",
    )
    .unwrap();
    let r = read_train_run(&run).unwrap();
    assert_eq!(r.epochs.len(), 1);
    write_run_report(&run).unwrap();
    // The same torn line in the middle of the file is an error.
    fs::write(
        run.join("metrics.jsonl"),
        "{\"epoch\":1,\"train_lo\n{\"epoch\":0,\"train_loss\":2.0,\"seconds\":10.0}\n",
    )
    .unwrap();
    let e = read_train_run(&run).unwrap_err().to_string();
    assert!(e.contains("metrics.jsonl:1:"), "{e}");
}

#[test]
fn directories_stand_for_what_they_hold() {
    let f = fixtures();
    let runs = read_inputs(&[f.join("runs")]).unwrap();
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|i| matches!(i, Input::Train(_))));
    // The fixtures directory itself: 4 bench results and a sweep; subdirectories that are not runs are not
    // entered.
    let top = read_inputs(std::slice::from_ref(&f)).unwrap();
    assert_eq!(top.len(), 5);
    // bad/ holds a run with a bad line (read first: sorted) and malformed JSON: the first error is reported.
    let e = read_inputs(&[f.join("bad")]).unwrap_err().to_string();
    assert!(e.contains("badrun/metrics.jsonl:2:"), "{e}");
    let e = read_inputs(&[f.join("proc")]).unwrap_err().to_string();
    assert!(e.contains("not a training run"), "{e}");
}

#[test]
fn bad_inputs_name_file_and_line() {
    let f = fixtures().join("bad");
    let e = read_input(&f.join("malformed.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("malformed.json:3:"), "{e}");
    assert!(!e.contains("at line"), "{e}");
    let e = read_input(&f.join("missing-field.json"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing-field.json:") && e.contains("arch"),
        "{e}"
    );
    let e = read_input(&f.join("unknown.json")).unwrap_err().to_string();
    assert!(e.contains("unknown.json") && e.contains("neither"), "{e}");
    let e = read_input(&f.join("badrun")).unwrap_err().to_string();
    assert!(e.contains("metrics.jsonl:2:"), "{e}");
    let e = read_input(&f.join("does-not-exist.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does-not-exist.json"), "{e}");
    let e = read_input(&fixtures().join("proc"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a training run"), "{e}");
}

#[test]
fn summary_round_trips_and_fills_from_metrics() {
    let run = read_train_run(&fixtures().join("runs/fixture-r50-1gpu")).unwrap();
    let s = run.summary.clone().unwrap();
    let text = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<TrainSummary>(&text).unwrap(), s);
    let mut filled = TrainSummary {
        arch: s.arch.clone(),
        device: s.device.clone(),
        world_size: 1,
        batch_size: 256,
        global_batch: 256,
        lr: 0.1,
        precision: s.precision.clone(),
        dataset: s.dataset.clone(),
        ..TrainSummary::default()
    };
    filled.fill_from_metrics(&run.epochs);
    assert_eq!(filled.epochs, 5);
    assert!((filled.wall_clock_s - 7222.0).abs() < 1e-9);
    assert_eq!(filled.acc1, Some(45.12));
    assert_eq!(filled.best_acc1, Some(45.12));
    assert!((filled.images_per_sec - 919.42).abs() < 1e-9);
    let dir = tempfile::tempdir().unwrap();
    let p = rn50_report::write_summary(dir.path(), &filled).unwrap();
    let mut back: TrainSummary = serde_json::from_str(&fs::read_to_string(p).unwrap()).unwrap();
    // serde_json's default float parsing may differ from the written value in the last bit.
    assert!((back.images_per_sec - filled.images_per_sec).abs() < 1e-9);
    back.images_per_sec = filled.images_per_sec;
    assert_eq!(back, filled);
}

#[test]
fn sweep_point_from_repeats() {
    let p = rn50_report::SweepPoint::from_repeats(
        2,
        32,
        Some(0.025),
        vec![18.6, f64::NAN, 17.9, 18.2, 18.4],
        None,
    );
    assert_eq!(p.global_batch, 64);
    assert_eq!((p.min, p.max), (17.9, 18.6));
    assert!((p.median - 18.3).abs() < 1e-12);
}
