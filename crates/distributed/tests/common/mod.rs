//! Spawning worker processes (src/bin/worker.rs) for the multi-process tests.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const WORKER: &str = env!("CARGO_BIN_EXE_rn50-dist-worker");

/// Multi-process tests run one at a time: on a 2-core machine, several jobs at once only make them slow.
pub use rn50_util::testing::{serial, serial_shared};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Rank {
    pub rank: usize,
    pub child: Child,
    pub log: PathBuf,
}

/// Starts `worker args…` as rank `rank` of `world`, output to dir/log-rank{rank}.
pub fn spawn_rank(
    dir: &Path,
    world: usize,
    rank: usize,
    port: u16,
    timeout_s: f64,
    args: &[&str],
) -> Rank {
    let log = dir.join(format!("log-rank{rank}"));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(WORKER)
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("RN50_DIST_TIMEOUT", timeout_s.to_string())
        .env("RN50_DIST_HEARTBEAT", "0.25")
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Rank { rank, child, log }
}

/// Waits for the process, killing it and failing the test if it runs past `guard` (a hang).
pub fn wait_guarded(child: &mut Child, guard: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > guard {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {guard:?}: hang");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn log(r: &Rank) -> String {
    std::fs::read_to_string(&r.log).unwrap_or_default()
}

/// Runs a whole job of `world` ranks to completion; returns each rank's (status, log).
pub fn run_job(dir: &Path, world: usize, args: &[&str]) -> Vec<(ExitStatus, String)> {
    let port = free_port();
    let mut ranks: Vec<Rank> = (0..world)
        .map(|r| spawn_rank(dir, world, r, port, 60.0, args))
        .collect();
    ranks
        .iter_mut()
        .map(|r| {
            let s = wait_guarded(
                &mut r.child,
                Duration::from_secs(300),
                &format!("rank {}", r.rank),
            );
            (s, log(r))
        })
        .collect()
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// How long a launcher may take before a test kills it as hung.
pub const LAUNCH_GUARD: Duration = Duration::from_secs(120);

/// `rn50-dist-worker launch ARGS…` (the workers are rn50-dist-worker too), its output piped.
pub fn launcher(args: &[&str], up_dir: &std::path::Path) -> std::process::Child {
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

/// Waits for a launcher (killing it if it hangs): its status, stdout and stderr.
pub fn finish(child: std::process::Child) -> (std::process::ExitStatus, String, String) {
    // wait_with_output has no timeout: a watchdog kills the launcher if it hangs.
    let pid = child.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let watchdog = std::thread::spawn(move || {
        let start = Instant::now();
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            if start.elapsed() > LAUNCH_GUARD {
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

/// The pid of worker `rank` among the children of `launcher` (from /proc: their RANK variable).
pub fn worker_pid(launcher: u32, rank: usize) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| {
                    env.split(|&b| b == 0)
                        .any(|kv| kv == format!("RANK={rank}").as_bytes())
                })
                .unwrap_or(false)
        })
}
