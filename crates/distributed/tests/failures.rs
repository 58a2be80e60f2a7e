//! Failures end the job quickly with messages that name the culprit: a rank killed mid-training, the store server
//! (rank 0) killed, a wrong MASTER_PORT, a rank that never starts, a worker failing under `launch`.
mod common;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GUARD: Duration = Duration::from_secs(120);

/// Starts a 3-rank job that trains until killed; kills `victim` with SIGKILL once it has done a few steps; returns
/// the survivors' (rank, status, log).
fn kill_mid_training(victim: usize) -> Vec<(usize, std::process::ExitStatus, String)> {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().to_str().unwrap().to_string();
    let args = [
        "train",
        "--out",
        &out,
        "--steps",
        "1000000",
        "--sleep-ms",
        "20",
        "--bucket-bytes",
        "400",
    ];
    let mut ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank(dir.path(), 3, r, port, 10.0, &args))
        .collect();
    let steps = dir.path().join(format!("step-rank{victim}"));
    let start = Instant::now();
    while std::fs::read_to_string(&steps)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        < 3
    {
        if start.elapsed() > GUARD
            || ranks
                .iter_mut()
                .any(|r| r.child.try_wait().unwrap().is_some())
        {
            ranks.iter_mut().for_each(|r| {
                let _ = r.child.kill();
            });
            let logs: Vec<String> = ranks.iter().map(log).collect();
            panic!("job did not start training:\n{}", logs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ranks[victim].child.kill().unwrap(); // SIGKILL
    let _ = ranks[victim].child.wait();
    ranks
        .iter_mut()
        .filter(|r| r.rank != victim)
        .map(|r| {
            let s = wait_guarded(&mut r.child, GUARD, &format!("survivor rank {}", r.rank));
            (r.rank, s, log(r))
        })
        .collect()
}

#[test]
fn survivors_name_the_killed_rank() {
    let _serial = serial();
    for (rank, status, log) in kill_mid_training(2) {
        assert!(
            !status.success(),
            "rank {rank} exited 0 after rank 2 was killed:\n{log}"
        );
        assert!(
            log.contains(&format!("rank {rank}/3: ")) && log.contains("rank 2 stopped responding"),
            "rank {rank}'s error does not name itself and the lost rank 2:\n{log}"
        );
    }
}

#[test]
fn survivors_report_the_lost_store_server() {
    let _serial = serial();
    for (rank, status, log) in kill_mid_training(0) {
        assert!(
            !status.success(),
            "rank {rank} exited 0 after rank 0 was killed:\n{log}"
        );
        assert!(
            log.contains("rank 0 (the store server at 127.0.0.1:"),
            "rank {rank}'s error does not say that rank 0 (the store) is gone:\n{log}"
        );
    }
}

#[test]
fn wrong_master_port_fails_within_the_timeout() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap().to_string();
    let (good, bad) = (free_port(), free_port());
    let args = ["train", "--out", &out, "--steps", "1"];
    let mut r0 = spawn_rank(dir.path(), 2, 0, good, 3.0, &args);
    let mut r1 = spawn_rank(dir.path(), 2, 1, bad, 3.0, &args);
    let s1 = wait_guarded(&mut r1.child, GUARD, "rank 1");
    let s0 = wait_guarded(&mut r0.child, GUARD, "rank 0");
    let (l0, l1) = (log(&r0), log(&r1));
    assert!(!s1.success() && !s0.success());
    assert!(
        l1.contains(
            "rank 1/2: rendezvous failed: cannot reach the store server (rank 0) at 127.0.0.1:"
        ) && l1.contains(&bad.to_string()),
        "rank 1:\n{l1}"
    );
    assert!(
        l0.contains("rank 0/2: rendezvous failed: rank 1 of 2 did not join within 3 s"),
        "rank 0:\n{l0}"
    );
}

#[test]
fn a_rank_that_never_starts_is_named() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap().to_string();
    let port = free_port();
    let args = ["train", "--out", &out, "--steps", "1"];
    let mut ranks = [
        spawn_rank(dir.path(), 3, 0, port, 3.0, &args),
        spawn_rank(dir.path(), 3, 2, port, 3.0, &args),
    ];
    for r in &mut ranks {
        let s = wait_guarded(&mut r.child, GUARD, &format!("rank {}", r.rank));
        let l = log(r);
        assert!(!s.success(), "rank {} exited 0:\n{l}", r.rank);
        assert!(
            l.contains(&format!("rank {}/3: rendezvous failed", r.rank)),
            "rank {}:\n{l}",
            r.rank
        );
        assert!(
            l.contains("rank 1 of 3 did not join within 3 s"),
            "rank {}:\n{l}",
            r.rank
        );
    }
}

fn launcher(args: &[&str], up_dir: &std::path::Path) -> std::process::Child {
    Command::new(WORKER)
        .arg("launch")
        .args(args)
        .env("RN50_TEST_UP_DIR", up_dir)
        .env_remove("OMP_NUM_THREADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: std::process::Child) -> (std::process::ExitStatus, String, String) {
    // wait_with_output has no timeout: a watchdog kills the launcher if it hangs.
    let pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            if start.elapsed() > GUARD {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(!watchdog.join().unwrap(), "launcher hung");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn launch_stops_everyone_when_a_worker_fails() {
    let _serial = serial();
    let up = tempfile::tempdir().unwrap();
    let master = format!("127.0.0.1:{}", free_port());
    let child = launcher(
        &[
            "--nproc-per-node",
            "3",
            "--master",
            &master,
            "--grace",
            "5",
            "--",
            "sleep",
            "--fail-rank",
            "1",
        ],
        up.path(),
    );
    let (status, stdout, stderr) = finish(child);
    assert_eq!(
        status.code(),
        Some(7),
        "launcher should exit with the failed worker's status\n{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("rank 1") && stderr.contains("exited with status 7"),
        "{stderr}"
    );
    // The others were stopped by the launcher's SIGTERM (they would otherwise sleep for a minute).
    for r in [0, 2] {
        assert!(
            stdout.contains(&format!("[rank {r}] rank {r}: stop requested")),
            "rank {r} not stopped:\n{stdout}"
        );
    }
}

#[test]
fn launch_forwards_sigusr1_and_exits_3() {
    let _serial = serial();
    let up = tempfile::tempdir().unwrap();
    let master = format!("127.0.0.1:{}", free_port());
    let child = launcher(
        &["--nproc-per-node", "2", "--master", &master, "--", "sleep"],
        up.path(),
    );
    let start = Instant::now();
    while !(up.path().join("up-0").exists() && up.path().join("up-1").exists()) {
        assert!(start.elapsed() < GUARD, "workers did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let (status, stdout, stderr) = finish(child);
    assert_eq!(status.code(), Some(3), "{stdout}\n{stderr}");
    for r in [0, 1] {
        assert!(
            stdout.contains(&format!("[rank {r}] rank {r}: stop requested")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!(
                "[rank {r}] rank {r} of 2 up (local {r}, OMP_NUM_THREADS="
            )),
            "{stdout}"
        );
    }
}

#[test]
fn launch_runs_a_training_job() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let master = format!("127.0.0.1:{}", free_port());
    let out = dir.path().to_str().unwrap();
    let child = launcher(
        &[
            "--nproc-per-node",
            "2",
            "--master",
            &master,
            "--timeout",
            "60",
            "--",
            "train",
            "--out",
            out,
            "--steps",
            "2",
        ],
        dir.path(),
    );
    let (status, stdout, stderr) = finish(child);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("[rank 0] step 1 mean loss"), "{stdout}");
    assert_eq!(
        read_f32(&dir.path().join("params-rank0.bin")),
        read_f32(&dir.path().join("params-rank1.bin"))
    );
}
