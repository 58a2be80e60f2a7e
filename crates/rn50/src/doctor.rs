//! `rn50 doctor`: what a user checks first on a new cluster node. Each line is OK, or says what to fix.
use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;

use crate::machine::{self, MachineInfo};
use crate::shim;

/// Check this node: libtorch, CPU features, GPUs, cuDNN/NCCL, Gloo, launcher environment.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Print the checks and machine facts as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to do about a WARN or FAIL.
    pub fix: Option<String>,
}

fn ok(name: &'static str, detail: impl Into<String>) -> Check {
    Check {
        name,
        status: Status::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        status: Status::Warn,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name,
        status: Status::Fail,
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

/// Which launcher started this process, from the variables each one sets.
pub fn detect_launcher(var: impl Fn(&str) -> Option<String>) -> (String, Option<String>) {
    let pick = |keys: [&str; 3]| -> Option<String> {
        let [r, w, l] = keys.map(&var);
        Some(format!(
            "rank {} of {}, local rank {}",
            r?,
            w?,
            l.unwrap_or_else(|| "?".into())
        ))
    };
    let found = [
        ("torchrun", ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
        ("SLURM", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"]),
        (
            "Open MPI",
            [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ],
        ),
        ("PBS", ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"]),
    ]
    .into_iter()
    .find_map(|(name, keys)| pick(keys).map(|d| (name.to_string(), Some(d))));
    match found {
        Some(f) => f,
        None if var("PBS_JOBID").is_some() => ("PBS".into(), None),
        None if var("SLURM_JOB_ID").is_some() => ("SLURM (allocation, not a task)".into(), None),
        None => ("none (single process)".into(), None),
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

    out.push(match &m.libtorch_path {
        Some(p) if m.torch_version == "2.13.0" => {
            ok("libtorch", format!("{} from {p}", m.torch_version))
        }
        Some(p) => fail(
            "libtorch",
            format!("{} from {p}", m.torch_version),
            "rebuild against PyTorch 2.13.0 (./dev build)",
        ),
        None => fail(
            "libtorch",
            "could not locate the loaded libtorch_cpu.so",
            "rebuild with ./dev build",
        ),
    });

    let c = &m.cpu;
    out.push(ok(
        "cpu",
        format!(
            "{}, {} CPUs usable ({} physical cores), {} GiB RAM",
            c.model,
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
    out.push(if c.has_bf16() {
        ok(
            "cpu bf16",
            format!(
                "native ({}): `--precision bf16` is the CPU default",
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
    match std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) if n > c.logical_cores => out.push(warn(
            "threads",
            format!(
                "OMP_NUM_THREADS={n} exceeds the {} usable CPUs",
                c.logical_cores
            ),
            "unset OMP_NUM_THREADS or lower it; rn50 sets its own thread count (--threads)",
        )),
        _ => out.push(ok(
            "threads",
            format!("libtorch intra-op threads: {}", m.torch_threads),
        )),
    }

    let built_cuda = build_setting(&config, "CUDA_VERSION");
    let seen = tch::Cuda::device_count();
    let gpus = &m.cuda_devices;
    out.push(match (built_cuda, gpus.is_empty()) {
        (Some(v), _) => ok("libtorch cuda", format!("built with CUDA {v}")),
        (None, true) => ok("libtorch cuda", "CPU-only libtorch (fine on a CPU node)"),
        (None, false) => fail(
            "libtorch cuda",
            "CPU-only libtorch on a node with GPUs",
            "install a CUDA build of torch==2.13.0 and rebuild (export LIBTORCH=…; see README)",
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
                    "install the nvidia-cudnn wheel matching torch 2.13",
                ),
            },
        );
        let nccl_built = build_setting(&config, "USE_NCCL") == Some("ON");
        out.push(match (nccl_built, nccl_version()) {
            (true, Some(v)) => ok("nccl", format!("{v} loadable")),
            (true, None) => warn(
                "nccl",
                "libtorch built with NCCL, libnccl.so.2 not loadable",
                "install the nvidia-nccl wheel matching torch 2.13",
            ),
            (false, _) => warn(
                "nccl",
                "libtorch built without NCCL",
                "use a CUDA torch wheel built with NCCL for multi-GPU",
            ),
        });
        out.push(if shim::cuda_compiled() {
            ok(
                "rn50 cuda feature",
                "on (NCCL process groups, GPU memory statistics)",
            )
        } else {
            warn(
                "rn50 cuda feature",
                "off",
                "build with `cargo build --release -p rn50 --features cuda` for multi-GPU training",
            )
        });
    }
    out.push(match build_setting(&config, "USE_GLOO") {
        Some("ON") => ok("gloo", "libtorch built with Gloo (CPU collectives)"),
        _ => warn(
            "gloo",
            "libtorch built without Gloo",
            "use the PyPI torch wheel, which has Gloo",
        ),
    });
    let (launcher, detail) = detect_launcher(|k| std::env::var(k).ok());
    out.push(ok(
        "launcher",
        match detail {
            Some(d) => format!("{launcher}: {d}"),
            None => launcher,
        },
    ));
    out
}

pub fn command(args: &DoctorArgs) -> Result<()> {
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
                Status::Ok => "OK  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            println!("{status} {:<18} {}", c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("     {:<18} fix: {f}", "");
            }
        }
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
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

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launchers_are_told_apart() {
        let (l, d) = detect_launcher(env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
        ]));
        assert_eq!(
            (l.as_str(), d.as_deref()),
            ("torchrun", Some("rank 1 of 4, local rank 1"))
        );
        let (l, _) = detect_launcher(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
        ]));
        assert_eq!(l, "SLURM");
        let (l, _) = detect_launcher(env(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]));
        assert_eq!(l, "Open MPI");
        let (l, d) = detect_launcher(env(&[]));
        assert!(l.starts_with("none") && d.is_none());
    }

    #[test]
    fn reads_build_settings() {
        let cfg =
            "  - Build settings: BLAS_INFO=mkl, CUDA_VERSION=13.0, USE_GLOO=ON, USE_NCCL=ON, \n";
        assert_eq!(build_setting(cfg, "CUDA_VERSION"), Some("13.0"));
        assert_eq!(build_setting(cfg, "USE_GLOO"), Some("ON"));
        assert_eq!(build_setting(cfg, "USE_MPI"), None);
    }

    #[test]
    fn this_node_passes_its_own_checks() {
        let m = machine::machine_info();
        let cs = checks(&m);
        let lib = cs.iter().find(|c| c.name == "libtorch").unwrap();
        assert_eq!(lib.status, Status::Ok, "{}", lib.detail);
        assert!(cs.iter().any(|c| c.name == "gloo"));
    }
}
