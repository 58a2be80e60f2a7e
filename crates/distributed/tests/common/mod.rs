//! Spawning worker processes (src/bin/worker.rs) for the multi-process tests.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const WORKER: &str = env!("CARGO_BIN_EXE_rn50-dist-worker");

/// Multi-process tests run one at a time: on a 2-core machine, several jobs at once only make them slow.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

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
