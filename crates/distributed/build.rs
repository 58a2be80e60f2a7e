//! Makes the crate's binaries (rn50-dist-worker, the tests) keep and find at run time the libtorch that torch-sys
//! found; the c10d shim they call is compiled by the rn50-shim crate.
use rn50_shim_build::Libtorch;

fn main() {
    Libtorch::from_torch_sys().link();
}
