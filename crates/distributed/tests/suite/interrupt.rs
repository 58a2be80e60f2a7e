//! Ctrl-C under `rn50 launch` is a request to stop, not a failure: the terminal's SIGINT reaches the launcher's
//! process group (its workers are in their own, so they get it once, forwarded), each worker stops as asked
//! (exit 3), and so does the launcher, without "failed"; a second Ctrl-C stops the workers at once, and the
//! launcher says it stopped on request (exit 130), again without "failed". Before, a worker died of the forwarded
//! SIGINT and the launcher ended with `rn50 launch: failed: rank 0 was killed by signal 2 (SIGINT)`.
use crate::common;
use common::*;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GUARD: Duration = Duration::from_secs(120);

/// `rn50 launch` of two `sleep` workers (with the worker flags `extra`) in a process group of its own, as a shell
/// starts a foreground job, once both workers are up.
fn two_workers_in_a_terminal(up: &std::path::Path, extra: &[&str]) -> std::process::Child {
    let master = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(WORKER);
    cmd.args(["launch", "--nproc-per-node", "2", "--master", &master])
        .args(["--", "sleep"])
        .args(extra)
        .env("RN50_TEST_UP_DIR", up)
        .env_remove("OMP_NUM_THREADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().unwrap();
    wait_for_files(up, "up");
    child
}

/// Waits until both workers wrote `UP/{what}-{rank}`.
fn wait_for_files(up: &std::path::Path, what: &str) {
    let start = Instant::now();
    while !(up.join(format!("{what}-0")).exists() && up.join(format!("{what}-1")).exists()) {
        assert!(start.elapsed() < GUARD, "workers did not write {what}-RANK");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A terminal's Ctrl-C: SIGINT to every process of the foreground job's process group.
fn ctrl_c(launcher: &std::process::Child) {
    // SAFETY: kill(2) on the process group of our own child, which leads it.
    assert_eq!(
        unsafe { libc::kill(-(launcher.id() as i32), libc::SIGINT) },
        0
    );
}

#[test]
fn ctrl_c_stops_the_workers_as_asked_and_the_launcher_exits_3() {
    let _waits = serial_shared();
    let up = tempfile::tempdir().unwrap();
    let child = two_workers_in_a_terminal(up.path(), &[]);
    ctrl_c(&child);
    let (status, stdout, stderr) = finish(child);
    assert_eq!(status.code(), Some(3), "{stdout}\n{stderr}");
    for r in [0, 1] {
        assert_eq!(
            stdout
                .matches(&format!("[rank {r}] rank {r}: stop requested"))
                .count(),
            1,
            "{stdout}\n{stderr}"
        );
    }
    assert!(!stderr.contains("failed"), "{stderr}");
}

#[test]
fn a_second_ctrl_c_stops_the_workers_at_once_and_is_no_failure() {
    let _waits = serial_shared();
    let up = tempfile::tempdir().unwrap();
    // Workers that take a minute to stop once asked: only the second Ctrl-C can end them in time.
    let child = two_workers_in_a_terminal(up.path(), &["--linger-ms", "60000"]);
    ctrl_c(&child);
    wait_for_files(up.path(), "stopping");
    ctrl_c(&child);
    let (status, stdout, stderr) = finish(child);
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGINT),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("rn50 launch: stopped on request: rank ")
            && stderr.contains(" was killed by signal 2 (SIGINT)"),
        "{stderr}"
    );
    assert!(!stderr.contains("failed"), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "{stderr}");
}
