//! `rn50 launch --max-restarts` around a real `rn50 train --resume auto` (issue 14): two ranks (Gloo on CPU),
//! one SIGKILLed once the first epoch's checkpoint exists. With a restart left, the launcher starts both
//! workers again and they continue from that checkpoint, training every epoch once (rank 1 killed, or rank 0
//! with the rendezvous store); without one, the launcher fails naming rank 1, and the checkpoint it leaves
//! continues in a single `train --resume auto`.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{metrics_lines, steps, TinyTrain};
use rn50::train::checkpoint::read_meta;

const EPOCHS: u64 = 3;
/// Enough steps that the kill, sent as soon as the first checkpoint is seen, lands well inside the second epoch
/// (a 2-rank epoch of 40 steps takes about a second on a 2-core machine).
const STEPS: u64 = 40;
/// Bound on each wait, so that a hang is a clear failure rather than a stuck CI job.
const PATIENCE: Duration = Duration::from_secs(300);

/// `train` on synthetic data into `out`, every step logged, checkpoints only at the ends of epochs.
fn train_args(out: &Path) -> TinyTrain {
    TinyTrain::dummy(out).flags(&format!(
        "--width 16 -b 2 --image-size 32 --augment cifar --precision fp32 -p 1 --checkpoint-minutes 0 \
         --resume auto --epochs {EPOCHS} --steps-per-epoch {STEPS}"
    ))
}

/// `rn50 launch --nproc-per-node 2 --max-restarts N --log-dir DIR/logs -- train …`, its stderr to DIR/launch.log.
fn launch(dir: &Path, max_restarts: usize) -> Child {
    Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(["launch", "--nproc-per-node", "2", "--timeout", "60"])
        .args(["--max-restarts", &max_restarts.to_string()])
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .arg("--")
        .args(train_args(&dir.join("run")).to_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("launch.log")).unwrap())
        .spawn()
        .unwrap()
}

/// Polls `f` until it gives a value; after [`PATIENCE`] kills the launcher and panics with `what` and its log.
fn wait_for<T>(
    what: &str,
    dir: &Path,
    launcher: &mut Child,
    mut f: impl FnMut(&mut Child) -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f(launcher) {
            return v;
        }
        if start.elapsed() > PATIENCE {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!(
                "{what}: still waiting after {PATIENCE:?}\n{}",
                read(&dir.join("launch.log"))
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The pid of the launcher's worker of rank `rank` in attempt `restart + 1`, from /proc: a child of `launcher`
/// whose environment has RANK and RN50_RESTART_COUNT.
fn worker_pid(launcher: u32, rank: usize, restart: usize) -> Option<u32> {
    let want = [
        format!("RANK={rank}"),
        format!("RN50_RESTART_COUNT={restart}"),
    ];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        // /proc/PID/stat: "pid (comm) state ppid …"; comm may hold spaces and parentheses.
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
        (ppid == launcher && want.iter().all(|w| vars.contains(&w.as_bytes()))).then_some(pid)
    })
}

/// Starts the launcher, SIGKILLs worker `rank` once the first checkpoint exists and waits for the launcher to
/// end. Returns its exit status, the killed worker's pid, and the checkpoint file that was the latest at the
/// kill with its epoch (read at once: later checkpoints prune it).
fn run_and_kill(dir: &Path, max_restarts: usize, rank: usize) -> (ExitStatus, u32, PathBuf, u64) {
    let mut launcher = launch(dir, max_restarts);
    let latest = dir.join("run/checkpoint.safetensors");
    let pid = wait_for("the worker started", dir, &mut launcher, |l| {
        worker_pid(l.id(), rank, 0)
    });
    let before = wait_for("the first epoch's checkpoint", dir, &mut launcher, |_| {
        std::fs::canonicalize(&latest).ok()
    });
    // SAFETY: plain kill(2). The pid is the worker's, which trains until this kill (it is mid-epoch), so the
    // launcher has not reaped it and the pid cannot have been reused.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let (seen, _) = read_meta(&before).unwrap();
    assert!(seen.epoch >= 1, "{seen:?}");
    let status = wait_for("the launcher to exit", dir, &mut launcher, |l| {
        l.try_wait().unwrap()
    });
    (status, pid, before, seen.epoch)
}

/// The epoch in a train log's "resumed from FILE at epoch E batch 0" line.
fn resumed_at(log: &str) -> Option<u64> {
    let rest = log
        .split_once("resumed from ")?
        .1
        .split_once(" at epoch ")?
        .1;
    rest.lines().next()?.strip_suffix(" batch 0")?.parse().ok()
}

/// Every epoch is in metrics.jsonl once, every step in steps.jsonl once (records of an epoch cut short by the
/// kill were dropped on resume), and the latest checkpoint is the end of the last epoch.
fn assert_trained_once(run: &Path) {
    let epochs: Vec<u64> = metrics_lines(run).iter().map(|r| r.epoch).collect();
    assert_eq!(
        epochs,
        (0..EPOCHS).collect::<Vec<_>>(),
        "metrics.jsonl epochs"
    );
    let steps: Vec<(u64, u64)> = steps(run).iter().map(|r| (r.epoch, r.step)).collect();
    let all: Vec<(u64, u64)> = (0..EPOCHS)
        .flat_map(|e| (0..STEPS).map(move |s| (e, s)))
        .collect();
    assert_eq!(steps, all, "steps.jsonl: each step once, in order");
    let (pos, _) = read_meta(&run.join("checkpoint.safetensors")).unwrap();
    assert_eq!((pos.epoch, pos.batch_in_epoch), (EPOCHS, 0));
    assert!(run.join("final.safetensors").exists());
}

/// `--max-restarts 1`, worker `killed` SIGKILLed: the launcher restarts both workers (RN50_RESTART_COUNT=1),
/// which continue from the checkpoint rather than train the first epoch again, and the job ends with every
/// epoch trained once.
fn a_killed_worker_is_restarted(killed: usize) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (status, pid, _, seen) = run_and_kill(d, 1, killed);
    let launch_log = read(&d.join("launch.log"));
    assert!(status.success(), "{status}\n{launch_log}");
    assert!(
        launch_log.contains(&format!(
            "rank {killed} (pid {pid}) was killed by signal 9 (SIGKILL); stopping the other workers before a \
             restart"
        )) && launch_log.contains("restarting all workers (restart 1 of 1)"),
        "{launch_log}"
    );
    // Each rank's log has both attempts, the second ending well; the killed rank's first ended with the kill.
    let logs: Vec<String> = (0..2)
        .map(|r| read(&d.join(format!("logs/rank{r}.log"))))
        .collect();
    for (r, log) in logs.iter().enumerate() {
        let (first, second) = log
            .split_once(&format!("rank {r}, attempt 2 (RN50_RESTART_COUNT=1)"))
            .unwrap_or_else(|| panic!("rank {r} has no second attempt:\n{log}"));
        assert!(
            first.contains(&format!("rank {r}, attempt 1 (RN50_RESTART_COUNT=0)"))
                && second.contains(&format!(
                    "=== rn50 launch: rank {r} exited with status 0 ==="
                )),
            "rank {r}:\n{log}"
        );
    }
    let (first, _) = logs[killed].split_once("attempt 2 (").unwrap();
    assert!(
        first.contains(&format!(
            "=== rn50 launch: rank {killed} was killed by signal 9 (SIGKILL) ==="
        )),
        "{}",
        logs[killed]
    );

    // The second attempt resumed after the first epoch (from the checkpoint seen before the kill, or a later
    // one) and logged only the epochs after it.
    let (_, second) = logs[0].split_once("attempt 2 (").unwrap();
    let epoch = resumed_at(second).unwrap_or_else(|| panic!("not resumed:\n{}", logs[0]));
    assert!(
        (seen..EPOCHS).contains(&epoch),
        "resumed at epoch {epoch}, the checkpoint at the kill was at epoch {seen}:\n{}",
        logs[0]
    );
    for e in 0..EPOCHS {
        assert_eq!(
            // The epoch's log line (after its time stamp and level).
            second
                .lines()
                .filter(|l| l.contains(&format!(" epoch {e}: loss")))
                .count(),
            usize::from(e >= epoch),
            "epoch {e} in the second attempt:\n{second}"
        );
    }
    assert_trained_once(&d.join("run"));
}

/// Rank 1 killed: rank 0 finds its peer gone.
#[test]
fn a_killed_worker_is_restarted_and_training_continues_from_the_checkpoint() {
    a_killed_worker_is_restarted(1);
}

/// Rank 0 killed, and with it the rendezvous store: the restart meets at a new one.
#[test]
fn a_killed_rank_0_is_restarted_and_training_continues_from_the_checkpoint() {
    a_killed_worker_is_restarted(0);
}

/// `--max-restarts 0`: the launcher fails naming rank 1, the checkpoint written before the kill is intact, and
/// a single `train --resume auto` continues the run from it to the end.
#[test]
fn without_restarts_the_launcher_fails_and_the_checkpoint_continues_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (status, pid, before, seen) = run_and_kill(d, 0, 1);
    let launch_log = read(&d.join("launch.log"));
    assert_eq!(status.code(), Some(128 + 9), "{launch_log}");
    assert!(
        launch_log.contains(&format!(
            "rank 1 (pid {pid}) was killed by signal 9 (SIGKILL); stopping the other workers\n"
        )) && launch_log.contains("rn50 launch: failed: rank 1 was killed by signal 9 (SIGKILL)")
            && !launch_log.contains("restarting"),
        "{launch_log}"
    );
    // Intact: the checkpoint that was the latest at the kill still is, and loads (the resume reads it whole).
    let run = d.join("run");
    assert_eq!(read_meta(&before).unwrap().0.epoch, seen);
    assert_eq!(
        std::fs::canonicalize(run.join("checkpoint.safetensors")).unwrap(),
        before
    );

    let r = train_args(&run).output();
    let log = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{log}");
    assert_eq!(resumed_at(&log), Some(seen), "{log}");
    assert_trained_once(&run);
}
