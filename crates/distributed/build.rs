//! Builds the c10d shim (TCPStore, ProcessGroupGloo/NCCL, Reducer) against the headers of the libtorch that
//! torch-sys found, the same way crates/rn50's build.rs builds its shim. Gloo's own headers are not in the wheel;
//! they come from Debian's libgloo-dev (/usr/include/gloo), which matches the wheel's ProcessGroupGloo.hpp.
use std::env;
use std::path::PathBuf;

fn main() {
    // torch-sys (links = "tch") exports the lib dir it linked against.
    let Ok(lib) = env::var("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from) else {
        panic!("torch-sys did not export its libtorch lib dir (DEP_TCH_LIBTORCH_LIB)");
    };
    let root = lib
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| lib.clone());
    let include = root.join("include");

    println!("cargo:rerun-if-changed=shim/c10d.cpp");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .file("shim/c10d.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .define("USE_C10D_GLOO", None)
        // The headers warn about C++20 bit-field initializers; harmless.
        .flag("-Wno-c++20-extensions")
        .flag("-Wno-deprecated-declarations")
        .flag("-Wno-unused-parameter");
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        // CUDA and NCCL headers: CUDA_HOME if set, else the pip wheels' nvidia packages next to torch in
        // site-packages (cuda_runtime.h needs crt/host_config.h and cuda_fp16.h needs CCCL's nv/target: the
        // `nvidia-cuda-crt` and `nvidia-cuda-cccl` wheels, both installing into nvidia/cu13/include).
        let real = std::fs::canonicalize(&root).unwrap_or_else(|_| root.clone());
        let nvidia = real.parent().map(|p| p.join("nvidia")).unwrap_or_default();
        let mut dirs = vec![
            nvidia.join("cu13/include"),
            nvidia.join("cuda_runtime/include"),
            nvidia.join("nccl/include"),
        ];
        if let Some(home) = env::var_os("CUDA_HOME") {
            dirs.insert(0, PathBuf::from(home).join("include"));
        }
        for d in dirs.iter().filter(|d| d.exists()) {
            build.include(d);
        }
        build
            .define("RN50_CUDA", None)
            .define("USE_C10D_NCCL", None);
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    build.compile("rn50c10d");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");

    // Keep libtorch.so (and through it libtorch_cuda.so) as a NEEDED entry, and find libtorch at run time.
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
}
