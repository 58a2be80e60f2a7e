//! Compiles the C++ shims against the headers of the libtorch that torch-sys found, as one static library that
//! reaches every binary linking this crate, from two translation units compiled side by side:
//! - cpp/rn50shim.cpp, rn50's shims as one unit (ATen's headers parsed once instead of five times): shim.cpp
//!   (autocast, foreach optimizer ops, device queries, what tch 0.26 lacks), fused_bn.cpp (the fused cuDNN batch
//!   norm + ReLU of a CUDA build), pool.cpp (the max-pool through cuDNN without an index tensor), profile.cpp (the
//!   Kineto profiler) and fused_block.cpp (the bottleneck with batch norm folded into the convolutions, ATen stages
//!   everywhere and cuDNN graphs in a CUDA build) and graph.cpp (a training step captured as one CUDA graph, and
//!   the side stream it is captured on);
//! - cpp/c10d.cpp, rn50-distributed's (TCPStore, ProcessGroupGloo/NCCL, Reducer). Gloo's own headers are not in
//!   the wheel; they come from Debian's libgloo-dev (/usr/include/gloo), which matches the wheel's
//!   ProcessGroupGloo.hpp.
//!
//! The C++ is a crate of its own so that `scripts/check-torch-compat.sh` can compile all of it against another
//! PyTorch's headers without checking the rest of the workspace.
use rn50_shim_build::Libtorch;

fn main() {
    let torch = Libtorch::from_torch_sys();
    let cuda = torch.cuda();

    let mut build = torch.shim("cpp/rn50shim.cpp", cuda);
    println!("cargo:rerun-if-changed=cpp/rn50_cudnn.h");
    for file in [
        "cpp/shim.cpp",
        "cpp/fused_bn.cpp",
        "cpp/pool.cpp",
        "cpp/profile.cpp",
        "cpp/fused_block.cpp",
        "cpp/graph.cpp",
        "cpp/c10d.cpp",
    ] {
        println!("cargo:rerun-if-changed={file}");
    }
    build.file("cpp/c10d.cpp");
    // Which process groups c10d's headers declare; only c10d.cpp includes them.
    build.define("USE_C10D_GLOO", None);
    if cuda {
        build.define("USE_C10D_NCCL", None);
    }
    build.compile("rn50shim");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
