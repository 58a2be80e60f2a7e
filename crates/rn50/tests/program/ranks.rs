//! Ranks of one job started with different flags: found at start-up, before anything is written, and an error
//! (exit 1) on every rank that names the flag and the ranks' values; never a run that drifts out of step (it
//! used to end with rank 0 "checkpointed after a signal", exit 3: requeue me).
use std::ffi::{OsStr, OsString};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::TinyTrain;

/// Rank `rank` of 2 running `rn50 args…`, stderr to `log`.
fn rank(rank: usize, port: u16, args: &[OsString], log: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("RN50_DIST_TIMEOUT", "30")
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Runs two ranks, `args` plus `extra[r]` on rank r; returns each one's exit code and stderr.
fn two_ranks<S: AsRef<OsStr>>(
    dir: &std::path::Path,
    args: &[S],
    extra: [&[&str]; 2],
) -> Vec<(Option<i32>, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut children: Vec<(Child, std::path::PathBuf)> = (0..2)
        .map(|r| {
            let log = dir.join(format!("log{r}"));
            let args: Vec<OsString> = args
                .iter()
                .map(|a| a.as_ref().to_os_string())
                .chain(extra[r].iter().map(OsString::from))
                .collect();
            (rank(r, port, &args, &log), log)
        })
        .collect();
    let start = Instant::now();
    children
        .iter_mut()
        .map(|(c, log)| {
            let status = loop {
                if let Some(s) = c.try_wait().unwrap() {
                    break s;
                }
                if start.elapsed() > Duration::from_secs(300) {
                    let _ = c.kill();
                    panic!(
                        "hang: {}",
                        std::fs::read_to_string(&*log).unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            (status.code(), std::fs::read_to_string(&*log).unwrap())
        })
        .collect()
}

/// What the ranks of [`two_ranks_with_different_batch_sizes`] are told.
const BATCH_SIZES: &str = "--batch-size: rank 0 has 1, rank 1 has 2";

/// Two ranks running `args` plus `-b 1` on rank 0 and `-b 2` on rank 1.
fn two_ranks_with_different_batch_sizes<S: AsRef<OsStr>>(
    dir: &std::path::Path,
    args: &[S],
) -> Vec<(Option<i32>, String)> {
    two_ranks(dir, args, [&["-b", "1"], &["-b", "2"]])
}

/// Every rank failed at the configuration check, naming the flag and both values (`difference`).
fn assert_named(results: &[(Option<i32>, String)], difference: &str) {
    for (r, (code, log)) in results.iter().enumerate() {
        assert_eq!(*code, Some(1), "rank {r}:\n{log}");
        assert!(
            log.contains(&format!("rank {r}/2: configuration check failed: "))
                && log.contains(difference),
            "rank {r}'s error does not name the flag and both values ({difference}):\n{log}"
        );
        assert!(!log.contains("signal received"), "rank {r}:\n{log}");
    }
}

#[test]
fn train_with_different_batch_sizes_is_an_error_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let results = two_ranks_with_different_batch_sizes(
        dir.path(),
        // 64 px: -b 1 at 32 px would be refused on its own (one value per channel in the last stage).
        &TinyTrain::dummy(&out)
            .flags("--width 8 --image-size 64 --steps-per-epoch 4 --epochs 1")
            .to_args(),
    );
    assert_named(&results, BATCH_SIZES);
    assert!(
        !out.exists(),
        "the run directory was created before the check"
    );
}

#[test]
fn bench_with_different_batch_sizes_is_an_error_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let results = two_ranks_with_different_batch_sizes(
        dir.path(),
        &[
            "bench",
            "-a",
            "resnet18",
            "--image-size",
            "32",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--device",
            "cpu",
        ],
    );
    assert_named(&results, BATCH_SIZES);
}

/// A rank with --sync-bn would wait in an all-gather that the rank without it never joins.
#[test]
fn train_with_and_without_sync_bn_is_an_error_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let results = two_ranks(
        dir.path(),
        &TinyTrain::dummy(&out)
            .flags("--width 16 --image-size 32 --steps-per-epoch 2 --epochs 1")
            .to_args(),
        [&[], &["--sync-bn"]],
    );
    assert_named(&results, "--sync-bn: rank 0 has false, rank 1 has true");
}
