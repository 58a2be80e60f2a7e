//! DDP semantics on CPU with Gloo over loopback, with real worker processes.
use crate::common;
use common::*;

/// Runs the job; returns the number of buckets rank 0 reported for each step.
fn train(
    dir: &std::path::Path,
    world: usize,
    batch: usize,
    steps: usize,
    bucket_bytes: usize,
) -> Vec<usize> {
    let (b, s, bb) = (
        batch.to_string(),
        steps.to_string(),
        bucket_bytes.to_string(),
    );
    let out = dir.to_str().unwrap();
    let args = [
        "train",
        "--out",
        out,
        "--batch",
        &b,
        "--steps",
        &s,
        "--bucket-bytes",
        &bb,
    ];
    let results = run_job(dir, world, &args);
    for (rank, (status, log)) in results.iter().enumerate() {
        assert!(
            status.success(),
            "rank {rank} of {world} failed ({status}):\n{log}"
        );
    }
    results[0]
        .1
        .lines()
        .filter(|l| l.starts_with("step "))
        .map(|l| {
            l.split(" buckets ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// After K SGD steps every rank holds bit-identical parameters, although each rank starts from different random
/// weights and trains on different samples (so the broadcast and the gradient averaging both had to happen).
#[test]
fn every_rank_ends_with_identical_parameters() {
    let _serial = serial();
    for world in [2usize, 3] {
        let dir = tempfile::tempdir().unwrap();
        // Small buckets: this net then has several, all reduced during backward.
        let buckets = train(dir.path(), world, 3, 4, 400);
        assert_eq!(buckets.len(), 4);
        assert!(
            buckets.iter().all(|&b| b >= 2),
            "expected several buckets per step, got {buckets:?}"
        );
        let p = |name: &str, r: usize| read_f32(&dir.path().join(format!("{name}-rank{r}.bin")));
        let (local0, final0) = (p("local-init", 0), p("params", 0));
        assert!(!final0.is_empty());
        assert_ne!(local0, final0, "training did not change the parameters");
        for r in 1..world {
            assert_ne!(
                p("local-init", r),
                local0,
                "ranks 0 and {r} started equal: the test would prove nothing"
            );
            assert_eq!(
                p("init", r),
                local0,
                "rank {r} did not receive rank 0's initial parameters"
            );
            let fr = p("params", r);
            assert!(
                fr.iter()
                    .zip(&final0)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "world {world}: rank {r} differs from rank 0 after training"
            );
        }
    }
}

/// Gradient averaging is exact: 2 ranks × batch b reach the parameters of 1 rank × batch 2b (no batch norm; the
/// data of a step depend on the step only, rank r taking rows r·b..(r+1)·b of the same global batch).
#[test]
fn two_ranks_match_one_rank_with_twice_the_batch() {
    let _serial = serial();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    train(one.path(), 1, 8, 5, 25 << 20);
    train(two.path(), 2, 4, 5, 25 << 20);
    let a = read_f32(&one.path().join("params-rank0.bin"));
    let b = read_f32(&two.path().join("params-rank0.bin"));
    let init = read_f32(&one.path().join("init-rank0.bin"));
    assert_eq!(a.len(), b.len());
    let moved = a
        .iter()
        .zip(&init)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        moved > 1e-3,
        "parameters barely moved ({moved}): the comparison would prove nothing"
    );
    assert!(
        diff < 2e-6,
        "2 ranks × batch 4 differ from 1 rank × batch 8 by up to {diff} (moved {moved})"
    );
}

/// SyncBatchNorm over 2 and 3 ranks, each with its rows of one global batch (unequal, one of them empty; NCHW and
/// channels_last), gives the outputs, input and parameter gradients and running statistics of plain batch norm
/// over the whole batch in one process (each rank checks against that reference and fails otherwise).
#[test]
fn sync_batch_norm_matches_batch_norm_of_the_global_batch() {
    let _serial = serial();
    for (rows, layout) in [
        ("4,4", None),
        ("3,5", Some("--channels-last")),
        ("2,0,3", None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let world = rows.split(',').count();
        let mut args = vec!["sync-bn", "--rows", rows];
        args.extend(layout);
        let results = run_job(dir.path(), world, &args);
        for (rank, (status, log)) in results.iter().enumerate() {
            assert!(
                status.success() && log.contains("SyncBatchNorm matches"),
                "rows {rows} {layout:?}: rank {rank} failed ({status}):\n{log}"
            );
        }
    }
}
