//! Several nodes over a real network, on one machine (issue 24): each "node" is a Linux network namespace with a
//! veth link to a bridge (tests/common/netns.rs), and runs its own `rn50 launch --nnodes N --node-rank I
//! --master NODE0:PORT` with GLOO_SOCKET_IFNAME naming its link. Checked:
//!
//! - 2 nodes × 1 rank train to the same final weights, bit for bit, as 1 node × 2 ranks (same global batch, one
//!   thread per rank), and 2 nodes × 2 ranks as 1 node × 4;
//! - a node whose processes are all SIGKILLed: the other node's ranks fail within the timeout naming the lost
//!   ranks, and the survivors alone (node 0 as a 1-node job of the same global batch) continue from the last
//!   checkpoint to the weights of an uninterrupted run;
//! - a link taken down mid-step: every rank ends within the timeout (no hang), and the checkpoint on disk continues
//!   to the weights of an uninterrupted run;
//! - with a second interface listed first on each node, GLOO_SOCKET_IFNAME chooses the link, and a wrong choice
//!   (no such interface, or one that is down) fails naming it, on that node and, through the store, on node 0.
//!
//! Namespaces need root (CI runs as root): elsewhere these tests fail, saying so, rather than pass untested. The
//! scheduler and MASTER_ADDR checks at the end need no namespace.
mod common;
#[path = "common/netns.rs"]
mod netns;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{metrics_lines, TinyTrain};
use netns::Net;
use rn50::train::checkpoint::read_meta;
// One multi-process test at a time: on a 2-core machine, several jobs at once only make each slow.
use rn50_util::testing::serial;

const RN50: &str = env!("CARGO_BIN_EXE_rn50");
/// --timeout of the jobs that lose a node or a link (RN50_DIST_TIMEOUT): every rank must end within it plus
/// [`SLACK`] (the failure diagnosis and the launcher's exit). A pulled link is noticed only when it runs out, so
/// the test waits that long; the rendezvous of four ranks on the 2-core CI machine takes a few seconds of it.
const TIMEOUT: u64 = 10;
const SLACK: Duration = Duration::from_secs(30);
/// Bound on a job that should finish, so that a hang is a clear failure rather than a stuck CI job.
const PATIENCE: Duration = Duration::from_secs(300);
/// The rendezvous port on node 0 (each test has namespaces of its own: no other program there).
const PORT: u16 = 29500;

/// The namespaces of `nodes` nodes (with `decoy` interfaces). A host that cannot make them fails the test, naming
/// what is missing: a test that returned early would report a pass without having tested anything.
fn namespaces(nodes: usize, decoy: bool) -> Net {
    Net::new(nodes, decoy).unwrap_or_else(|why| {
        panic!(
            "needs root and network namespaces (run as root, with iproute2's `ip`; CI does): {why}"
        )
    })
}

/// `train` on synthetic data: ResNet-18 at width 16, 32 px, batch 2 per rank, a checkpoint at each epoch's end.
fn train_args(out: &Path, epochs: u64, steps: u64) -> TinyTrain {
    TinyTrain::dummy(out).flags(&format!(
        "--width 16 -b 2 --image-size 32 --augment cifar --precision fp32 -p 10 --checkpoint-minutes 0 \
         --resume auto --epochs {epochs} --steps-per-epoch {steps}"
    ))
}

/// A running launcher and the file its output goes to.
struct Job {
    child: Child,
    log: PathBuf,
    what: String,
}

impl Job {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the launcher to end; after `guard` kills it and panics (a hang).
    fn wait(&mut self, guard: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if start.elapsed() > guard {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still running after {guard:?}: hang\n{}",
                    self.what,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the launcher and asserts that it succeeded; its output.
    fn success(mut self) -> String {
        let status = self.wait(PATIENCE);
        let log = self.log();
        assert!(status.success(), "{}: {status}\n{log}", self.what);
        log
    }
}

/// Starts `cmd` (a launcher) with one thread per rank, its output to `log`.
fn start(mut cmd: Command, log: PathBuf, what: String) -> Job {
    let out = std::fs::File::create(&log).unwrap();
    let child = cmd
        .env("OMP_NUM_THREADS", "1")
        .env("RN50_DIST_HEARTBEAT", "0.5")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Job { child, log, what }
}

/// `rn50 launch` of node `node` of `net`: `nproc` ranks, Gloo on `ifname` ("": rn50's default), the rendezvous
/// at node 0.
fn launch_node(
    net: &Net,
    node: usize,
    nproc: usize,
    ifname: &str,
    timeout: u64,
    dir: &Path,
    command: &TinyTrain,
) -> Job {
    let mut cmd = net.command(node, RN50);
    cmd.args(["launch", "--nnodes", &net.nodes.len().to_string()])
        .args(["--node-rank", &node.to_string()])
        .args(["--nproc-per-node", &nproc.to_string()])
        .args(["--master", &net.master(PORT)])
        .args(["--timeout", &timeout.to_string(), "--grace", "5", "--"])
        .args(command.to_args())
        .env("GLOO_SOCKET_IFNAME", ifname);
    let log = dir.join(format!("node{node}.log"));
    start(cmd, log, format!("node {node}'s launcher"))
}

/// Every node of `net` with `nproc` ranks each, Gloo on each node's link.
fn launch_nodes(
    net: &Net,
    nproc: usize,
    timeout: u64,
    dir: &Path,
    command: &TinyTrain,
) -> Vec<Job> {
    (0..net.nodes.len())
        .map(|i| launch_node(net, i, nproc, &net.nodes[i].ifname, timeout, dir, command))
        .collect()
}

/// `rn50 launch --nproc-per-node NPROC` on one machine (on node `node` of `net`, or in this test's own
/// namespace): a single-node job.
fn launch_one_node(
    net: Option<(&Net, usize)>,
    nproc: usize,
    dir: &Path,
    command: &TinyTrain,
) -> Job {
    let mut cmd = match net {
        Some((net, node)) => net.command(node, RN50),
        None => Command::new(RN50),
    };
    cmd.args(["launch", "--nproc-per-node", &nproc.to_string()])
        .args(["--timeout", &TIMEOUT.to_string(), "--"])
        .args(command.to_args());
    let log = dir.join(format!("one-node-{nproc}.log"));
    start(cmd, log, format!("1 node × {nproc}"))
}

/// The tensors of a safetensors file: name → (dtype, shape, raw bytes).
fn tensors(path: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, v)| {
            (
                name,
                (
                    format!("{:?}", v.dtype()),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                ),
            )
        })
        .collect()
}

/// The final weights of two runs are the same, tensor for tensor, bit for bit.
fn assert_same_weights(a: &Path, b: &Path) {
    let (ta, tb) = (
        tensors(&a.join("final.safetensors")),
        tensors(&b.join("final.safetensors")),
    );
    assert!(ta.len() > 10, "{} tensors in {}", ta.len(), a.display());
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "tensor names"
    );
    let differ: Vec<&String> = ta.keys().filter(|k| ta[*k] != tb[*k]).collect();
    assert!(
        differ.is_empty(),
        "{} of {} tensors differ between {} and {}: {differ:?}",
        differ.len(),
        ta.len(),
        a.display(),
        b.display()
    );
}

/// Polls until the run in `out` has a checkpoint (the end of its first epoch); the checkpoint's epoch.
fn wait_for_checkpoint(out: &Path, jobs: &mut [Job]) -> u64 {
    let latest = out.join("checkpoint.safetensors");
    let start = Instant::now();
    loop {
        if let Some(epoch) = std::fs::canonicalize(&latest)
            .ok()
            .and_then(|p| read_meta(&p).ok())
            .map(|(pos, _)| pos.epoch)
        {
            return epoch;
        }
        for j in jobs.iter_mut() {
            if let Some(s) = j.child.try_wait().unwrap() {
                panic!(
                    "{} ended ({s}) before the first checkpoint\n{}",
                    j.what,
                    j.log()
                );
            }
        }
        assert!(
            start.elapsed() < PATIENCE,
            "no checkpoint after {PATIENCE:?}\n{}",
            jobs.iter().map(Job::log).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The epoch in a train log's "resumed from FILE at epoch E batch 0" line.
fn resumed_at(log: &str) -> Option<u64> {
    let rest = log
        .split_once("resumed from ")?
        .1
        .split_once(" at epoch ")?
        .1;
    rest.lines().next()?.strip_suffix(" batch 0")?.parse().ok()
}

/// The run in `out` logged every epoch once and wrote its final weights.
fn assert_finished(out: &Path, epochs: u64) {
    let logged: Vec<u64> = metrics_lines(out).iter().map(|r| r.epoch).collect();
    assert_eq!(
        logged,
        (0..epochs).collect::<Vec<_>>(),
        "metrics.jsonl epochs"
    );
    assert!(out.join("final.safetensors").exists());
}

#[test]
fn two_nodes_train_to_the_weights_of_one_node_with_the_same_global_batch() {
    let _serial = serial();
    let net = namespaces(2, false);
    let dir = tempfile::tempdir().unwrap();
    for per_node in [1, 2] {
        let world = 2 * per_node;
        let d = dir.path().join(format!("world{world}"));
        std::fs::create_dir_all(&d).unwrap();
        let (one, two) = (d.join("one-node"), d.join("two-nodes"));
        launch_one_node(None, world, &d, &train_args(&one, 2, 6)).success();
        let jobs = launch_nodes(&net, per_node, TIMEOUT, &d, &train_args(&two, 2, 6));
        let logs: Vec<String> = jobs.into_iter().map(Job::success).collect();
        // Rank 0 (node 0) saw the whole world: the global batch of 2 per rank.
        assert!(
            logs[0].contains(&format!(
                "global batch {} (2 x 1 accum x {world} procs)",
                2 * world
            )),
            "{}",
            logs[0]
        );
        assert_same_weights(&one, &two);
    }
}

#[test]
fn a_crashed_node_ends_the_other_nodes_ranks_and_the_survivors_resume() {
    let _serial = serial();
    let net = namespaces(2, false);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (epochs, steps) = (3, 30);
    let run = d.join("run");
    let mut jobs = launch_nodes(&net, 2, TIMEOUT, d, &train_args(&run, epochs, steps));
    let seen = wait_for_checkpoint(&run, &mut jobs);
    assert!(seen >= 1, "checkpoint at epoch {seen}");
    // Node 1 (ranks 2 and 3, and its launcher) dies at once.
    net.crash(1);
    let node0 = jobs[0].wait(Duration::from_secs(TIMEOUT) + SLACK);
    jobs[1].wait(SLACK);
    let log = jobs[0].log();
    assert!(!node0.success(), "{log}");
    assert!(
        log.contains("ranks 2, 3 stopped responding"),
        "node 0 should name the lost ranks:\n{log}"
    );
    // The checkpoint seen before the crash is still there, loadable.
    let (pos, _) = read_meta(&run.join("checkpoint.safetensors")).unwrap();
    assert!(pos.epoch >= seen, "{pos:?}");

    // Node 0 alone, 4 ranks (the same global batch), continues from it.
    resume_alone_to_the_uninterrupted_weights(&net, 4, d, &run, (epochs, steps), seen);
}

#[test]
fn a_link_taken_down_mid_step_ends_every_rank_within_the_timeout() {
    let _serial = serial();
    let net = namespaces(2, false);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (epochs, steps) = (3, 40);
    let run = d.join("run");
    let mut jobs = launch_nodes(&net, 1, TIMEOUT, d, &train_args(&run, epochs, steps));
    let seen = wait_for_checkpoint(&run, &mut jobs);
    // Mid-epoch, between the ranks' all-reduces: node 1's cable is pulled.
    net.unplug(1);
    let cut = Instant::now();
    let guard = Duration::from_secs(TIMEOUT) + SLACK;
    for j in jobs.iter_mut() {
        let status = j.wait(guard.saturating_sub(cut.elapsed()));
        assert!(!status.success(), "{}: {status}\n{}", j.what, j.log());
    }
    let (log0, log1) = (jobs[0].log(), jobs[1].log());
    // Rank 0 no longer hears rank 1's heartbeats; rank 1 no longer reaches rank 0's store.
    assert!(
        log0.contains("error: rank 0/2:") && log0.contains("rank 1 stopped responding"),
        "{log0}"
    );
    assert!(
        log1.contains("error: rank 1/2:")
            && log1.contains(&format!(
                "rank 0 (the store server at {}) is unreachable",
                net.master(PORT)
            )),
        "{log1}"
    );

    // The checkpoint on disk continues, on node 0 alone (2 ranks: the same global batch).
    resume_alone_to_the_uninterrupted_weights(&net, 2, d, &run, (epochs, steps), seen);
}

/// `run`, cut short after its checkpoint of epoch `seen`, continues on node 0 alone with `nproc` ranks: from that
/// checkpoint, through every epoch once, to the weights of a run that was never interrupted.
fn resume_alone_to_the_uninterrupted_weights(
    net: &Net,
    nproc: usize,
    d: &Path,
    run: &Path,
    (epochs, steps): (u64, u64),
    seen: u64,
) {
    let log = launch_one_node(Some((net, 0)), nproc, d, &train_args(run, epochs, steps)).success();
    let at = resumed_at(&log).unwrap_or_else(|| panic!("not resumed:\n{log}"));
    assert!(
        (seen..epochs).contains(&at),
        "resumed at epoch {at}, checkpoint at {seen}:\n{log}"
    );
    assert_finished(run, epochs);
    let whole = d.join("uninterrupted");
    launch_one_node(None, nproc, d, &train_args(&whole, epochs, steps)).success();
    assert_same_weights(run, &whole);
}

#[test]
fn gloo_socket_ifname_chooses_the_interface_and_a_wrong_one_is_named() {
    let _serial = serial();
    // Each node's first interface is a decoy (up, addressed, on a network reaching no other node).
    let net = namespaces(2, true);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (veth1, decoy1) = (net.nodes[1].ifname.clone(), "decoy1");

    // The documented choice: GLOO_SOCKET_IFNAME names the link to the other nodes.
    let ok = d.join("ok");
    std::fs::create_dir_all(&ok).unwrap();
    for j in launch_nodes(&net, 1, TIMEOUT, &ok, &train_args(&ok.join("run"), 1, 3)) {
        j.success();
    }

    // Without GLOO_SOCKET_IFNAME each rank binds to its address on the way to the master (in these namespaces
    // the host name resolves to loopback, which the other node cannot reach, and the decoy comes first).
    let auto = d.join("auto");
    std::fs::create_dir_all(&auto).unwrap();
    let train = train_args(&auto.join("run"), 1, 3);
    for j in (0..2)
        .map(|i| launch_node(&net, i, 1, "", TIMEOUT, &auto, &train))
        .collect::<Vec<_>>()
    {
        j.success();
    }

    // Wrong choices on node 1: an interface that does not exist, then the decoy, taken down.
    let short = 8;
    for (case, ifname, says) in [
        (
            "missing",
            "nosuch0",
            "nosuch0 is not an interface of this host".to_string(),
        ),
        ("down", decoy1, format!("{decoy1} is down")),
    ] {
        if case == "down" {
            net.ip_in(1, &["link", "set", decoy1, "down"]);
        }
        let c = d.join(case);
        std::fs::create_dir_all(&c).unwrap();
        let train = train_args(&c.join("run"), 1, 3);
        let mut n0 = launch_node(&net, 0, 1, &net.nodes[0].ifname, short, &c, &train);
        let mut n1 = launch_node(&net, 1, 1, ifname, short, &c, &train);
        let guard = Duration::from_secs(short) + SLACK;
        let (s1, s0) = (n1.wait(guard), n0.wait(guard));
        let (log0, log1) = (n0.log(), n1.log());
        let named = format!("GLOO_SOCKET_IFNAME={ifname}: {says}");
        assert!(
            !s1.success() && log1.contains(&named),
            "{case}: {s1}\n{log1}"
        );
        // The interfaces are listed, the decoy first.
        let listed = log1.split_once("(interfaces: ").map_or("", |(_, l)| l);
        let (p_decoy, p_veth) = (
            listed.find(decoy1),
            listed.find(&format!("{veth1} 10.200.")),
        );
        assert!(
            p_decoy.is_some() && p_veth.is_some() && p_decoy < p_veth,
            "{case}: {log1}"
        );
        // Node 0 fails too, and says why: rank 1's report through the store.
        assert!(
            !s0.success() && log0.contains(&format!("rank 1 reports: {named}")),
            "{case}: {s0}\n{log0}"
        );
    }
}

/// `rn50 launch` with `env` (and nothing else from the scheduler's variables): status and stderr.
fn launch_under(env: &[(&str, &str)], flags: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(RN50);
    cmd.arg("launch")
        .args(flags)
        .args(["--", "train", "--dummy", "--out"]);
    cmd.arg(dir.path().join("run"));
    for (k, _) in std::env::vars() {
        if ["SLURM_", "OMPI_", "PMI_", "PALS_", "MPI_"]
            .iter()
            .any(|p| k.starts_with(p))
        {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn launch_flags_that_disagree_with_the_scheduler_are_a_usage_error() {
    // srun on 3 nodes, this one node 0: a launcher that thinks it is node 1 of 2.
    let slurm = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_NODEID", "0"),
        ("SLURM_STEP_NUM_NODES", "3"),
        ("SLURM_NNODES", "3"),
    ];
    let (code, err) = launch_under(
        &slurm,
        &["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--nnodes 2 but SLURM (srun) runs it on 3 nodes (SLURM_STEP_NUM_NODES=3)")
            && err.contains("--node-rank 1 but this is node 0 for SLURM (srun) (SLURM_NODEID=0)"),
        "{err}"
    );
    // A single-node launch under a 3-node srun step (every node would run a job of its own).
    let (code, err) = launch_under(&slurm, &["--nproc-per-node", "1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--nnodes 1 but SLURM (srun) runs it on 3 nodes"),
        "{err}"
    );
    // mpirun with one launcher per node (scripts/pbs-train.sh): the node rank is the MPI rank.
    let ompi = [
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
    ];
    let (code, err) = launch_under(
        &ompi,
        &["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "0"],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "--node-rank 0 but this is node 1 for Open MPI (mpirun) (OMPI_COMM_WORLD_RANK=1)"
        ) && !err.contains("--nnodes"),
        "{err}"
    );
}

#[test]
fn a_master_addr_of_another_host_fails_at_once_on_rank_0() {
    // Rank 0 of 2, told that the store is at an address this host does not have (TEST-NET-2, for documentation only).
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let out = train_args(&dir.path().join("run"), 1, 1)
        .command()
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "198.51.100.77")
        .env("MASTER_PORT", "29500")
        .env("RN50_DIST_TIMEOUT", "60")
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "rank 0/2: rendezvous failed: MASTER_ADDR 198.51.100.77 is not an address of this host (rank 0 serves \
             the rendezvous store): interfaces: lo 127.0.0.1"
        ),
        "{err}"
    );
    // At once, not after the 60 s timeout (a hang guard, generous for a loaded machine).
    assert!(
        start.elapsed() < Duration::from_secs(45),
        "{:?}",
        start.elapsed()
    );
}
