//! Builds the C++ shims against the headers of the libtorch that torch-sys found (shim.cpp: autocast, foreach
//! optimizer ops, device queries, what tch 0.26 lacks; fused_bn.cpp: the fused cuDNN batch norm + ReLU of a
//! CUDA build (whenever the libtorch has CUDA); pool.cpp: the max-pool through cuDNN without an index tensor;
//! fused_block.cpp: the bottleneck with batch norm folded into the convolutions, ATen stages
//! everywhere and cuDNN graphs in a `cuda` build; profile.cpp: the Kineto profiler), and makes the binary find that libtorch at run time.
use rn50_shim_build::Libtorch;

fn main() {
    let torch = Libtorch::from_torch_sys();
    let extra = [
        "shim/fused_bn.cpp",
        "shim/fused_block.cpp",
        "shim/pool.cpp",
        "shim/profile.cpp",
    ];
    let mut build = torch.shim("shim/shim.cpp", torch.cuda());
    println!("cargo:rerun-if-changed=shim/rn50_cudnn.h");
    for file in extra {
        println!("cargo:rerun-if-changed={file}");
        build.file(file);
    }
    build.compile("rn50shim");
    torch.link();
    println!(
        "cargo:rustc-env=RN50_BUILD_LIBTORCH={}",
        torch.root.display()
    );
}
