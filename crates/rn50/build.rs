//! Builds the C++ shims (shim.cpp: autocast, foreach optimizer ops, device queries; profile.cpp: the Kineto
//! profiler; what tch 0.26 lacks) against the headers of the libtorch that torch-sys found, and makes the binary
//! find that libtorch at run time.
use rn50_shim_build::{cuda_feature, Libtorch};

fn main() {
    let torch = Libtorch::from_torch_sys();
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-changed=shim/profile.cpp");
    torch
        .shim("shim/shim.cpp", cuda_feature())
        .file("shim/profile.cpp")
        .compile("rn50shim");
    torch.link();
    println!(
        "cargo:rustc-env=RN50_BUILD_LIBTORCH={}",
        torch.root.display()
    );
}
