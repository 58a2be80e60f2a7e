//! Log lines as batch jobs keep them (stderr not a terminal): every line of `train` starts with a UTC time stamp
//! and the level; the per-step lines carry the ETA of the epoch and of the run; evaluation (train's and `rn50
//! eval`'s) has progress lines with images/s and its ETA; the start line's numbers read as people write them;
//! `RUST_LOG` filters; one of several ranks says which it is (`[rank N]`), once, whether `rn50 launch`
//! prefixes its lines or not.
use crate::common;

use std::process::{Command, Output};

use common::{rn50, TinyTrain};

/// A small run on synthetic data: 2 epochs of 3 steps, a line every step.
fn tiny(out: &std::path::Path) -> TinyTrain {
    TinyTrain::dummy(out).flags(
        "--width 8 -b 2 --image-size 32 --augment cifar --steps-per-epoch 3 --epochs 2 -p 1 --precision fp32",
    )
}

/// `2026-11-23T20:41:07.512Z` at the start of `line`: returns the rest after it.
fn after_time_stamp(line: &str) -> Option<&str> {
    let (ts, rest) = (line.get(..24)?, line.get(24..)?);
    let b = ts.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let ok = digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z';
    ok.then_some(rest)
}

/// The level and message of a log line (`None` for a line that is not one).
fn level_and_message(line: &str) -> Option<(&str, &str)> {
    let rest = after_time_stamp(line)?.trim_start();
    let (level, msg) = rest.split_once(' ')?;
    ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
        .contains(&level)
        .then_some((level, msg))
}

/// `h:mm:ss` after `key ` in `msg`, in seconds.
fn eta(msg: &str, key: &str) -> Option<u64> {
    let at = msg.find(&format!("{key} "))? + key.len() + 1;
    let hms: Vec<u64> = msg[at..]
        .split_whitespace()
        .next()?
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    match hms[..] {
        [h, m, s] if m < 60 && s < 60 => Some(h * 3600 + m * 60 + s),
        _ => None,
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_line_has_a_utc_time_stamp_and_level_and_step_lines_have_both_etas() {
    let dir = tempfile::tempdir().unwrap();
    let r = tiny(&dir.path().join("run")).output();
    let log = stderr(&r);
    assert!(r.status.success(), "{log}");
    // Every line is a log line but the end-of-run summary, a table (results are not log lines): its header and
    // one row.
    let (lines, table): (Vec<&str>, Vec<&str>) =
        log.lines().partition(|l| level_and_message(l).is_some());
    assert!(lines.len() >= 8, "{log}");
    assert!(
        table.len() == 2 && table[0].starts_with("run ") && table[0].contains("Acc@1"),
        "lines that are not log lines: {table:?}\n{log}"
    );
    let steps: Vec<&str> = lines
        .iter()
        .filter_map(|l| level_and_message(l))
        .filter(|(level, m)| *level == "INFO" && m.starts_with("epoch ") && m.contains("] loss"))
        .map(|(_, m)| m)
        .collect();
    assert_eq!(steps.len(), 6, "a line per step, 2 epochs of 3:\n{log}");
    for m in &steps {
        let (epoch, run) = (eta(m, "ETA"), eta(m, "run ETA"));
        assert!(epoch.is_some() && run.is_some(), "{m}");
        assert!(run >= epoch, "the run ends after the epoch: {m}");
    }
    // The last step of the run has nothing left.
    assert_eq!(eta(steps[5], "run ETA"), Some(0), "{}", steps[5]);
    assert!(
        steps[0].starts_with("epoch 0 [    1/3]") && steps[5].starts_with("epoch 1 [    3/3]"),
        "{steps:?}"
    );
    // One process of one: no rank in its lines.
    assert!(!log.contains("[rank"), "{log}");
}

/// The messages of the progress lines of `label` (`val epoch 0`, `eval`), each checked to be
/// `LABEL [    i/n] R img/s ETA h:mm:ss` with a rate above 0.
fn eval_lines<'a>(log: &'a str, label: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = log
        .lines()
        .filter_map(level_and_message)
        .map(|(_, m)| m)
        .filter(|m| m.starts_with(&format!("{label} [")))
        .collect();
    for m in &lines {
        let (_, rest) = m.split_once("] ").unwrap_or_else(|| panic!("{m}"));
        let (rate, rest) = rest.split_once(" img/s ").unwrap_or_else(|| panic!("{m}"));
        assert!(rate.parse::<f64>().unwrap() > 0.0, "{m}");
        assert!(
            rest.starts_with("ETA ") && eta(rest, "ETA").is_some(),
            "{m}"
        );
    }
    lines
}

/// Evaluation is not silent: a time-stamped line per `-p` batches with images/s and the ETA, after each epoch of
/// `train` and in `rn50 eval`, the last one at ETA 0. The start line's milestones given as thirds of 2 epochs
/// read 0.667, 1.333, 1.778, not f64's 0.6666666666666666; each epoch's line has the training top-1.
#[test]
fn evaluation_shows_progress_and_the_start_line_reads_as_people_write() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    common::image_tree(&data, "train", 2, 2);
    // 6 images, batch 2: 3 batches.
    common::image_tree(&data, "val", 2, 3);
    let out = dir.path().join("run");
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let r = rn50(&[
        "train",
        d,
        "-a",
        "resnet18",
        "--width",
        "8",
        "-b",
        "2",
        "--image-size",
        "32",
        "--val-resize",
        "36",
        "--val-crop",
        "32",
        "--epochs",
        "2",
        "--lr-milestones",
        "0.6666666666666666,1.3333333333333333,1.7777777777777777",
        "-p",
        "1",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--out",
        o,
    ]);
    let log = stderr(&r);
    assert!(r.status.success(), "{log}");
    for e in 0..2 {
        let label = format!("val epoch {e}");
        let lines = eval_lines(&log, &label);
        assert_eq!(lines.len(), 3, "{log}");
        for (i, l) in lines.iter().enumerate() {
            assert!(l.starts_with(&format!("{label} [{:>5}/3] ", i + 1)), "{l}");
        }
        assert_eq!(eta(lines[2], "ETA"), Some(0), "{}", lines[2]);
    }
    let start = log
        .lines()
        .filter_map(level_and_message)
        .find(|(_, m)| m.starts_with("rn50 train:"))
        .unwrap_or_else(|| panic!("no start line:\n{log}"))
        .1;
    assert!(
        start.contains("step ×0.1 at epochs 0.667, 1.333, 1.778, 2 epochs"),
        "{start}"
    );
    let epoch_lines = log
        .lines()
        .filter(|l| l.contains(": loss ") && l.contains("train Acc@1 "));
    assert_eq!(epoch_lines.count(), 2, "{log}");

    let weights = out.join("final.safetensors");
    let r = rn50(&[
        "eval",
        d,
        "--weights",
        weights.to_str().unwrap(),
        "-a",
        "resnet18",
        "-b",
        "2",
        "--resize",
        "36",
        "--crop",
        "32",
        "-p",
        "2",
        "--device",
        "cpu",
    ]);
    let log = stderr(&r);
    assert!(r.status.success(), "{log}");
    // -p 2: batch 2, and the last.
    let lines = eval_lines(&log, "eval");
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].starts_with("eval [    2/3]") && lines[1].starts_with("eval [    3/3]"),
        "{lines:?}"
    );
}

#[test]
fn rust_log_filters_by_level() {
    let dir = tempfile::tempdir().unwrap();
    let r = tiny(&dir.path().join("run"))
        .command()
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let log = stderr(&r);
    assert!(r.status.success(), "{log}");
    assert!(!log.contains(" INFO "), "{log}");
    // Results are not log lines: the summary is still there, and the run's files are all written.
    assert!(log.contains("Acc@1"), "{log}");
    assert!(dir.path().join("run/final.safetensors").exists());
}

/// `rn50 launch` prefixes each worker's lines with `[rank N] ` (the rank then comes first, and once); with
/// `--no-prefix` the worker writes `[rank N]` after the level itself, as under srun, mpirun or torchrun.
#[test]
fn ranks_say_which_they_are_once() {
    let dir = tempfile::tempdir().unwrap();
    for prefix in [true, false] {
        let out = dir.path().join(format!("run-{prefix}"));
        let mut args = vec!["launch", "--nproc-per-node", "2"];
        if !prefix {
            args.push("--no-prefix");
        }
        args.push("--");
        let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
            .args(&args)
            .args(tiny(&out).to_args())
            .env("OMP_NUM_THREADS", "1")
            .env("RN50_DIST_TIMEOUT", "60")
            .output()
            .unwrap();
        let log = stderr(&r);
        assert!(r.status.success(), "{log}");
        let steps: Vec<&str> = log.lines().filter(|l| l.contains("] loss")).collect();
        assert_eq!(steps.len(), 6, "rank 0 logs each step:\n{log}");
        for l in steps {
            let (line, rank_in_message) = match l.strip_prefix("[rank 0] ") {
                Some(rest) => (rest, false),
                None => (l, true),
            };
            assert_eq!(rank_in_message, !prefix, "{l}");
            let (level, msg) = level_and_message(line).unwrap_or_else(|| panic!("{l}"));
            assert_eq!(level, "INFO");
            assert_eq!(msg.starts_with("[rank 0] epoch "), !prefix, "{l}");
            assert_eq!(msg.matches("[rank").count(), usize::from(!prefix), "{l}");
        }
    }
}
