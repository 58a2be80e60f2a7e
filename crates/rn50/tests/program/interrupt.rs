//! Ctrl-C is a request to stop, not a crash (issue 38): the first SIGINT does what SIGTERM does (`rn50 train`
//! saves a checkpoint, prints how to resume and exits 3, also under `rn50 launch`, which does not call that a
//! failure); a second SIGINT stops at once. Each run is started in a process group of its own and sent SIGINT as
//! a terminal's Ctrl-C is, to the whole group. Before, the first SIGINT killed `rn50 train` (no checkpoint) and
//! `rn50 launch` ended with "rn50 launch: failed: rank 0 was killed by signal 2 (SIGINT)", exit 130.
use crate::common;

use std::ffi::{OsStr, OsString};
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use common::TinyTrain;

/// How long any one wait of these tests may take before the test fails (and kills what it started).
const GUARD: Duration = Duration::from_secs(300);

/// A command started as a shell starts a foreground job (a process group of its own), its stderr read line by
/// line on a thread so that every wait is bounded.
struct Job {
    child: Child,
    lines: Receiver<String>,
    stderr: String,
}

impl Job {
    fn start<S: AsRef<OsStr>>(args: &[S]) -> Job {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rn50"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Job {
            child,
            lines,
            stderr: String::new(),
        }
    }

    /// Reads stderr until a line contains `text`; fails the test if the job ends or GUARD passes first.
    fn wait_for(&mut self, text: &str) {
        let start = Instant::now();
        while start.elapsed() < GUARD {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    self.stderr.push_str(&line);
                    self.stderr.push('\n');
                    if line.contains(text) {
                        return;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        panic!("no {text:?} from rn50:\n{}", self.stderr);
    }

    /// A terminal's Ctrl-C: SIGINT to every process of the job's process group.
    fn ctrl_c(&self) {
        // SAFETY: kill(2) on the process group our own child leads.
        assert_eq!(
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGINT) },
            0
        );
    }

    /// SIGINT to the job's own process only, as `kill -INT PID` sends it.
    fn sigint(&self) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) },
            0
        );
    }

    /// Waits for the job to end (killing it after GUARD): its status and all of its stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > GUARD {
                // SAFETY: kill(2) on the process group our own child leads.
                unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
                let _ = self.child.wait();
                panic!("rn50 did not end:\n{}", self.stderr);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The reader thread ends with the pipe (every process that held it has ended).
        while let Ok(line) = self.lines.recv_timeout(GUARD) {
            self.stderr.push_str(&line);
            self.stderr.push('\n');
        }
        (status, self.stderr)
    }
}

/// A small ResNet on random data at 32 px, on the CPU, logging every step, into `out`.
fn tiny_train(out: &Path, steps_per_epoch: &str) -> TinyTrain {
    TinyTrain::dummy(out).flags(&format!(
        "--width 16 -b 2 --image-size 32 --epochs 2 --steps-per-epoch {steps_per_epoch} -p 1 --precision fp32"
    ))
}

#[test]
fn ctrl_c_saves_a_checkpoint_prints_how_to_resume_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let train = tiny_train(&out, "40");
    let mut job = Job::start(&train.to_args());
    job.wait_for("[    3/");
    job.ctrl_c();
    let (status, stderr) = job.finish();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(
            "SIGINT: saving a checkpoint after this step; press Ctrl-C again to stop at once"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "signal received: checkpoint saved to {}/checkpoint-",
            out.display()
        )) && stderr.contains(&format!("(resume with --resume {})", out.display())),
        "{stderr}"
    );
    let (pos, _) = rn50::train::checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert_eq!(pos.epoch, 0, "{stderr}");
    assert!(pos.batch_in_epoch >= 3, "{pos:?}\n{stderr}");
    assert!(!out.join("final.safetensors").exists());

    // The line's advice works: the same command with --resume RUN_DIR trains the rest to the end.
    let resume = train.args(["--resume".as_ref(), out.as_os_str()]);
    let (status, stderr) = Job::start(&resume.to_args()).finish();
    assert!(status.success(), "{stderr}");
    assert!(out.join("final.safetensors").exists(), "{stderr}");
    let epochs = common::json_lines(&out.join("metrics.jsonl"));
    assert_eq!(epochs.len(), 2, "{stderr}");
}

#[test]
fn a_second_ctrl_c_stops_at_once_without_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // ResNet-50 at 224 px: a step takes long enough that the second Ctrl-C comes before the step ends.
    let mut args = tiny_train(&out, "1000").to_args();
    let at = |f: &str| args.iter().position(|a| a == f).unwrap() + 1;
    let (arch, width, size) = (at("-a"), at("--width"), at("--image-size"));
    args[arch] = "resnet50".into();
    args[width] = "64".into();
    args[size] = "224".into();
    let mut job = Job::start(&args);
    job.wait_for("[    1/");
    job.ctrl_c();
    job.wait_for("press Ctrl-C again to stop at once");
    job.ctrl_c();
    let (status, stderr) = job.finish();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}\n{stderr}");
    assert!(!stderr.contains("checkpoint saved"), "{stderr}");
}

#[test]
fn ctrl_c_under_launch_checkpoints_and_is_no_failure() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let train = tiny_train(&out, "100000");
    let launch = ["launch", "--nproc-per-node", "2", "--"].map(OsString::from);
    let args = [launch.to_vec(), train.to_args()].concat();
    let mut job = Job::start(&args);
    job.wait_for("[    3/");
    job.ctrl_c();
    let (status, stderr) = job.finish();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("failed"), "{stderr}");
    assert!(
        stderr.contains(&format!("(resume with --resume {})", out.display())),
        "{stderr}"
    );
    // Each worker was asked to stop (by the launcher: they are not in the terminal's process group, so a second
    // SIGINT from the terminal would have killed them).
    for r in 0..2 {
        let said = stderr
            .lines()
            .filter(|l| l.starts_with(&format!("[rank {r}]")) && l.contains("SIGINT: saving"))
            .count();
        assert_eq!(said, 1, "rank {r}:\n{stderr}");
    }
    let (pos, _) = rn50::train::checkpoint::read_meta(&out.join("checkpoint.safetensors")).unwrap();
    assert!(pos.batch_in_epoch >= 3, "{pos:?}\n{stderr}");
}

/// `bench --sweep` keeps the points it measured: SIGINT during the first point lets that point finish, then the
/// sweep prints its table and writes its JSON with what it has, removes its temporary folder and exits 3.
#[test]
fn sigint_ends_a_sweep_with_the_points_measured() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sweep.json");
    let mut job = Job::start(&[
        "bench",
        "--sweep",
        "--world-sizes",
        "1",
        "--batch-sizes",
        "2,3,4",
        "--repeats",
        "1",
        "-a",
        "resnet18",
        // 16 channels wide: a point of 50 steps at torchvision's 64 took 38 CPU-seconds.
        "--width",
        "16",
        "--image-size",
        "32",
        "--warmup",
        "0",
        "--steps",
        "50",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--data",
        "host",
        "--json",
        json.to_str().unwrap(),
    ]);
    job.wait_for("sweep: 1 rank(s), batch 2 per rank");
    job.sigint();
    let pid = job.child.id();
    let (status, stderr) = job.finish();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("stopped on request (SIGINT): the sweep above has the ")
            && stderr.contains(" point(s) measured before"),
        "{stderr}"
    );
    let r: rn50_report::schema::SweepResult = rn50_report::schema::read_json(&json).unwrap();
    assert!((1..3).contains(&r.points.len()), "{stderr}");
    assert!(!std::env::temp_dir()
        .join(format!("rn50-sweep-{pid}"))
        .exists());
}
