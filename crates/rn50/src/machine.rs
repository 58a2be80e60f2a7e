//! Facts about the machine a run happened on, recorded with every result: CPU, cores, bf16 support,
//! libtorch, CUDA devices.
use serde::Serialize;

use crate::shim;

#[derive(Clone, Debug, Serialize)]
pub struct CpuInfo {
    /// "Intel", "AMD", or the raw `vendor_id` of other makers.
    pub vendor: String,
    pub model: String,
    /// CPUs this process may run on (affinity / cgroup aware).
    pub logical_cores: usize,
    pub physical_cores: usize,
    pub amx_bf16: bool,
    pub avx512_bf16: bool,
    pub avx512f: bool,
    /// `ONEDNN_MAX_CPU_ISA` (or its old name `DNNL_MAX_CPU_ISA`) as set for this process: the ISA cap oneDNN
    /// reads at start-up.
    pub onednn_max_isa: Option<String>,
}

impl CpuInfo {
    /// Native bf16 matmul/conv support (what makes bf16 autocast worth it on CPU).
    pub fn has_bf16(&self) -> bool {
        self.amx_bf16 || self.avx512_bf16
    }

    /// Whether oneDNN runs bf16 convolutions with its AVX512-BF16 kernels rather than AMX: CPUs with
    /// AVX512-BF16 and no AMX (AMD Zen 4 and 5, Intel Cooper Lake), or an AMX CPU whose oneDNN is capped below
    /// AMX by `ONEDNN_MAX_CPU_ISA`. Caps below AVX512_CORE_BF16 leave oneDNN no bf16 kernels at all.
    pub fn bf16_without_amx(&self) -> bool {
        if !self.avx512_bf16 {
            return false;
        }
        let cap = self
            .onednn_max_isa
            .as_ref()
            .map(|s| s.trim().to_ascii_uppercase());
        match cap.as_deref() {
            Some("AVX512_CORE_BF16" | "AVX512_CORE_FP16" | "AVX10_1_512" | "AVX10_2_512") => true,
            Some(c) if c.starts_with("SSE") || c.starts_with("AVX2") || c == "AVX" => false,
            Some("AVX512_CORE" | "AVX512_CORE_VNNI") => false,
            // Unset, ALL/DEFAULT, or an AMX level: oneDNN uses what the CPU has.
            _ => !self.amx_bf16,
        }
    }
}

fn onednn_max_isa() -> Option<String> {
    ["ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
}

#[derive(Clone, Debug, Serialize)]
pub struct CudaDevice {
    pub index: usize,
    pub name: String,
    pub total_memory_bytes: u64,
    pub compute_capability: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    pub hostname: String,
    pub os: String,
    pub cpu: CpuInfo,
    pub memory_bytes: u64,
    pub torch_version: String,
    pub libtorch_path: Option<String>,
    pub torch_threads: i32,
    pub cuda_devices: Vec<CudaDevice>,
    pub cuda_driver_version: Option<String>,
    pub cudnn_version: Option<i64>,
    pub rn50_version: &'static str,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Parses `/proc/cpuinfo` text.
pub fn parse_cpuinfo(text: &str, logical_cores: usize) -> CpuInfo {
    let mut model = String::new();
    let mut vendor = String::new();
    let mut flags = String::new();
    let mut cores = std::collections::HashSet::new();
    let mut phys = String::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "model name" if model.is_empty() => model = v.to_string(),
            "vendor_id" if vendor.is_empty() => vendor = v.to_string(),
            "flags" if flags.is_empty() => flags = v.to_string(),
            "physical id" => phys = v.to_string(),
            "core id" => {
                cores.insert((phys.clone(), v.to_string()));
            }
            _ => {}
        }
    }
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let physical_cores = if cores.is_empty() {
        logical_cores
    } else {
        cores.len().min(logical_cores).max(1)
    };
    CpuInfo {
        vendor: match vendor.as_str() {
            "GenuineIntel" => "Intel".into(),
            "AuthenticAMD" => "AMD".into(),
            "" => "unknown".into(),
            _ => vendor,
        },
        model: if model.is_empty() {
            std::env::consts::ARCH.to_string()
        } else {
            model
        },
        logical_cores,
        physical_cores,
        amx_bf16: has("amx_bf16"),
        avx512_bf16: has("avx512_bf16"),
        avx512f: has("avx512f"),
        onednn_max_isa: None,
    }
}

pub fn cpu_info() -> CpuInfo {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    CpuInfo {
        onednn_max_isa: onednn_max_isa(),
        ..parse_cpuinfo(&read("/proc/cpuinfo"), logical)
    }
}

fn meminfo_total() -> u64 {
    read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Peak resident set size of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> u64 {
    read("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CUDA devices through the driver API (libcuda.so.1), which needs no CUDA headers or toolkit; empty when
/// there is no driver. tch only tells how many devices there are.
pub fn cuda_devices() -> (Vec<CudaDevice>, Option<String>) {
    cuda_driver::query().unwrap_or_default()
}

mod cuda_driver {
    use super::CudaDevice;
    use std::ffi::{c_char, c_int, CStr};

    type Fn0 = unsafe extern "C" fn(u32) -> c_int;
    type FnIntP = unsafe extern "C" fn(*mut c_int) -> c_int;
    type FnDev = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type FnName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    type FnMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
    type FnAttr = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

    const CC_MAJOR: c_int = 75;
    const CC_MINOR: c_int = 76;

    pub fn query() -> Option<(Vec<CudaDevice>, Option<String>)> {
        // SAFETY: the signatures are those of the CUDA driver API (cuda.h), stable since CUDA 3.2.
        unsafe {
            let lib = libloading::Library::new("libcuda.so.1").ok()?;
            let init: libloading::Symbol<Fn0> = lib.get(b"cuInit").ok()?;
            if init(0) != 0 {
                return None;
            }
            let version: libloading::Symbol<FnIntP> = lib.get(b"cuDriverGetVersion").ok()?;
            let count: libloading::Symbol<FnIntP> = lib.get(b"cuDeviceGetCount").ok()?;
            let get: libloading::Symbol<FnDev> = lib.get(b"cuDeviceGet").ok()?;
            let name: libloading::Symbol<FnName> = lib.get(b"cuDeviceGetName").ok()?;
            let mem: libloading::Symbol<FnMem> = lib.get(b"cuDeviceTotalMem_v2").ok()?;
            let attr: libloading::Symbol<FnAttr> = lib.get(b"cuDeviceGetAttribute").ok()?;
            let mut v = 0;
            let driver =
                (version(&mut v) == 0).then(|| format!("{}.{}", v / 1000, (v % 1000) / 10));
            let mut n = 0;
            if count(&mut n) != 0 {
                return Some((vec![], driver));
            }
            let mut devices = Vec::new();
            for i in 0..n {
                let mut dev = 0;
                if get(&mut dev, i) != 0 {
                    continue;
                }
                let mut buf = [0 as c_char; 256];
                name(buf.as_mut_ptr(), buf.len() as c_int, dev);
                let mut bytes = 0usize;
                mem(&mut bytes, dev);
                let (mut major, mut minor) = (0, 0);
                attr(&mut major, CC_MAJOR, dev);
                attr(&mut minor, CC_MINOR, dev);
                devices.push(CudaDevice {
                    index: i as usize,
                    name: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                    total_memory_bytes: bytes as u64,
                    compute_capability: format!("{major}.{minor}"),
                });
            }
            Some((devices, driver))
        }
    }
}

pub fn machine_info() -> MachineInfo {
    let (cuda_devices, cuda_driver_version) = cuda_devices();
    let cudnn = tch::Cuda::cudnn_is_available().then(tch::utils::version_cudnn);
    MachineInfo {
        hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
        os: format!(
            "{} {}",
            std::env::consts::OS,
            read("/proc/sys/kernel/osrelease").trim()
        ),
        cpu: cpu_info(),
        memory_bytes: meminfo_total(),
        torch_version: shim::torch_version(),
        libtorch_path: shim::libtorch_path(),
        torch_threads: tch::get_num_threads(),
        cuda_devices,
        cuda_driver_version,
        cudnn_version: cudnn,
        rn50_version: env!("CARGO_PKG_VERSION"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpuinfo_flags_and_cores() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\nphysical id\t: 0\ncore id\t\t: 0\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\nphysical id\t: 0\ncore id\t\t: 0\n";
        let c = parse_cpuinfo(text, 2);
        assert_eq!(c.model, "Intel(R) Xeon(R) Platinum 8480+");
        assert_eq!(c.vendor, "Intel");
        assert!(c.amx_bf16 && c.avx512_bf16 && c.avx512f && c.has_bf16());
        assert_eq!(c.physical_cores, 1, "two hyperthreads of one core");
        let none = parse_cpuinfo("flags\t: fpu sse2\n", 4);
        assert!(!none.has_bf16());
        assert_eq!(none.physical_cores, 4);
        assert_eq!(none.vendor, "unknown");
    }

    /// Which CPUs run oneDNN's bf16 convolutions on AVX512-BF16 kernels (the ones with the narrow-convolution
    /// heap corruption), with and without an ONEDNN_MAX_CPU_ISA cap.
    #[test]
    fn tells_avx512_bf16_from_amx() {
        let zen4 = parse_cpuinfo(
            "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\nflags\t: avx512f avx512_bf16\n",
            2,
        );
        let spr = parse_cpuinfo("flags\t: avx512f avx512_bf16 amx_bf16 amx_tile\n", 2);
        let zen3 = parse_cpuinfo("vendor_id\t: AuthenticAMD\nflags\t: avx2 fma\n", 2);
        let capped = |c: &CpuInfo, cap: &str| CpuInfo {
            onednn_max_isa: Some(cap.into()),
            ..c.clone()
        };
        assert_eq!(zen4.vendor, "AMD");
        assert!(zen4.bf16_without_amx());
        assert!(
            capped(&zen4, "avx512_core_amx").bf16_without_amx(),
            "a cap cannot add AMX"
        );
        assert!(
            !capped(&zen4, "AVX2").bf16_without_amx(),
            "no bf16 kernels below AVX512_CORE_BF16"
        );
        assert!(!spr.bf16_without_amx());
        assert!(!capped(&spr, "ALL").bf16_without_amx());
        assert!(capped(&spr, "AVX512_CORE_BF16").bf16_without_amx());
        assert!(capped(&spr, "avx512_core_fp16").bf16_without_amx());
        assert!(!capped(&spr, "AVX512_CORE_VNNI").bf16_without_amx());
        assert!(!zen3.bf16_without_amx());
    }

    #[test]
    fn this_machine_reports_real_numbers() {
        assert!(peak_rss_bytes() > 0);
        assert!(cpu_info().logical_cores >= 1);
        assert!(meminfo_total() > 0);
    }
}
