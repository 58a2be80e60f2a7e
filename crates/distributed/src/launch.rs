//! `rn50 launch`: torchrun's job for rn50. Starts one worker per local rank with the rendezvous environment,
//! prefixes their output with the rank, forwards SIGINT/SIGTERM/SIGUSR1 to them, and when one fails stops the
//! others (SIGTERM) and exits non-zero naming the failed rank. Workers asked to stop either way are SIGKILLed
//! after a grace period.
//!
//! Exit status 3 is rn50 train's "checkpointed after SIGTERM/SIGUSR1, requeue me": an orderly stop, so the other
//! workers are left to finish their own checkpoint-and-exit, and the launcher exits 3 too.
use anyhow::{bail, Context};
use clap::Args;
use rn50_args::{usize_in, UsageError};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Exit status of a worker that checkpointed and stopped on request.
pub const EXIT_REQUEUE: i32 = 3;

#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// Worker processes on this node, 1 to 1024 (one per GPU; on CPU the cores are split between them).
    #[arg(long, value_name = "N", value_parser = usize_in(1..=rn50_args::MAX_THREADS))]
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
    /// SIGINT/SIGTERM/SIGUSR1; rn50 train saves a checkpoint in that time), before SIGKILL: 0 to 86400 (a day),
    /// default 30 s, as torchrun and SLURM's default KillWait.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub grace: u64,
    /// Pass worker output through unchanged instead of prefixing lines with "[rank]".
    #[arg(long)]
    pub no_prefix: bool,
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

fn pump(
    src: impl std::io::Read + Send + 'static,
    prefix: Option<String>,
    to_stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        while r
            .read_until(b'\n', &mut line)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
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

/// Runs the workers to completion; returns the launcher's exit code (0, 3 for an orderly checkpoint-and-stop, or
/// the failed worker's code). Errors only when the workers cannot be started.
pub fn run(args: &LaunchArgs, exe: &Path) -> anyhow::Result<i32> {
    if args.nproc_per_node == 0 || args.nnodes == 0 {
        bail!("--nproc-per-node and --nnodes must be at least 1");
    }
    if args.node_rank >= args.nnodes {
        bail!(UsageError::new(format!(
            "--node-rank {} is outside 0..{} (--nnodes)",
            args.node_rank, args.nnodes
        )));
    }
    if args.command.is_empty() {
        bail!("no command for the workers (e.g. `rn50 launch --nproc-per-node 2 -- train ...`)");
    }
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let first_rank = args.node_rank * args.nproc_per_node;
    let master = resolve_master(args)?;

    // Signals to forward; registered before spawning so none is lost in between.
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGUSR1])
            .context("cannot install signal handlers")?;
    let sig_handle = signals.handle();
    let pids: Arc<Mutex<Vec<u32>>> = Arc::default();
    let forwarded: Arc<Mutex<Option<i32>>> = Arc::default();

    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pumps = Vec::new();
    for local in 0..args.nproc_per_node {
        let rank = first_rank + local;
        let mut cmd = Command::new(exe);
        cmd.args(&args.command)
            .envs(worker_env(args, &master, local, cpus)?)
            .stdin(Stdio::null());
        if !args.no_prefix {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
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
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e).with_context(|| {
                    format!("cannot start worker rank {rank} ({})", exe.display())
                });
            }
        };
        if let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) {
            pumps.push(pump(out, Some(format!("[rank {rank}] ")), false));
            pumps.push(pump(err, Some(format!("[rank {rank}] ")), true));
        }
        pids.lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .push(child.id());
        children.push((rank, child));
    }

    let forwarder = {
        let (pids, forwarded) = (pids.clone(), forwarded.clone());
        std::thread::spawn(move || {
            for sig in signals.forever() {
                if let Ok(mut f) = forwarded.lock() {
                    f.get_or_insert(sig);
                }
                if let Ok(p) = pids.lock() {
                    p.iter().for_each(|&pid| kill(pid, sig));
                }
            }
        })
    };

    let mut failure: Option<(usize, ExitStatus)> = None;
    let mut requeue = false;
    // When the workers were first asked to stop, and by which signal: SIGKILL follows `grace` later, since a
    // worker that cannot act on the signal (stopped, hung in a collective or in the kernel) would otherwise keep
    // the launcher, and the job, for ever.
    let mut asked: Option<(Instant, i32)> = None;
    let (mut term_sent, mut killed) = (false, false);
    let grace = Duration::from_secs(args.grace);
    let mut running: Vec<(usize, Child)> = children;
    while !running.is_empty() {
        let mut still = Vec::new();
        for (rank, mut child) in running {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if let Ok(mut p) = pids.lock() {
                        p.retain(|&pid| pid != child.id());
                    }
                    if status.success() {
                        continue;
                    }
                    if status.code() == Some(EXIT_REQUEUE) {
                        requeue = true;
                        continue;
                    }
                    if failure.is_none() {
                        eprintln!(
                            "rn50 launch: rank {rank} (pid {}) {}; stopping the other workers",
                            child.id(),
                            describe(status)
                        );
                        failure = Some((rank, status));
                    }
                }
                Ok(None) => still.push((rank, child)),
                Err(e) => {
                    eprintln!("rn50 launch: cannot wait for rank {rank}: {e}");
                    failure.get_or_insert((rank, ExitStatus::from_raw(1 << 8)));
                }
            }
        }
        running = still;
        if asked.is_none() {
            if let Some(sig) = forwarded.lock().ok().and_then(|f| *f) {
                asked = Some((Instant::now(), sig));
            }
        }
        if failure.is_some() && !running.is_empty() && !term_sent {
            running
                .iter()
                .for_each(|(_, c)| kill(c.id(), libc::SIGTERM));
            term_sent = true;
            asked.get_or_insert((Instant::now(), libc::SIGTERM));
        }
        match asked {
            Some((t, sig)) if !killed && !running.is_empty() && t.elapsed() > grace => {
                for (rank, c) in &running {
                    eprintln!(
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
    sig_handle.close();
    let _ = forwarder.join();
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

    if let Some((rank, status)) = failure {
        eprintln!("rn50 launch: failed: rank {rank} {}", describe(status));
        return Ok(match code_of(status) {
            0 => 1,
            c => c,
        });
    }
    if requeue {
        return Ok(EXIT_REQUEUE);
    }
    Ok(0)
}
