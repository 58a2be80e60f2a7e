//! What the build scripts of rn50's C++ shims share: the libtorch that torch-sys linked, whether to build the CUDA
//! code (whenever that libtorch has CUDA, see [`Libtorch::cuda`]), a `cc::Build` set up for its headers (C++17, the
//! wheel's CXX11 ABI, and for CUDA the CUDA/NCCL headers of the pip wheels' nvidia packages or `CUDA_HOME`), and the
//! link arguments that keep libtorch_cuda and find libtorch at run time. Shims include `rn50_shim_common.h`
//! (exception guard, tensor-handle gather) from here.
use std::env;
use std::path::{Path, PathBuf};

/// The libtorch that torch-sys found (a wheel's `torch/` or an unpacked libtorch).
pub struct Libtorch {
    /// `<root>/lib`, where libtorch*.so live.
    pub lib: PathBuf,
    /// The libtorch root, with `include/` and `lib/`.
    pub root: PathBuf,
}

impl Libtorch {
    /// Reads the lib dir torch-sys (links = "tch") exports to the build scripts of crates that depend on it.
    pub fn from_torch_sys() -> Libtorch {
        let Ok(lib) = env::var("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from) else {
            panic!("torch-sys did not export its libtorch lib dir (DEP_TCH_LIBTORCH_LIB)");
        };
        let root = lib
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| lib.clone());
        Libtorch { lib, root }
    }

    /// Whether the shims compile their CUDA code (NCCL process groups, the fused cuDNN batch norm, GPU memory
    /// statistics): whenever this libtorch has CUDA (`lib/libtorch_cuda.so`) and the CUDA headers are found, so one
    /// binary serves CPU and GPU nodes and a CPU-only libtorch still builds. The `cuda` feature insists (also for a
    /// headers-only libtorch, as `scripts/check-torch-compat.sh` checks): without the CUDA headers the build stops
    /// saying so.
    pub fn cuda(&self) -> bool {
        let has_lib = self.lib.join("libtorch_cuda.so").exists();
        let headers = self
            .cuda_includes()
            .iter()
            .any(|d| d.join("cuda_runtime.h").exists());
        let required = env::var_os("CARGO_FEATURE_CUDA").is_some();
        if required && !headers {
            panic!(
                "the `cuda` feature needs the CUDA headers: cuda_runtime.h is not in the nvidia wheels next to {} \
                 nor in CUDA_HOME (install the nvidia-cuda-runtime wheel or set CUDA_HOME)",
                self.root.display()
            );
        }
        if has_lib && !headers {
            println!(
                "cargo:warning=libtorch at {} has CUDA but no CUDA headers were found (nvidia wheels next to \
                 torch, or CUDA_HOME): building without NCCL and the fused GPU batch norm",
                self.root.display()
            );
        }
        headers && (has_lib || required)
    }

    /// A C++ build of `source` against libtorch's headers. With `cuda`, adds the CUDA and NCCL headers, defines
    /// `RN50_CUDA` and links libtorch_cuda/libc10_cuda.
    pub fn shim(&self, source: &str, cuda: bool) -> cc::Build {
        let common = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        println!("cargo:rerun-if-changed={source}");
        println!(
            "cargo:rerun-if-changed={}",
            common.join("rn50_shim_common.h").display()
        );
        let include = self.root.join("include");
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .pic(true)
            .warnings(false)
            .file(source)
            .include(&include)
            .include(include.join("torch/csrc/api/include"))
            .include(&common)
            .flag("-std=c++17")
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            // The headers warn about C++20 bit-field initializers; harmless.
            .flag("-Wno-c++20-extensions")
            .flag("-Wno-deprecated-declarations")
            .flag("-Wno-unused-parameter");
        if cuda {
            for dir in self.cuda_includes() {
                build.include(dir);
            }
            build.define("RN50_CUDA", None);
            println!("cargo:rustc-link-lib=dylib=torch_cuda");
            println!("cargo:rustc-link-lib=dylib=c10_cuda");
        }
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        build
    }

    /// CUDA, NCCL, cuDNN and cuDNN frontend headers: `CUDA_HOME/include` if set, then the pip wheels' nvidia packages next to torch in
    /// site-packages (cuda_runtime.h needs crt/host_config.h and cuda_fp16.h needs CCCL's nv/target: the
    /// `nvidia-cuda-crt` and `nvidia-cuda-cccl` wheels, both installing into nvidia/cu13/include). Links are
    /// resolved first: `.venv/libtorch` points into site-packages, where nvidia/ sits next to torch/.
    fn cuda_includes(&self) -> Vec<PathBuf> {
        let real = std::fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        let nvidia = real.parent().map(|p| p.join("nvidia")).unwrap_or_default();
        let mut dirs = vec![
            nvidia.join("cu13/include"),
            nvidia.join("cuda_runtime/include"),
            nvidia.join("nccl/include"),
            nvidia.join("cudnn/include"),
        ];
        // The cuDNN frontend (header-only, the `nvidia-cudnn-frontend` wheel) installs into site-packages/include;
        // without it the fused block's cuDNN graphs are left out of the build (fused_block.cpp checks).
        if let Some(site) = real.parent() {
            if site.join("include/cudnn_frontend.h").exists() {
                dirs.push(site.join("include"));
            }
        }
        if let Some(home) = env::var_os("CUDA_HOME") {
            dirs.insert(0, PathBuf::from(home).join("include"));
        }
        dirs.retain(|d| d.exists());
        dirs
    }

    /// Keeps libtorch.so (and through it libtorch_cuda.so) as a NEEDED entry, otherwise the linker drops it and
    /// CUDA is never seen (tch-rs #980, #907; rust-lld rejects --copy-dt-needed-entries, so it is named
    /// directly), and finds libtorch at run time through an rpath.
    pub fn link(&self) {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", self.lib.display());
    }
}
