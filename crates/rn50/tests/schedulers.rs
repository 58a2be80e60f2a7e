//! The real schedulers and launchers around a real `rn50 train` (issue 24): a single-node SLURM cluster the
//! test starts and stops (`scripts/slurm-train.sbatch`, interrupted by `scontrol requeue` and by the time limit's
//! SIGUSR1, requeued, resumed), Open MPI's `mpirun` (two jobs at once on one node), `scripts/pbs-train.sh` in a
//! fake PBS job under the real mpirun (SIGTERM at the walltime, then the resubmission), and the .venv's torchrun
//! (static, SIGTERM then a rerun; c10d rendezvous with a SIGKILLed worker and `--max-restarts 1`).
//!
//! Every job trains the same tiny network for the same steps with 2 ranks of 1 thread, and each must end with
//! final weights equal, bit for bit, to one uninterrupted `rn50 launch --nproc-per-node 2` run. Every wait is
//! bounded; everything a test starts carries a marker variable in its environment and is SIGKILLed by a guard
//! when the test ends, however it ends. A missing scheduler (Debian packages of scripts/apt-packages.txt, the
//! .venv's torchrun) skips its test with a message, except as root, where `./dev test` installs them: there it
//! fails.
mod common;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{metrics_lines, steps, TinyTrain};
// One test at a time: each runs 2 ranks (or 4) on what may be 2 cores.
use rn50::train::checkpoint::read_meta;
use rn50_util::testing::serial;
use tch::Tensor;

const EPOCHS: u64 = 2;
/// Steps per epoch. An interruption is sent once a run is [`INTO_EPOCH`] steps into an epoch, with its ranks
/// stopped ([`Frozen`]) until it reached them: it lands a step or two later however long the scheduler takes to
/// pass it on, well inside the epoch. (Before the ranks were stopped, epochs of 300 steps gave the signal time to
/// arrive, and their training took 450 of the 490 CPU-seconds of these tests.)
const STEPS: u64 = 50;
/// Steps into an epoch before an interruption is sent.
const INTO_EPOCH: u64 = 10;
/// Bound on every wait: a hang is a clear failure, not a stuck CI job.
const PATIENCE: Duration = Duration::from_secs(300);

const RN50: &str = env!("CARGO_BIN_EXE_rn50");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What these tests' runs add to [`TinyTrain`]'s flags: every step recorded, checkpoints at the ends of epochs
/// (and on a stop signal).
fn flags() -> String {
    format!(
        "--width 16 -b 2 --image-size 32 --augment cifar --precision fp32 -p 1 --checkpoint-minutes 0 \
         --epochs {EPOCHS} --steps-per-epoch {STEPS}"
    )
}

/// `train` on synthetic data into `out` (no --resume).
fn tiny(out: &Path) -> TinyTrain {
    TinyTrain::dummy(out).flags(&flags())
}

/// The arguments after `rn50 train`, for the scripts that say `train` themselves (slurm-train.sbatch).
fn after_train(t: &TinyTrain) -> Vec<OsString> {
    let mut a = t.to_args();
    assert_eq!(a.remove(0), "train");
    a
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `name` on PATH or in the sbin directories (root's tools), if installed.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The programs a test needs, or None after saying why it is skipped; as root (CI, where `./dev test` installs
/// scripts/apt-packages.txt) a missing one is a failure.
fn need(test: &str, names: &[&str], package: &str) -> Option<Vec<PathBuf>> {
    let found: Vec<Option<PathBuf>> = names.iter().map(|n| which(n)).collect();
    let missing: Vec<&str> = names
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(n, _)| *n)
        .collect();
    if missing.is_empty() {
        return Some(found.into_iter().flatten().collect());
    }
    let why = format!(
        "{test}: {} not installed (Debian: {package}; `./dev setup` as root installs scripts/apt-packages.txt)",
        missing.join(", ")
    );
    assert!(!is_root(), "{why}");
    eprintln!("skipped: {why}");
    None
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 20 ms until it gives a value; panics with `what` and `context()` after [`PATIENCE`].
fn wait_for<T>(what: &str, context: impl Fn() -> String, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "{what}: still waiting after {PATIENCE:?}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, what: &str, context: impl Fn() -> String) -> ExitStatus {
    wait_for(what, context, || child.try_wait().unwrap())
}

/// Kills, when dropped, every process whose environment holds `RN50_SCHEDULER_TEST=<its marker>`: whatever a
/// test started (launchers, their workers, daemons, job steps) carries it, and nothing else does.
struct Reaper {
    marker: String,
}

impl Reaper {
    fn new(test: &str) -> Reaper {
        Reaper {
            marker: format!("{test}-{}", std::process::id()),
        }
    }

    /// `cmd` marked, its output to `log` (stdout and stderr), stdin closed.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>, log: &Path) -> Command {
        let mut c = Command::new(program);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        c.env("RN50_SCHEDULER_TEST", &self.marker)
            .env("OMP_NUM_THREADS", "1")
            .env("RN50_DIST_TIMEOUT", "60")
            .env_remove("MASTER_ADDR")
            .env_remove("MASTER_PORT")
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .env_remove("LOCAL_RANK")
            .env_remove("LOCAL_WORLD_SIZE")
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f);
        c
    }

    /// The marked processes' pids.
    fn pids(&self) -> Vec<i32> {
        let want = format!("RN50_SCHEDULER_TEST={}", self.marker);
        let me = std::process::id() as i32;
        std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|&pid| pid != me)
                    .filter(|pid| {
                        std::fs::read(format!("/proc/{pid}/environ"))
                            .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn kill_all(&self, sig: i32) {
        for pid in self.pids() {
            // SAFETY: plain kill(2) of a process this test started (it carries the marker).
            unsafe { libc::kill(pid, sig) };
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Twice, with a pause: a process forked while the first sweep ran is caught by the second.
        for _ in 0..2 {
            self.kill_all(libc::SIGKILL);
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The training ranks among a [`Reaper`]'s processes (`rn50 train`, not a launcher, job script or daemon), stopped
/// (SIGSTOP) once their run is where a test interrupts it, so that the interruption lands at the step they are at
/// however long it takes to reach them. [`Frozen::thaw_when_signalled`] continues them once it did; dropped, it
/// continues any still stopped.
struct Frozen(Vec<i32>);

/// `/proc/PID/status` as KEY → value; empty once the process is gone.
fn proc_status(pid: i32) -> BTreeMap<String, String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// Whether a process of this [`proc_status`] is stopped (state T).
fn stopped(status: &BTreeMap<String, String>) -> bool {
    status.get("State").is_some_and(|s| s.starts_with('T'))
}

impl Frozen {
    fn ranks(reaper: &Reaper) -> Frozen {
        let ranks: Vec<i32> = reaper
            .pids()
            .into_iter()
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmdline.split(|&b| b == 0).nth(1) == Some(b"train".as_slice())
            })
            .collect();
        assert!(!ranks.is_empty(), "no rn50 train process to stop");
        for &pid in &ranks {
            // SAFETY: plain kill(2) of a process this test started (it carries the marker).
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        let frozen = Frozen(ranks);
        wait_for(
            "the ranks to stop",
            || format!("{:?}", frozen.0),
            || {
                frozen
                    .0
                    .iter()
                    .all(|&pid| {
                        let st = proc_status(pid);
                        st.is_empty() || stopped(&st)
                    })
                    .then_some(())
            },
        );
        frozen
    }

    /// Waits until each rank has SIGTERM, SIGUSR1 or SIGINT pending, or is no longer stopped (ended, killed, or
    /// continued by whoever signalled it: slurmd sends SIGCONT before SIGTERM), then continues them.
    fn thaw_when_signalled(self, what: &str) {
        let interruptions = [libc::SIGTERM, libc::SIGUSR1, libc::SIGINT]
            .iter()
            .fold(0u64, |m, s| m | 1 << (s - 1));
        let reached = |pid: i32| {
            let st = proc_status(pid);
            let pending = |k: &str| {
                st.get(k)
                    .and_then(|v| u64::from_str_radix(v, 16).ok())
                    .unwrap_or(0)
            };
            !stopped(&st) || (pending("ShdPnd") | pending("SigPnd")) & interruptions != 0
        };
        wait_for(
            &format!("{what} to reach the stopped ranks {:?}", self.0),
            || {
                self.0
                    .iter()
                    .map(|&pid| format!("{pid}: {:?}\n", proc_status(pid)))
                    .collect()
            },
            || self.0.iter().all(|&pid| reached(pid)).then_some(()),
        );
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if stopped(&proc_status(pid)) {
                // SAFETY: plain kill(2) of a rank this test stopped.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
        }
    }
}

/// Final (or any) weights of a run: every tensor by name.
fn tensors(path: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

/// `run`'s final weights equal `want`'s bit for bit (parameters and batch-norm statistics).
fn assert_same_weights(run: &Path, want: &Path, what: &str) {
    let (a, b) = (
        tensors(&run.join("final.safetensors")),
        tensors(&want.join("final.safetensors")),
    );
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}"
    );
    let differ: Vec<&String> = a
        .iter()
        .filter(|(k, t)| !t.equal(&b[*k]))
        .map(|(k, _)| k)
        .collect();
    assert!(
        differ.is_empty(),
        "{what}: final weights differ from the uninterrupted run in {} of {} tensors: {differ:?}",
        differ.len(),
        a.len()
    );
}

/// Every epoch recorded once, every step once and in order (steps of an interrupted attempt past its
/// checkpoint were dropped on resume), the run finished.
fn assert_trained_once(run: &Path) {
    let epochs: Vec<u64> = metrics_lines(run).iter().map(|r| r.epoch).collect();
    assert_eq!(epochs, (0..EPOCHS).collect::<Vec<_>>(), "metrics.jsonl");
    let steps: Vec<(u64, u64)> = steps(run).iter().map(|r| (r.epoch, r.step)).collect();
    let all: Vec<(u64, u64)> = (0..EPOCHS)
        .flat_map(|e| (0..STEPS).map(move |s| (e, s)))
        .collect();
    let first_wrong = steps.iter().zip(&all).position(|(a, b)| a != b);
    assert!(
        steps == all,
        "steps.jsonl: each step once, in order; {} records, first wrong at {first_wrong:?}",
        steps.len()
    );
}

/// The last (epoch, step) in a run's steps.jsonl being written, if any.
fn last_step(run: &Path) -> Option<(u64, u64)> {
    read(&run.join("steps.jsonl"))
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<rn50_report::StepRecord>(l).ok())
        .map(|r| (r.epoch, r.step))
}

/// Every "resumed from FILE at epoch E batch B" in a log, as (E, B).
fn resumes(log: &str) -> Vec<(u64, u64)> {
    log.split("resumed from ")
        .skip(1)
        .filter_map(|rest| {
            let (_, at) = rest.split_once(" at epoch ")?;
            let line = at.lines().next()?;
            let (e, b) = line.split_once(" batch ")?;
            Some((e.parse().ok()?, b.trim().parse().ok()?))
        })
        .collect()
}

/// A resume in the middle of epoch `epoch`, not at its start or end.
fn mid_epoch(at: (u64, u64), epoch: u64) -> bool {
    at.0 == epoch && (1..STEPS).contains(&at.1)
}

/// Where a test expects a run to have resumed: in the middle of an epoch (from the checkpoint of a stop signal)
/// or at an epoch's start (from the end of the epoch before).
#[derive(Clone, Copy, Debug)]
enum Resume {
    Mid(u64),
    Start(u64),
}

/// The end of every requeue-and-resume test: `log` (all of the job's runs) resumed where `want_resumes` says,
/// one after the other, and the run in `run` trained each step once, to the weights of the uninterrupted
/// reference `want` (`what` names the way it was run).
fn assert_resumed_as_uninterrupted(
    log: &str,
    want_resumes: &[Resume],
    run: &Path,
    want: &Path,
    what: &str,
) {
    let at = resumes(log);
    assert!(
        at.len() == want_resumes.len()
            && at.iter().zip(want_resumes).all(|(&at, &w)| match w {
                Resume::Mid(epoch) => mid_epoch(at, epoch),
                Resume::Start(epoch) => at == (epoch, 0),
            }),
        "{what}: resumed at {at:?} (want {want_resumes:?}):\n{log}"
    );
    assert_trained_once(run);
    assert_same_weights(run, want, what);
}

/// The uninterrupted run every scheduler's run must reproduce: `rn50 launch --nproc-per-node 2`, 1 thread per
/// rank. Made once per test binary.
fn reference() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = common::run_dir("schedulers-reference");
        let reaper = Reaper::new("reference");
        let log = dir.join("log");
        let mut c = reaper.command(RN50, &log);
        c.args(["launch", "--nproc-per-node", "2", "--"])
            .args(tiny(&dir.join("run")).to_args());
        let mut child = c.spawn().unwrap();
        let status = wait_exit(&mut child, "the reference run", || read(&log));
        assert!(status.success(), "reference run: {status}\n{}", read(&log));
        dir.join("run")
    })
}

// ---------------------------------------------------------------------------------------------------------------
// SLURM

/// A single-node SLURM cluster of its own: munged with its own key and socket, slurmctld and slurmd in the
/// foreground, configuration, state and spool in a temporary directory, ports picked free. Dropping it cancels
/// its jobs and kills everything it started.
struct Slurm {
    /// First, so that what it started is dead before the directory goes.
    reaper: Reaper,
    dir: tempfile::TempDir,
    conf: PathBuf,
    /// munged, slurmctld, slurmd.
    daemons: Vec<Child>,
}

impl Slurm {
    fn start(bins: &[PathBuf]) -> Slurm {
        let [munged, slurmctld, slurmd] = [&bins[0], &bins[1], &bins[2]];
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        // munged wants its socket's directory reachable by every user.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        for sub in ["state", "spool", "munge"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        let key = d.join("munge/munge.key");
        let mut bytes = [0u8; 1024];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").unwrap(),
            &mut bytes,
        )
        .unwrap();
        std::fs::write(&key, bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = d.join("munge/munge.socket");

        // The node as slurmd sees this machine (its real CPUs and memory).
        let probe = Command::new(slurmd).arg("-C").output().unwrap();
        let node_line = String::from_utf8_lossy(&probe.stdout)
            .lines()
            .find(|l| l.starts_with("NodeName="))
            .unwrap_or_else(|| panic!("slurmd -C: {probe:?}"))
            .to_string();
        let node = node_line
            .split_whitespace()
            .next()
            .unwrap()
            .trim_start_matches("NodeName=")
            .to_string();
        // Job ids (hence the job scripts' MASTER_PORT, 15000 + id mod 15000) differ between test runs at once.
        let first_job = 1 + std::process::id() % 14000;
        let p = |name: &str| s(&d.join(name));
        let conf = d.join("slurm.conf");
        let text = format!(
            "ClusterName=rn50test\n\
             SlurmctldHost={node}(127.0.0.1)\n\
             SlurmUser=root\nSlurmdUser=root\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={d_port}\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={socket},cred_expire=5\n\
             StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctld_pid}\nSlurmdPidFile={d_pid}\n\
             SlurmctldLogFile={ctld_log}\nSlurmdLogFile={d_log}\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\n\
             SchedulerType=sched/builtin\nSchedulerParameters=sched_interval=1\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             MpiDefault=none\nMailProg=/bin/true\nReturnToService=2\n\
             FirstJobId={first_job}\nKillWait=30\nMinJobAge=600\n\
             {node_line} NodeAddr=127.0.0.1 State=UNKNOWN\n\
             PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            ctld_port = free_port(),
            d_port = free_port(),
            socket = s(&socket),
            state = p("state"),
            spool = p("spool"),
            ctld_pid = p("slurmctld.pid"),
            d_pid = p("slurmd.pid"),
            ctld_log = p("slurmctld.log"),
            d_log = p("slurmd.log"),
        );
        std::fs::write(&conf, text).unwrap();
        let mut slurm = Slurm {
            reaper: Reaper::new("slurm"),
            dir,
            conf,
            daemons: Vec::new(),
        };
        let log = d.join("daemons.log");
        let munged = slurm
            .reaper
            .command(munged, &log)
            .arg("-F")
            .arg("--force")
            .arg(format!("--key-file={}", s(&key)))
            .arg(format!("--socket={}", s(&socket)))
            .arg(format!("--pid-file={}", p("munge/munged.pid")))
            .arg(format!("--seed-file={}", p("munge/munged.seed")))
            .arg(format!("--log-file={}", p("munge/munged.log")))
            .spawn()
            .unwrap();
        slurm.daemons.push(munged);
        wait_for(
            "munged's socket",
            || slurm.logs(),
            || socket.exists().then_some(()),
        );
        for daemon in [slurmctld, slurmd] {
            let child = slurm
                .reaper
                .command(daemon, &log)
                .env("SLURM_CONF", &slurm.conf)
                .args(["-D", "-f"])
                .arg(&slurm.conf)
                .spawn()
                .unwrap();
            slurm.daemons.push(child);
        }
        wait_for(
            "the node to be idle in sinfo",
            || slurm.logs(),
            || {
                let o = slurm.cmd("sinfo", &["-h", "-o", "%T"]);
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .starts_with("idle")
                    .then_some(())
            },
        );
        slurm
    }

    /// A SLURM client command against this cluster.
    fn cmd(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .env("RN50_SCHEDULER_TEST", &self.reaper.marker)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// `sbatch --parsable OPTIONS scripts/slurm-train.sbatch ARGS…` with RN50 the binary under test; the job id.
    fn sbatch(&self, options: &[&str], rn50: &str, args: &[OsString]) -> String {
        let script = repo().join("scripts/slurm-train.sbatch");
        let o = Command::new("sbatch")
            .arg("--parsable")
            .args(options)
            .arg(&script)
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .env("RN50", rn50)
            .env("RN50_SCHEDULER_TEST", &self.reaper.marker)
            .env("OMP_NUM_THREADS", "1")
            .env("RN50_DIST_TIMEOUT", "60")
            .env_remove("MASTER_PORT")
            .env_remove("MASTER_ADDR")
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "sbatch: {o:?}\n{}", self.logs());
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    }

    /// `scontrol show job ID` as KEY → value.
    fn job(&self, id: &str) -> BTreeMap<String, String> {
        let o = self.cmd("scontrol", &["show", "job", "-o", id]);
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Waits for job `id` to end COMPLETED after `restarts` requeues. (A requeued job may start again after
    /// the job credentials' lifetime, `AuthInfo=cred_expire`: 120 s by default, 5 s on this cluster.)
    fn wait_completed(&self, id: &str, restarts: u32, out: &Path) {
        wait_for(
            &format!("job {id} to complete"),
            || format!("{:?}\n{}\n{}", self.job(id), read(out), self.logs()),
            || {
                let j = self.job(id);
                match j.get("JobState").map(String::as_str) {
                    Some("COMPLETED") => Some(()),
                    Some("FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY") => {
                        panic!("job {id}: {j:?}\n{}\n{}", read(out), self.logs())
                    }
                    _ => None,
                }
            },
        );
        assert_eq!(
            self.job(id).get("Restarts").map(String::as_str),
            Some(restarts.to_string().as_str()),
            "{}",
            read(out)
        );
    }

    /// Waits until job `id` runs attempt `restart` and its run is `INTO_EPOCH` steps into epoch `epoch`.
    fn wait_running_into(&self, id: &str, out: &Path, run: &Path, restart: u32, epoch: u64) {
        let banner = format!("rn50: job {id} (restart {restart})");
        wait_for(
            &format!("job {id}, attempt {restart}, {INTO_EPOCH} steps into epoch {epoch}"),
            || format!("{:?}\n{}\n{}", self.job(id), read(out), self.logs()),
            || {
                let at = last_step(run)?;
                (read(out).contains(&banner) && at.0 == epoch && at.1 >= INTO_EPOCH).then_some(())
            },
        );
    }

    fn logs(&self) -> String {
        let d = self.dir.path();
        ["daemons.log", "slurmctld.log", "slurmd.log"]
            .iter()
            .map(|f| {
                let t = read(&d.join(f));
                let tail: Vec<&str> = t.lines().rev().take(30).collect();
                format!(
                    "--- {f} (last lines)\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Cancel this cluster's jobs and let their steps end before the daemons go; the reaper then kills
        // whatever is left (daemons, slurmstepd, tasks).
        let _ = self.cmd("scancel", &["--full", "--user=root"]);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let o = self.cmd("squeue", &["-h"]);
            if !o.status.success() || o.stdout.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.reaper.kill_all(libc::SIGTERM);
        let start = Instant::now();
        for d in &mut self.daemons {
            while d.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// The CPUs in a Cpus_allowed_list value ("0-1", "0,2-3").
fn cpu_count(list: &str) -> usize {
    list.split(',')
        .map(|r| match r.trim().split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// `sbatch scripts/slurm-train.sbatch` on a cluster of one node, changed only by sbatch's options:
/// - `-c 2`: the task may run on the 2 CPUs asked for (SLURM ≥ 22.05's srun took 1 before the script passed
///   --cpus-per-task on), with 2 threads;
/// - 2 tasks × `-c 1` train; `scontrol requeue` in epoch 0 (the job is requeued, its tasks get SIGTERM,
///   checkpoint and exit 3) and then the time limit's SIGUSR1 in epoch 1 (`scancel --signal=USR1`, which
///   `--signal=USR1@120` sends: the tasks exit 3 and the script requeues the job itself) each resume mid-epoch in
///   the next attempt, and the final weights equal the uninterrupted run's.
#[test]
fn slurm_sbatch_requeue_and_resume() {
    let Some(bins) = need(
        "SLURM",
        &[
            "munged",
            "slurmctld",
            "slurmd",
            "sbatch",
            "scontrol",
            "sinfo",
            "squeue",
            "scancel",
        ],
        "slurm-wlm, munge",
    ) else {
        return;
    };
    let _serial = serial();
    let want = reference();
    let slurm = Slurm::start(&bins);
    let d = slurm.dir.path().to_path_buf();

    // Affinity: a stand-in for rn50 that prints what the task may run on.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 {
        let fake = d.join("show-cpus.sh");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho \"task $SLURM_PROCID $(grep Cpus_allowed_list /proc/self/status) OMP_NUM_THREADS=$OMP_NUM_THREADS\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = d.join("affinity.out");
        let id = slurm.sbatch(
            &[
                "--nodes=1",
                "--ntasks-per-node=1",
                "--gpus-per-node=0",
                "-c",
                "2",
                "--time=5",
                &format!("--output={}", s(&out)),
            ],
            &s(&fake),
            &[],
        );
        slurm.wait_completed(&id, 0, &out);
        let text = read(&out);
        let line = text
            .lines()
            .find(|l| l.starts_with("task 0 "))
            .unwrap_or_else(|| panic!("{text}"));
        let list = line
            .split("Cpus_allowed_list:")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(cpu_count(list), 2, "-c 2: the task may use {list}\n{text}");
        assert!(line.ends_with("OMP_NUM_THREADS=2"), "{text}");
    } else {
        eprintln!("SLURM: affinity check skipped: 1 CPU");
    }

    // Training, interrupted twice.
    let (out, run) = (d.join("train.out"), d.join("run"));
    let args = after_train(&tiny(&run));
    let id = slurm.sbatch(
        &[
            "--nodes=1",
            "--ntasks-per-node=2",
            "--gpus-per-node=0",
            "-c",
            "1",
            "--time=30",
            &format!("--output={}", s(&out)),
        ],
        RN50,
        &args,
    );
    slurm.wait_running_into(&id, &out, &run, 0, 0);
    let frozen = Frozen::ranks(&slurm.reaper);
    let o = slurm.cmd("scontrol", &["requeue", &id]);
    assert!(o.status.success(), "scontrol requeue: {o:?}");
    frozen.thaw_when_signalled("scontrol requeue");
    slurm.wait_running_into(&id, &out, &run, 1, 1);
    let frozen = Frozen::ranks(&slurm.reaper);
    let o = slurm.cmd("scancel", &["--signal=USR1", &id]);
    assert!(o.status.success(), "scancel --signal=USR1: {o:?}");
    frozen.thaw_when_signalled("scancel --signal=USR1");
    slurm.wait_completed(&id, 2, &out);

    let log = read(&out);
    for r in 0..3 {
        assert!(
            log.contains(&format!("rn50: job {id} (restart {r})")),
            "attempt {r}:\n{log}"
        );
    }
    assert_eq!(
        log.matches(&format!(
            "checkpointed before the time limit; requeueing job {id}"
        ))
        .count(),
        1,
        "the script requeues after the SIGUSR1 (the scontrol requeue needs it not):\n{log}"
    );
    assert_resumed_as_uninterrupted(
        &log,
        &[Resume::Mid(0), Resume::Mid(1)],
        &run,
        want,
        "SLURM, requeued twice",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Open MPI

/// `mpirun -np 2 rn50 train …` as root in a container (what CI is); Open MPI's session directory in the log's
/// folder (TMPDIR), inside the test's temporary folder, so that it goes with it.
fn mpirun(reaper: &Reaper, mpirun: &Path, log: &Path, train: &TinyTrain) -> Command {
    let mut c = reaper.command(mpirun, log);
    c.env("TMPDIR", log.parent().unwrap())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            "2",
        ])
        .args(["-x", "OMP_NUM_THREADS", "-x", "RN50_DIST_TIMEOUT"])
        .arg(RN50)
        .args(train.to_args());
    c
}

/// Two `mpirun -np 2` jobs at once on one node, neither given MASTER_PORT: each rendezvouses on a port derived
/// from its own Open MPI job (both used 29500 before, and the second failed), and both train to the
/// uninterrupted run's weights. Each job has a TMPDIR of its own, as a scheduler's jobs do: two Open MPI 4
/// mpiruns starting at once in one TMPDIR race to create its session directory, and the loser fails in
/// orte_init ("mkdir ... File exists", open-mpi/ompi#8510), before rn50 runs.
#[test]
fn two_mpirun_jobs_at_once_on_one_node() {
    let Some(bins) = need("Open MPI", &["mpirun"], "openmpi-bin") else {
        return;
    };
    let _serial = serial();
    let want = reference();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reaper = Reaper::new("mpirun");
    let mut jobs: Vec<(Child, PathBuf, PathBuf)> = ["a", "b"]
        .iter()
        .map(|j| {
            let tmp = d.join(format!("tmp-{j}"));
            std::fs::create_dir(&tmp).unwrap();
            let (log, run) = (tmp.join("mpirun.log"), d.join(j));
            (
                mpirun(&reaper, &bins[0], &log, &tiny(&run))
                    .spawn()
                    .unwrap(),
                log,
                run,
            )
        })
        .collect();
    for (child, log, _) in &mut jobs {
        let status = wait_exit(child, "mpirun", || read(log));
        assert!(status.success(), "mpirun: {status}\n{}", read(log));
    }
    for (_, _, run) in &jobs {
        assert_trained_once(run);
        assert_same_weights(run, want, "mpirun -np 2 (two jobs at once)");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// PBS (fake job, real Open MPI)

/// `scripts/pbs-train.sh` in a PBS job of one node faked by its variables (PBS_NODEFILE, PBS_JOBID,
/// PBS_O_WORKDIR), 2 workers under the real mpirun; returns the script's child, which leads a session of its
/// own as a PBS job's top shell does.
fn pbs_job(reaper: &Reaper, d: &Path, log: &Path) -> Child {
    let nodefile = d.join("nodefile");
    let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout).unwrap();
    // One line per MPI slot, as PBS writes it.
    std::fs::write(&nodefile, format!("{0}\n{0}\n", host.trim())).unwrap();
    use std::os::unix::process::CommandExt;
    let mut c = reaper.command("bash", log);
    c.arg(repo().join("scripts/pbs-train.sh"))
        .env("PBS_NODEFILE", &nodefile)
        .env(
            "PBS_JOBID",
            format!("{}.pbs", 1 + std::process::id() % 14000),
        )
        .env("PBS_O_WORKDIR", d)
        .env("DATA", "unused")
        .env("OUT", "run")
        .env("GPUS_PER_NODE", "2")
        .env("RN50", RN50)
        // TinyTrain's source, network and device, and these tests' flags: the script gives DATA and --out.
        .env(
            "EXTRA",
            format!("--dummy -a resnet18 --device cpu {}", flags()),
        )
        .env("GLOO_SOCKET_IFNAME", "lo")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("TMPDIR", d)
        .env_remove("LD_LIBRARY_PATH");
    // SAFETY: setsid(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    };
    c.spawn().unwrap()
}

/// The processes of session `sid` (field 6 of /proc/PID/stat).
fn session_pids(sid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                        // "pid (comm) state ppid pgrp session …"; comm may hold spaces and parentheses.
                        st.rsplit_once(')').and_then(|(_, rest)| {
                            rest.split_whitespace().nth(3)?.parse::<i32>().ok()
                        }) == Some(sid)
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// SIGTERM at the walltime, to the script alone or to every process of the job's session (what PBS Pro's MoM
/// does, mpirun and the node's launcher and workers included): the script prints its "checkpointed …; resubmit"
/// line and exits 3, a mid-epoch checkpoint is on disk, and the same job submitted again resumes from it to the
/// uninterrupted run's weights. Before, the script died at once (143) with nothing saved, or a signalled mpirun
/// SIGKILLed the launcher before its checkpoint and exited 1; and `-x LD_LIBRARY_PATH` warned when unset.
fn pbs_walltime(whole_job: bool) {
    let Some(_) = need("PBS (under Open MPI)", &["mpirun"], "openmpi-bin") else {
        return;
    };
    let _serial = serial();
    let want = reference();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reaper = Reaper::new(if whole_job { "pbs-job" } else { "pbs-script" });
    let run = d.join("run");
    let log = d.join("job1.log");
    let mut job = pbs_job(&reaper, d, &log);
    wait_for(
        "the job to be under way",
        || read(&log),
        || {
            assert!(
                job.try_wait().unwrap().is_none(),
                "ended early:\n{}",
                read(&log)
            );
            last_step(&run).filter(|&(e, s)| e == 0 && s >= INTO_EPOCH)
        },
    );
    let frozen = Frozen::ranks(&reaper);
    let targets = if whole_job {
        session_pids(job.id() as i32)
    } else {
        vec![job.id() as i32]
    };
    assert!(
        targets.len() >= if whole_job { 5 } else { 1 },
        "{targets:?}"
    );
    for pid in targets {
        // SAFETY: plain kill(2) of the script or a process of its session, all started by this test.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    frozen.thaw_when_signalled("SIGTERM");
    let status = wait_exit(&mut job, "the script to stop", || read(&log));
    let text = read(&log);
    assert_eq!(status.code(), Some(3), "{text}");
    assert!(
        text.contains(
            "rn50: checkpointed before the walltime; resubmit the same qsub command to resume from"
        ),
        "{text}"
    );
    assert!(
        !text.contains("could not find environment variable"),
        "{text}"
    );
    let (pos, _) = read_meta(&run.join("checkpoint.safetensors")).unwrap();
    assert!(
        mid_epoch((pos.epoch, pos.batch_in_epoch), 0),
        "checkpoint at {pos:?}\n{text}"
    );

    // Resubmitted: the same job again, uninterrupted.
    let log2 = d.join("job2.log");
    let mut job = pbs_job(&reaper, d, &log2);
    let status = wait_exit(&mut job, "the resubmitted job", || read(&log2));
    let text = read(&log2);
    assert!(status.success(), "{status}\n{text}");
    assert_resumed_as_uninterrupted(
        &text,
        &[Resume::Mid(0)],
        &run,
        want,
        "PBS script, SIGTERM then resubmitted",
    );
}

#[test]
fn pbs_script_sigterm_checkpoints_exits_3_and_resumes() {
    pbs_walltime(false);
}

#[test]
fn pbs_job_sigterm_to_every_process_checkpoints_exits_3_and_resumes() {
    pbs_walltime(true);
}

// ---------------------------------------------------------------------------------------------------------------
// torchrun

/// torchrun of the repo's .venv (what ./dev sets up), or of RN50_PYTHON's environment.
fn torchrun() -> Option<PathBuf> {
    let mut candidates = vec![repo().join(".venv/bin/torchrun")];
    if let Some(py) = std::env::var_os("RN50_PYTHON") {
        candidates.insert(0, PathBuf::from(py).with_file_name("torchrun"));
    }
    let found = candidates.into_iter().find(|p| p.is_file());
    if found.is_none() {
        eprintln!("skipped: no torchrun in .venv (run ./dev setup)");
    }
    found
}

/// The pid of a process carrying `RN50_SCHEDULER_TEST=<marker>` whose environment also has all of `vars`.
fn pid_with(reaper: &Reaper, vars: &[String]) -> Option<i32> {
    reaper.pids().into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
            let have: Vec<&[u8]> = env.split(|&b| b == 0).collect();
            vars.iter().all(|v| have.contains(&v.as_bytes()))
        })
    })
}

/// torchrun, static rendezvous (its agent's store), stopped by SIGTERM in epoch 0: torchrun exits non-zero (1,
/// not rn50's 3: its own behaviour) but rank 0 saved a mid-epoch checkpoint and there is no final.safetensors,
/// which is what a job script checks to requeue; the same command again resumes and ends with the
/// uninterrupted run's weights.
#[test]
fn torchrun_static_sigterm_then_rerun_resumes() {
    let Some(torchrun) = torchrun() else {
        return;
    };
    let _serial = serial();
    let want = reference();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reaper = Reaper::new("torchrun-static");
    let run = d.join("run");
    let start = |log: &Path| {
        let mut c = reaper.command(&torchrun, log);
        c.args([
            "--nproc-per-node",
            "2",
            "--master-port",
            &free_port().to_string(),
            "--no-python",
            RN50,
        ])
        .args(tiny(&run).flags("--resume auto").to_args());
        c.spawn().unwrap()
    };
    let log = d.join("first.log");
    let mut child = start(&log);
    wait_for(
        "torchrun under way",
        || read(&log),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "ended early:\n{}",
                read(&log)
            );
            last_step(&run).filter(|&(e, s)| e == 0 && s >= INTO_EPOCH)
        },
    );
    let frozen = Frozen::ranks(&reaper);
    // SAFETY: plain kill(2) of torchrun, still running.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    frozen.thaw_when_signalled("torchrun's SIGTERM");
    let status = wait_exit(&mut child, "torchrun to stop", || read(&log));
    let text = read(&log);
    assert!(!status.success(), "{text}");
    assert!(text.contains("signal received: checkpoint saved"), "{text}");
    assert!(!run.join("final.safetensors").exists());
    let (pos, _) = read_meta(&run.join("checkpoint.safetensors")).unwrap();
    assert!(
        mid_epoch((pos.epoch, pos.batch_in_epoch), 0),
        "{pos:?}\n{text}"
    );

    let log = d.join("second.log");
    let mut child = start(&log);
    let status = wait_exit(&mut child, "torchrun, resumed", || read(&log));
    let text = read(&log);
    assert!(status.success(), "{status}\n{text}");
    assert_resumed_as_uninterrupted(
        &text,
        &[Resume::Mid(0)],
        &run,
        want,
        "torchrun static, SIGTERM then rerun",
    );
}

/// torchrun with c10d rendezvous and `--max-restarts 1`: rank 1 SIGKILLed in epoch 1 (after the first epoch's
/// checkpoint); the agent restarts both workers, which resume from that checkpoint (`--resume auto`) and end
/// with the uninterrupted run's weights.
#[test]
fn torchrun_c10d_rendezvous_restarts_a_killed_worker() {
    let Some(torchrun) = torchrun() else {
        return;
    };
    let _serial = serial();
    let want = reference();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let reaper = Reaper::new("torchrun-c10d");
    let run = d.join("run");
    let log = d.join("log");
    let run_id = format!("rn50-test-{}", std::process::id());
    let mut c = reaper.command(&torchrun, &log);
    c.args([
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--max-restarts",
        "1",
    ])
    .arg(format!("--rdzv-endpoint=127.0.0.1:{}", free_port()))
    .arg(format!("--rdzv-id={run_id}"))
    .args(["--no-python", RN50])
    .args(tiny(&run).flags("--resume auto").to_args());
    let mut child = c.spawn().unwrap();
    let first = [
        "RANK=1".to_string(),
        "TORCHELASTIC_RESTART_COUNT=0".to_string(),
        format!("TORCHELASTIC_RUN_ID={run_id}"),
    ];
    let pid = wait_for(
        "epoch 1 under way",
        || read(&log),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "ended early:\n{}",
                read(&log)
            );
            last_step(&run).filter(|&(e, s)| e == 1 && s >= INTO_EPOCH)?;
            pid_with(&reaper, &first)
        },
    );
    let frozen = Frozen::ranks(&reaper);
    // SAFETY: plain kill(2) of rank 1, found running a moment ago and training until killed.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(frozen);
    let status = wait_exit(&mut child, "torchrun to finish", || read(&log));
    let text = read(&log);
    assert!(status.success(), "{status}\n{text}");
    assert_resumed_as_uninterrupted(
        &text,
        &[Resume::Start(1)],
        &run,
        want,
        "torchrun c10d, rank 1 killed and restarted",
    );
}
