//! Builds the c10d shim (TCPStore, ProcessGroupGloo/NCCL, Reducer) against the headers of the libtorch that
//! torch-sys found. Gloo's own headers are not in the wheel; they come from Debian's libgloo-dev
//! (/usr/include/gloo), which matches the wheel's ProcessGroupGloo.hpp.
use rn50_shim_build::Libtorch;

fn main() {
    let torch = Libtorch::from_torch_sys();
    let cuda = torch.cuda();
    let mut build = torch.shim("shim/c10d.cpp", cuda);
    build.define("USE_C10D_GLOO", None);
    if cuda {
        build.define("USE_C10D_NCCL", None);
    }
    build.compile("rn50c10d");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    torch.link();
}
