//! Compiles the C++ shims against the headers of the libtorch that torch-sys found, as two static libraries that
//! reach every binary linking this crate:
//! - `rn50shim`, rn50's (cpp/shim.cpp: autocast, foreach optimizer ops, device queries, what tch 0.26 lacks;
//!   fused_bn.cpp: the fused cuDNN batch norm + ReLU of a CUDA build; pool.cpp: the max-pool through cuDNN without
//!   an index tensor; fused_block.cpp: the bottleneck with batch norm folded into the convolutions, ATen stages
//!   everywhere and cuDNN graphs in a CUDA build; profile.cpp: the Kineto profiler);
//! - `rn50c10d`, rn50-distributed's (cpp/c10d.cpp: TCPStore, ProcessGroupGloo/NCCL, Reducer). Gloo's own headers
//!   are not in the wheel; they come from Debian's libgloo-dev (/usr/include/gloo), which matches the wheel's
//!   ProcessGroupGloo.hpp.
//!
//! The C++ is a crate of its own so that `scripts/check-torch-compat.sh` can compile all of it against another
//! PyTorch's headers without checking the rest of the workspace.
use rn50_shim_build::Libtorch;

fn main() {
    let torch = Libtorch::from_torch_sys();
    let cuda = torch.cuda();

    let mut rn50 = torch.shim("cpp/shim.cpp", cuda);
    println!("cargo:rerun-if-changed=cpp/rn50_cudnn.h");
    for file in [
        "cpp/fused_bn.cpp",
        "cpp/fused_block.cpp",
        "cpp/pool.cpp",
        "cpp/profile.cpp",
    ] {
        println!("cargo:rerun-if-changed={file}");
        rn50.file(file);
    }
    rn50.compile("rn50shim");

    let mut c10d = torch.shim("cpp/c10d.cpp", cuda);
    c10d.define("USE_C10D_GLOO", None);
    if cuda {
        c10d.define("USE_C10D_NCCL", None);
    }
    c10d.compile("rn50c10d");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
}
