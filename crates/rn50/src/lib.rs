//! rn50: ImageNet training and measurement on libtorch.
//!
//! The flow, one module per stage: [`model`] (ResNets with torchvision's names and init) →
//! [`step`] (one training step: precision, loss, SGD) → [`train`] (`rn50 train` and `rn50 eval`) and
//! [`bench`] (throughput on synthetic or real data), both fed by [`input`] (batch sources and their hand-over
//! to the device); [`classify`] (`rn50 classify`) runs saved weights on images, [`export`] (`rn50 export`)
//! writes them as TorchScript. [`device`] chooses and sets up the compute device;
//! [`shim`] wraps the C++ calls tch lacks; [`machine`] and [`doctor`] describe the node; [`alloc`] keeps
//! glibc from returning freed memory each step.
pub mod alloc;
pub mod bench;
pub mod classify;
pub mod device;
pub mod doctor;
pub mod export;
pub mod input;
pub mod machine;
pub mod model;
pub mod shim;
pub mod step;
pub mod train;
