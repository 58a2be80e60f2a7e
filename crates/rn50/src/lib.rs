//! rn50: ImageNet training and measurement on libtorch.
//!
//! The flow, one module per stage: [`model`] (ResNets with torchvision's names and init) →
//! [`step`] (one training step: precision, loss, SGD) → [`train`] (`rn50 train` and `rn50 eval`) and
//! [`bench`] (throughput on synthetic or real data), both fed by [`input`] (batch sources and their hand-over
//! to the device); [`infer`] loads saved weights to run them, for `rn50 eval`, [`classify`] (`rn50 classify`:
//! saved weights on images) and [`export`] (`rn50 export`: them as TorchScript); [`pyjson`] writes JSON as Python
//! does. [`device`] chooses and sets up the compute device;
//! [`shim`] wraps the C++ calls tch lacks; [`machine`] and [`doctor`] describe the node; [`alloc`] keeps
//! glibc from returning freed memory each step. [`cli`] is the command line of every subcommand.
pub mod alloc;
pub mod bench;
pub mod classify;
pub mod cli;
pub mod device;
pub mod doctor;
pub mod export;
pub mod infer;
pub mod input;
pub mod machine;
pub mod model;
pub mod pyjson;
pub mod shim;
pub mod step;
pub mod train;
