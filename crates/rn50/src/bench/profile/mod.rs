//! `rn50 bench --profile`: where a step's time goes, by kind of work (convolution, batch norm, elementwise,
//! optimizer, casts, copies, communication, other), from libtorch's Kineto profiler (crates/shim/cpp/profile.cpp).
//!
//! What is summed:
//! - on CPU, the *self* time of every op (its duration less that of the ops nested in it on the same thread),
//!   so nothing is counted twice and the total is the time spent inside ops;
//! - on CUDA, the device time of every kernel, memcpy and memset. Kernels on different streams can overlap, so
//!   the total can exceed the wall time.
//!
//! Each op or kernel is classified by its name ([`classify`]); one whose name says nothing specific (a copy, an
//! elementwise kernel, an `aten::empty`) takes the kind of the op it runs in ([`resolve`]): on CPU the op it is
//! nested in, on CUDA the CPU op that launched it (Kineto's correlation id). So the `aten::copy_` of an
//! `aten::to` is a cast, a reduction kernel launched by batch norm's backward is batch norm, and the cast of a
//! weight autocast makes inside `aten::conv2d` stays a cast.
//!
//! The parts: [`ops`], the kinds of work by name; [`summary`], the time per step by kind ([`summarize`]);
//! [`render`](mod@render), the table printed. libtorch's profiler itself is [`Profiler`], with the other
//! bindings in [`crate::shim`].
pub mod ops;
pub mod render;
pub mod summary;

pub use rn50_report::schema::{KindTime, NameTime, ProfileReport, ProfileSource, WorkKind};

pub use crate::shim::{KinetoEvent, Profiler};
pub use ops::{classify, classify_op, display_name, resolve, short_kernel_name};
pub use render::render;
pub use summary::summarize;
