//! Launcher environments: torchrun/`rn50 launch`, SLURM, Open MPI, PMI (MPICH/Intel MPI/Cray PALS), PBS, none.
use rn50_distributed::env::{threads_per_local_rank, EnvError, LaunchSource, WorldInfo};
use rn50_distributed::launch::{parse_master, resolve_master, worker_env, LaunchArgs};
use std::collections::HashMap;

fn vars(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn world(kv: &[(&str, &str)]) -> WorldInfo {
    WorldInfo::from_vars(&vars(kv)).unwrap_or_else(|e| panic!("{kv:?}: {e}"))
}

#[test]
fn no_launcher_is_a_single_process() {
    assert_eq!(world(&[]), WorldInfo::single());
    assert_eq!(world(&[("PATH", "/bin")]).source, LaunchSource::Single);
    assert_eq!(world(&[("MASTER_PORT", "1234")]).master_port, 1234);
}

#[test]
fn torchrun() {
    let w = world(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node7"),
        ("MASTER_PORT", "29400"),
    ]);
    assert_eq!(
        w,
        WorldInfo {
            rank: 5,
            world_size: 8,
            local_rank: 1,
            local_world_size: 4,
            master_addr: "node7".into(),
            master_port: 29400,
            source: LaunchSource::Torchrun
        }
    );
    assert!(w.is_distributed() && !w.is_main());
    // Only RANK/WORLD_SIZE: one node assumed, loopback master, default port.
    let w = world(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(
        (
            w.local_rank,
            w.local_world_size,
            w.master_addr.as_str(),
            w.master_port
        ),
        (1, 2, "127.0.0.1", 29500)
    );
}

#[test]
fn torchrun_takes_precedence_over_the_scheduler() {
    // A job script that sets RANK/WORLD_SIZE inside a SLURM allocation.
    let w = world(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("SLURM_PROCID", "3"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_NTASKS", "4"),
    ]);
    assert_eq!(
        (w.source, w.rank, w.world_size),
        (LaunchSource::Torchrun, 0, 1)
    );
}

#[test]
fn slurm_srun() {
    let base = [
        ("SLURM_JOB_ID", "123456"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "9"),
        ("SLURM_NTASKS", "11"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_TASKS_PER_NODE", "4(x2),3"),
        ("SLURM_JOB_NODELIST", "gpu[01-02,07]"),
    ];
    let w = world(&base);
    assert_eq!(
        w,
        WorldInfo {
            rank: 9,
            world_size: 11,
            local_rank: 1,
            local_world_size: 3,
            master_addr: "gpu01".into(),
            master_port: 15000 + (123456 % 15000) as u16,
            source: LaunchSource::Slurm
        }
    );
    // Explicit MASTER_ADDR/PORT win; the step's own node list beats the job's.
    let mut kv = base.to_vec();
    kv.push(("SLURM_STEP_NODELIST", "node[001-003]-ib"));
    assert_eq!(world(&kv).master_addr, "node001-ib");
    kv.push(("MASTER_ADDR", "10.0.0.1"));
    kv.push(("MASTER_PORT", "23456"));
    let w = world(&kv);
    assert_eq!((w.master_addr.as_str(), w.master_port), ("10.0.0.1", 23456));
}

#[test]
fn slurm_variants() {
    // --ntasks-per-node only, old variable names, node list with a plain host first.
    let w = world(&[
        ("SLURM_STEPID", "1"),
        ("SLURM_PROCID", "2"),
        ("SLURM_NPROCS", "4"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NTASKS_PER_NODE", "2"),
        ("SLURM_NODELIST", "cpu3,gpu[01-04]"),
    ]);
    assert_eq!(
        (w.rank, w.world_size, w.local_rank, w.local_world_size),
        (2, 4, 0, 2)
    );
    assert_eq!((w.master_addr.as_str(), w.master_port), ("cpu3", 29500));
    // The batch script itself (no srun step) is one process, whatever SLURM_NTASKS says.
    assert_eq!(
        world(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_ID", "5")
        ])
        .source,
        LaunchSource::Single
    );
}

#[test]
fn slurm_errors() {
    let bad_nodeid = vars(&[
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_NODEID", "5"),
        ("SLURM_TASKS_PER_NODE", "2"),
        ("SLURM_JOB_NODELIST", "a"),
    ]);
    assert!(matches!(
        WorldInfo::from_vars(&bad_nodeid),
        Err(EnvError::Inconsistent(_))
    ));
    let bad_list = vars(&[
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_JOB_NODELIST", "gpu[01-"),
    ]);
    assert!(matches!(
        WorldInfo::from_vars(&bad_list),
        Err(EnvError::Parse(_))
    ));
    let bad_tasks = vars(&[
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_TASKS_PER_NODE", "2(x"),
    ]);
    assert!(WorldInfo::from_vars(&bad_tasks).is_err());
}

#[test]
fn open_mpi() {
    let w = world(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "head"),
    ]);
    assert_eq!(
        (
            w.source,
            w.rank,
            w.world_size,
            w.local_rank,
            w.local_world_size
        ),
        (LaunchSource::OpenMpi, 3, 4, 1, 2)
    );
    assert_eq!((w.master_addr.as_str(), w.master_port), ("head", 29500));
    // One node: loopback. Several nodes and nothing to find the master with: a clear error.
    let one = world(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ]);
    assert_eq!(one.master_addr, "127.0.0.1");
    let e = WorldInfo::from_vars(&vars(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ]))
    .unwrap_err();
    assert!(
        e.to_string().contains("mpirun -x MASTER_ADDR=<first host>"),
        "{e}"
    );
}

/// Two `mpirun` jobs on one node without MASTER_PORT (issue 24): each rendezvouses on a port of its own,
/// derived from Open MPI's job id (as 4.1.4 sets it), the same for every rank of a job, not both on 29500.
#[test]
fn open_mpi_jobs_on_one_node_get_their_own_ports() {
    let rank = |job: &str, r: &str| {
        world(&[
            ("OMPI_COMM_WORLD_RANK", r),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", r),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", job),
            ("PMIX_NAMESPACE", job),
        ])
    };
    let (a0, a1) = (rank("1264517121", "0"), rank("1264517121", "1"));
    let b0 = rank("1263271937", "0");
    assert_eq!(a0.master_port, a1.master_port);
    assert_ne!(a0.master_port, b0.master_port);
    for p in [a0.master_port, b0.master_port] {
        assert!((15000..30000).contains(&p), "{p}");
    }
    // MASTER_PORT still wins.
    let w = world(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_MCA_ess_base_jobid", "1264517121"),
        ("MASTER_PORT", "23456"),
    ]);
    assert_eq!(w.master_port, 23456);
    // MPICH/Intel MPI across nodes: their own way to pass the host.
    let e = WorldInfo::from_vars(&vars(&[
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "4"),
        ("PMI_LOCAL_SIZE", "2"),
    ]))
    .unwrap_err();
    assert!(e.to_string().contains("-genv MASTER_ADDR"), "{e}");
}

#[test]
fn pbs_with_mpi_uses_the_nodefile() {
    let dir = tempfile::tempdir().unwrap();
    let nodefile = dir.path().join("nodes");
    std::fs::write(
        &nodefile,
        "\nhost-a.cluster\nhost-a.cluster\nhost-b.cluster\n",
    )
    .unwrap();
    let nf = nodefile.to_str().unwrap();
    // Open MPI's mpirun inside a PBS/UGE job (ABCI).
    let w = world(&[
        ("PBS_NODEFILE", nf),
        ("PBS_JOBID", "4242.pbs1"),
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ]);
    assert_eq!(
        (w.master_addr.as_str(), w.master_port),
        ("host-a.cluster", 15000 + 4242)
    );
    // Cray PALS (PBS Pro mpiexec) and MPICH/Intel MPI Hydra.
    let pals = world(&[
        ("PBS_NODEFILE", nf),
        ("PALS_RANKID", "5"),
        ("PMI_SIZE", "8"),
        ("PALS_LOCAL_RANKID", "1"),
        ("PMI_LOCAL_SIZE", "4"),
    ]);
    assert_eq!(
        (
            pals.source,
            pals.rank,
            pals.world_size,
            pals.local_rank,
            pals.local_world_size,
            pals.master_addr.as_str()
        ),
        (LaunchSource::Pmi, 5, 8, 1, 4, "host-a.cluster")
    );
    let hydra = world(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("JOB_ID", "77"),
    ]);
    assert_eq!(
        (
            hydra.rank,
            hydra.local_rank,
            hydra.master_addr.as_str(),
            hydra.master_port
        ),
        (1, 1, "127.0.0.1", 15077)
    );
    let missing = vars(&[
        ("PBS_NODEFILE", "/nonexistent/nodes"),
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "2"),
    ]);
    assert!(WorldInfo::from_vars(&missing)
        .unwrap_err()
        .to_string()
        .contains("PBS_NODEFILE"));
}

#[test]
fn bad_values_are_errors_not_panics() {
    for kv in [
        vec![("RANK", "x"), ("WORLD_SIZE", "2")],
        vec![("RANK", "2"), ("WORLD_SIZE", "2")],
        vec![("RANK", "0"), ("WORLD_SIZE", "0")],
        vec![
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "3"),
            ("LOCAL_WORLD_SIZE", "2"),
        ],
        vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")],
        vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "0")],
        vec![("OMPI_COMM_WORLD_RANK", "-1")],
    ] {
        assert!(
            WorldInfo::from_vars(&vars(&kv)).is_err(),
            "{kv:?} should be rejected"
        );
    }
}

#[test]
fn threads_split_between_local_ranks() {
    assert_eq!(threads_per_local_rank(16, 4), 4);
    assert_eq!(threads_per_local_rank(2, 2), 1);
    assert_eq!(threads_per_local_rank(2, 3), 1);
    assert_eq!(threads_per_local_rank(7, 2), 3);
    assert_eq!(threads_per_local_rank(8, 0), 8);
}

#[test]
fn launch_environment() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        launch: LaunchArgs,
    }
    let cli = Cli::try_parse_from([
        "rn50",
        "--nproc-per-node",
        "4",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master",
        "10.1.2.3:4567",
        "--timeout",
        "90",
        "train",
        "--epochs",
        "1",
        "-b",
        "32",
    ])
    .unwrap();
    assert_eq!(cli.launch.command, ["train", "--epochs", "1", "-b", "32"]);
    let master = resolve_master(&cli.launch).unwrap();
    let env: HashMap<String, String> = worker_env(&cli.launch, &master, 2, 16)
        .unwrap()
        .into_iter()
        .collect();
    let w = WorldInfo::from_vars(&env).unwrap();
    assert_eq!(
        w,
        WorldInfo {
            rank: 6,
            world_size: 8,
            local_rank: 2,
            local_world_size: 4,
            master_addr: "10.1.2.3".into(),
            master_port: 4567,
            source: LaunchSource::Torchrun
        }
    );
    assert_eq!(env["RN50_DIST_TIMEOUT"], "90");
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        assert_eq!(env["OMP_NUM_THREADS"], "4");
    }
    assert_eq!(
        parse_master("[::1]:29500").unwrap(),
        ("::1".to_string(), 29500)
    );
    for bad in ["host", "host:", ":80", "host:0", "host:99999"] {
        assert!(parse_master(bad).is_err(), "{bad}");
    }
    // Defaults.
    let cli = Cli::try_parse_from([
        "rn50",
        "--nproc-per-node",
        "2",
        "--",
        "bench",
        "--steps",
        "3",
    ])
    .unwrap();
    assert_eq!((cli.launch.nnodes, cli.launch.node_rank), (1, 0));
    assert_eq!(cli.launch.command, ["bench", "--steps", "3"]);
    // One node without --master: loopback and a port free at the time; several nodes: the default port.
    let (addr, port) = resolve_master(&cli.launch).unwrap();
    assert_eq!(addr, "127.0.0.1");
    assert!(port > 0);
    let mut multi = cli.launch.clone();
    multi.nnodes = 2;
    assert_eq!(
        resolve_master(&multi).unwrap(),
        ("127.0.0.1".to_string(), 29500)
    );
}
