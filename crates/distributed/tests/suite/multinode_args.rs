//! Bad multi-node input is a clear error (issue 24): `rn50 launch --nnodes/--node-rank` that disagree with the
//! scheduler or MPI launcher that started it, a MASTER_ADDR that is not rank 0's, a GLOO_SOCKET_IFNAME that cannot
//! be used. The checks themselves on made-up environments and interfaces, then on real ranks
//! (src/bin/worker.rs) on loopback. The same errors across network namespaces: crates/rn50/tests/multinode.rs.
use crate::common;
use common::*;
use rn50_distributed::group::{
    describe_interfaces, ifname_problem, interfaces, master_addr_problem, Interface,
};
use rn50_distributed::launch::{scheduler_mismatch, LaunchArgs};
use std::collections::HashMap;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn launch_args(nnodes: usize, node_rank: usize) -> LaunchArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }
    let (n, r) = (nnodes.to_string(), node_rank.to_string());
    Cli::try_parse_from([
        "rn50",
        "--nproc-per-node",
        "2",
        "--nnodes",
        &n,
        "--node-rank",
        &r,
        "--",
        "train",
    ])
    .unwrap()
    .launch
}

fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn launch_flags_are_compared_with_the_scheduler_that_started_the_launcher() {
    let step = env(&[
        ("SLURM_JOB_ID", "5"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_NODEID", "1"),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_NNODES", "4"),
    ]);
    // The step's node count wins over the job's (srun -N2 in a 4-node allocation).
    assert_eq!(scheduler_mismatch(&launch_args(2, 1), &step), None);
    let m = scheduler_mismatch(&launch_args(4, 0), &step).unwrap();
    assert!(
        m.contains("--nnodes 4 but SLURM (srun) runs it on 2 nodes (SLURM_STEP_NUM_NODES=2)")
            && m.contains("--node-rank 0 but this is node 1 for SLURM (srun) (SLURM_NODEID=1)"),
        "{m}"
    );
    // Older SLURM spells it SLURM_STEPID; without a step's count, the job's.
    let old = env(&[
        ("SLURM_STEPID", "3"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NNODES", "2"),
    ]);
    let m = scheduler_mismatch(&launch_args(1, 0), &old).unwrap();
    assert!(
        m.contains("--nnodes 1 but SLURM (srun) runs it on 2 nodes (SLURM_NNODES=2)"),
        "{m}"
    );
    assert!(!m.contains("--node-rank"), "{m}");
    // A batch script (no step) may run a single-node job on a multi-node allocation.
    let batch = env(&[
        ("SLURM_JOB_ID", "5"),
        ("SLURM_NODEID", "0"),
        ("SLURM_NNODES", "4"),
    ]);
    assert_eq!(scheduler_mismatch(&launch_args(1, 0), &batch), None);

    // One launcher per node under Open MPI (scripts/pbs-train.sh) or MPICH/Intel MPI/PALS.
    let ompi = |rank: &str, local: &str| {
        env(&[
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_RANK", rank),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", local),
            // mpirun under SLURM starts its daemons with srun: the MPI variables describe the launchers.
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NODEID", "0"),
            ("SLURM_STEP_NUM_NODES", "3"),
        ])
    };
    assert_eq!(
        scheduler_mismatch(&launch_args(3, 2), &ompi("2", "1")),
        None
    );
    let m = scheduler_mismatch(&launch_args(2, 2), &ompi("2", "1")).unwrap();
    assert!(
        m.contains("--nnodes 2 but Open MPI (mpirun) runs it on 3 nodes (OMPI_COMM_WORLD_SIZE=3)"),
        "{m}"
    );
    // Several launchers per node: no node index to compare with.
    assert_eq!(
        scheduler_mismatch(&launch_args(5, 4), &ompi("2", "2")),
        None
    );
    let pmi = env(&[
        ("PMI_SIZE", "2"),
        ("PMI_RANK", "0"),
        ("MPI_LOCALNRANKS", "1"),
    ]);
    assert_eq!(scheduler_mismatch(&launch_args(2, 0), &pmi), None);
    let m = scheduler_mismatch(&launch_args(2, 1), &pmi).unwrap();
    assert!(
        m.contains("--node-rank 1 but this is node 0 for MPI (mpiexec/PMI) (PMI_RANK=0)"),
        "{m}"
    );
    let pals = env(&[
        ("PALS_SIZE", "4"),
        ("PALS_RANKID", "3"),
        ("PALS_LOCAL_SIZE", "1"),
    ]);
    assert_eq!(scheduler_mismatch(&launch_args(4, 3), &pals), None);
    assert!(scheduler_mismatch(&launch_args(4, 0), &pals).is_some());
    // No scheduler: nothing to compare.
    assert_eq!(scheduler_mismatch(&launch_args(8, 7), &env(&[])), None);
}

fn iface(name: &str, up: bool, running: bool, addrs: &[&str]) -> Interface {
    Interface {
        name: name.into(),
        up,
        running,
        addrs: addrs.iter().map(|a| a.parse::<IpAddr>().unwrap()).collect(),
    }
}

fn host() -> Vec<Interface> {
    vec![
        iface("lo", true, true, &["127.0.0.1", "::1"]),
        iface("eth0", true, true, &["10.1.2.3", "fe80::1"]),
        iface("ib0", true, false, &["10.9.0.3"]),
        iface("eth1", false, false, &["192.168.7.3"]),
        iface("eth2", true, true, &[]),
    ]
}

#[test]
fn interfaces_are_described_with_their_addresses_and_state() {
    assert_eq!(
        describe_interfaces(&host()),
        "lo 127.0.0.1 ::1, eth0 10.1.2.3, ib0 10.9.0.3 (no carrier), eth1 192.168.7.3 (down), eth2"
    );
    assert_eq!(describe_interfaces(&[]), "none found");
    // This host's own: loopback is always there.
    let mine = interfaces();
    let lo = mine.iter().find(|i| i.name == "lo").expect("no lo");
    assert!(
        lo.up && lo.addrs.contains(&"127.0.0.1".parse().unwrap()),
        "{mine:?}"
    );
}

#[test]
fn master_addr_must_be_an_address_of_rank_0s_host() {
    let h = host();
    for ok in [
        "10.1.2.3",
        "127.0.0.1",
        "127.0.1.1",
        "localhost",
        "::1",
        "0.0.0.0",
        "192.168.7.3",
    ] {
        assert_eq!(master_addr_problem(ok, 29500, &h), None, "{ok}");
    }
    let m = master_addr_problem("10.9.9.9", 29500, &h).unwrap();
    assert!(
        m.starts_with(
            "MASTER_ADDR 10.9.9.9 is not an address of this host (rank 0 serves the rendezvous store): \
             interfaces: lo 127.0.0.1 ::1, eth0 10.1.2.3, ib0"
        ),
        "{m}"
    );
    assert!(m.contains("RN50_MASTER_ADDR_CHECK=0"), "{m}");
    // A name that does not resolve is left to the store's own error.
    assert_eq!(master_addr_problem("no-such-host.invalid", 29500, &h), None);
}

#[test]
fn gloo_socket_ifname_must_name_a_usable_interface() {
    let h = host();
    assert_eq!(ifname_problem("", &h), None);
    assert_eq!(ifname_problem("eth0", &h), None);
    assert_eq!(ifname_problem("eth0,lo", &h), None);
    for (names, says) in [
        ("eth9", "eth9 is not an interface of this host"),
        ("eth1", "eth1 is down"),
        ("ib0", "ib0 has no carrier (its link is down)"),
        ("eth2", "eth2 has no IP address"),
        ("eth0,eth9", "eth9 is not an interface of this host"),
    ] {
        let m = ifname_problem(names, &h).unwrap();
        assert!(
            m.starts_with(&format!(
                "GLOO_SOCKET_IFNAME={names}: {says} (interfaces: lo 127.0.0.1"
            )),
            "{m}"
        );
    }
}

/// `rn50-dist-worker train` as rank `rank` of 2 with `vars`, output to dir/rank{rank}.log.
fn worker(dir: &std::path::Path, rank: usize, vars: &[(&str, String)]) -> Rank {
    let log = dir.join(format!("rank{rank}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(WORKER)
        .args(["train", "--steps", "2", "--out"])
        .arg(dir.join(format!("params{rank}")))
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env("RN50_DIST_HEARTBEAT", "0.25")
        .env("OMP_NUM_THREADS", "1")
        .env_remove("GLOO_SOCKET_IFNAME")
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Rank { rank, child, log }
}

#[test]
fn rank_0_with_a_master_addr_of_another_host_fails_at_once() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let vars = [
        ("MASTER_ADDR", "198.51.100.77".to_string()),
        ("MASTER_PORT", free_port().to_string()),
        ("RN50_DIST_TIMEOUT", "60".to_string()),
    ];
    let mut r0 = worker(dir.path(), 0, &vars);
    // A hang guard well below the 60 s timeout: the error comes before any wait.
    let status = wait_guarded(&mut r0.child, Duration::from_secs(45), "rank 0");
    let out = log(&r0);
    assert!(!status.success(), "{out}");
    assert!(
        out.contains(
            "rank 0/2: rendezvous failed: MASTER_ADDR 198.51.100.77 is not an address of this host (rank 0 \
             serves the rendezvous store): interfaces: lo 127.0.0.1"
        ),
        "{out}"
    );
    assert!(start.elapsed() < Duration::from_secs(45));
}

#[test]
fn a_gloo_socket_ifname_that_does_not_exist_is_named_on_every_rank() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let common = |ifname: &str| {
        vec![
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", port.clone()),
            ("RN50_DIST_TIMEOUT", "5".to_string()),
            ("GLOO_SOCKET_IFNAME", ifname.to_string()),
        ]
    };
    // Rank 1 names an interface this host does not have; rank 0 a good one (loopback).
    let mut ranks = [
        worker(dir.path(), 0, &common("lo")),
        worker(dir.path(), 1, &common("nosuch0")),
    ];
    let guard = Duration::from_secs(5) + Duration::from_secs(60);
    let statuses: Vec<_> = ranks
        .iter_mut()
        .map(|r| wait_guarded(&mut r.child, guard, &format!("rank {}", r.rank)))
        .collect();
    let (out0, out1) = (log(&ranks[0]), log(&ranks[1]));
    let named = "GLOO_SOCKET_IFNAME=nosuch0: nosuch0 is not an interface of this host (interfaces: lo 127.0.0.1";
    assert!(!statuses[1].success(), "{out1}");
    assert!(
        out1.contains(&format!(
            "rank 1/2: process group init (connecting to every rank) failed: {named}"
        )),
        "{out1}"
    );
    // Rank 0's own connection set-up fails (within its timeout) and passes on rank 1's report.
    assert!(!statuses[0].success(), "{out0}");
    assert!(out0.contains(&format!("rank 1 reports: {named}")), "{out0}");
}
