//! Safe wrappers over the C++ of `crates/shim/cpp/` (the rn50-shim crate compiles it): `shim.cpp`, the libtorch
//! calls tch 0.26 lacks (CPU autocast, foreach SGD, AMP unscale, TF32 and cuDNN autotuning, pinning without the
//! deprecated device argument, build facts, CUDA allocator statistics, torch.save files); the fused cuDNN batch
//! norm + ReLU of `fused_bn.cpp`; the bottleneck with batch norm folded into its convolutions of `fused_block.cpp`;
//! cuDNN's max-pool without an index tensor of `pool.cpp`; libtorch's Kineto profiler of `profile.cpp`
//! ([`Profiler`], its events read by [`crate::bench::profile`]); and the CUDA graph and side stream of `graph.cpp`
//! ([`CudaGraph`], [`SideStream`], used by [`crate::step::graph`]).
//!
//! The conventions of rn50's two FFI layers (this one and `rn50_distributed`'s `ffi.rs`), the same in both:
//! - the `extern "C"` declarations sit in a private `ffi` module with the only helpers that touch raw
//!   pointers: `last_error`, `check`, `handles`, and the copy-and-free of what the shim allocated;
//! - every entry point returns 0 on success and non-zero on failure, the C++ exception's message kept per
//!   thread until the next call (`*_last_error()`); `ffi::check(rc)` turns that into `Err(message)` and each
//!   wrapper maps it to its crate's error, here `anyhow` naming what was attempted;
//! - ownership: tensors go in as borrowed `at::Tensor*` handles, valid for the call; a tensor the shim returns
//!   through an out-pointer is a new heap tensor owned by the returned `Tensor`; strings and buffers it
//!   `malloc`s are copied and freed at once by the shim's `*_free`; a shim that yields many tensors hands each
//!   to a callback as a new heap tensor owned from then on by the Rust side; opaque C++ objects (in the distributed
//!   layer: store, process group, work, reducer) belong to one Rust value whose `Drop` frees them;
//! - every `unsafe` block says why it is sound.
use std::ffi::{c_char, c_int, CStr};

use anyhow::{anyhow, bail, Result};
use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use crate::step::optim::Rate;

mod ffi {
    // The library these functions are in (linked into every binary that links this crate).
    extern crate rn50_shim;

    use std::ffi::{c_char, c_int, c_void, CStr};

    use tch::Tensor;
    use torch_sys::C_tensor;

    extern "C" {
        pub fn rn50_last_error() -> *const c_char;
        pub fn rn50_free(p: *mut c_char);
        pub fn rn50_autocast_enter(
            device: c_int,
            enabled: c_int,
            dtype: c_int,
            prev_enabled: *mut c_int,
            prev_dtype: *mut c_int,
        ) -> c_int;
        pub fn rn50_autocast_exit(device: c_int, prev_enabled: c_int, prev_dtype: c_int) -> c_int;
        pub fn rn50_autocast_is_enabled(device: c_int) -> c_int;
        pub fn rn50_set_tf32(on: c_int) -> c_int;
        pub fn rn50_get_tf32() -> c_int;
        pub fn rn50_get_cudnn_benchmark() -> c_int;
        pub fn rn50_pin_memory(t: *const C_tensor, out: *mut *mut C_tensor) -> c_int;
        pub fn rn50_sgd_foreach(
            params: *const *const C_tensor,
            grads: *const *const C_tensor,
            bufs: *const *const C_tensor,
            n: usize,
            lr: f64,
            momentum: f64,
            weight_decay: f64,
            nesterov: c_int,
        ) -> c_int;
        pub fn rn50_sgd_fused(
            params: *const *const C_tensor,
            grads: *const *const C_tensor,
            bufs: *const *const C_tensor,
            n: usize,
            lr: f64,
            lr_tensor: *const C_tensor,
            momentum: f64,
            weight_decay: f64,
            nesterov: c_int,
            found_inf: *const C_tensor,
        ) -> c_int;
        pub fn rn50_adam_foreach(
            params: *const *const C_tensor,
            grads: *const *const C_tensor,
            exp_avgs: *const *const C_tensor,
            exp_avg_sqs: *const *const C_tensor,
            n: usize,
            lr: f64,
            beta1: f64,
            beta2: f64,
            eps: f64,
            weight_decay: f64,
            step: f64,
            rectified: c_int,
        ) -> c_int;
        pub fn rn50_lookahead_sync(
            slow: *const *const C_tensor,
            fast: *const *const C_tensor,
            n: usize,
            alpha: f64,
        ) -> c_int;
        pub fn rn50_amp_unscale(
            grads: *const *const C_tensor,
            n: usize,
            found_inf: *const C_tensor,
            inv_scale: *const C_tensor,
        ) -> c_int;
        pub fn rn50_torch_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int)
            -> c_int;
        pub fn rn50_show_config() -> *mut c_char;
        pub fn rn50_libtorch_path() -> *mut c_char;
        pub fn rn50_cuda_compiled() -> c_int;
        pub fn rn50_cuda_memory(device: c_int, peak: *mut i64, current: *mut i64) -> c_int;
        pub fn rn50_cuda_reset_peak(device: c_int) -> c_int;
        pub fn rn50_torch_pickle(
            path: *const c_char,
            out: *mut *mut c_char,
            len: *mut usize,
        ) -> c_int;
        pub fn rn50_torch_unpickle(
            path: *const c_char,
            pickle: *const c_char,
            len: usize,
            data: *mut c_void,
            f: extern "C" fn(*mut c_void, *const c_char, *mut C_tensor),
        ) -> c_int;
        pub fn rn50_fused_last_error() -> *const c_char;
        pub fn rn50_bn_relu(
            x: *const C_tensor,
            z: *const C_tensor,
            weight: *const C_tensor,
            bias: *const C_tensor,
            running_mean: *const C_tensor,
            running_var: *const C_tensor,
            momentum: f64,
            eps: f64,
            out: *mut *mut C_tensor,
        ) -> c_int;
        pub fn rn50_block_last_error() -> *const c_char;
        pub fn rn50_pool_last_error() -> *const c_char;
        pub fn rn50_max_pool(
            x: *const C_tensor,
            window: *const i64,
            out: *mut *mut C_tensor,
        ) -> c_int;
        #[allow(clippy::too_many_arguments)]
        pub fn rn50_bottleneck(
            x: *const C_tensor,
            shortcut: *const C_tensor,
            params: *const *const C_tensor,
            nparams: usize,
            buffers: *const *const C_tensor,
            nbuffers: usize,
            stride: i64,
            shortcut_stride: i64,
            momentum: f64,
            eps: f64,
            use_graph: c_int,
            out: *mut *mut C_tensor,
        ) -> c_int;
        pub fn rn50_block_graphs_compiled() -> c_int;
        pub fn rn50_block_set_plans(n: i64) -> c_int;
        pub fn rn50_block_report() -> *mut c_char;
        pub fn rn50_profile_last_error() -> *const c_char;
        pub fn rn50_profile_start(cuda: c_int) -> c_int;
        pub fn rn50_profile_stop(out: *mut *mut RawProfile) -> c_int;
        pub fn rn50_profile_len(p: *const RawProfile) -> usize;
        pub fn rn50_profile_event(p: *const RawProfile, i: usize, out: *mut RawEvent) -> c_int;
        pub fn rn50_profile_free(p: *mut RawProfile);
        pub fn rn50_graph_last_error() -> *const c_char;
        pub fn rn50_side_stream_enter(device: c_int, out: *mut *mut RawSideStream) -> c_int;
        pub fn rn50_side_stream_exit(s: *mut RawSideStream) -> c_int;
        pub fn rn50_graph_capture_begin(out: *mut *mut RawGraph) -> c_int;
        pub fn rn50_graph_capture_end(g: *mut RawGraph) -> c_int;
        pub fn rn50_graph_replay(g: *mut RawGraph) -> c_int;
        pub fn rn50_graph_free(g: *mut RawGraph);
    }

    /// crates/shim/cpp/graph.cpp's Rn50SideStream, only ever behind a pointer.
    #[repr(C)]
    pub struct RawSideStream {
        _private: [u8; 0],
    }

    /// crates/shim/cpp/graph.cpp's Rn50Graph, only ever behind a pointer.
    #[repr(C)]
    pub struct RawGraph {
        _private: [u8; 0],
    }

    /// crates/shim/cpp/profile.cpp's Rn50ProfileEvent.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct RawEvent {
        pub name: *const c_char,
        pub dtypes: *const c_char,
        pub start_ns: u64,
        pub duration_ns: u64,
        pub start_thread: u64,
        pub end_thread: u64,
        pub correlation: u64,
        pub linked_correlation: u64,
        pub device_type: i32,
        pub activity_type: u8,
        pub is_async: u8,
    }

    /// crates/shim/cpp/profile.cpp's Rn50Profile, only ever behind a pointer.
    #[repr(C)]
    pub struct RawProfile {
        _private: [u8; 0],
    }

    /// The shim's message for the last failed call on this thread.
    pub fn last_error() -> String {
        // SAFETY: the shim returns a thread-local NUL-terminated string that lives until the next call.
        unsafe { message(rn50_last_error()) }
    }

    /// The same for `crates/shim/cpp/fused_bn.cpp`, which keeps its own.
    pub fn fused_last_error() -> String {
        // SAFETY: as in `last_error`.
        unsafe { message(rn50_fused_last_error()) }
    }

    /// The same for `crates/shim/cpp/fused_block.cpp`.
    pub fn block_last_error() -> String {
        // SAFETY: as in `last_error`.
        unsafe { message(rn50_block_last_error()) }
    }

    /// The same for `crates/shim/cpp/pool.cpp`.
    pub fn pool_last_error() -> String {
        // SAFETY: as in `last_error`.
        unsafe { message(rn50_pool_last_error()) }
    }

    /// The same for `crates/shim/cpp/profile.cpp`.
    pub fn profile_last_error() -> String {
        // SAFETY: as in `last_error`.
        unsafe { message(rn50_profile_last_error()) }
    }

    /// The same for `crates/shim/cpp/graph.cpp`.
    pub fn graph_last_error() -> String {
        // SAFETY: as in `last_error`.
        unsafe { message(rn50_graph_last_error()) }
    }

    /// # Safety
    /// `p` is null or a NUL-terminated string that stays alive during the call.
    unsafe fn message(p: *const c_char) -> String {
        if p.is_null() {
            return "unknown error".into();
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }

    /// Turns a shim return code into a Result carrying the C++ message.
    pub fn check(rc: c_int) -> Result<(), String> {
        if rc == 0 {
            Ok(())
        } else {
            Err(last_error())
        }
    }

    /// A string the shim `malloc`ed (null: none), copied and freed.
    pub fn take_string(p: *mut c_char) -> Option<String> {
        if p.is_null() {
            return None;
        }
        // SAFETY: p is a malloc'd NUL-terminated string from the shim, freed once, right after copying.
        unsafe {
            let s = CStr::from_ptr(p).to_string_lossy().into_owned();
            rn50_free(p);
            Some(s)
        }
    }

    /// `len` bytes the shim `malloc`ed at `p`, copied and freed.
    pub fn take_bytes(p: *mut c_char, len: usize) -> Vec<u8> {
        if p.is_null() {
            return Vec::new();
        }
        // SAFETY: p is a malloc'd buffer of `len` bytes from the shim, freed once, right after copying.
        unsafe {
            let v = std::slice::from_raw_parts(p as *const u8, len).to_vec();
            rn50_free(p);
            v
        }
    }

    /// The callback of `rn50_torch_unpickle`: adds one named tensor to the `Vec<(String, Tensor)>` at `data`.
    pub extern "C" fn push_tensor(data: *mut c_void, name: *const c_char, t: *mut C_tensor) {
        // SAFETY: `data` is the `&mut Vec` that `torch_load` passed for this call; `name` a NUL-terminated
        // string alive during the call; `t` a new heap tensor that the shim hands over.
        unsafe {
            let v = &mut *(data as *mut Vec<(String, Tensor)>);
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            v.push((name, Tensor::from_ptr(t)));
        }
    }

    /// tch tensors as the `at::Tensor*` handles the shim takes. The tensors must outlive the call.
    pub fn handles(ts: &[Tensor]) -> Vec<*const C_tensor> {
        ts.iter().map(|t| t.as_ptr()).collect()
    }
}

/// [`ffi::check`], the message prefixed with what was attempted.
fn check(rc: c_int, what: &str) -> Result<()> {
    ffi::check(rc).map_err(|msg| anyhow!("{what}: {msg}"))
}

fn device_code(device: Device) -> c_int {
    match device {
        Device::Cuda(_) => 1,
        _ => 0,
    }
}

/// An autocast region: ops inside run in `dtype` where PyTorch's autocast policy says so (convolutions and
/// matmuls in bf16/fp16, reductions and losses in fp32). Dropping it restores the previous state.
#[must_use = "autocast ends when the guard is dropped"]
pub struct Autocast {
    device: c_int,
    prev_enabled: c_int,
    prev_dtype: c_int,
}

impl Autocast {
    pub fn enter(device: Device, dtype: Kind) -> Result<Self> {
        let code = match dtype {
            Kind::BFloat16 => 0,
            Kind::Half => 1,
            other => bail!("autocast supports bf16 and fp16, not {other:?}"),
        };
        Self::region(device, true, code)
    }

    /// A region inside an autocast one where ops run in their inputs' dtypes again
    /// (`torch.autocast(device, enabled=False)`).
    pub fn disabled(device: Device) -> Result<Self> {
        Self::region(device, false, 0)
    }

    fn region(device: Device, enabled: bool, code: c_int) -> Result<Self> {
        let device = device_code(device);
        let (mut prev_enabled, mut prev_dtype) = (0, 0);
        // SAFETY: plain out-parameters.
        check(
            unsafe {
                ffi::rn50_autocast_enter(
                    device,
                    enabled as c_int,
                    code,
                    &mut prev_enabled,
                    &mut prev_dtype,
                )
            },
            "autocast",
        )?;
        Ok(Self {
            device,
            prev_enabled,
            prev_dtype,
        })
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        // SAFETY: restores the state recorded by enter; cannot fail short of a libtorch bug.
        let rc =
            unsafe { ffi::rn50_autocast_exit(self.device, self.prev_enabled, self.prev_dtype) };
        debug_assert_eq!(rc, 0);
    }
}

pub fn autocast_enabled(device: Device) -> bool {
    // SAFETY: no pointers; reads a flag.
    unsafe { ffi::rn50_autocast_is_enabled(device_code(device)) != 0 }
}

/// Allow TF32 in cuBLAS matmuls and cuDNN convolutions (Ampere and newer GPUs; no effect on CPU).
pub fn set_tf32(on: bool) -> Result<()> {
    // SAFETY: no pointers; sets two flags.
    check(unsafe { ffi::rn50_set_tf32(on as c_int) }, "set TF32")
}

pub fn tf32() -> bool {
    // SAFETY: no pointers; reads a flag.
    unsafe { ffi::rn50_get_tf32() != 0 }
}

/// Whether cuDNN autotuning (`torch.backends.cudnn.benchmark`) is on.
pub fn cudnn_benchmark() -> bool {
    // SAFETY: no pointers; reads a flag.
    unsafe { ffi::rn50_get_cudnn_benchmark() != 0 }
}

/// A copy of CPU tensor `t` in page-locked memory from PyTorch's caching host allocator (`t.pin_memory()`), so
/// that a copy to the GPU can run asynchronously. tch's `pin_memory(device)` passes a device, which libtorch
/// deprecates with two warnings a call.
pub fn pin_memory(t: &Tensor) -> Result<Tensor> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `t` is a live tensor handle; on success the shim stores a new heap tensor in `out`, owned by the
    // returned Tensor.
    check(
        unsafe { ffi::rn50_pin_memory(t.as_ptr(), &mut out) },
        "pin_memory",
    )?;
    // SAFETY: see above.
    Ok(unsafe { Tensor::from_ptr(out) })
}

/// What a fused op ([`bn_relu`], [`bottleneck`], [`max_pool`]) did.
pub enum Fused {
    /// The fused op's output, recorded for autograd.
    Done(Tensor),
    /// The fused path does not apply to these tensors (why); run the separate ops instead.
    NotApplicable(String),
}

/// `relu(batch_norm(x) + z)` (or `relu(batch_norm(x))`) in training mode as one cuDNN fused batch norm, forward and
/// backward (`crates/shim/cpp/fused_bn.cpp`); `running_mean`/`running_var` are updated as `batch_norm` does. Applies to
/// NHWC-contiguous fp16/bf16 CUDA tensors of a build with the `cuda` feature.
#[allow(clippy::too_many_arguments)]
pub fn bn_relu(
    x: &Tensor,
    z: Option<&Tensor>,
    weight: &Tensor,
    bias: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    momentum: f64,
    eps: f64,
) -> Result<Fused> {
    let mut out: *mut C_tensor = std::ptr::null_mut();
    let z = z.map_or(std::ptr::null(), |z| z.as_ptr());
    // SAFETY: live tensor handles (z may be null); on success the shim stores a new heap tensor in `out`,
    // owned by the returned Tensor.
    let rc = unsafe {
        ffi::rn50_bn_relu(
            x.as_ptr(),
            z,
            weight.as_ptr(),
            bias.as_ptr(),
            running_mean.as_ptr(),
            running_var.as_ptr(),
            momentum,
            eps,
            &mut out,
        )
    };
    match rc {
        // SAFETY: on success `out` is a new heap tensor, owned from here on by the returned Tensor.
        0 => Ok(Fused::Done(unsafe { Tensor::from_ptr(out) })),
        2 => Ok(Fused::NotApplicable(ffi::fused_last_error())),
        _ => bail!("fused batch norm + ReLU: {}", ffi::fused_last_error()),
    }
}

/// `max_pool2d(x, kernel, stride, padding)` (floor mode, no dilation) through cuDNN's NHWC pooling, forward and
/// backward, with no index tensor (`crates/shim/cpp/pool.cpp`): the output is PyTorch's, and so is the input gradient
/// wherever a window's maximum is unique. Applies to NHWC-contiguous fp16/bf16/fp32 CUDA tensors of a build with
/// the `cuda` feature.
pub fn max_pool(
    x: &Tensor,
    kernel: [i64; 2],
    stride: [i64; 2],
    padding: [i64; 2],
) -> Result<Fused> {
    let window = [
        kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1],
    ];
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: a live tensor handle and six integers; on success the shim stores a new heap tensor in `out`.
    let rc = unsafe { ffi::rn50_max_pool(x.as_ptr(), window.as_ptr(), &mut out) };
    match rc {
        // SAFETY: on success `out` is a new heap tensor, owned from here on by the returned Tensor.
        0 => Ok(Fused::Done(unsafe { Tensor::from_ptr(out) })),
        2 => Ok(Fused::NotApplicable(ffi::pool_last_error())),
        _ => bail!("cuDNN max-pool: {}", ffi::pool_last_error()),
    }
}

/// Where a [`bottleneck`]'s output goes: the body alone, or the whole block with its shortcut.
pub enum BlockReach<'a> {
    /// `conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))`, conv3's raw output: the caller runs the tail.
    Body,
    /// `relu(bn3(body) + shortcut)`, the shortcut the given tensor as it is (the block's input).
    Identity(&'a Tensor),
    /// `relu(bn3(body) + bn(conv(input)))`, the projection's 1x1 conv at `stride` (its weight and batch norm
    /// among the parameters) of `input`: the block's input, or ResNet-D's average-pooled input.
    Projection { input: &'a Tensor, stride: i64 },
}

/// A ResNet bottleneck in training as one autograd function whose stages fold each batch norm into the
/// convolutions around it (`crates/shim/cpp/fused_block.cpp`): statistics from the convolution's output, the
/// normalisation and ReLU applied as the next convolution reads its input (or, for bn3 and the projection's batch
/// norm, in one pass that adds the branches), the activations recomputed in backward instead of stored.
/// `params`: the conv weights of conv1, conv2, conv3 (and the projection's), then γ and β of bn1, bn2 (and bn3,
/// and the projection's), as `reach` needs them; `buffers`: the running mean and variance of the same batch norms,
/// updated as `batch_norm` does. `use_graph`: on CUDA the stages as cuDNN graphs (declined,
/// [`Fused::NotApplicable`], where the build lacks them or cuDNN does not support one for this shape); with
/// `false`, and on the CPU, as ATen ops, the decomposition's reference.
#[allow(clippy::too_many_arguments)]
pub fn bottleneck(
    x: &Tensor,
    reach: BlockReach,
    params: &[Tensor],
    buffers: &[Tensor],
    stride: i64,
    momentum: f64,
    eps: f64,
    use_graph: bool,
) -> Result<Fused> {
    let (shortcut, shortcut_stride) = match reach {
        BlockReach::Body => (x, 1),
        BlockReach::Identity(r) => (r, 1),
        BlockReach::Projection { input, stride } => (input, stride),
    };
    let (p, b) = (ffi::handles(params), ffi::handles(buffers));
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: live tensor handles and arrays of them, valid for the call; on success the shim stores a new heap
    // tensor in `out`.
    let rc = unsafe {
        ffi::rn50_bottleneck(
            x.as_ptr(),
            shortcut.as_ptr(),
            p.as_ptr(),
            p.len(),
            b.as_ptr(),
            b.len(),
            stride,
            shortcut_stride,
            momentum,
            eps,
            c_int::from(use_graph),
            &mut out,
        )
    };
    match rc {
        // SAFETY: on success `out` is a new heap tensor, owned from here on by the returned Tensor.
        0 => Ok(Fused::Done(unsafe { Tensor::from_ptr(out) })),
        2 => Ok(Fused::NotApplicable(ffi::block_last_error())),
        _ => bail!("fused bottleneck: {}", ffi::block_last_error()),
    }
}

/// How many of cuDNN's execution plans each of the fused bottleneck's graphs built from now on times on its first
/// run, the fastest kept for the run (`--fused-block-plans`): cuDNN's heuristics in order, mode A, then past the
/// default of 4 mode B's too, then the fallback list.
pub fn set_block_plans(n: usize) -> Result<()> {
    let n = i64::try_from(n)?;
    // SAFETY: no pointers; sets a counter.
    check(
        unsafe { ffi::rn50_block_set_plans(n) },
        "the fused block's plans per graph",
    )
}

/// Whether this build has the fused bottleneck body's cuDNN graphs (a `cuda` build with the cuDNN frontend headers).
pub fn block_graphs_compiled() -> bool {
    // SAFETY: no arguments, returns a constant.
    unsafe { ffi::rn50_block_graphs_compiled() != 0 }
}

/// The bottleneck shapes the fused body declined since the last call (cuDNN does not support one of their graphs),
/// one message each, every one reported once per process.
pub fn block_report() -> Vec<String> {
    // SAFETY: no arguments; returns a malloc'd string or null.
    ffi::take_string(unsafe { ffi::rn50_block_report() })
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// One SGD update of `params` with torch.optim.SGD's multi-tensor kernels. `grads` are modified in place
/// (weight decay is added to them); `bufs` are the momentum buffers, zero-initialised.
pub fn sgd_foreach(
    params: &[Tensor],
    grads: &[Tensor],
    bufs: &[Tensor],
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    nesterov: bool,
) -> Result<()> {
    check_sgd_lists(params, grads, bufs, momentum)?;
    let (p, g, b) = (
        ffi::handles(params),
        ffi::handles(grads),
        ffi::handles(bufs),
    );
    // SAFETY: arrays of live tensor handles of the stated length.
    let rc = unsafe {
        ffi::rn50_sgd_foreach(
            p.as_ptr(),
            g.as_ptr(),
            b.as_ptr(),
            p.len(),
            lr,
            momentum,
            weight_decay,
            nesterov as c_int,
        )
    };
    check(rc, "SGD step")
}

/// The same update through torch.optim.SGD's fused CUDA kernel, skipped on the device where `found_inf`
/// (fp16's overflow flag) is 1: no host sync. CUDA tensors only. The rate is a number or, [`Rate::Device`], a
/// one-element fp32 tensor on the parameters' device that the kernel reads (`_fused_sgd_`'s `tensor_lr` overload).
#[allow(clippy::too_many_arguments)]
pub fn sgd_fused<'a>(
    params: &[Tensor],
    grads: &[Tensor],
    bufs: &[Tensor],
    lr: impl Into<Rate<'a>>,
    momentum: f64,
    weight_decay: f64,
    nesterov: bool,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    check_sgd_lists(params, grads, bufs, momentum)?;
    let (p, g, b) = (
        ffi::handles(params),
        ffi::handles(grads),
        ffi::handles(bufs),
    );
    let (lr, lr_tensor) = match lr.into() {
        Rate::Value(v) => (v, std::ptr::null()),
        Rate::Device(t) => (f64::NAN, t.as_ptr()),
    };
    let inf = found_inf.map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: arrays of live tensor handles of the stated length; lr_tensor and found_inf live handles or null.
    let rc = unsafe {
        ffi::rn50_sgd_fused(
            p.as_ptr(),
            g.as_ptr(),
            b.as_ptr(),
            p.len(),
            lr,
            lr_tensor,
            momentum,
            weight_decay,
            nesterov as c_int,
            inf,
        )
    };
    check(rc, "SGD step")
}

/// One gradient per parameter, and one momentum buffer each where there is momentum.
fn check_sgd_lists(
    params: &[Tensor],
    grads: &[Tensor],
    bufs: &[Tensor],
    momentum: f64,
) -> Result<()> {
    let n = params.len();
    if grads.len() != n || (momentum != 0.0 && bufs.len() != n) {
        bail!(
            "SGD: {n} params, {} grads, {} momentum buffers",
            grads.len(),
            bufs.len()
        );
    }
    Ok(())
}

/// One Adam-family update of `params`: torch.optim.AdamW's multi-tensor path, or with `rectified`
/// torch.optim.RAdam(decoupled_weight_decay=True)'s. `exp_avgs` and `exp_avg_sqs` are the moments, zero-initialised;
/// `step` counts updates from 1.
#[allow(clippy::too_many_arguments)]
pub fn adam_foreach(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    lr: f64,
    (beta1, beta2, eps): (f64, f64, f64),
    weight_decay: f64,
    step: u64,
    rectified: bool,
) -> Result<()> {
    let n = params.len();
    if grads.len() != n || exp_avgs.len() != n || exp_avg_sqs.len() != n || step == 0 {
        bail!(
            "Adam: {n} params, {} grads, {} and {} moments, step {step} (counted from 1)",
            grads.len(),
            exp_avgs.len(),
            exp_avg_sqs.len()
        );
    }
    let (p, g, m, v) = (
        ffi::handles(params),
        ffi::handles(grads),
        ffi::handles(exp_avgs),
        ffi::handles(exp_avg_sqs),
    );
    // SAFETY: arrays of live tensor handles of the stated length.
    let rc = unsafe {
        ffi::rn50_adam_foreach(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step as f64,
            rectified as c_int,
        )
    };
    check(rc, "Adam step")
}

/// Lookahead's synchronisation: `slow` += `alpha`·(`fast` - `slow`), then `fast` = `slow`.
pub fn lookahead_sync(slow: &[Tensor], fast: &[Tensor], alpha: f64) -> Result<()> {
    if slow.len() != fast.len() {
        bail!(
            "Lookahead: {} slow and {} fast tensors",
            slow.len(),
            fast.len()
        );
    }
    let (s, f) = (ffi::handles(slow), ffi::handles(fast));
    // SAFETY: arrays of live tensor handles of the stated length.
    let rc = unsafe { ffi::rn50_lookahead_sync(s.as_ptr(), f.as_ptr(), s.len(), alpha) };
    check(rc, "Lookahead")
}

/// GradScaler.unscale_: multiply grads by `inv_scale`; set `found_inf` to 1 if any is inf/NaN.
pub fn amp_unscale(grads: &[Tensor], found_inf: &Tensor, inv_scale: &Tensor) -> Result<()> {
    let g = ffi::handles(grads);
    // SAFETY: an array of live tensor handles of the stated length, and two live handles.
    let rc = unsafe {
        ffi::rn50_amp_unscale(g.as_ptr(), g.len(), found_inf.as_ptr(), inv_scale.as_ptr())
    };
    check(rc, "AMP unscale")
}

/// The libtorch version the shim was compiled against, e.g. "2.13.0".
pub fn torch_version() -> String {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: plain out-parameters; cannot fail.
    unsafe { ffi::rn50_torch_version(&mut a, &mut b, &mut c) };
    format!("{a}.{b}.{c}")
}

/// The PyTorch versions rn50 builds against (crates/shim-build/compat/rn50_torch_compat.h enforces it at build
/// time; `rn50 doctor` checks it at run time).
pub const SUPPORTED_TORCH: &str = "2.11, 2.12 or 2.13";

/// Whether `version` ("2.12.0", "2.11.0+cu130", …) is one of [`SUPPORTED_TORCH`].
pub fn torch_supported(version: &str) -> bool {
    let mut parts = version.split(['.', '+']).map(|p| p.parse::<u32>().ok());
    matches!(
        (parts.next(), parts.next()),
        (Some(Some(2)), Some(Some(11..=13)))
    )
}

/// libtorch's own build summary (`torch.__config__.show()`).
pub fn show_config() -> Option<String> {
    // SAFETY: no arguments; returns a malloc'd string or null.
    ffi::take_string(unsafe { ffi::rn50_show_config() })
}

/// The libtorch_cpu.so file this process actually loaded.
pub fn libtorch_path() -> Option<String> {
    // SAFETY: no arguments; returns a malloc'd string or null.
    ffi::take_string(unsafe { ffi::rn50_libtorch_path() })
}

/// Whether this binary was built with the `cuda` feature (NCCL process groups).
pub fn cuda_compiled() -> bool {
    // SAFETY: no arguments, returns a constant.
    unsafe { ffi::rn50_cuda_compiled() != 0 }
}

/// (peak, current) bytes allocated by the CUDA caching allocator on `device`; None where there is no CUDA.
pub fn cuda_memory(device: usize) -> Option<(i64, i64)> {
    let (mut peak, mut current) = (0, 0);
    // SAFETY: plain out-parameters.
    let rc = unsafe { ffi::rn50_cuda_memory(device as c_int, &mut peak, &mut current) };
    (rc == 0).then_some((peak, current))
}

pub fn cuda_reset_peak(device: usize) {
    // SAFETY: no pointers; an error (no CUDA) leaves nothing to reset.
    unsafe { ffi::rn50_cuda_reset_peak(device as c_int) };
}

/// `path` as the C string the shim takes.
fn c_path(path: &std::path::Path) -> Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::CString::new(path.as_os_str().as_bytes())?)
}

/// The pickle (`data.pkl`) of the torch.save file `path`, PyTorch 1.6's zip format and later; a TorchScript
/// archive is an error.
pub fn torch_pickle(path: &std::path::Path) -> Result<Vec<u8>> {
    let c_path = c_path(path)?;
    let (mut out, mut len) = (std::ptr::null_mut(), 0);
    // SAFETY: a NUL-terminated path alive during the call and two out-parameters; on success `out` is a malloc'd
    // buffer of `len` bytes that take_bytes frees.
    let rc = unsafe { ffi::rn50_torch_pickle(c_path.as_ptr(), &mut out, &mut len) };
    ffi::check(rc).map_err(|msg| anyhow!("{msg}"))?;
    Ok(ffi::take_bytes(out, len))
}

/// Every tensor that `pickle` (the torch.save file `path`'s, as [`torch_pickle`] read it, possibly rewritten)
/// holds, read from `path` to the CPU, named by where it sits: dict keys and list indices joined by `/`
/// (`conv1.weight` in a state_dict, `state_dict/module.conv1.weight` in a checkpoint dict), in the pickle's order.
pub fn torch_unpickle(path: &std::path::Path, pickle: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let c_path = c_path(path)?;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    // SAFETY: a NUL-terminated path and `pickle` alive during the call; `tensors` is the Vec that `push_tensor`
    // casts `data` back to, borrowed mutably for the call only.
    let rc = unsafe {
        ffi::rn50_torch_unpickle(
            c_path.as_ptr(),
            pickle.as_ptr() as *const std::ffi::c_char,
            pickle.len(),
            &mut tensors as *mut Vec<(String, Tensor)> as *mut std::ffi::c_void,
            ffi::push_tensor,
        )
    };
    ffi::check(rc).map_err(|msg| anyhow!("{msg}"))?;
    Ok(tensors)
}

/// libkineto::ActivityType values the profile summary uses (stable since Kineto's first release).
pub const ACTIVITY_CPU_OP: u8 = 0;
pub const ACTIVITY_GPU_MEMCPY: u8 = 3;
pub const ACTIVITY_GPU_MEMSET: u8 = 4;
pub const ACTIVITY_KERNEL: u8 = 5;
/// c10::DeviceType values.
pub const DEVICE_CPU: i32 = 0;
pub const DEVICE_CUDA: i32 = 1;

/// One event of a profile, as libtorch's KinetoEvent describes it.
#[derive(Clone, Debug, Default)]
pub struct KinetoEvent {
    pub name: String,
    pub start_ns: u64,
    pub duration_ns: u64,
    pub start_thread: u64,
    pub end_thread: u64,
    /// A CPU op's id: what the GPU work it launched links to.
    pub correlation: u64,
    /// For GPU work and CUDA runtime calls, the CPU op that launched them; 0 for CPU ops.
    pub linked_correlation: u64,
    /// c10::DeviceType (0 CPU, 1 CUDA).
    pub device_type: i32,
    /// libkineto::ActivityType (0 CPU op, 3 memcpy, 4 memset, 5 kernel, …).
    pub activity_type: u8,
    pub is_async: bool,
    /// A CPU op's input dtypes, one per input ("" for non-tensors).
    pub dtypes: Vec<String>,
}

impl KinetoEvent {
    /// A synchronous aten op or autograd node on a CPU thread (not a CUDA runtime call, not a memory record).
    pub fn is_cpu_op(&self) -> bool {
        self.device_type == DEVICE_CPU
            && self.activity_type == ACTIVITY_CPU_OP
            && self.linked_correlation == 0
            && !self.is_async
            && self.start_thread == self.end_thread
            && !matches!(self.name.as_str(), "[memory]" | "[OutOfMemory]")
    }

    /// Work timed on a CUDA device.
    pub fn is_gpu_work(&self) -> bool {
        self.device_type == DEVICE_CUDA
            && matches!(
                self.activity_type,
                ACTIVITY_KERNEL | ACTIVITY_GPU_MEMCPY | ACTIVITY_GPU_MEMSET
            )
    }

    /// When the event ended, in the clock of `start_ns`.
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// [`ffi::check`] for `crates/shim/cpp/profile.cpp`, which keeps its own message.
fn profile_check(rc: c_int, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    bail!("{what}: {}", ffi::profile_last_error())
}

/// libtorch's profiler recording on this thread (and the threads libtorch hands its state to, such as
/// autograd's). One at a time per process. Dropped without [`Profiler::stop`], it stops and discards.
#[must_use = "the profiler records until stopped"]
pub struct Profiler {
    active: bool,
}

impl Profiler {
    /// Starts recording CPU ops, and with a CUDA `device` the GPU work too.
    pub fn start(device: Device) -> Result<Profiler> {
        // SAFETY: no arguments beyond a flag.
        profile_check(
            unsafe { ffi::rn50_profile_start(device.is_cuda() as c_int) },
            "starting libtorch's profiler",
        )?;
        Ok(Profiler { active: true })
    }

    /// Stops recording and returns the events.
    pub fn stop(mut self) -> Result<Vec<KinetoEvent>> {
        self.active = false;
        let mut raw: *mut ffi::RawProfile = std::ptr::null_mut();
        // SAFETY: out-parameter; on success the shim stores a heap profile freed below.
        profile_check(
            unsafe { ffi::rn50_profile_stop(&mut raw) },
            "stopping libtorch's profiler",
        )?;
        struct Owned(*mut ffi::RawProfile);
        impl Drop for Owned {
            fn drop(&mut self) {
                // SAFETY: the pointer came from rn50_profile_stop and is freed once.
                unsafe { ffi::rn50_profile_free(self.0) }
            }
        }
        let owned = Owned(raw);
        // SAFETY: a live profile (or null, which has length 0).
        let n = unsafe { ffi::rn50_profile_len(owned.0) };
        let mut events = Vec::with_capacity(n);
        for i in 0..n {
            let mut e = std::mem::MaybeUninit::<ffi::RawEvent>::uninit();
            // SAFETY: i < n; on success the shim has written the whole struct.
            profile_check(
                unsafe { ffi::rn50_profile_event(owned.0, i, e.as_mut_ptr()) },
                "reading the profile",
            )?;
            let e = unsafe { e.assume_init() };
            let text = |p: *const c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    // SAFETY: a NUL-terminated string owned by the profile, alive until `owned` drops.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            };
            let dtypes = text(e.dtypes);
            let dtypes = if dtypes.is_empty() {
                Vec::new()
            } else {
                dtypes.split(',').map(str::to_string).collect()
            };
            let name = text(e.name);
            events.push(KinetoEvent {
                name,
                start_ns: e.start_ns,
                duration_ns: e.duration_ns,
                start_thread: e.start_thread,
                end_thread: e.end_thread,
                correlation: e.correlation,
                linked_correlation: e.linked_correlation,
                device_type: e.device_type,
                activity_type: e.activity_type,
                is_async: e.is_async != 0,
                dtypes,
            });
        }
        Ok(events)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.active {
            let mut raw: *mut ffi::RawProfile = std::ptr::null_mut();
            // SAFETY: as in stop; the events are discarded.
            unsafe {
                if ffi::rn50_profile_stop(&mut raw) == 0 {
                    ffi::rn50_profile_free(raw);
                }
            }
        }
    }
}

/// [`ffi::check`] for `crates/shim/cpp/graph.cpp`, the message prefixed with what was attempted.
fn graph_check(rc: c_int, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    bail!("{what}: {}", ffi::graph_last_error())
}

/// A side stream of a CUDA device, current on this thread while the guard lives (`with torch.cuda.stream(s)`): it
/// starts after the work already queued on the stream that was current, and when the guard is dropped that stream
/// waits for the side stream's work and is current again. CUDA graphs are warmed up and captured on one
/// (`crates/shim/cpp/graph.cpp`). Not `Send`: the current stream is the thread's.
#[must_use = "the side stream is current until the guard is dropped"]
pub struct SideStream(*mut ffi::RawSideStream);

impl SideStream {
    /// Enters a side stream of CUDA device `device` (fails in a build without CUDA).
    pub fn enter(device: usize) -> Result<SideStream> {
        let mut raw: *mut ffi::RawSideStream = std::ptr::null_mut();
        // SAFETY: an out-parameter; on success the shim stores a heap object freed by exit in Drop.
        graph_check(
            unsafe { ffi::rn50_side_stream_enter(device as c_int, &mut raw) },
            "entering a side CUDA stream",
        )?;
        Ok(SideStream(raw))
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: the object enter made, freed here once; recording and waiting on an event cannot fail short of
        // a broken CUDA context, which the next CUDA call reports.
        let rc = unsafe { ffi::rn50_side_stream_exit(self.0) };
        debug_assert_eq!(rc, 0, "{}", ffi::graph_last_error());
    }
}

/// A CUDA graph (`at::cuda::CUDAGraph`): the work queued on the current stream during [`CudaGraph::capture`],
/// launched again by [`CudaGraph::replay`] with the same kernels on the same memory. Tensors the captured work
/// allocated live in the graph's private memory pool as long as it; tensors it only used must be kept alive by the
/// caller as long as the graph is replayed.
pub struct CudaGraph(*mut ffi::RawGraph);

impl CudaGraph {
    /// Captures the CUDA work `work` queues on the current stream, which must be a [`SideStream`], after a device
    /// synchronize and with the allocator's cache emptied (as `torch.cuda.graph`). The work is recorded, not run.
    /// Fails in a build without CUDA; when `work` fails, the capture is ended and its error returned.
    pub fn capture<T>(work: impl FnOnce() -> Result<T>) -> Result<(CudaGraph, T)> {
        let mut raw: *mut ffi::RawGraph = std::ptr::null_mut();
        // SAFETY: an out-parameter; on success the shim stores a heap graph, owned by `graph` from here on.
        graph_check(
            unsafe { ffi::rn50_graph_capture_begin(&mut raw) },
            "beginning a CUDA graph capture",
        )?;
        let graph = CudaGraph(raw);
        let out = work();
        // SAFETY: the graph begun above, on this thread and stream.
        let end = graph_check(
            unsafe { ffi::rn50_graph_capture_end(graph.0) },
            "ending the CUDA graph capture",
        );
        // The work's own error first: a capture it broke fails to end too.
        let out = out.map_err(|e| e.context("capturing a CUDA graph"))?;
        end?;
        Ok((graph, out))
    }

    /// Launches the graph on the current stream (asynchronously, as its kernels would be).
    pub fn replay(&self) -> Result<()> {
        // SAFETY: a captured graph, owned by self.
        graph_check(
            unsafe { ffi::rn50_graph_replay(self.0) },
            "replaying the CUDA graph",
        )
    }
}

// SAFETY: after capture the graph is an instantiated executable graph with no tie to the thread that captured it
// (a replay launches on the calling thread's current stream); every use goes through &self or &mut self.
unsafe impl Send for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: the graph capture made, freed here once.
        unsafe { ffi::rn50_graph_free(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autocast_scope_casts_matmul_to_bf16_and_restores() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        assert!(!autocast_enabled(Device::Cpu));
        {
            let _outer = Autocast::enter(Device::Cpu, Kind::BFloat16).unwrap();
            {
                let _inner = Autocast::enter(Device::Cpu, Kind::BFloat16).unwrap();
                assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
            }
            assert!(
                autocast_enabled(Device::Cpu),
                "inner exit must not end the outer region"
            );
            assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
        }
        assert!(!autocast_enabled(Device::Cpu));
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
    }

    #[test]
    fn a_disabled_region_runs_in_the_inputs_dtypes_and_restores() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        let _outer = Autocast::enter(Device::Cpu, Kind::Half).unwrap();
        {
            let _off = Autocast::disabled(Device::Cpu).unwrap();
            assert!(!autocast_enabled(Device::Cpu));
            assert_eq!(a.matmul(&a).kind(), Kind::Float);
        }
        assert!(autocast_enabled(Device::Cpu));
        assert_eq!(
            a.matmul(&a).kind(),
            Kind::Half,
            "the outer region's dtype is kept"
        );
    }

    #[test]
    fn autocast_rejects_fp32() {
        assert!(Autocast::enter(Device::Cpu, Kind::Float).is_err());
    }

    #[test]
    fn sgd_foreach_matches_formula() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]);
        let g = Tensor::from_slice(&[0.5f32, 0.25]);
        let b = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        // step 1: g' = g + 0.1 p; buf = g'; p -= 0.5 buf
        sgd_foreach(
            &[p.shallow_clone()],
            &[g.shallow_clone()],
            &[b.shallow_clone()],
            0.5,
            0.9,
            0.1,
            false,
        )
        .unwrap();
        let want = [1.0 - 0.5 * (0.5 + 0.1), -2.0 - 0.5 * (0.25 - 0.2)];
        let got: Vec<f32> = Vec::try_from(&p).unwrap();
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn amp_unscale_detects_inf() {
        let g = Tensor::from_slice(&[2.0f32, f32::INFINITY]);
        let found = Tensor::zeros([1], (Kind::Float, Device::Cpu));
        let inv = Tensor::from_slice(&[0.5f32]);
        amp_unscale(&[g.shallow_clone()], &found, &inv).unwrap();
        assert_eq!(f64::try_from(&found).unwrap(), 1.0);
        assert_eq!(f64::try_from(g.get(0)).unwrap(), 1.0);
    }

    #[test]
    fn version_is_a_supported_libtorch() {
        assert!(torch_supported(&torch_version()), "{}", torch_version());
        assert!(libtorch_path().unwrap().contains("libtorch_cpu"));
        for (v, ok) in [
            ("2.11.0", true),
            ("2.12.1+cu130", true),
            ("2.13.0", true),
            ("2.10.0", false),
            ("2.14.0", false),
            ("3.11.0", false),
            ("", false),
        ] {
            assert_eq!(torch_supported(v), ok, "{v}");
        }
    }
}
