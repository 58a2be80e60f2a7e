//! Under PyTorch's own launcher: torchrun's agent serves the store, the workers connect to it as clients.
use crate::common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// torchrun of RN50_PYTHON's environment, or of the repo's .venv (what ./dev sets up). Without one the test
/// fails, saying how to get it: returning early would report a pass without having tested anything.
fn torchrun() -> PathBuf {
    let mut candidates =
        vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/torchrun")];
    if let Some(py) = std::env::var_os("RN50_PYTHON") {
        candidates.insert(0, PathBuf::from(py).with_file_name("torchrun"));
    }
    match candidates.iter().find(|p| p.is_file()) {
        Some(found) => found.clone(),
        None => panic!(
            "needs torchrun: ./dev setup installs it into .venv (or point RN50_PYTHON at a Python whose \
             environment has it); looked for {candidates:?}"
        ),
    }
}

#[test]
fn torchrun_with_its_agent_store() {
    let torchrun = torchrun();
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let port = free_port().to_string();
    let mut child = Command::new(torchrun)
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            &port,
            "--no-python",
            WORKER,
        ])
        .args(["train", "--out", out, "--steps", "3"])
        .env("RN50_DIST_TIMEOUT", "60")
        .stdout(std::fs::File::create(dir.path().join("log")).unwrap())
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let status = wait_guarded(&mut child, Duration::from_secs(300), "torchrun");
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default()
        + &std::fs::read_to_string(dir.path().join("err")).unwrap_or_default();
    assert!(status.success(), "{log}");
    let (a, b) = (
        read_f32(&dir.path().join("params-rank0.bin")),
        read_f32(&dir.path().join("params-rank1.bin")),
    );
    assert!(
        !a.is_empty() && a == b,
        "ranks differ under torchrun\n{log}"
    );
}
