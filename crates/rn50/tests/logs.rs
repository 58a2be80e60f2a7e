//! Log lines as batch jobs keep them (stderr not a terminal): every line of `train` starts with a UTC time stamp
//! and the level; the per-step lines carry the ETA of the epoch and of the run; `RUST_LOG` filters; one of
//! several ranks says which it is (`[rank N]`), once, whether `rn50 launch` prefixes its lines or not.
mod common;

use std::process::{Command, Output};

use common::rn50;

/// A small run on synthetic data: 2 epochs of 3 steps, a line every step.
fn tiny(out: &std::path::Path) -> Vec<String> {
    let flags = "train --dummy -a resnet18 --width 8 -b 2 --image-size 32 --augment cifar \
                 --steps-per-epoch 3 --epochs 2 -p 1 --device cpu --precision fp32 --out";
    flags
        .split_whitespace()
        .map(String::from)
        .chain([out.to_str().unwrap().to_string()])
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
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
    let r = rn50(&strs(&tiny(&dir.path().join("run"))));
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

#[test]
fn rust_log_filters_by_level() {
    let dir = tempfile::tempdir().unwrap();
    let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(tiny(&dir.path().join("run")))
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
        let train = tiny(&out);
        args.extend(strs(&train));
        let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
            .args(&args)
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
