//! `rn50 launch`: torchrun's job for rn50. Starts one worker per local rank with the rendezvous environment,
//! prefixes their output with the rank, forwards SIGINT/SIGTERM/SIGUSR1 to them (and SIGHUP/SIGQUIT as SIGTERM,
//! the stop request rn50 train checkpoints on: torchrun too takes all four as a request to end its workers), and
//! when one fails stops the others (SIGTERM) and exits non-zero naming the failed rank, or, with
//! `--max-restarts N`, starts all of them again (as torchrun's elastic agent does), up to N times. Workers asked to stop either way are SIGKILLed after a
//! grace period. `--log-dir DIR` also writes each rank's output to `DIR/rankN.log`.
//!
//! Exit status 3 is rn50 train's "checkpointed after SIGINT/SIGTERM/SIGUSR1, requeue me": an orderly stop, so the
//! other workers are left to finish their own checkpoint-and-exit, and the launcher exits 3 too (never restarting).
//! A worker killed by a signal the launcher forwarded (a second Ctrl-C stops rn50 commands at once) was stopped
//! on request too: the launcher says so and exits 128 + the signal, without calling it a failure.
use anyhow::{bail, Context};
use clap::Args;
use rn50_args::{usize_in, UsageError};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Exit status of a worker that checkpointed and stopped on request.
pub const EXIT_REQUEUE: i32 = 3;

#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// Worker processes on this node: 1 to 1024, or `gpu` for one per visible CUDA device (as torchrun's
    /// `--nproc-per-node gpu`: the CUDA_VISIBLE_DEVICES list when it is set, else the /dev/nvidiaN devices, else
    /// `nvidia-smi -L`; an error when there are none). On CPU the cores are split between the workers.
    #[arg(long, value_name = "N|gpu", value_parser = parse_nproc)]
    pub nproc_per_node: usize,
    /// Nodes in the job, 1 to 65536 (run `rn50 launch` once per node).
    #[arg(long, value_name = "M", default_value_t = 1, value_parser = usize_in(1..=65536))]
    pub nnodes: usize,
    /// This node's index, 0..nnodes (node 0 hosts rank 0 and the rendezvous store).
    #[arg(long, value_name = "R", default_value_t = 0, value_parser = usize_in(0..65536))]
    pub node_rank: usize,
    /// Rendezvous address: node 0's address and a free port. Default: 127.0.0.1 with a port that is free now for a
    /// single node (two jobs on one machine cannot collide), 127.0.0.1:29500 otherwise.
    #[arg(long, value_name = "ADDR:PORT")]
    pub master: Option<String>,
    /// Rendezvous and collective timeout in seconds, 1 to 604800 (a week), passed to the workers
    /// (RN50_DIST_TIMEOUT).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub timeout: Option<u64>,
    /// Seconds the workers get to exit once asked to stop (SIGTERM after one of them failed, or a forwarded
    /// SIGINT/SIGTERM/SIGUSR1, or SIGHUP/SIGQUIT as SIGTERM; rn50 train saves a checkpoint in that time), before
    /// SIGKILL: 0 to 86400 (a day), default 30 s, as torchrun and SLURM's default KillWait.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub grace: u64,
    /// Pass worker output through unchanged instead of prefixing lines with "[rank]".
    #[arg(long)]
    pub no_prefix: bool,
    /// After a worker fails (exits non-zero other than 3, or is killed by a signal the launcher did not send),
    /// stop the others and start all of them again, up to N times (0 to 100, default 0: the job fails), as
    /// torchrun's elastic agent does. Workers see the attempt in RN50_RESTART_COUNT (0 first). An rn50 train
    /// run continues from its last checkpoint only with `--resume auto`
    /// (`rn50 launch --nproc-per-node 8 --max-restarts 3 -- train /data/imagenet --out runs/r50 --resume auto`):
    /// without it a restarted train refuses its used --out. SIGINT/SIGTERM/SIGUSR1/SIGHUP/SIGQUIT sent to the
    /// launcher, and exit 3, never restart. With several nodes each node's launcher restarts its own workers,
    /// which meet again at --master.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = usize_in(0..=100))]
    pub max_restarts: usize,
    /// Also write each rank's output (stdout and stderr, unprefixed) to DIR/rank0.log, DIR/rank1.log, …,
    /// appending, with a header line per attempt and a line with how the rank ended; the terminal still gets
    /// every rank's lines (as torchrun's `--log-dir DIR --redirects 3 --tee 3`).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// The rn50 command each worker runs, after `--`: e.g.
    /// `rn50 launch --nproc-per-node 8 -- train /data/imagenet --out runs/r50`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

/// `--nproc-per-node`: a count, or `gpu` for the number of visible CUDA devices ([`visible_gpus`]).
fn parse_nproc(s: &str) -> Result<usize, String> {
    if s != "gpu" {
        return s
            .parse()
            .ok()
            .filter(|n| (1..=rn50_args::MAX_THREADS as usize).contains(n))
            .ok_or_else(|| format!("expected 1 to {} or `gpu`", rn50_args::MAX_THREADS));
    }
    match visible_gpus() {
        (0, how) => Err(format!("no CUDA device visible ({how})")),
        (n, _) => Ok(n),
    }
}

/// The CUDA devices this process can use, and how that was found: the entries of CUDA_VISIBLE_DEVICES when it is
/// set (CUDA ignores the entries from the first invalid one, `-1` or empty, on), else the /dev/nvidiaN device
/// files, else the GPU lines of `nvidia-smi -L`.
pub fn visible_gpus() -> (usize, String) {
    if let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") {
        let n = v
            .split(',')
            .map(str::trim)
            .take_while(|d| !d.is_empty() && !d.starts_with('-'))
            .count();
        return (n, format!("CUDA_VISIBLE_DEVICES={v:?}"));
    }
    let devices = std::fs::read_dir("/dev")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name().to_str().is_some_and(|n| {
                        n.strip_prefix("nvidia")
                            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                    })
                })
                .count()
        })
        .unwrap_or(0);
    if devices > 0 {
        return (devices, "/dev/nvidiaN".into());
    }
    let smi = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count()
        })
        .unwrap_or(0);
    (
        smi,
        "no CUDA_VISIBLE_DEVICES, no /dev/nvidiaN, no GPU from nvidia-smi -L".into(),
    )
}

/// What the scheduler or MPI launcher that started this `rn50 launch` says about the nodes, when it started one
/// launcher per node: (who, the node count and the variable it came from, this node's index and its variable).
struct SchedulerNodes {
    who: &'static str,
    nnodes: Option<(usize, String)>,
    node: Option<(usize, String)>,
}

fn scheduler_nodes(env: &HashMap<String, String>) -> Option<SchedulerNodes> {
    let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let num = |k: &str| get(k)?.parse::<usize>().ok().map(|n| (n, k.to_string()));
    let first = |ks: &[&str]| ks.iter().find_map(|k| num(k));
    // The innermost launcher first: mpirun under SLURM starts its daemons with srun.
    if get("OMPI_COMM_WORLD_SIZE").is_some() {
        // Several launchers per node have no node index to compare with.
        return (first(&["OMPI_COMM_WORLD_LOCAL_SIZE"])?.0 == 1).then(|| SchedulerNodes {
            who: "Open MPI (mpirun)",
            nnodes: num("OMPI_COMM_WORLD_SIZE"),
            node: num("OMPI_COMM_WORLD_RANK"),
        });
    }
    if get("PMI_SIZE").is_some() || get("PALS_SIZE").is_some() {
        let local = first(&["PMI_LOCAL_SIZE", "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE"]);
        if local.map(|l| l.0) == Some(1) {
            return Some(SchedulerNodes {
                who: "MPI (mpiexec/PMI)",
                nnodes: first(&["PMI_SIZE", "PALS_SIZE"]),
                node: first(&["PMI_RANK", "PALS_RANKID"]),
            });
        }
    }
    // An srun step (a batch script itself may run a single-node launch on a multi-node allocation).
    if (get("SLURM_STEP_ID").is_some() || get("SLURM_STEPID").is_some())
        && get("SLURM_NODEID").is_some()
    {
        return Some(SchedulerNodes {
            who: "SLURM (srun)",
            nnodes: first(&[
                "SLURM_STEP_NUM_NODES",
                "SLURM_NNODES",
                "SLURM_JOB_NUM_NODES",
            ]),
            node: num("SLURM_NODEID"),
        });
    }
    None
}

/// Where --nnodes/--node-rank disagree with the scheduler or MPI launcher that started this launcher (one per
/// node; see [`scheduler_nodes`]), the usage error naming both values; None when they agree or nothing says.
pub fn scheduler_mismatch(args: &LaunchArgs, env: &HashMap<String, String>) -> Option<String> {
    let s = scheduler_nodes(env)?;
    let mut bad = Vec::new();
    if let Some((n, var)) = s.nnodes.filter(|(n, _)| *n != args.nnodes) {
        bad.push(format!(
            "--nnodes {} but {} runs it on {n} nodes ({var}={n})",
            args.nnodes, s.who
        ));
    }
    if let Some((r, var)) = s.node.filter(|(r, _)| *r != args.node_rank) {
        bad.push(format!(
            "--node-rank {} but this is node {r} for {} ({var}={r})",
            args.node_rank, s.who
        ));
    }
    (!bad.is_empty()).then(|| {
        format!(
            "rn50 launch disagrees with the scheduler's environment: {} (each node's launcher takes the job's node \
             count and that node's own index)",
            bad.join("; ")
        )
    })
}

/// ADDR:PORT, with IPv6 addresses in brackets ([::1]:29500).
pub fn parse_master(s: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = s
        .rsplit_once(':')
        .with_context(|| format!("--master {s:?}: expected ADDR:PORT"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p > 0)
        .with_context(|| format!("--master {s:?}: bad port"))?;
    if host.is_empty() {
        bail!("--master {s:?}: empty address");
    }
    Ok((host.to_string(), port))
}

/// The rendezvous address the workers get: --master, else (one node) a free port on loopback, else the default.
pub fn resolve_master(args: &LaunchArgs) -> anyhow::Result<(String, u16)> {
    match &args.master {
        Some(m) => parse_master(m),
        None if args.nnodes == 1 => {
            let l =
                std::net::TcpListener::bind("127.0.0.1:0").context("looking for a free port")?;
            Ok(("127.0.0.1".into(), l.local_addr()?.port()))
        }
        None => Ok(("127.0.0.1".into(), crate::env::DEFAULT_PORT)),
    }
}

/// The environment of local worker `local` (what torchrun sets); `master` from [`resolve_master`].
pub fn worker_env(
    args: &LaunchArgs,
    master: &(String, u16),
    local: usize,
    cpus: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let (addr, port) = master.clone();
    let world = args.nproc_per_node * args.nnodes;
    let mut env = vec![
        (
            "RANK".to_string(),
            (args.node_rank * args.nproc_per_node + local).to_string(),
        ),
        ("WORLD_SIZE".into(), world.to_string()),
        ("LOCAL_RANK".into(), local.to_string()),
        ("LOCAL_WORLD_SIZE".into(), args.nproc_per_node.to_string()),
        ("GROUP_RANK".into(), args.node_rank.to_string()),
        ("MASTER_ADDR".into(), addr),
        ("MASTER_PORT".into(), port.to_string()),
    ];
    // Respect an explicit OMP_NUM_THREADS; otherwise split the cores.
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        env.push((
            "OMP_NUM_THREADS".into(),
            crate::env::threads_per_local_rank(cpus, args.nproc_per_node).to_string(),
        ));
    }
    if let Some(t) = args.timeout {
        env.push(("RN50_DIST_TIMEOUT".into(), t.to_string()));
    }
    Ok(env)
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s} ({})", signal_name(s)),
        _ => format!("ended with {status}"),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGUSR1 => "SIGUSR1",
        _ => "signal",
    }
}

/// The shell-style exit code of a worker status (128 + signal when killed).
fn code_of(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// A rank's log file under --log-dir, shared by the threads copying its stdout and stderr.
type RankLog = Arc<Mutex<File>>;

/// Appends `line` to a rank's log (a log that cannot be written is not worth failing the job for).
fn log_line(log: &RankLog, line: &[u8]) {
    if let Ok(mut f) = log.lock() {
        let _ = f.write_all(line);
    }
}

/// Copies a worker's stdout or stderr, line by line, to the launcher's own (behind `prefix`) and to its log.
fn pump(
    src: impl std::io::Read + Send + 'static,
    prefix: Option<String>,
    to_stderr: bool,
    log: Option<RankLog>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        while r
            .read_until(b'\n', &mut line)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            if let Some(log) = &log {
                log_line(log, &line);
            }
            let mut out: Box<dyn Write> = if to_stderr {
                Box::new(std::io::stderr().lock())
            } else {
                Box::new(std::io::stdout().lock())
            };
            if let Some(p) = &prefix {
                let _ = out.write_all(p.as_bytes());
            }
            let _ = out.write_all(&line);
            let _ = out.flush();
            line.clear();
        }
    })
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) on a child we started and have not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Now as `YYYY-MM-DDTHH:MM:SSZ` (for the log headers).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// How one attempt (all local workers, started together) ended.
enum Attempt {
    /// Every worker exited 0.
    Done,
    /// A worker exited 3 (checkpointed and stopped), or the launcher forwarded a signal, and none failed first.
    Stopped,
    /// A worker was killed by a signal the launcher had forwarded (a second Ctrl-C), and none failed first.
    Interrupted { rank: usize, status: ExitStatus },
    /// The first worker to fail, and whether the job may be restarted for it: not when the launcher had
    /// forwarded a signal or a worker had already stopped with 3 (an orderly stop, whatever came after).
    Failed {
        rank: usize,
        status: ExitStatus,
        restartable: bool,
    },
}

/// What the attempts share: the signal forwarder's view of the running workers and the first signal it forwarded.
struct Shared {
    pids: Arc<Mutex<Vec<u32>>>,
    forwarded: Arc<Mutex<Option<i32>>>,
}

impl Shared {
    fn forwarded(&self) -> Option<i32> {
        self.forwarded.lock().ok().and_then(|f| *f)
    }
}

/// The signals the launcher takes as a request for the workers: stop (SIGINT, SIGTERM, SIGHUP when the terminal
/// or ssh session that started it goes away, SIGQUIT), or checkpoint and stop (SIGUSR1, as SLURM's
/// `--signal=USR1@T` sends ahead of the time limit). torchrun's agent likewise turns SIGINT/SIGTERM/SIGHUP/SIGQUIT
/// into a termination of its workers.
const FORWARDED: [i32; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGHUP,
    libc::SIGQUIT,
];

/// What the workers get for a signal the launcher received: SIGHUP and SIGQUIT become SIGTERM, which rn50 train
/// checkpoints on and exits 3 (SIGHUP would kill it outright, SIGQUIT dump its core); the rest go as they are.
fn to_workers(sig: i32) -> i32 {
    match sig {
        libc::SIGHUP | libc::SIGQUIT => libc::SIGTERM,
        s => s,
    }
}

/// Closes the signal iterator (ending the forwarder thread) however `run` returns.
struct CloseSignals(signal_hook::iterator::Handle);

impl Drop for CloseSignals {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Runs the workers to completion, restarting them after a failure up to --max-restarts times; returns the
/// launcher's exit code (0, 3 for an orderly checkpoint-and-stop, or the last failed worker's code). Errors only
/// when the workers cannot be started.
pub fn run(args: &LaunchArgs, exe: &Path) -> anyhow::Result<ExitCode> {
    if args.nproc_per_node == 0 || args.nnodes == 0 {
        bail!("--nproc-per-node and --nnodes must be at least 1");
    }
    if args.node_rank >= args.nnodes {
        bail!(UsageError::new(format!(
            "--node-rank {} is outside 0..{} (--nnodes)",
            args.node_rank, args.nnodes
        )));
    }
    let vars: HashMap<String, String> = std::env::vars().collect();
    if let Some(msg) = scheduler_mismatch(args, &vars) {
        bail!(UsageError::new(msg));
    }
    if args.command.is_empty() {
        bail!("no command for the workers (e.g. `rn50 launch --nproc-per-node 2 -- train ...`)");
    }
    if args.max_restarts > 0
        && args.command.first().is_some_and(|c| c == "train")
        && !args.command.iter().any(|a| a.starts_with("--resume"))
    {
        tracing::warn!(
            "rn50 launch: --max-restarts without `--resume auto` in the train command: a restarted train \
             refuses its used --out instead of continuing from the last checkpoint"
        );
    }
    if let Some(dir) = &args.log_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating --log-dir {}", dir.display()))?;
    }

    // Signals to forward; registered before spawning so none is lost in between.
    let mut signals =
        signal_hook::iterator::Signals::new(FORWARDED).context("cannot install signal handlers")?;
    let _close = CloseSignals(signals.handle());
    let shared = Shared {
        pids: Arc::default(),
        forwarded: Arc::default(),
    };
    {
        let (pids, forwarded) = (shared.pids.clone(), shared.forwarded.clone());
        std::thread::spawn(move || {
            for received in signals.forever() {
                let sig = to_workers(received);
                if sig != received {
                    tracing::warn!(
                        "rn50 launch: {}: asking the workers to stop ({} to each)",
                        signal_name(received),
                        signal_name(sig)
                    );
                }
                if let Ok(mut f) = forwarded.lock() {
                    f.get_or_insert(sig);
                }
                if let Ok(p) = pids.lock() {
                    p.iter().for_each(|&pid| kill(pid, sig));
                }
            }
        });
    }

    let mut restarts = 0;
    loop {
        match run_attempt(args, exe, restarts, &shared)? {
            Attempt::Done => return Ok(ExitCode::SUCCESS),
            Attempt::Stopped => return Ok(ExitCode::from(EXIT_REQUEUE as u8)),
            Attempt::Interrupted { rank, status } => {
                tracing::warn!(
                    "rn50 launch: stopped on request: rank {rank} {}",
                    describe(status)
                );
                return Ok(ExitCode::from(code_of(status) as u8));
            }
            Attempt::Failed {
                rank,
                status,
                restartable,
            } => {
                // A signal that came while the workers were being stopped ends the job as well.
                if restartable && restarts < args.max_restarts && shared.forwarded().is_none() {
                    restarts += 1;
                    tracing::warn!(
                        "rn50 launch: rank {rank} {}: restarting all workers (restart {restarts} of {})",
                        describe(status),
                        args.max_restarts
                    );
                    continue;
                }
                let used = if args.max_restarts > 0 {
                    format!(
                        " (after {restarts} of {} restarts{})",
                        args.max_restarts,
                        if restartable {
                            ""
                        } else {
                            "; stopped on request, not restarted"
                        }
                    )
                } else {
                    String::new()
                };
                tracing::error!(
                    "rn50 launch: failed: rank {rank} {}{used}",
                    describe(status)
                );
                return Ok(match u8::try_from(code_of(status)) {
                    Ok(0) | Err(_) => ExitCode::FAILURE,
                    Ok(c) => ExitCode::from(c),
                });
            }
        }
    }
}

/// Starts every local worker (attempt `restarts` + 1) and waits for all of them.
fn run_attempt(
    args: &LaunchArgs,
    exe: &Path,
    restarts: usize,
    shared: &Shared,
) -> anyhow::Result<Attempt> {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let first_rank = args.node_rank * args.nproc_per_node;
    // A fresh free port for each attempt (unless --master): the last attempt's store may still hold its own.
    let master = resolve_master(args)?;
    let piped = !args.no_prefix || args.log_dir.is_some();

    let mut children: Vec<(usize, Child, Option<RankLog>)> = Vec::new();
    let mut pumps = Vec::new();
    {
        // Held while starting: a signal forwarded meanwhile reaches every worker of this attempt.
        let mut pids = shared
            .pids
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        if shared.forwarded().is_some() {
            // Asked to stop before this attempt started: nothing to run.
            return Ok(Attempt::Stopped);
        }
        for local in 0..args.nproc_per_node {
            let rank = first_rank + local;
            let log = match &args.log_dir {
                Some(dir) => {
                    let path = dir.join(format!("rank{rank}.log"));
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .with_context(|| format!("opening {}", path.display()))?;
                    let log = Arc::new(Mutex::new(file));
                    log_line(
                        &log,
                        format!(
                            "=== rn50 launch: rank {rank}, attempt {} (RN50_RESTART_COUNT={restarts}), {} ===\n",
                            restarts + 1,
                            utc_now()
                        )
                        .as_bytes(),
                    );
                    Some(log)
                }
                None => None,
            };
            let mut cmd = Command::new(exe);
            cmd.args(&args.command)
                .envs(worker_env(args, &master, local, cpus)?)
                .env("RN50_RESTART_COUNT", restarts.to_string())
                .env_remove(rn50_util::log::LAUNCHER_PREFIXES_RANK)
                .stdin(Stdio::null());
            if piped {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            if !args.no_prefix {
                // The worker's log lines then carry no `[rank N]` of their own.
                cmd.env(rn50_util::log::LAUNCHER_PREFIXES_RANK, "1");
            }
            // Own process group: a terminal's Ctrl-C reaches the launcher only, which forwards it once. And the
            // workers die with the launcher even if it is SIGKILLed.
            cmd.process_group(0);
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    for (_, c, _) in &mut children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    pids.clear();
                    return Err(e).with_context(|| {
                        format!("cannot start worker rank {rank} ({})", exe.display())
                    });
                }
            };
            if let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) {
                let prefix = (!args.no_prefix).then(|| format!("[rank {rank}] "));
                pumps.push(pump(out, prefix.clone(), false, log.clone()));
                pumps.push(pump(err, prefix, true, log.clone()));
            }
            pids.push(child.id());
            children.push((rank, child, log));
        }
    }

    let mut failure: Option<(usize, ExitStatus)> = None;
    let mut requeue = false;
    // The first worker killed by a signal the launcher forwarded to it: stopped on request, not failed.
    let mut interrupted: Option<(usize, ExitStatus)> = None;
    // Whether the job was asked to stop (a forwarded signal, or a worker's exit 3) before any worker failed.
    let mut stop_first = false;
    // When the workers were first asked to stop, and by which signal: SIGKILL follows `grace` later, since a
    // worker that cannot act on the signal (stopped, hung in a collective or in the kernel) would otherwise keep
    // the launcher, and the job, for ever.
    let mut asked: Option<(Instant, i32)> = None;
    let (mut term_sent, mut killed) = (false, false);
    let grace = Duration::from_secs(args.grace);
    let mut running = children;
    while !running.is_empty() {
        let mut still = Vec::new();
        for (rank, mut child, log) in running {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if let Ok(mut p) = shared.pids.lock() {
                        p.retain(|&pid| pid != child.id());
                    }
                    if let Some(log) = &log {
                        let line =
                            format!("=== rn50 launch: rank {rank} {} ===\n", describe(status));
                        log_line(log, line.as_bytes());
                    }
                    if status.success() {
                        continue;
                    }
                    if status.code() == Some(EXIT_REQUEUE) {
                        requeue = true;
                        stop_first |= failure.is_none();
                        continue;
                    }
                    if shared.forwarded().is_some()
                        && status.signal().is_some_and(|s| FORWARDED.contains(&s))
                    {
                        stop_first |= failure.is_none();
                        interrupted.get_or_insert((rank, status));
                        continue;
                    }
                    if failure.is_none() {
                        let then = if args.max_restarts > 0 {
                            "stopping the other workers before a restart"
                        } else {
                            "stopping the other workers"
                        };
                        tracing::warn!(
                            "rn50 launch: rank {rank} (pid {}) {}; {then}",
                            child.id(),
                            describe(status)
                        );
                        failure = Some((rank, status));
                    }
                }
                Ok(None) => still.push((rank, child, log)),
                Err(e) => {
                    tracing::error!("rn50 launch: cannot wait for rank {rank}: {e}");
                    failure.get_or_insert((rank, ExitStatus::from_raw(1 << 8)));
                }
            }
        }
        running = still;
        if asked.is_none() {
            if let Some(sig) = shared.forwarded() {
                stop_first |= failure.is_none();
                asked = Some((Instant::now(), sig));
            }
        }
        if failure.is_some() && !running.is_empty() && !term_sent {
            running
                .iter()
                .for_each(|(_, c, _)| kill(c.id(), libc::SIGTERM));
            term_sent = true;
            asked.get_or_insert((Instant::now(), libc::SIGTERM));
        }
        match asked {
            Some((t, sig)) if !killed && !running.is_empty() && t.elapsed() > grace => {
                for (rank, c, _) in &running {
                    tracing::warn!(
                        "rn50 launch: rank {rank} still running {} s after {}: SIGKILL",
                        grace.as_secs(),
                        signal_name(sig)
                    );
                    kill(c.id(), libc::SIGKILL);
                }
                killed = true;
            }
            _ => {}
        }
        if !running.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Let the output threads drain what the workers wrote last.
    let deadline = Instant::now() + Duration::from_secs(5);
    for p in pumps {
        while !p.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if p.is_finished() {
            let _ = p.join();
        }
    }

    Ok(match failure {
        Some((rank, status)) => Attempt::Failed {
            rank,
            status,
            restartable: !stop_first,
        },
        None => match interrupted {
            Some((rank, status)) => Attempt::Interrupted { rank, status },
            None if requeue || shared.forwarded().is_some() => Attempt::Stopped,
            None => Attempt::Done,
        },
    })
}
