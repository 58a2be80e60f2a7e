//! Builds the C++ shims (autocast, foreach optimizer ops, device queries: what tch 0.26 lacks; the fused cuDNN
//! batch norm + ReLU of the `cuda` feature) against the headers of the libtorch that torch-sys found, and makes
//! the binary find that libtorch at run time.
use rn50_shim_build::{cuda_feature, Libtorch};

fn main() {
    let torch = Libtorch::from_torch_sys();
    println!("cargo:rerun-if-changed=shim/fused_bn.cpp");
    torch
        .shim("shim/shim.cpp", cuda_feature())
        .file("shim/fused_bn.cpp")
        .compile("rn50shim");
    torch.link();
    println!(
        "cargo:rustc-env=RN50_BUILD_LIBTORCH={}",
        torch.root.display()
    );
}
