//! Builds the C++ shim (autocast, foreach optimizer ops, device queries: what tch 0.26 lacks) against the
//! headers of the libtorch that torch-sys found, and makes the binary find that libtorch at run time.
use std::env;
use std::path::PathBuf;

fn main() {
    // torch-sys (links = "tch") exports the lib dir it linked against.
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not export its libtorch lib dir"),
    );
    let root = lib
        .parent()
        .expect("libtorch lib dir has a parent")
        .to_path_buf();
    let include = root.join("include");

    println!("cargo:rerun-if-changed=shim/shim.cpp");
    println!("cargo:rerun-if-changed=shim/shim.h");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .file("shim/shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // The headers warn about C++20 bit-field initializers; harmless.
        .flag("-Wno-c++20-extensions")
        .flag("-Wno-deprecated-declarations")
        .flag("-Wno-unused-parameter");
    if env::var_os("CARGO_FEATURE_CUDA").is_some() {
        // CUDA and NCCL headers: from CUDA_HOME if set, else the pip wheels' nvidia packages next to torch.
        // (Resolve links first: `.venv/libtorch` points into site-packages, where nvidia/ sits next to torch/.)
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
        build.define("RN50_CUDA", None);
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    build.compile("rn50shim");

    // Keep libtorch.so (and through it libtorch_cuda.so) as a NEEDED entry: otherwise the linker drops it and
    // CUDA is never seen (tch-rs #980, #907). rust-lld rejects --copy-dt-needed-entries, so name it directly.
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env=RN50_BUILD_LIBTORCH={}", root.display());
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
}
