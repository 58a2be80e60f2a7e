//! `train --mllog` against MLCommons' own tools (issue 26): the compliance checker of the .venv's mlperf-logging
//! (ruleset 4.0.0, its newest with ResNet) passes short CPU runs' logs as they are, mllog's own encoder writes
//! every line as rn50 wrote it, and what made raw logs fail is gone: no submission lines or cache_clear, a step
//! schedule's end rate of 0, run_stop success for any --target-accuracy, a resumed run's second attempt in the
//! same file, submission flags without --mllog. --drop-caches really drops the page cache, and needs root.
use crate::common;

use std::ffi::OsStr;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{
    metrics_lines, python, python_output, reference_script, shared_photos, steps, TinyTrain,
};
use serde_json::Value;

/// DATA/{train,val}/<wnid>/: the `n` smallest ImageNet sample photos (quick to decode), each its own class,
/// `copies` times in train/; in val/ each once, and the first photo once more under the second class. One network
/// gets at most one of the two right: top-1 is at most n/(n+1), below 100% (the checker wants an eval_accuracy
/// under 1.0), and a network that has learnt the n photos scores n/(n+1) (n = 2: 66.7%, under MLPerf's 75.9%; n =
/// 8: 88.9%, and 77.8% with one more miss). The validation photos are the training photos: a toy that reaches
/// the target honestly, not an ImageNet result.
fn toy_data(root: &Path, n: usize, copies: usize) {
    let mut photos = shared_photos();
    photos.sort_by_key(|p| (std::fs::metadata(p).unwrap().len(), p.clone()));
    photos.truncate(n);
    photos.sort();
    let wnid = |p: &Path| p.file_stem().unwrap().to_str().unwrap().to_string();
    for p in &photos {
        let w = wnid(p);
        for (split, k) in [("train", copies), ("val", 1)] {
            let dir = root.join(split).join(&w);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..k {
                std::fs::copy(p, dir.join(format!("{w}_{i}.JPEG"))).unwrap();
            }
        }
    }
    let twin = root
        .join("val")
        .join(wnid(&photos[1]))
        .join(format!("{}_twin.JPEG", wnid(&photos[0])));
    std::fs::copy(&photos[0], twin).unwrap();
}

/// A small, quick network for the toy data in `data` on CPU, evaluated every epoch, into `out`.
fn toy(data: &Path, out: &Path) -> TinyTrain {
    TinyTrain::on(data, out).flags(
        "--width 8 -b 8 --image-size 32 --val-resize 32 --val-crop 32 --precision fp32 --eval-every 1 \
         --eval-offset 0",
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `python ARGS…` ([`python_output`]) where the tests' Python must have MLCommons' mlperf-logging
/// (scripts/requirements.txt pins it; ./dev setup installs it): a missing module fails the test, saying so.
fn mlperf_python(args: &[&OsStr]) -> Output {
    let probe = python_output(
        &[
            "-c",
            "import mlperf_logging.compliance_checker, mlperf_logging.mllog",
        ],
        None,
        &[],
    );
    assert!(
        probe.status.success(),
        "MLCommons' mlperf-logging is not installed in {} (pinned in scripts/requirements.txt; ./dev setup installs \
         it):\n{}",
        python().display(),
        String::from_utf8_lossy(&probe.stderr)
    );
    python_output(args, None, &[])
}

/// MLCommons' compliance checker on `log` (training, ruleset 4.0.0): whether it passed, and what it printed.
fn checker(log: &Path) -> (bool, String) {
    let report = log.with_extension("checker.txt");
    let out = mlperf_python(&[
        "-m".as_ref(),
        "mlperf_logging.compliance_checker".as_ref(),
        "--usage".as_ref(),
        "training".as_ref(),
        "--ruleset".as_ref(),
        "4.0.0".as_ref(),
        "--log_output".as_ref(),
        report.as_os_str(),
        log.as_os_str(),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The `:::MLLOG` lines of `path`, parsed (each line must be one).
fn mllog_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let json = l.strip_prefix(":::MLLOG ").unwrap_or_else(|| panic!("{l}"));
            serde_json::from_str(json).unwrap()
        })
        .collect()
}

/// The values of `key` in `lines`, in order.
fn values(lines: &[Value], key: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["key"] == key)
        .map(|l| l["value"].clone())
        .collect()
}

/// The one value of `key`.
fn value(lines: &[Value], key: &str) -> Value {
    let v = values(lines, key);
    assert_eq!(v.len(), 1, "{key}: {v:?}");
    v[0].clone()
}

/// run_stop's status.
fn status(lines: &[Value]) -> String {
    let stops: Vec<&Value> = lines.iter().filter(|l| l["key"] == "run_stop").collect();
    assert_eq!(stops.len(), 1, "{stops:?}");
    stops[0]["metadata"]["status"].as_str().unwrap().to_string()
}

/// A closed-division run with MLPerf's LARS recipe (recipes/mlperf-lars.toml, shrunk to the toy data and a CPU)
/// and the submission's flags, into a log where a job script logged cache_clear with mllog itself (as MLPerf's
/// scripts do after dropping the caches): the official checker passes the log as written (the raw logs failed on
/// the missing submission lines and cache_clear), rn50 did not contradict the script's cache_clear, the run
/// stopped at the first evaluation that reached 75.9%, and mllog's encoder writes every line as rn50 did
/// (`{"namespace": "", ...`, floats as Python's `5e-05`, the org's accents and quotes escaped as json.dumps does).
#[test]
fn a_closed_division_run_passes_the_official_checker() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    toy_data(&data, 8, 4);
    let (out, log) = (dir.path().join("run"), dir.path().join("result_0.txt"));
    let script = format!(
        "from mlperf_logging import mllog\nmllog.config(filename='{}')\n\
         mllog.get_mllogger().event(key=mllog.constants.CACHE_CLEAR, value=True)",
        s(&log)
    );
    let logged = mlperf_python(&["-c".as_ref(), script.as_ref()]);
    assert!(
        logged.status.success(),
        "{}",
        String::from_utf8_lossy(&logged.stderr)
    );
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes/mlperf-lars.toml");
    let r = toy(&data, &out)
        .args(["--config", s(&recipe)])
        .flags("--lr 2 --epochs 30")
        .args(["--mllog", s(&log)])
        .flags(
            "--submission-platform 1xCPU --submission-division closed --submission-status research",
        )
        .args(["--submission-org", "Université \"Toy\" Lab"])
        .output();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    let (passed, report) = checker(&log);
    assert!(passed, "the checker refused {}:\n{report}", log.display());

    let lines = mllog_lines(&log);
    assert_eq!(status(&lines), "success");
    let acc: Vec<f64> = values(&lines, "eval_accuracy")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let last = *acc.last().unwrap();
    assert!((0.759..1.0).contains(&last), "{acc:?}");
    assert!(
        acc[..acc.len() - 1].iter().all(|&a| a < 0.759),
        "stops at the first evaluation that reaches the target: {acc:?}"
    );
    assert!(acc.len() < 30, "stopped before the last epoch: {acc:?}");
    assert_eq!(
        metrics_lines(&out).len(),
        acc.len(),
        "one evaluation per epoch trained"
    );
    assert_eq!(value(&lines, "submission_org"), "Université \"Toy\" Lab");
    assert_eq!(value(&lines, "submission_platform"), "1xCPU");
    assert_eq!(value(&lines, "submission_division"), "closed");
    assert_eq!(value(&lines, "submission_status"), "research");
    assert_eq!(value(&lines, "cache_clear"), true, "the script's, alone");
    assert_eq!(lines[0]["key"], "cache_clear");
    assert_eq!(value(&lines, "lars_opt_weight_decay"), 0.00005);
    assert_eq!(
        (
            value(&lines, "train_samples"),
            value(&lines, "eval_samples")
        ),
        (32.into(), 9.into())
    );
    // The file is as mllog writes: its own encoder gives every line back byte for byte.
    reference_script("mllog_encode.py", &[&log]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(r#""key": "run_stop""#),
        "grep-able as mllog's"
    );
}

/// Values that Python's json.dumps writes its own way, each logged by rn50's writer: floats (`1e-05`, `1e+16`,
/// `2.0`, `-0.0`, the shortest digits), integers beyond f64, strings with accents, an emoji, DEL, control
/// characters, quotes and backslashes, and nested lists and objects. mllog's encoder gives each line back as it is.
#[test]
fn every_value_is_written_as_json_dumps_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("values.txt");
    let mut log = rn50::train::mllog::MlLog::open(&path).unwrap();
    let floats = [
        0.0,
        -0.0,
        1e-4,
        1e-5,
        5e-5,
        0.1 + 0.2,
        1e15,
        1e16,
        1.5e300,
        5e-324,
        2.0,
        3264.0,
        0.759,
        -123.456e-9,
    ];
    for f in floats {
        log.event("float", f).unwrap();
    }
    log.event("int", u64::MAX).unwrap();
    log.event("int", i64::MIN).unwrap();
    for t in [
        "Ünïversité",
        "😀",
        "\u{7f}",
        "\u{1}\u{1f}",
        "\"quoted\" \\ / tab\t\r\n",
        "\u{2028}",
    ] {
        log.event("string", t).unwrap();
    }
    log.event_with(
        "nested",
        serde_json::json!({"a": [1, 2.5, null, true, "é"], "b": {}, "c": []}),
        serde_json::json!({"epoch_num": 3, "note": "ü"}),
    )
    .unwrap();
    drop(log);
    reference_script("mllog_encode.py", &[&path]);
}

/// A quick run on synthetic data (no accuracy: the target is never reached) into `out`, logging to
/// `log`, then `extra`.
fn dummy_run(out: &Path, log: &Path, extra: &str) -> TinyTrain {
    TinyTrain::dummy(out)
        .flags("--width 8 -b 2 --image-size 32 --augment cifar --precision fp32 -p 1")
        .args(["--mllog", s(log)])
        .flags(extra)
}

/// The learning rate of the last step steps.jsonl logged (every step with -p 1).
fn last_step_lr(out: &Path) -> f64 {
    steps(out).last().unwrap().lr
}

/// `--lr-schedule step` logged sgd_opt_end_learning_rate 0 (issue 26): the end rate is the rate the last step
/// trained at, as steps.jsonl has it, for the step schedule (÷10 at each milestone) and MLPerf's polynomial
/// decay alike; the step schedule's milestones and factor are logged under mllog's names, the poly power only
/// for poly.
#[test]
fn the_end_learning_rate_is_the_last_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (out, log) = (dir.path().join("step"), dir.path().join("step.txt"));
    let r = dummy_run(
        &out,
        &log,
        "--epochs 3 --steps-per-epoch 2 --lr 0.4 --lr-schedule step --lr-milestones 1,2",
    )
    .output();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let lines = mllog_lines(&log);
    let end = value(&lines, "sgd_opt_end_learning_rate").as_f64().unwrap();
    assert_eq!(end, last_step_lr(&out));
    assert!(end > 0.0 && end < 0.4, "{end}");
    assert_eq!(value(&lines, "sgd_opt_base_learning_rate"), 0.4);
    assert_eq!(
        value(&lines, "opt_learning_rate_decay_boundary_epochs"),
        serde_json::json!([1.0, 2.0])
    );
    assert_eq!(value(&lines, "opt_learning_rate_decay_factor"), 0.1);
    assert!(values(&lines, "sgd_opt_learning_rate_decay_poly_power").is_empty());

    let (out, log) = (dir.path().join("poly"), dir.path().join("poly.txt"));
    let r = dummy_run(
        &out,
        &log,
        "--epochs 2 --steps-per-epoch 2 --optimizer lars --lr 2 --lr-schedule poly --lr-end 0.0001",
    )
    .output();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let lines = mllog_lines(&log);
    let end = value(&lines, "lars_opt_end_learning_rate")
        .as_f64()
        .unwrap();
    assert_eq!(end, last_step_lr(&out));
    assert_eq!(end, 0.0001);
    assert_eq!(
        value(&lines, "lars_opt_learning_rate_decay_poly_power"),
        2.0
    );
    assert!(values(&lines, "opt_learning_rate_decay_boundary_epochs").is_empty());
}

/// run_stop said success for any --target-accuracy (issue 26). With --mllog the target is MLPerf's 75.9%: another
/// --target-accuracy is a usage error (exit 2) before anything is written, 75.9 itself is accepted. A run whose
/// best evaluation is under 75.9% (the toy data with two photos: at most 66.7%) trains every epoch and ends
/// aborted, and its open-division log passes the checker (an aborted run is a log, not a result).
#[test]
fn run_stop_success_is_mlperfs_target_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    toy_data(&data, 2, 4);
    let (out, log) = (dir.path().join("run"), dir.path().join("result_0.txt"));
    let base = toy(&data, &out)
        .flags("--lr 0.5 --epochs 3")
        .args(["--mllog", s(&log)])
        .flags("--submission-org Toy --submission-platform 1xCPU --submission-division open");
    let with = |extra: &str| base.clone().flags(extra);
    let r = with("--target-accuracy 50").output();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--target-accuracy 50 with --mllog") && err.contains("75.9"),
        "{err}"
    );
    assert!(!out.exists() && !log.exists(), "nothing written");
    let parsed = common::rn50_parse_only(&with("--target-accuracy 75.9").to_args());
    assert!(
        parsed.status.success(),
        "{}",
        String::from_utf8_lossy(&parsed.stderr)
    );

    let r = base.output();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let lines = mllog_lines(&log);
    let acc = values(&lines, "eval_accuracy");
    assert_eq!(acc.len(), 3, "every epoch: {acc:?}");
    assert!(acc.iter().all(|a| a.as_f64().unwrap() < 0.759), "{acc:?}");
    assert_eq!(status(&lines), "aborted");
    assert_eq!(value(&lines, "cache_clear"), false, "no --drop-caches");
    let summary: rn50_report::TrainSummary =
        rn50_report::schema::read_json(&out.join("summary.json")).unwrap();
    assert_eq!(summary.target_acc1, Some(75.9));
    assert!(summary.time_to_target_s.is_none());
    let (passed, report) = checker(&log);
    assert!(passed, "the checker refused {}:\n{report}", log.display());
}

/// A run and its resume in one log failed 15 EXACTLY_ONE rules (issue 26). A log holds one uninterrupted run: a
/// run stopped by SIGTERM ends its log with run_stop aborted; its resume trains on, says why it writes no log,
/// and leaves the log byte for byte; a new run into a log that holds a run is refused (exit 1) before anything
/// is written, the run directory included.
#[test]
fn a_log_holds_one_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let (out, log) = (dir.path().join("run"), dir.path().join("result_0.txt"));
    let mut child = dummy_run(&out, &log, "--epochs 1 --steps-per-epoch 100000")
        .command()
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // After its third step, stop it as SLURM would.
    let _err = common::read_stderr_until(&mut child, "[    3/");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(3), "preempted");
    let lines = mllog_lines(&log);
    assert_eq!(lines.last().unwrap()["key"], "run_stop");
    assert_eq!(status(&lines), "aborted");
    let first = std::fs::read(&log).unwrap();

    let r = dummy_run(&out, &log, "--epochs 1 --steps-per-epoch 20 --resume auto").output();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("not written by this run: it resumes from a checkpoint"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        first,
        "the log is the first attempt's"
    );
    assert_eq!(metrics_lines(&out).len(), 1, "trained on");

    let listing = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let before = listing(&out);
    let r = dummy_run(&out, &log, "--epochs 1 --steps-per-epoch 2 --overwrite").output();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(err.contains("already holds a run"), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), first);
    assert_eq!(listing(&out), before, "--overwrite removed nothing");
}

/// The submission's flags and --drop-caches need --mllog, and their values are checked: exit 2, naming the flag,
/// before anything is written.
#[test]
fn mlperf_flags_need_mllog_and_valid_values() {
    let dir = tempfile::tempdir().unwrap();
    let (out, log) = (dir.path().join("run"), dir.path().join("log.txt"));
    let without = TinyTrain::dummy(&out).flags("--width 8 -b 2 --image-size 32");
    for flag in [
        "--submission-org Lab",
        "--submission-platform 1xCPU",
        "--submission-division open",
        "--submission-status cloud",
        "--drop-caches",
    ] {
        let r = without.clone().flags(flag).output();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("--mllog"), "{flag}: {err}");
    }
    for (flag, value) in [
        ("--submission-division", "semi"),
        ("--submission-status", "rented"),
        ("--submission-org", ""),
        ("--submission-platform", "  "),
    ] {
        let r = without
            .clone()
            .args(["--mllog", s(&log), flag, value])
            .output();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{flag} {value:?}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
    assert!(!out.exists() && !log.exists(), "nothing written");
}

/// The pages of `path` in the page cache (mincore over a mapping of it, which reads nothing in).
fn cached_pages(path: &Path) -> usize {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    // SAFETY: a read-only shared mapping of a file this test owns, unmapped before returning.
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(map, libc::MAP_FAILED);
        let mut resident = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(map, len, resident.as_mut_ptr()), 0);
        libc::munmap(map, len);
        resident.iter().filter(|&&b| b & 1 == 1).count()
    }
}

/// --drop-caches drops the page cache for real (a file read just before is no longer cached after the run
/// starts) and logs cache_clear true before init_start; without root it is an error naming the kernel's switch
/// (exit 1) before anything is written. As root, the refusal is tested as the user nobody (setpriv).
#[test]
fn drop_caches_drops_the_page_cache_and_needs_root() {
    let root = unsafe { libc::geteuid() } == 0;
    let dir = tempfile::tempdir().unwrap();
    // The refused run may write here, as whichever user it runs as.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let (out, log) = (dir.path().join("run"), dir.path().join("log.txt"));
    let run = dummy_run(&out, &log, "--epochs 1 --steps-per-epoch 1 --drop-caches");
    let mut refused = match root {
        true => {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
            c.arg(env!("CARGO_BIN_EXE_rn50"));
            c
        }
        false => Command::new(env!("CARGO_BIN_EXE_rn50")),
    };
    let r = refused.args(run.to_args()).output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--drop-caches: cannot open /proc/sys/vm/drop_caches for writing")
            && err.contains("root"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!out.exists() && !log.exists(), "nothing written");
    if !root {
        return;
    }
    // On the disk (a tmpfs file is not page cache that can be dropped).
    let marker = tempfile::NamedTempFile::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::write(marker.path(), vec![7u8; 8 << 20]).unwrap();
    std::fs::read(marker.path()).unwrap();
    assert!(
        cached_pages(marker.path()) > 0,
        "the marker is cached before the run"
    );
    let r = run.output();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(
        cached_pages(marker.path()),
        0,
        "the run dropped the page cache"
    );
    let lines = mllog_lines(&log);
    assert_eq!(lines[0]["key"], "cache_clear");
    assert_eq!(lines[0]["value"], true);
    assert_eq!(lines[1]["key"], "init_start");
    assert!(lines[0]["time_ms"].as_u64() <= lines[1]["time_ms"].as_u64());
}

/// Waits for `child` (its stdout and stderr read by other threads), killing it and failing the test if it has not
/// ended after `secs`: a deadline only to end a hang, far beyond what the run takes.
fn wait_or_kill(
    child: &mut std::process::Child,
    secs: u64,
    what: &str,
) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed().as_secs() > secs {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{what}: rn50 hung ({secs} s)");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `--mllog` to a pipe is written to as it is (issue 34): rn50's own stdout when it is a pipe (`--mllog /dev/stdout
/// | cat`), and a FIFO another process reads. Both hung before training: rn50 read the whole target first,
/// looking for an earlier run, from a pipe whose write end it held.
#[test]
fn a_log_to_a_pipe_is_written_as_it_is() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let run = |out: &str, log: &Path| -> Command {
        let mut cmd =
            dummy_run(&dir.path().join(out), log, "--epochs 1 --steps-per-epoch 2").command();
        cmd.stderr(Stdio::piped());
        cmd
    };
    // The log's lines among what `reader` got, the keys of those in order.
    let keys = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(":::MLLOG "))
            .map(|j| {
                serde_json::from_str::<Value>(j).unwrap()["key"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            r.read_to_string(&mut text).unwrap();
            text
        })
    };

    let mut child = run("stdout", Path::new("/dev/stdout"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = read_all(Box::new(child.stdout.take().unwrap()));
    let stderr = read_all(Box::new(child.stderr.take().unwrap()));
    let status = wait_or_kill(&mut child, 300, "--mllog /dev/stdout | cat");
    let err = stderr.join().unwrap();
    assert!(status.success(), "{err}");
    let got = keys(&stdout.join().unwrap());
    assert_eq!(
        (
            got.first().map(String::as_str),
            got.last().map(String::as_str)
        ),
        (Some("cache_clear"), Some("run_stop")),
        "{got:?}"
    );

    let fifo = dir.path().join("log.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut child = run("fifo", &fifo).stdout(Stdio::null()).spawn().unwrap();
    let stderr = read_all(Box::new(child.stderr.take().unwrap()));
    // Opening the FIFO to read waits for rn50 to open it to write.
    let path = fifo.clone();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::fs::File::open(path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    });
    let status = wait_or_kill(&mut child, 300, "--mllog FIFO");
    let err = stderr.join().unwrap();
    if !reader.is_finished() {
        // rn50 ended without opening the FIFO: let the reader's open return.
        drop(std::fs::OpenOptions::new().write(true).open(&fifo));
    }
    assert!(status.success(), "{err}");
    let got = keys(&reader.join().unwrap());
    assert!(got.contains(&"init_start".to_string()), "{got:?}");
    assert_eq!(got.last().map(String::as_str), Some("run_stop"), "{got:?}");
}
