//! `rn50 doctor`: what a user checks first on a new cluster node. Each line is OK, or says what to fix.
use std::collections::HashMap;

use anyhow::{bail, Result};
use clap::Args;
use rn50_distributed::{LaunchSource, WorldInfo};
use serde::Serialize;

use crate::machine::{self, MachineInfo};
use crate::shim;
use crate::step::precision::{BF16_MIN_CONV_CHANNELS, NARROW_BF16_PROBLEM};

/// Check this node: libtorch, CPU features, GPUs, cuDNN/NCCL, Gloo, launcher environment.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Print the checks and machine facts as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: CheckStatus,
    pub detail: String,
    /// What to do about a WARN or FAIL.
    pub fix: Option<String>,
}

fn ok(name: &'static str, detail: impl Into<String>) -> Check {
    Check {
        name,
        status: CheckStatus::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        status: CheckStatus::Warn,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        status: CheckStatus::Fail,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// `KEY=value` from libtorch's build settings line.
fn build_setting<'a>(config: &'a str, key: &str) -> Option<&'a str> {
    config
        .split([',', '\n'])
        .map(str::trim)
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Whether a `USE_…` build setting is on: CMake writes ON, 1 or TRUE depending on how the option was set
/// (the CUDA wheels of 2.11–2.13 say `USE_GLOO=ON` but `USE_NCCL=1`).
fn setting_on(config: &str, key: &str) -> bool {
    build_setting(config, key)
        .is_some_and(|v| ["ON", "1", "TRUE", "YES"].contains(&v.to_ascii_uppercase().as_str()))
}

/// NCCL's runtime version through `ncclGetVersion`, if libnccl is loadable.
fn nccl_version() -> Option<String> {
    // SAFETY: ncclResult_t ncclGetVersion(int*), stable NCCL API.
    unsafe {
        let lib = libloading::Library::new("libnccl.so.2").ok()?;
        let f: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
            lib.get(b"ncclGetVersion").ok()?;
        let mut v = 0;
        (f(&mut v) == 0).then(|| format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
    }
}

/// The launcher check: what [`WorldInfo::from_vars`] (the one detector `bench` and `train` use) makes of the
/// environment `env`, so that doctor says what a run started here would do.
pub fn launcher_check(env: &HashMap<String, String>) -> Check {
    match WorldInfo::from_vars(env) {
        Ok(w) if w.source == LaunchSource::Single => {
            let has = |k: &str| env.get(k).is_some_and(|v| !v.trim().is_empty());
            let inside = if has("SLURM_JOB_ID") {
                " in a SLURM allocation, not a task"
            } else if has("PBS_JOBID") {
                " in a PBS job"
            } else {
                ""
            };
            ok("launcher", format!("{}{inside}", w.source.name()))
        }
        Ok(w) => ok(
            "launcher",
            format!(
                "{}: rank {} of {}, local rank {} of {}, rendezvous {}:{}",
                w.source.name(),
                w.rank,
                w.world_size,
                w.local_rank,
                w.local_world_size,
                w.master_addr,
                w.master_port
            ),
        ),
        Err(e) => fail("launcher", e.to_string(), launcher_fix(env)),
    }
}

/// What to do when the launcher's variables do not add up, for the launcher that set them (the one
/// [`WorldInfo::from_vars`] reads first). Under an MPI launcher every rank gets its place from the launcher, so
/// setting RANK/WORLD_SIZE there would give every rank the same one: only the rendezvous host is missing.
fn launcher_fix(env: &HashMap<String, String>) -> &'static str {
    let has = |k: &str| env.get(k).is_some_and(|v| !v.trim().is_empty());
    if has("RANK") && has("WORLD_SIZE") {
        "fix RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (or start the job with rn50 launch or torchrun, which \
         set them)"
    } else if has("OMPI_COMM_WORLD_RANK") {
        "under Open MPI every rank's place comes from mpirun (do not set RANK or WORLD_SIZE); across nodes pass \
         rank 0's host: mpirun -x MASTER_ADDR=<first host> (and -x MASTER_PORT=P to choose the port)"
    } else if has("SLURM_PROCID") && (has("SLURM_STEP_ID") || has("SLURM_STEPID")) {
        "start the tasks with srun inside the allocation (srun sets SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID and \
         the tasks per node); do not set them by hand"
    } else if has("PMI_RANK") || has("PALS_RANKID") {
        "under MPICH/Intel MPI/PALS every rank's place comes from mpiexec (do not set RANK or WORLD_SIZE); across \
         nodes pass rank 0's host: mpiexec -genv MASTER_ADDR <first host> (PALS: --env MASTER_ADDR=<first host>)"
    } else {
        "fix the launcher's variables"
    }
}

/// What the threads check looks at.
#[derive(Clone, Debug)]
pub struct Threads {
    /// The CPUs this process may use: its affinity mask and a container's CPU quota
    /// (`std::thread::available_parallelism`).
    pub usable: usize,
    /// The CPUs of the machine (online).
    pub online: usize,
    /// libtorch's intra-op threads as this process starts (`torch.get_num_threads()`): OMP_NUM_THREADS, else the
    /// CPUs of the affinity mask, a CPU quota not counted.
    pub torch: usize,
    /// OMP_NUM_THREADS as set.
    pub omp: Option<String>,
    /// Processes of this job on this node (the launcher's local world size; 1 alone).
    pub local_ranks: usize,
}

/// The CPUs of this machine that are online (`sysconf(_SC_NPROCESSORS_ONLN)`), whatever this process may use.
fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system setting; no memory is handed over.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Whether libtorch's intra-op threads, as a process started here gets them, oversubscribe the CPUs: more threads
/// than this process may use (a CPU quota libtorch does not look at, or OMP_NUM_THREADS set too high), or, with
/// several ranks on this node and no OMP_NUM_THREADS, the ranks' default threads together more than the
/// machine's CPUs. Oversubscribed threads wait on each other at every parallel op: a loaded node ran 3.4x faster
/// at 1 thread than at the default.
pub fn threads_check(t: &Threads) -> Check {
    let usable = t.usable.max(1);
    let omp = t.omp.as_deref().map(str::trim).filter(|v| !v.is_empty());
    let share = (usable / t.local_ranks.max(1)).max(1);
    let fix = format!(
        "give --threads {share} to train, bench, eval and classify, or export OMP_NUM_THREADS={share} (the CPUs \
         this process may use{})",
        match t.local_ranks {
            1 => String::new(),
            n => format!(", divided between the {n} ranks of this node"),
        }
    );
    match omp.map(|v| (v, v.parse::<usize>().ok())) {
        Some((v, Some(n))) if n > usable => warn(
            "threads",
            format!("OMP_NUM_THREADS={v} exceeds the {usable} CPUs this process may use"),
            fix,
        ),
        Some((v, None)) => warn(
            "threads",
            format!("OMP_NUM_THREADS={v:?} is not a thread count: libtorch ignores it"),
            fix,
        ),
        Some(_) => ok(
            "threads",
            format!(
                "libtorch intra-op threads: {} (OMP_NUM_THREADS), {usable} CPUs usable",
                t.torch
            ),
        ),
        None if t.torch > usable => warn(
            "threads",
            format!(
                "libtorch's default of {} intra-op threads oversubscribes the {usable} CPUs this process may use \
                 (a CPU quota or affinity libtorch does not count): its threads wait on each other, and a loaded \
                 node ran 3.4x faster at 1 thread",
                t.torch
            ),
            fix,
        ),
        None if t.local_ranks > 1 && t.torch * t.local_ranks > t.online => warn(
            "threads",
            format!(
                "OMP_NUM_THREADS is not set with {} ranks on this node: each libtorch defaults to {} threads, {} \
                 in all on {} CPUs (rn50 train and bench divide the CPUs between the ranks they see; other programs \
                 of the job do not)",
                t.local_ranks,
                t.torch,
                t.torch * t.local_ranks,
                t.online
            ),
            fix,
        ),
        None => ok(
            "threads",
            format!(
                "libtorch intra-op threads: {} (its default), {usable} CPUs usable",
                t.torch
            ),
        ),
    }
}

/// The libtorch rn50 was compiled against (its headers) and the one loaded now (its build settings), both in
/// the supported range and the same.
fn libtorch_check(m: &MachineInfo, config: &str) -> Check {
    let Some(path) = &m.libtorch_path else {
        return fail(
            "libtorch",
            "could not locate the loaded libtorch_cpu.so",
            "rebuild with ./dev build",
        );
    };
    let built = &m.torch_version;
    let loaded = build_setting(config, "TORCH_VERSION").unwrap_or(built);
    let detail = format!("{loaded} from {path}");
    // Major.minor: pre-releases in vendor containers say 2.11.0a0+git… where the headers say 2.11.0.
    let release = |v: &str| -> Vec<String> {
        v.split(['.', 'a', '+'])
            .take(2)
            .map(str::to_owned)
            .collect()
    };
    if !shim::torch_supported(built) {
        fail(
            "libtorch",
            format!("{detail}; rn50 was built against {built}"),
            format!(
                "rebuild against PyTorch {} (./dev build, or export LIBTORCH=…)",
                shim::SUPPORTED_TORCH
            ),
        )
    } else if release(loaded) != release(built) {
        fail(
            "libtorch",
            format!("{detail}, but rn50 was built against {built}"),
            "rebuild against the torch this node loads, or fix LD_LIBRARY_PATH",
        )
    } else {
        ok(
            "libtorch",
            format!("{detail} (supported: {})", shim::SUPPORTED_TORCH),
        )
    }
}

pub fn checks(m: &MachineInfo) -> Vec<Check> {
    let config = shim::show_config().unwrap_or_default();
    let mut out = vec![ok(
        "rn50",
        format!(
            "{} (this binary: {})",
            m.rn50_version,
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ),
    )];

    out.push(libtorch_check(m, &config));
    let c = &m.cpu;
    out.push(ok(
        "cpu",
        format!(
            "{}, {} CPUs usable ({} physical cores), {} GiB RAM",
            if c.model.contains(&c.vendor) {
                c.model.clone()
            } else {
                format!("{} {}", c.vendor, c.model)
            },
            c.logical_cores,
            c.physical_cores,
            m.memory_bytes >> 30
        ),
    ));
    let features: Vec<&str> = [
        ("AMX-BF16", c.amx_bf16),
        ("AVX512-BF16", c.avx512_bf16),
        ("AVX-512", c.avx512f),
    ]
    .into_iter()
    .filter_map(|(n, has)| has.then_some(n))
    .collect();
    let cap = c
        .onednn_max_isa
        .as_ref()
        .map(|v| format!("; ONEDNN_MAX_CPU_ISA={v}"))
        .unwrap_or_default();
    out.push(if c.bf16_without_amx() {
        warn(
            "cpu bf16",
            format!(
                "native ({}{cap}), without AMX: {NARROW_BF16_PROBLEM}",
                features.join(", ")
            ),
            format!(
                "nothing for standard widths; rn50 trains nets with convolutions narrower than \
                 {BF16_MIN_CONV_CHANNELS} channels (--width, half of it in a deep stem, squeeze-and-excitation's) in \
                 fp32 here and refuses --precision bf16 for them"
            ),
        )
    } else if c.has_bf16() {
        ok(
            "cpu bf16",
            format!(
                "native ({}{cap}): `--precision bf16` is the CPU default",
                features.join(", ")
            ),
        )
    } else {
        warn(
            "cpu bf16",
            "no AMX or AVX512-BF16",
            "train on this CPU with --precision fp32",
        )
    });
    out.push(threads_check(&Threads {
        usable: c.logical_cores,
        online: online_cpus(),
        torch: m.torch_threads.max(1) as usize,
        omp: std::env::var("OMP_NUM_THREADS").ok(),
        local_ranks: WorldInfo::from_env().map_or(1, |w| w.local_world_size.max(1)),
    }));

    let built_cuda = build_setting(&config, "CUDA_VERSION");
    let seen = tch::Cuda::device_count();
    let gpus = &m.cuda_devices;
    out.push(match (built_cuda, gpus.is_empty()) {
        (Some(v), _) => ok("libtorch cuda", format!("built with CUDA {v}")),
        (None, true) => ok("libtorch cuda", "CPU-only libtorch (fine on a CPU node)"),
        (None, false) => fail(
            "libtorch cuda",
            "CPU-only libtorch on a node with GPUs",
            "install a CUDA build of torch 2.11–2.13 and rebuild (export LIBTORCH=…; see README)",
        ),
    });
    out.push(if gpus.is_empty() {
        ok("gpus", format!("none (driver: {})", m.cuda_driver_version.as_deref().unwrap_or("not installed")))
    } else if seen as usize != gpus.len() {
        fail(
            "gpus",
            format!("driver {} shows {} GPU(s), libtorch sees {seen}", m.cuda_driver_version.as_deref().unwrap_or("?"), gpus.len()),
            "libtorch_cuda is not loaded or CUDA_VISIBLE_DEVICES hides devices: check `ldd rn50 | grep torch_cuda`",
        )
    } else {
        let list: Vec<String> = gpus
            .iter()
            .map(|g| format!("cuda:{} {} {:.0} GiB sm_{}", g.index, g.name, g.total_memory_bytes as f64 / (1u64 << 30) as f64, g.compute_capability.replace('.', "")))
            .collect();
        ok("gpus", format!("driver {}: {}", m.cuda_driver_version.as_deref().unwrap_or("?"), list.join("; ")))
    });
    if built_cuda.is_some() {
        out.push(
            match (m.cudnn_version, build_setting(&config, "CUDNN_VERSION")) {
                (Some(v), _) => ok("cudnn", format!("{v} loaded")),
                (None, Some(b)) if gpus.is_empty() => {
                    ok("cudnn", format!("built with {b} (not loaded: no GPU)"))
                }
                (None, b) => warn(
                    "cudnn",
                    format!("not available (built with {})", b.unwrap_or("?")),
                    "install the nvidia-cudnn wheel your torch wheel requires",
                ),
            },
        );
        // The NCCL libtorch_cuda loaded (libnccl.so.2 is one of its dependencies) is what NCCL process groups use.
        out.push(match (nccl_version(), setting_on(&config, "USE_NCCL")) {
            (Some(v), _) => ok("nccl", format!("{v} (loaded with libtorch)")),
            (None, true) => warn(
                "nccl",
                "libtorch built with NCCL, libnccl.so.2 not loadable",
                "install the nvidia-nccl wheel your torch wheel requires",
            ),
            (None, false) => warn(
                "nccl",
                "libtorch built without NCCL",
                "use a CUDA torch wheel built with NCCL for multi-GPU",
            ),
        });
        out.push(if shim::cuda_compiled() {
            ok(
                "rn50 cuda",
                "built in (NCCL process groups, fused cuDNN batch norm, cuDNN max-pool, the step as a CUDA graph, \
                 GPU memory statistics); a GPU's default: fused BN+ReLU on (--no-fused-bn), folded block off \
                 (--fused-block), cuDNN max-pool on (--no-cudnn-pool), the step as a CUDA graph off (--cuda-graph in \
                 bench and train; not yet measured on a GPU)",
            )
        } else {
            warn(
                "rn50 cuda",
                "not built in: the CUDA headers were missing when rn50 was built",
                "install the nvidia wheels of scripts/requirements.txt (or set CUDA_HOME) and rebuild",
            )
        });
        if shim::cuda_compiled() {
            out.push(if shim::block_graphs_compiled() {
                ok(
                    "rn50 fused block",
                    "the cuDNN graphs of --fused-block built in (the cuDNN frontend's headers were found)",
                )
            } else {
                warn(
                    "rn50 fused block",
                    "not built in: the cuDNN frontend's headers were missing when rn50 was built, so \
                     --fused-block runs the per-layer fused batch norm",
                    "install the nvidia-cudnn-frontend wheel of scripts/requirements.txt (its headers go to \
                     site-packages/include, beside torch/) and rebuild",
                )
            });
        }
    }
    out.push(match setting_on(&config, "USE_GLOO") {
        true => ok("gloo", "libtorch built with Gloo (CPU collectives)"),
        false => warn(
            "gloo",
            "libtorch built without Gloo",
            "use the PyPI torch wheel, which has Gloo",
        ),
    });
    out.push(launcher_check(&std::env::vars().collect()));
    out
}

pub fn run(args: &DoctorArgs) -> Result<()> {
    let m = machine::machine_info();
    let checks = checks(&m);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "checks": checks, "machine": m }))?
        );
    } else {
        for c in &checks {
            let status = match c.status {
                CheckStatus::Ok => "OK  ",
                CheckStatus::Warn => "WARN",
                CheckStatus::Fail => "FAIL",
            };
            println!("{status} {:<18} {}", c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("     {:<18} fix: {f}", "");
            }
        }
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| c.name)
        .collect();
    if !failed.is_empty() {
        bail!("{} check(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn launcher(pairs: &[(&str, &str)]) -> String {
        let c = launcher_check(&env(pairs));
        assert_eq!(c.status, CheckStatus::Ok, "{}", c.detail);
        c.detail
    }

    #[test]
    fn launchers_are_told_apart() {
        assert_eq!(
            launcher(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")]),
            "torchrun: rank 1 of 4, local rank 1 of 4, rendezvous 127.0.0.1:29500"
        );
        let slurm = launcher(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS_PER_NODE", "8"),
            ("SLURM_JOB_ID", "1234"),
        ]);
        assert!(slurm.starts_with("SLURM: rank 0 of 8"), "{slurm}");
        let mpi = launcher(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]);
        assert!(mpi.starts_with("Open MPI: rank 0 of 2"), "{mpi}");
        assert_eq!(launcher(&[]), "none (single process)");
        assert_eq!(
            launcher(&[
                ("SLURM_JOB_ID", "7"),
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "4")
            ]),
            "none (single process) in a SLURM allocation, not a task"
        );
    }

    /// `mpirun` inside a SLURM allocation: the batch step's SLURM variables are inherited by every rank, and
    /// Open MPI's say where each one is. The first doctor read them as SLURM (rank 0 of 8, everywhere) while
    /// training used Open MPI's; now both are [`WorldInfo`]'s.
    #[test]
    fn mpirun_inside_slurm_is_open_mpi_as_training_sees_it() {
        let vars = env(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODELIST", "node[01-02]"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ]);
        let w = WorldInfo::from_vars(&vars).unwrap();
        let c = launcher_check(&vars);
        assert_eq!(c.status, CheckStatus::Ok, "{}", c.detail);
        assert_eq!(
            c.detail,
            format!(
                "Open MPI: rank 5 of 8, local rank 1 of 4, rendezvous node01:{}",
                w.master_port
            )
        );
        assert_eq!((w.source, w.rank), (LaunchSource::OpenMpi, 5));
    }

    #[test]
    fn broken_launcher_variables_fail_the_check() {
        let c = launcher_check(&env(&[("RANK", "4"), ("WORLD_SIZE", "4")]));
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(c.detail.contains("outside a world of 4"), "{}", c.detail);
        assert!(c.fix.unwrap().contains("fix RANK, WORLD_SIZE"));
    }

    /// `mpirun` across nodes without MASTER_ADDR (issue 24): the fix is mpirun's `-x MASTER_ADDR`, not setting
    /// RANK and WORLD_SIZE, which would give every rank the same place.
    #[test]
    fn the_fix_under_mpirun_is_mpiruns() {
        let c = launcher_check(&env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]));
        assert_eq!(c.status, CheckStatus::Fail);
        assert!(c.detail.contains("several nodes"), "{}", c.detail);
        let fix = c.fix.unwrap();
        assert!(fix.contains("mpirun -x MASTER_ADDR=<first host>"), "{fix}");
        assert!(fix.contains("do not set RANK"), "{fix}");
        let c = launcher_check(&env(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "4"),
            ("PMI_LOCAL_SIZE", "2"),
        ]));
        assert!(c.fix.unwrap().contains("-genv MASTER_ADDR"));
    }

    /// The build settings line of the torch 2.11.0+cu130 wheel (`torch.__config__.show()`, compiler flags cut):
    /// NCCL is on as `USE_NCCL=1`, which the first doctor read as off.
    const WHEEL_2_11_CU130: &str = "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, \
        COMMIT_SHA=70d99e998b4955e0049d13a98d77ae1b14db1f45, CUDA_VERSION=13.0, CUDNN_VERSION=9.19.0, \
        LAPACK_INFO=mkl, PERF_WITH_AVX=1, PERF_WITH_AVX2=1, TORCH_VERSION=2.11.0, USE_CUDA=ON, USE_CUDNN=ON, \
        USE_CUSPARSELT=1, USE_GFLAGS=OFF, USE_GLOG=OFF, USE_GLOO=ON, USE_MKL=ON, USE_MKLDNN=ON, USE_MPI=OFF, \
        USE_NCCL=1, USE_NNPACK=ON, USE_OPENMP=ON, USE_ROCM=OFF, USE_ROCM_KERNEL_ASSERT=OFF, USE_XCCL=OFF, \
        USE_XPU=OFF, \n";

    #[test]
    fn reads_build_settings() {
        let cfg = WHEEL_2_11_CU130;
        assert_eq!(build_setting(cfg, "CUDA_VERSION"), Some("13.0"));
        assert_eq!(build_setting(cfg, "TORCH_VERSION"), Some("2.11.0"));
        assert_eq!(build_setting(cfg, "USE_MPI"), Some("OFF"));
        assert_eq!(build_setting(cfg, "USE_UCC"), None);
        assert!(setting_on(cfg, "USE_NCCL"), "USE_NCCL=1 is on");
        assert!(setting_on(cfg, "USE_GLOO") && setting_on(cfg, "USE_CUSPARSELT"));
        assert!(!setting_on(cfg, "USE_MPI") && !setting_on(cfg, "USE_ROCM"));
        assert!(!setting_on(cfg, "USE_UCC"));
    }

    /// 2.11–2.13 pass; outside the range, or a loaded libtorch other than the one built against, fails.
    #[test]
    fn libtorch_versions_in_and_out_of_range() {
        let mut m = machine::machine_info();
        let status = |m: &MachineInfo, loaded: &str| {
            let cfg =
                format!("  - Build settings: BLAS_INFO=mkl, TORCH_VERSION={loaded}, USE_GLOO=ON\n");
            let c = libtorch_check(m, &cfg);
            (c.status, c.detail)
        };
        for v in ["2.11.0", "2.12.0", "2.13.0"] {
            m.torch_version = v.into();
            assert_eq!(status(&m, v).0, CheckStatus::Ok, "{v}");
        }
        m.torch_version = "2.11.0".into();
        assert_eq!(
            status(&m, "2.11.0a0+git70d99e9").0,
            CheckStatus::Ok,
            "NGC-style pre-release"
        );
        m.torch_version = "2.13.0".into();
        let (s, d) = status(&m, "2.11.0");
        assert_eq!(s, CheckStatus::Fail);
        assert!(d.contains("built against 2.13.0"), "{d}");
        for v in ["2.10.0", "2.14.0", "3.0.0"] {
            m.torch_version = v.into();
            assert_eq!(status(&m, v).0, CheckStatus::Fail, "{v}");
        }
    }

    /// Issue 44: the default thread count oversubscribing this process's CPUs is a warning naming the fix; so is
    /// OMP_NUM_THREADS above them, and a node shared by ranks that all default to the machine's CPUs.
    #[test]
    fn oversubscribed_threads_are_warned_of() {
        let t = Threads {
            usable: 4,
            online: 64,
            torch: 4,
            omp: None,
            local_ranks: 1,
        };
        let check = |t: &Threads| {
            let c = threads_check(t);
            (c.status, c.detail, c.fix.unwrap_or_default())
        };
        let (status, detail, _) = check(&t);
        assert_eq!(status, CheckStatus::Ok, "{detail}");
        assert!(
            detail.contains("4 (its default), 4 CPUs usable"),
            "{detail}"
        );
        // A container's quota of 4 CPUs on a machine whose 64 libtorch takes.
        let (status, detail, fix) = check(&Threads {
            torch: 64,
            ..t.clone()
        });
        assert_eq!(status, CheckStatus::Warn);
        assert!(
            detail.contains("default of 64 intra-op threads oversubscribes the 4 CPUs"),
            "{detail}"
        );
        assert!(
            fix.contains("--threads 4") && fix.contains("OMP_NUM_THREADS=4"),
            "{fix}"
        );
        let omp = |v: &str| Threads {
            omp: Some(v.into()),
            ..t.clone()
        };
        let (status, detail, _) = check(&omp("8"));
        assert_eq!(status, CheckStatus::Warn);
        assert!(
            detail.contains("OMP_NUM_THREADS=8 exceeds the 4 CPUs"),
            "{detail}"
        );
        assert_eq!(check(&omp("2")).0, CheckStatus::Ok);
        assert_eq!(check(&omp("four")).0, CheckStatus::Warn);
        // 8 ranks on a 64-CPU node, each seeing all of it: 8 x 64 threads.
        let shared = Threads {
            usable: 64,
            torch: 64,
            local_ranks: 8,
            ..t.clone()
        };
        let (status, detail, fix) = check(&shared);
        assert_eq!(status, CheckStatus::Warn);
        assert!(
            detail.contains("8 ranks") && detail.contains("512 in all on 64 CPUs"),
            "{detail}"
        );
        assert!(
            fix.contains("--threads 8") && fix.contains("the 8 ranks"),
            "{fix}"
        );
        // The same ranks each bound to their own 8 CPUs (srun --cpus-per-task 8), or OMP_NUM_THREADS set: fine.
        let bound = Threads {
            usable: 8,
            torch: 8,
            ..shared.clone()
        };
        assert_eq!(check(&bound).0, CheckStatus::Ok);
        assert_eq!(
            check(&Threads {
                omp: Some("8".into()),
                ..shared
            })
            .0,
            CheckStatus::Ok
        );
    }

    #[test]
    fn this_node_passes_its_own_checks() {
        let m = machine::machine_info();
        let cs = checks(&m);
        let lib = cs.iter().find(|c| c.name == "libtorch").unwrap();
        assert_eq!(lib.status, CheckStatus::Ok, "{}", lib.detail);
        assert!(cs.iter().any(|c| c.name == "gloo"));
    }
}
