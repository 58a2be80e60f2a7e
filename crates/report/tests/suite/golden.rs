//! Report tables from fixture JSONs compared with golden Markdown/CSV/text, byte for byte.
//! `RN50_UPDATE_GOLDEN=1` rewrites the golden files instead (review the diff before committing).

use std::fs;
use std::path::{Path, PathBuf};

use rn50_report::report::{collect, json, markdown, write_report};
use rn50_report::run_report::{lr_chart, lr_per_step, metrics_table, read_steps, summary_markdown};
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
    let c = collect(&all_inputs(), &[]).unwrap();
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
    let c = collect(&all_inputs(), &[]).unwrap();
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
    check_golden("nosummary-metrics.csv", &metrics_table(&run).to_csv());
    check_golden("nosummary-summary.md", &summary_markdown(&run));
}

#[test]
fn write_report_produces_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let c = collect(&all_inputs(), &[]).unwrap();
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
    assert_eq!(runs.len(), 5);
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

/// Copies a fixture run into a temporary directory, where its report can be written.
fn copy_run(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join(name);
    fs::create_dir(&run).unwrap();
    for e in fs::read_dir(fixtures().join("runs").join(name)).unwrap() {
        let p = e.unwrap().path();
        fs::copy(&p, run.join(p.file_name().unwrap())).unwrap();
    }
    (dir, run)
}

fn keep_pngs(run: &Path, prefix: &str) {
    if let Some(keep) = std::env::var_os("RN50_KEEP_REPORT") {
        let keep = PathBuf::from(keep);
        fs::create_dir_all(&keep).unwrap();
        for png in ["loss.png", "accuracy.png", "lr.png"] {
            fs::copy(run.join(png), keep.join(format!("{prefix}-{png}"))).unwrap();
        }
    }
}

/// A smoke run (`--steps-per-epoch 20 --val-max-images 500`) says so in summary.md before its table and in the
/// table's "covers" column, and in the terminal's summary; a full run's shows neither.
#[test]
fn a_smoke_runs_summary_says_what_it_covers() {
    let (_dir, run) = copy_run("fixture-r50-smoke");
    write_run_report(&run).unwrap();
    let md = fs::read_to_string(run.join("summary.md")).unwrap();
    check_golden("smoke-summary.md", &md);
    let text = summary_text(&run).unwrap();
    check_golden("smoke-summary.txt", &text);
    check_golden(
        "smoke-metrics.csv",
        &fs::read_to_string(run.join("metrics.csv")).unwrap(),
    );
    keep_pngs(&run, "smoke");
    for s in [&md, &text] {
        assert!(
            s.contains(
                "Partial run: 20 of 5,005 steps per epoch, validation on 500 of 50,000 images."
            ),
            "{s}"
        );
        assert!(s.contains("not a result"), "{s}");
        assert!(s.contains("covers"), "{s}");
        assert!(
            s.contains("⚠ 20 of 5,005 steps/epoch, val 500 of 50,000"),
            "{s}"
        );
    }
    // Before the table, where a reader starts.
    assert!(
        md.find("Partial run").unwrap() < md.find("| run |").unwrap(),
        "{md}"
    );
    // No EMA, no EMA columns.
    assert!(!md.contains("EMA"), "{md}");

    let full = read_train_run(&fixtures().join("runs/fixture-r50-1gpu")).unwrap();
    let md = summary_markdown(&full);
    for absent in ["⚠", "covers", "Partial", "EMA"] {
        assert!(!md.contains(absent), "{absent}: {md}");
    }
}

/// A run with --ema shows its average's final and best top-1 in summary.md (and the per-epoch EMA columns in
/// metrics.csv); a whole run says nothing of coverage.
#[test]
fn an_ema_runs_summary_has_its_ema_accuracy() {
    let (_dir, run) = copy_run("fixture-r50-ema");
    write_run_report(&run).unwrap();
    let md = fs::read_to_string(run.join("summary.md")).unwrap();
    check_golden("ema-summary.md", &md);
    let csv = fs::read_to_string(run.join("metrics.csv")).unwrap();
    check_golden("ema-metrics.csv", &csv);
    keep_pngs(&run, "ema");
    assert!(md.contains("| EMA Acc@1 | best EMA Acc@1 |"), "{md}");
    assert!(md.contains("| 38.02 | 38.02 |"), "{md}");
    assert!(!md.contains("⚠") && !md.contains("covers"), "{md}");
    assert!(csv.starts_with("epoch,"), "{csv}");
    assert!(
        csv.lines().next().unwrap().contains(",ema_acc1,ema_acc5,"),
        "{csv}"
    );
}

fn mixed_inputs() -> Vec<PathBuf> {
    let f = fixtures().join("runs");
    vec![
        f.join("fixture-r50-1gpu"),
        f.join("fixture-r50-smoke"),
        f.join("fixture-r50-ema"),
    ]
}

/// `rn50 report` over a full run, a smoke run and an EMA run: the "covers" column and the warning before the
/// table, EMA columns, and the CSV's coverage columns a script filters on.
#[test]
fn report_marks_partial_runs_and_shows_ema() {
    let c = collect(&mixed_inputs(), &[]).unwrap();
    let md = markdown(&c);
    check_golden("report-mixed.md", &md);
    let rows: Vec<TrainRow> = c.runs.iter().map(train_row).collect();
    let t = train_table(&rows, true);
    check_golden("train-mixed.csv", &t.to_csv());
    check_golden("train-mixed.txt", &t.to_text());
    assert!(
        md.contains("**⚠ Partial runs: fixture-r50-smoke.**"),
        "{md}"
    );
    assert!(md.contains("| run | covers | arch |"), "{md}");
    assert!(
        md.contains("| fixture-r50-1gpu | — |"),
        "older summary, unknown: {md}"
    );
    assert!(md.contains("| fixture-r50-ema | full |"), "{md}");
    assert!(
        md.contains("| best Acc@1 | EMA Acc@1 | best EMA Acc@1 | img/s |"),
        "{md}"
    );
    // The smoke run is not the full runs' baseline, nor they its.
    let csv = t.to_csv();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |k: &str| header.iter().position(|h| *h == k).unwrap();
    let smoke: Vec<String> = csv_fields(
        csv.lines()
            .find(|l| l.starts_with("fixture-r50-smoke"))
            .unwrap(),
    );
    assert_eq!(smoke[col("steps_per_epoch")], "20");
    assert_eq!(smoke[col("full_steps_per_epoch")], "5005");
    assert_eq!(smoke[col("val_images")], "500");
    assert_eq!(smoke[col("val_images_total")], "50000");
    assert_eq!(
        smoke[col("covers")],
        "20 of 5,005 steps/epoch, val 500 of 50,000"
    );
    assert_eq!(smoke[col("ema_acc1")], "");
    assert_eq!(smoke[col("efficiency_time")], "1");
    let j = json(&c, vec![]);
    let v = serde_json::to_value(&j.train).unwrap();
    assert_eq!(v[1]["partial"], true);
    assert_eq!(v[1]["steps_per_epoch"], 20);
    assert_eq!(v[1]["val_images_total"], 50000);
    assert_eq!(v[0]["partial"], false);
    assert_eq!(v[2]["best_ema_acc1"], 38.02);
    let dir = tempfile::tempdir().unwrap();
    for f in write_report(&c, dir.path()).unwrap() {
        if let (Some(keep), true) = (
            std::env::var_os("RN50_KEEP_REPORT"),
            f.extension().is_some_and(|e| e == "png"),
        ) {
            let name = format!("mixed-{}", f.file_name().unwrap().to_string_lossy());
            fs::copy(&f, PathBuf::from(keep).join(name)).unwrap();
        }
    }

    // Full runs alone: no covers column, no EMA columns, no warning; the CSV still has the coverage columns.
    let full = collect(&[fixtures().join("runs/fixture-r50-1gpu")], &[]).unwrap();
    let md = markdown(&full);
    for absent in ["⚠", "covers", "Partial", "EMA"] {
        assert!(!md.contains(absent), "{absent}: {md}");
    }
    let rows: Vec<TrainRow> = full.runs.iter().map(train_row).collect();
    let csv = train_table(&rows, true).to_csv();
    let header = csv.lines().next().unwrap();
    assert!(!header.contains("ema"), "{header}");
    assert!(
        header.ends_with(",steps_per_epoch,full_steps_per_epoch,val_images,val_images_total"),
        "{header}"
    );
}

/// Splits a CSV line (quoted fields with commas).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (vec![], String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    out.push(cur);
    out
}

/// lr.png is per logged step from steps.jsonl: x = epoch + (step + 1) / steps per epoch, so the warm-up is a ramp
/// and each epoch ends at a whole number.
#[test]
fn the_lr_plot_is_per_step() {
    let dir = fixtures().join("runs/fixture-r50-smoke");
    let run = read_train_run(&dir).unwrap();
    let steps = read_steps(&dir.join("steps.jsonl")).unwrap();
    assert_eq!(steps.len(), 20);
    let chart = lr_chart(&run, &steps);
    let pts = &chart.series[0].points;
    assert_eq!(pts.len(), 20);
    assert_eq!(pts[0], (0.1, 0.005), "epoch 0 step 1 of 20");
    assert_eq!(pts[9], (1.0, 0.05), "epoch 0's last step");
    assert_eq!(pts[19], (2.0, 0.1));
    assert!(pts.windows(2).all(|w| w[0].1 < w[1].1), "warm-up: {pts:?}");
    assert!(chart.markers.is_empty(), "no resume in this log");
    // A whole run's steps: 5 logged of 5,005 per epoch.
    let dir = fixtures().join("runs/fixture-r50-ema");
    let run = read_train_run(&dir).unwrap();
    let chart = lr_chart(&run, &read_steps(&dir.join("steps.jsonl")).unwrap());
    let xs: Vec<f64> = chart.series[0].points.iter().map(|p| p.0).collect();
    assert_eq!(xs.len(), 15);
    assert_eq!((xs[0], xs[4], xs[14]), (1001.0 / 5005.0, 1.0, 3.0));
    // No steps.jsonl: the epochs' last rates.
    let run = read_train_run(&fixtures().join("runs/fixture-r50-1gpu")).unwrap();
    let chart = lr_chart(&run, &[]);
    assert_eq!(chart.series[0].points.len(), 5);
}

/// An older rn50 appended a resumed attempt's steps after the killed attempt's: the later records replace the
/// earlier ones of the same steps, and the plot marks where the attempt started. rn50 now trims the log to the
/// checkpoint instead, which leaves no such mark.
#[test]
fn a_resume_in_an_older_log_is_marked_where_the_attempt_started() {
    let rec = |epoch, step, lr| rn50_report::StepRecord {
        epoch,
        step,
        loss: 1.0,
        lr,
        ..Default::default()
    };
    // 4 steps per epoch; attempt 1 ran to epoch 1 step 2, attempt 2 went on from epoch 1 step 0.
    let steps = [
        rec(0, 1, 0.1),
        rec(0, 3, 0.2),
        rec(1, 1, 0.3),
        rec(1, 3, 0.4),
        rec(1, 1, 0.31),
        rec(1, 3, 0.41),
        rec(2, 1, 0.5),
    ];
    let (points, resumes) = lr_per_step(&steps, 4);
    assert_eq!(resumes, [1.5]);
    assert_eq!(
        points,
        [(0.5, 0.1), (1.0, 0.2), (1.5, 0.31), (2.0, 0.41), (2.5, 0.5)]
    );
    // The plot draws it, with its legend entry.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("resumed");
    fs::create_dir(&run).unwrap();
    fs::write(run.join("metrics.jsonl"), "{\"epoch\":0,\"lr\":0.2}\n").unwrap();
    let lines: Vec<String> = steps
        .iter()
        .map(|s| serde_json::to_string(s).unwrap() + "\n")
        .collect();
    // And a torn last line (a record being written) is left out.
    fs::write(
        run.join("steps.jsonl"),
        lines.concat() + "{\"epoch\":2,\"st",
    )
    .unwrap();
    assert_eq!(read_steps(&run.join("steps.jsonl")).unwrap().len(), 7);
    let r = read_train_run(&run).unwrap();
    let chart = lr_chart(&r, &read_steps(&run.join("steps.jsonl")).unwrap());
    assert_eq!(chart.markers.len(), 1);
    write_run_report(&run).unwrap();
    keep_pngs(&run, "resumed");
}
