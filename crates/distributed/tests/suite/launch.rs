//! `launch --max-restarts`, `--log-dir` and `--nproc-per-node gpu`, with real launcher and worker processes
//! (src/bin/worker.rs's `attempt` and `sleep`).
use crate::common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `launch ARGS… -- attempt ATTEMPT_ARGS…` on 2 local ranks; status, stdout, stderr.
fn attempts(launch_args: &[&str], attempt_args: &[&str]) -> (Option<i32>, String, String) {
    let up = tempfile::tempdir().unwrap();
    let master = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--nproc-per-node", "2", "--master", &master, "--grace", "5"];
    args.extend_from_slice(launch_args);
    args.extend_from_slice(&["--", "attempt"]);
    args.extend_from_slice(attempt_args);
    let (status, stdout, stderr) = finish(launcher(&args, up.path()));
    (status.code(), stdout, stderr)
}

#[test]
fn a_failed_attempt_is_restarted_and_the_next_one_succeeds() {
    let _waits = serial_shared();
    let (code, stdout, stderr) = attempts(
        &["--max-restarts", "1"],
        &["--fail-rank", "1", "--fail-attempts", "1"],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "rn50 launch: rank 1 exited with status 7: restarting all workers (restart 1 of 1)"
        ),
        "{stderr}"
    );
    for r in [0, 1] {
        for n in [0, 1] {
            assert!(
                stdout.contains(&format!(
                    "[rank {r}] rank {r} stdout: RN50_RESTART_COUNT={n}"
                )),
                "rank {r} attempt {n} missing:\n{stdout}"
            );
        }
    }
    assert!(!stdout.contains("RN50_RESTART_COUNT=2"), "{stdout}");
}

#[test]
fn a_worker_that_always_fails_uses_up_the_restarts() {
    let _waits = serial_shared();
    let (code, stdout, stderr) = attempts(&["--max-restarts", "2"], &["--fail-rank", "1"]);
    assert_eq!(code, Some(7), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("restart 1 of 2") && stderr.contains("restart 2 of 2"),
        "{stderr}"
    );
    assert!(
        stderr.contains("rn50 launch: failed: rank 1 exited with status 7 (after 2 of 2 restarts)"),
        "{stderr}"
    );
    assert!(
        stdout.contains("[rank 1] rank 1 stdout: RN50_RESTART_COUNT=2"),
        "{stdout}"
    );
    assert!(!stdout.contains("RN50_RESTART_COUNT=3"), "{stdout}");
}

#[test]
fn without_max_restarts_a_failure_ends_the_job() {
    let _waits = serial_shared();
    let (code, stdout, stderr) = attempts(&[], &["--fail-rank", "0", "--code", "5"]);
    assert_eq!(code, Some(5), "{stdout}\n{stderr}");
    assert!(!stderr.contains("restart"), "{stderr}");
    assert!(
        stderr.contains("rn50 launch: failed: rank 0 exited with status 5\n"),
        "{stderr}"
    );
    assert!(!stdout.contains("RN50_RESTART_COUNT=1"), "{stdout}");
}

#[test]
fn exit_3_is_passed_through_not_restarted() {
    let _waits = serial_shared();
    let (code, stdout, stderr) = attempts(
        &["--max-restarts", "3"],
        &["--fail-rank", "1", "--code", "3"],
    );
    assert_eq!(code, Some(3), "{stdout}\n{stderr}");
    assert!(!stderr.contains("restart"), "{stderr}");
    assert!(!stdout.contains("RN50_RESTART_COUNT=1"), "{stdout}");
}

#[test]
fn each_rank_logs_every_attempt_to_its_file() {
    let _waits = serial_shared();
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().join("logs");
    let (code, stdout, stderr) = attempts(
        &["--max-restarts", "1", "--log-dir", dir.to_str().unwrap()],
        &["--fail-rank", "1", "--fail-attempts", "1"],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for r in [0, 1] {
        let log = std::fs::read_to_string(dir.join(format!("rank{r}.log"))).unwrap();
        // Per attempt: the header, the worker's two lines (stdout and stderr, in either order), how it ended.
        let mut attempts: Vec<Vec<&str>> = Vec::new();
        for line in log.lines() {
            if line.starts_with(&format!("=== rn50 launch: rank {r}, attempt ")) {
                attempts.push(Vec::new());
            }
            attempts.last_mut().expect("a header first").push(line);
        }
        assert_eq!(attempts.len(), 2, "{log}");
        for (n, attempt) in attempts.iter().enumerate() {
            assert!(
                attempt[0].starts_with(&format!(
                    "=== rn50 launch: rank {r}, attempt {} (RN50_RESTART_COUNT={n}), 20",
                    n + 1
                )),
                "{log}"
            );
            // Rank 1 fails its first attempt (exit 7). Rank 0's first attempt then ends either way: it exits 0,
            // or, when rank 1's failure comes first (a loaded machine), the launcher stops it to restart both,
            // possibly before it printed anything.
            let status = if r == 1 && n == 0 { 7 } else { 0 };
            let exited = format!("=== rn50 launch: rank {r} exited with status {status} ===");
            let stopped = "=== rn50 launch: rank 0 was killed by signal 15 (SIGTERM) ===";
            let end = *attempt.last().unwrap();
            let was_stopped = r == 0 && n == 0 && end == stopped;
            assert!(
                end == exited || was_stopped,
                "attempt {}, how it ended: {end:?}\n{log}",
                n + 1
            );
            let printed = &attempt[1..attempt.len() - 1];
            let lines =
                ["stdout", "stderr"].map(|s| format!("rank {r} {s}: RN50_RESTART_COUNT={n}"));
            let mut sorted = printed.to_vec();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), printed.len(), "a line twice:\n{log}");
            assert!(
                printed.iter().all(|l| lines.contains(&l.to_string())),
                "{log}"
            );
            assert!(was_stopped || printed.len() == 2, "{log}");
        }
    }
    // The terminal still gets every rank's lines, prefixed.
    assert!(
        stdout.contains("[rank 1] rank 1 stdout: RN50_RESTART_COUNT=1"),
        "{stdout}"
    );
}

#[test]
fn a_killed_worker_is_restarted_and_a_signal_to_the_launcher_is_not() {
    let _waits = serial_shared();
    let up = tempfile::tempdir().unwrap();
    let master = format!("127.0.0.1:{}", free_port());
    let child = launcher(
        &[
            "--nproc-per-node",
            "2",
            "--master",
            &master,
            "--grace",
            "5",
            "--max-restarts",
            "1",
            "--",
            "sleep",
        ],
        up.path(),
    );
    let wait_up = || {
        let start = Instant::now();
        while !(up.path().join("up-0").exists() && up.path().join("up-1").exists()) {
            assert!(start.elapsed() < LAUNCH_GUARD, "workers did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        for r in [0, 1] {
            std::fs::remove_file(up.path().join(format!("up-{r}"))).unwrap();
        }
    };
    wait_up();
    let victim = worker_pid(child.id(), 1).expect("rank 1's pid");
    // SAFETY: kill(2) on a worker of our own launcher.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    // The second attempt's workers start; SIGUSR1 to the launcher then stops them (exit 3), with no restart
    // (one would be left).
    wait_up();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let (status, stdout, stderr) = finish(child);
    assert_eq!(status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "rank 1 was killed by signal 9 (SIGKILL): restarting all workers (restart 1 of 1)"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.matches("restarting").count(), 1, "{stderr}");
    for r in [0, 1] {
        assert!(
            stdout.contains(&format!("[rank {r}] rank {r}: stop requested")),
            "{stdout}"
        );
    }
}

/// `rn50-dist-worker launch --nproc-per-node gpu -- attempt` with CUDA_VISIBLE_DEVICES set to `devices`.
fn gpu_launch(devices: &str) -> (Option<i32>, String, String) {
    let out = Command::new(WORKER)
        .args(["launch", "--nproc-per-node", "gpu", "--", "attempt"])
        .env("CUDA_VISIBLE_DEVICES", devices)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn nproc_per_node_gpu_counts_the_visible_devices() {
    let _waits = serial_shared();
    let (code, stdout, stderr) = gpu_launch("0,1");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    for r in [0, 1] {
        assert!(
            stdout.contains(&format!("[rank {r}] rank {r} stdout: RN50_RESTART_COUNT=0")),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("[rank 2]"), "{stdout}");
    // CUDA ignores the list from its first invalid entry on.
    let (code, stdout, stderr) = gpu_launch("3,-1,2");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("[rank 0]") && !stdout.contains("[rank 1]"),
        "{stdout}"
    );
}

#[test]
fn nproc_per_node_gpu_without_devices_is_a_usage_error() {
    for devices in ["", "-1"] {
        let (code, stdout, stderr) = gpu_launch(devices);
        assert_eq!(code, Some(2), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("invalid value 'gpu' for '--nproc-per-node <N|gpu>': no CUDA device visible (CUDA_VISIBLE_DEVICES="),
            "{stderr}"
        );
        assert!(stdout.is_empty(), "{stdout}");
    }
    // Integers still work, and anything else is refused.
    let out = Command::new(WORKER)
        .args(["launch", "--nproc-per-node", "0", "--", "attempt"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected 1 to 1024 or `gpu`"));
}
