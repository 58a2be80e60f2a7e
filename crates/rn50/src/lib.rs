//! rn50: ImageNet training and measurement on libtorch.
//!
//! The flow, one module per stage: [`model`] (ResNets with torchvision's names and init) →
//! [`step`] (one training step: precision, loss, SGD) → [`bench`] (throughput on synthetic data).
//! [`shim`] wraps the C++ calls tch lacks; [`machine`] and [`doctor`] describe the node.
pub mod alloc;
pub mod bench;
pub mod classify;
pub mod device;
pub mod doctor;
pub mod input;
pub mod machine;
pub mod model;
pub mod shim;
pub mod step;
pub mod train;
