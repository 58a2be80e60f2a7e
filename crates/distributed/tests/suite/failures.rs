//! Failures end the job quickly with messages that name the culprit: a rank killed mid-training, the store server
//! (rank 0) killed or frozen, a wrong MASTER_PORT or one held by another program, a rank that never starts, ranks
//! out of step, a worker failing or frozen under `launch`.
use crate::common;
use common::*;
use std::time::{Duration, Instant};

const GUARD: Duration = Duration::from_secs(120);

/// Arguments of a worker that trains until it is stopped, writing its step count to OUT/step-rank{r}.
fn endless_training(out: &str) -> Vec<&str> {
    vec![
        "train",
        "--out",
        out,
        "--steps",
        "1000000",
        "--sleep-ms",
        "20",
        "--bucket-bytes",
        "400",
    ]
}

/// Waits until rank `rank` of a job training in `dir` has done a few steps (fails the test if a rank ends first).
fn wait_for_steps(dir: &std::path::Path, ranks: &mut [Rank], rank: usize) {
    let steps = dir.join(format!("step-rank{rank}"));
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
}

/// Starts a 3-rank job that trains until killed; kills `victim` with SIGKILL once it has done a few steps; returns
/// the survivors' (rank, status, log).
fn kill_mid_training(victim: usize) -> Vec<(usize, std::process::ExitStatus, String)> {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().to_str().unwrap().to_string();
    let args = endless_training(&out);
    let mut ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank(dir.path(), 3, r, port, 10.0, &args))
        .collect();
    wait_for_steps(dir.path(), &mut ranks, victim);
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
    let _waits = serial_shared();
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
    let _waits = serial_shared();
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

/// `rn50 launch` of two workers running `sleep`, with the launcher flags `extra`, once both are up.
fn two_sleeping_workers(up: &std::path::Path, extra: &[&str]) -> std::process::Child {
    let master = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--nproc-per-node", "2", "--master", &master];
    args.extend(extra);
    args.extend(["--", "sleep"]);
    let child = launcher(&args, up);
    let start = Instant::now();
    while !(up.join("up-0").exists() && up.join("up-1").exists()) {
        assert!(start.elapsed() < GUARD, "workers did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn launch_stops_everyone_when_a_worker_fails() {
    let _waits = serial_shared();
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
    let _waits = serial_shared();
    let up = tempfile::tempdir().unwrap();
    let child = two_sleeping_workers(up.path(), &[]);
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

/// SIGHUP (the terminal or ssh session that started the launcher went away) and SIGQUIT are stop requests, as
/// SIGTERM and as in torchrun: each worker gets SIGTERM, checkpoints and exits 3, and so does the launcher. With
/// SIGQUIT rank 1 is frozen: the same escalation to SIGKILL after --grace.
#[test]
fn launch_turns_sighup_and_sigquit_into_sigterm() {
    let _waits = serial_shared();
    for (sig, name) in [(libc::SIGHUP, "SIGHUP"), (libc::SIGQUIT, "SIGQUIT")] {
        let up = tempfile::tempdir().unwrap();
        let child = two_sleeping_workers(up.path(), &["--grace", "3"]);
        let freeze = sig == libc::SIGQUIT;
        let frozen = freeze.then(|| sigstop(worker_pid(child.id(), 1).expect("rank 1's pid")));
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, sig) };
        let (status, stdout, stderr) = finish(child);
        drop(frozen);
        let stopped: &[usize] = if freeze { &[0] } else { &[0, 1] };
        for r in stopped {
            assert!(
                stdout.contains(&format!("[rank {r}] rank {r}: stop requested")),
                "{name} not forwarded as SIGTERM to rank {r}:\n{stdout}\n{stderr}"
            );
        }
        if freeze {
            assert!(
                stderr.contains("rn50 launch: rank 1 still running 3 s after SIGTERM: SIGKILL"),
                "{name}:\n{stdout}\n{stderr}"
            );
            assert_eq!(
                status.code(),
                Some(128 + libc::SIGKILL),
                "{name}:\n{stderr}"
            );
        } else {
            assert_eq!(status.code(), Some(3), "{name}:\n{stdout}\n{stderr}");
        }
        assert!(
            stderr.contains(&format!(
                "rn50 launch: {name}: asking the workers to stop (SIGTERM to each)"
            )),
            "{name}:\n{stdout}\n{stderr}"
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

/// SIGKILLs a process when dropped: a test that stops a process (SIGSTOP) must not leave it behind if it fails.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Only while it is still stopped: a launcher may have killed and reaped it already, and its pid reused.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        if state == Some(Some('T')) {
            // SAFETY: kill(2) on the stopped process this test stopped.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
}

fn sigstop(pid: u32) -> KillOnDrop {
    // SAFETY: kill(2) on our own (grand)child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    KillOnDrop(pid)
}

#[test]
fn a_frozen_store_server_is_named_not_waited_for() {
    let _waits = serial_shared();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = dir.path().to_str().unwrap().to_string();
    let args = endless_training(&out);
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| spawn_rank(dir.path(), 2, r, port, 5.0, &args))
        .collect();
    wait_for_steps(dir.path(), &mut ranks, 0);
    // Frozen, not dead: its sockets stay open and the kernel still accepts connections to the store's port.
    let _frozen = sigstop(ranks[0].child.id());
    let s1 = wait_guarded(&mut ranks[1].child, GUARD, "rank 1 (rank 0 frozen)");
    let l1 = log(&ranks[1]);
    assert!(!s1.success(), "rank 1 exited 0 with rank 0 frozen:\n{l1}");
    assert!(
        l1.contains("rank 1/2: ") && l1.contains("rank 0 (the store server at 127.0.0.1:"),
        "rank 1's error does not name itself and the frozen rank 0:\n{l1}"
    );
}

#[test]
fn launch_ends_a_job_whose_rank_0_is_frozen() {
    let _waits = serial_shared();
    let dir = tempfile::tempdir().unwrap();
    let master = format!("127.0.0.1:{}", free_port());
    let out = dir.path().to_str().unwrap().to_string();
    let mut args = vec![
        "--nproc-per-node",
        "2",
        "--master",
        &master,
        "--timeout",
        "5",
        "--grace",
        "5",
        "--",
    ];
    args.extend(endless_training(&out));
    let child = launcher(&args, dir.path());
    let start = Instant::now();
    while std::fs::read_to_string(dir.path().join("step-rank0"))
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        < 3
    {
        assert!(start.elapsed() < GUARD, "the job did not start training");
        std::thread::sleep(Duration::from_millis(20));
    }
    let rank0 = worker_pid(child.id(), 0).expect("rank 0's pid");
    let _frozen = sigstop(rank0);
    let (status, stdout, stderr) = finish(child);
    assert!(!status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("[rank 1] ") && stderr.contains("rank 0 (the store server at 127.0.0.1:"),
        "rank 1 does not name the frozen rank 0:\n{stderr}"
    );
    assert!(
        stderr.contains("rn50 launch: rank 0 still running 5 s after SIGTERM: SIGKILL"),
        "the frozen rank 0 was not SIGKILLed after the grace period:\n{stderr}"
    );
}

#[test]
fn launch_escalates_its_sigterm_to_sigkill() {
    let _waits = serial_shared();
    let up = tempfile::tempdir().unwrap();
    let child = two_sleeping_workers(up.path(), &["--grace", "3"]);
    // Rank 1 cannot act on SIGTERM: the launcher must not wait for it forever.
    let _frozen = sigstop(worker_pid(child.id(), 1).expect("rank 1's pid"));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, stdout, stderr) = finish(child);
    assert!(
        stdout.contains("[rank 0] rank 0: stop requested"),
        "SIGTERM not forwarded:\n{stdout}"
    );
    assert!(
        stderr.contains("rn50 launch: rank 1 still running 3 s after SIGTERM: SIGKILL"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGKILL),
        "the launcher exits as its killed worker did\n{stdout}\n{stderr}"
    );
}

/// A listener on 127.0.0.1 that accepts every connection and, for each, writes `reply` (if any) and then holds it
/// open without reading: a port held by some other program. Returns its port.
fn foreign_listener(reply: &'static [u8]) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut c in l.incoming().flatten() {
            use std::io::Write;
            let _ = c.write_all(reply);
            held.push(c);
        }
    });
    port
}

fn not_a_store(reply: &'static [u8]) {
    let _waits = serial_shared();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap().to_string();
    let port = foreign_listener(reply);
    let mut r1 = spawn_rank(dir.path(), 2, 1, port, 3.0, &["train", "--out", &out]);
    let s1 = wait_guarded(
        &mut r1.child,
        GUARD,
        "rank 1 (MASTER_PORT held by a foreign listener)",
    );
    let l1 = log(&r1);
    assert!(!s1.success(), "{l1}");
    assert!(
        l1.contains(&format!(
            "rank 1/2: rendezvous failed: 127.0.0.1:{port} answers but is not an rn50/c10d store"
        )),
        "{l1}"
    );
}

#[test]
fn a_master_port_that_accepts_and_stays_silent_is_not_a_store() {
    not_a_store(b"");
}

#[test]
fn a_master_port_that_answers_garbage_is_not_a_store() {
    not_a_store(b"SSH-2.0-OpenSSH_9.6\r\n");
}

/// Rank 0 checks for a stop request while rank 1 is in another collective: an error, never a stop (rn50 train took
/// it for SIGTERM and exited 3, "checkpointed, requeue me").
#[test]
fn a_rank_out_of_step_is_an_error_not_a_stop_request() {
    let _waits = serial_shared();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| spawn_rank(dir.path(), 2, r, port, 5.0, &["out-of-step"]))
        .collect();
    let s0 = wait_guarded(&mut ranks[0].child, GUARD, "rank 0");
    let _ = wait_guarded(&mut ranks[1].child, GUARD, "rank 1");
    let l0 = log(&ranks[0]);
    assert_eq!(s0.code(), Some(1), "{l0}");
    assert!(
        l0.contains(
            "rank 0/2: all-reduce of checking for a stop signal failed: the ranks are out of step"
        ),
        "{l0}"
    );
}
