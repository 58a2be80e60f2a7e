//! `rn50 bench --profile`: where a step's time goes, by kind of work (convolution, batch norm, elementwise,
//! optimizer, casts, copies, communication, other), from libtorch's Kineto profiler (shim/profile.cpp).
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
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, CStr};

use anyhow::{bail, Result};
use tch::Device;

pub use rn50_report::schema::{KindTime, NameTime, ProfileReport, ProfileSource, WorkKind};

/// Kinds a name gives to work that any op may do (a copy, a pointwise kernel): inside an op of a specific
/// kind, such work is that op's.
fn generic(kind: WorkKind) -> bool {
    matches!(kind, WorkKind::Elementwise | WorkKind::Copy)
}

/// Pointwise ops, by base name ([`base_op`]): `aten::add_`, `aten::threshold_backward`, `ReluBackward0`.
const ELEMENTWISE: &[&str] = &[
    "add",
    "sub",
    "rsub",
    "mul",
    "div",
    "relu",
    "threshold",
    "hardtanh",
    "clamp",
    "clamp_min",
    "clamp_max",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "pow",
    "reciprocal",
    "sigmoid",
    "silu",
    "gelu",
    "tanh",
    "leaky_relu",
    "where",
    "masked_fill",
    "fill",
    "zero",
    "zeros",
    "ones",
    "zeros_like",
    "ones_like",
    "full_like",
    "addcmul",
    "addcdiv",
    "lerp",
    "sign",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
];
/// Ops that only ever change dtypes. Most casts are an `aten::copy_` between dtypes ([`classify_op`]).
const CAST: &[&str] = &[
    "_autocast_to_reduced_precision",
    "_autocast_to_full_precision",
];
/// Copies and layout changes, and `aten::to`, which is a cast only when its `copy_` changes the dtype (inside
/// oneDNN's convolution backward it changes the memory format).
const COPY: &[&str] = &[
    "copy",
    "_copy_from",
    "_copy_from_and_resize",
    "contiguous",
    "clone",
    "to",
    "_to_copy",
    "tocopy",
    "type_as",
];

/// The base of an op's name for matching: `autograd::engine::evaluate_function: ReluBackward0` → `relu`,
/// `aten::threshold_backward` → `threshold`, `aten::add_` → `add`.
fn base_op(lower: &str) -> &str {
    let s = lower
        .strip_prefix("autograd::engine::evaluate_function: ")
        .unwrap_or(lower);
    let s = s.rsplit("::").next().unwrap_or(s);
    let s = s.trim_end_matches(|c: char| c.is_ascii_digit());
    let s = s.strip_suffix("backward").unwrap_or(s);
    s.trim_end_matches('_')
}

/// The kind of work an aten op, autograd node or GPU kernel does, from its name alone; None when the name does
/// not say (an allocation, a view, a reduction or GEMM kernel: [`resolve`] then looks at the op around it).
pub fn classify(name: &str) -> Option<WorkKind> {
    let lower = name.to_ascii_lowercase();
    let n = lower.as_str();
    let has = |pats: &[&str]| pats.iter().any(|p| n.contains(p));
    if has(&[
        "nccl",
        "gloo",
        "c10d::",
        "ddp.reducer",
        "allreduce",
        "all_reduce",
        "allgather",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "record_param_comms",
    ]) {
        return Some(WorkKind::Communication);
    }
    if has(&[
        "_foreach_",
        "multi_tensor_apply",
        "_amp_",
        "amp_update_scale",
        "non_finite_check",
        "optimizer",
    ]) {
        return Some(WorkKind::Optimizer);
    }
    // Before convolution: cuDNN's batch-norm kernels are `cudnn::bn_…`.
    if has(&[
        "batch_norm",
        "batchnorm",
        "bn_fw",
        "bn_bw",
        "::bn_",
        "welford",
    ]) {
        return Some(WorkKind::BatchNorm);
    }
    if (n.contains("conv") && !n.contains("convert"))
        || has(&[
            "fprop",
            "dgrad",
            "wgrad",
            "winograd",
            "implicit_gemm",
            "implicit_convolve",
            "cudnn::cnn::",
        ])
    {
        return Some(WorkKind::Convolution);
    }
    if has(&["memcpy", "memset"]) {
        return Some(WorkKind::Copy);
    }
    let base = base_op(n);
    if CAST.contains(&base) {
        return Some(WorkKind::Cast);
    }
    if COPY.contains(&base) || has(&["direct_copy_kernel", "copy_kernel"]) {
        return Some(WorkKind::Copy);
    }
    if ELEMENTWISE.contains(&base) || n.contains("elementwise_kernel") {
        return Some(WorkKind::Elementwise);
    }
    None
}

/// The kind of a CPU op from its name and its inputs' dtypes (as the profiler records them: "float",
/// "c10::Half", "unsigned char", "" for a non-tensor): an `aten::copy_` into another dtype is a cast — the
/// copy_ inside every `aten::to` that casts, and the uint8 batch copied into the float input buffer.
pub fn classify_op(name: &str, dtypes: &[String]) -> Option<WorkKind> {
    let is_copy = name == "aten::copy_" || name == "aten::copy";
    match dtypes {
        [dst, src, ..] if is_copy && !dst.is_empty() && !src.is_empty() && dst != src => {
            Some(WorkKind::Cast)
        }
        _ => classify(name),
    }
}

/// An op's name as the "other" rows show it: autograd's `evaluate_function: ` wrapper and namespaces of
/// autograd nodes dropped (`autograd::engine::evaluate_function: AddmmBackward0` → `AddmmBackward0`).
pub fn display_name(name: &str) -> String {
    let s = name
        .strip_prefix("autograd::engine::evaluate_function: ")
        .unwrap_or(name);
    s.strip_prefix("torch::autograd::").unwrap_or(s).to_string()
}

/// The kind of a piece of work whose own name says `own`, run inside (or launched by) an op of kind `context`:
/// a specific name wins; a generic one (copy, elementwise) or none takes a specific context.
pub fn resolve(own: Option<WorkKind>, context: Option<WorkKind>) -> Option<WorkKind> {
    match (own, context) {
        (Some(k), Some(c)) if generic(k) && !generic(c) => Some(c),
        (Some(k), _) => Some(k),
        (None, c) => c,
    }
}

/// A GPU kernel's name without return type, namespaces' `(anonymous namespace)`, template and call arguments:
/// `void at::native::(anonymous namespace)::max_pool_forward_nhwc<float>(…)` → `at::native::max_pool_forward_nhwc`.
pub fn short_kernel_name(name: &str) -> String {
    let s = name.strip_prefix("void ").unwrap_or(name);
    let s = s.replace("(anonymous namespace)::", "");
    let cut = s.find(['<', '(']).unwrap_or(s.len());
    let short = if cut == 0 {
        &s[..]
    } else {
        s[..cut].trim_end()
    };
    short.chars().take(80).collect()
}

/// libkineto::ActivityType values the summary uses (stable since Kineto's first release).
const ACTIVITY_CPU_OP: u8 = 0;
const ACTIVITY_GPU_MEMCPY: u8 = 3;
const ACTIVITY_GPU_MEMSET: u8 = 4;
const ACTIVITY_KERNEL: u8 = 5;
/// c10::DeviceType values.
const DEVICE_CPU: i32 = 0;
const DEVICE_CUDA: i32 = 1;

/// One event of a profile, as libtorch's KinetoEvent describes it.
#[derive(Clone, Debug, Default)]
pub struct Event {
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

impl Event {
    /// A synchronous aten op or autograd node on a CPU thread (not a CUDA runtime call, not a memory record).
    fn is_cpu_op(&self) -> bool {
        self.device_type == DEVICE_CPU
            && self.activity_type == ACTIVITY_CPU_OP
            && self.linked_correlation == 0
            && !self.is_async
            && self.start_thread == self.end_thread
            && !matches!(self.name.as_str(), "[memory]" | "[OutOfMemory]")
    }

    /// Work timed on a CUDA device.
    fn is_gpu_work(&self) -> bool {
        self.device_type == DEVICE_CUDA
            && matches!(
                self.activity_type,
                ACTIVITY_KERNEL | ACTIVITY_GPU_MEMCPY | ACTIVITY_GPU_MEMSET
            )
    }

    fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// What a CPU op's time is attributed to.
#[derive(Clone, Debug)]
struct OpShare {
    kind: Option<WorkKind>,
    /// For unclassified work, the outermost of the unclassified ops it runs in (`aten::linear` rather than the
    /// `aten::addmm` inside it): the name the "other" rows show.
    label: String,
    self_ns: u64,
}

/// Nests the CPU ops of each thread by time, and gives each its self time (duration less its children's), its
/// kind ([`resolve`]d against its parent's) and its label. Keyed by index into `events`.
fn attribute_cpu_ops(events: &[Event]) -> HashMap<usize, OpShare> {
    let mut order: Vec<usize> = (0..events.len())
        .filter(|&i| events[i].is_cpu_op())
        .collect();
    // Per thread, by start; of two ops starting together the longer is the parent. Parents come first.
    order.sort_by_key(|&i| {
        let e = &events[i];
        (e.start_thread, e.start_ns, std::cmp::Reverse(e.duration_ns))
    });
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut children_ns: HashMap<usize, u64> = HashMap::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut thread = None;
    for &i in &order {
        let e = &events[i];
        if thread != Some(e.start_thread) {
            stack.clear();
            thread = Some(e.start_thread);
        }
        while stack
            .last()
            .is_some_and(|&p| events[p].end_ns() <= e.start_ns)
        {
            stack.pop();
        }
        if let Some(&p) = stack.last() {
            parent.insert(i, p);
            // An op that outlives its parent (not expected) is cut at the parent's end.
            let inside = e.end_ns().min(events[p].end_ns()) - e.start_ns;
            *children_ns.entry(p).or_default() += inside;
        }
        stack.push(i);
    }
    // The `aten::to` and `aten::_to_copy` around a copy_ between dtypes are that cast.
    let own: HashMap<usize, Option<WorkKind>> = order
        .iter()
        .map(|&i| (i, classify_op(&events[i].name, &events[i].dtypes)))
        .collect();
    let mut cast_wrappers: HashSet<usize> = HashSet::new();
    for &i in &order {
        if own[&i] == Some(WorkKind::Cast) {
            let mut at = i;
            while let Some(&p) = parent.get(&at) {
                let name = events[p].name.to_ascii_lowercase();
                if !matches!(base_op(&name), "to" | "_to_copy" | "tocopy" | "type_as") {
                    break;
                }
                cast_wrappers.insert(p);
                at = p;
            }
        }
    }
    let mut out: HashMap<usize, OpShare> = HashMap::with_capacity(order.len());
    for &i in &order {
        let e = &events[i];
        let p = parent.get(&i).copied();
        let own = if cast_wrappers.contains(&i) {
            Some(WorkKind::Cast)
        } else {
            own[&i]
        };
        let kind = resolve(own, p.and_then(|p| out[&p].kind));
        let label = match (kind, p) {
            (None, Some(p)) if out[&p].kind.is_none() => out[&p].label.clone(),
            _ => display_name(&e.name),
        };
        let children = children_ns.get(&i).copied().unwrap_or(0);
        out.insert(
            i,
            OpShare {
                kind,
                label,
                self_ns: e.duration_ns.saturating_sub(children),
            },
        );
    }
    out
}

/// How many "other" names the report keeps.
const OTHER_TOP: usize = 5;

/// Sums `events` (from `steps` profiled steps that took `wall_ms` in all) by kind of work: GPU work when `cuda`
/// and the profile has some, CPU op self time otherwise.
pub fn summarize(events: &[Event], cuda: bool, steps: usize, wall_ms: f64) -> ProfileReport {
    let ops = attribute_cpu_ops(events);
    let gpu: Vec<&Event> = events.iter().filter(|e| e.is_gpu_work()).collect();
    let mut by_kind: HashMap<WorkKind, u64> = HashMap::new();
    let mut other: HashMap<String, u64> = HashMap::new();
    let mut add = |kind: Option<WorkKind>, label: &str, ns: u64| {
        *by_kind.entry(kind.unwrap_or(WorkKind::Other)).or_default() += ns;
        if kind.is_none() {
            *other.entry(label.to_string()).or_default() += ns;
        }
    };
    let mut note = None;
    let source = if cuda && !gpu.is_empty() {
        let by_corr: HashMap<u64, &OpShare> = ops
            .iter()
            .filter(|(&i, _)| events[i].correlation != 0)
            .map(|(&i, s)| (events[i].correlation, s))
            .collect();
        for e in gpu {
            let op = by_corr.get(&e.linked_correlation);
            let kind = resolve(classify(&e.name), op.and_then(|s| s.kind));
            let label = op.map_or_else(|| short_kernel_name(&e.name), |s| s.label.clone());
            add(kind, &label, e.duration_ns);
        }
        ProfileSource::CudaKernels
    } else {
        if cuda {
            note = Some(
                "no CUDA activity was recorded (CUPTI unavailable?): these are CPU op times".into(),
            );
        }
        for s in ops.values() {
            add(s.kind, &s.label, s.self_ns);
        }
        ProfileSource::CpuOps
    };
    let steps_f = steps.max(1) as f64;
    let total_ns: u64 = by_kind.values().sum();
    let ms = |ns: u64| ns as f64 / 1e6 / steps_f;
    let share = |ns: u64| {
        if total_ns == 0 {
            0.0
        } else {
            ns as f64 / total_ns as f64
        }
    };
    let mut kinds: Vec<KindTime> = WorkKind::ALL
        .iter()
        .map(|&k| {
            let ns = by_kind.get(&k).copied().unwrap_or(0);
            KindTime {
                kind: k,
                ms_per_step: ms(ns),
                share: share(ns),
            }
        })
        .collect();
    // Largest first, `other` last whatever its size.
    kinds.sort_by(|a, b| {
        (a.kind == WorkKind::Other)
            .cmp(&(b.kind == WorkKind::Other))
            .then(b.ms_per_step.total_cmp(&a.ms_per_step))
    });
    let mut other: Vec<(String, u64)> = other.into_iter().collect();
    other.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other_top = other
        .into_iter()
        .take(OTHER_TOP)
        .map(|(name, ns)| NameTime {
            name,
            ms_per_step: ms(ns),
            share: share(ns),
        })
        .collect();
    ProfileReport {
        source,
        steps,
        wall_ms_per_step: wall_ms / steps_f,
        total_ms_per_step: ms(total_ns),
        kinds,
        other_top,
        events: events.len(),
        note,
    }
}

/// The table `rn50 bench --profile` prints.
pub fn render(p: &ProfileReport) -> String {
    let what = match p.source {
        ProfileSource::CpuOps => "CPU op self time",
        ProfileSource::CudaKernels => "GPU kernel time",
    };
    let mut s = format!(
        "profile: {} extra step{} after the measured ones, {what} (profiling slows steps; img/s above is unprofiled)\n",
        p.steps,
        if p.steps == 1 { "" } else { "s" }
    );
    if let Some(n) = &p.note {
        s += &format!("  note: {n}\n");
    }
    s += &format!("  {:<44}{:>10}{:>8}\n", "kind", "ms/step", "share");
    for k in &p.kinds {
        if k.ms_per_step == 0.0 && k.kind != WorkKind::Other {
            continue;
        }
        s += &format!(
            "  {:<44}{:>10.2}{:>7.1}%\n",
            k.kind.name(),
            k.ms_per_step,
            100.0 * k.share
        );
        if k.kind == WorkKind::Other {
            for o in &p.other_top {
                let name: String = if o.name.chars().count() > 40 {
                    o.name.chars().take(39).chain(['…']).collect()
                } else {
                    o.name.clone()
                };
                s += &format!(
                    "    {:<42}{:>10.2}{:>7.1}%\n",
                    name,
                    o.ms_per_step,
                    100.0 * o.share
                );
            }
        }
    }
    let covered = match p.source {
        ProfileSource::CpuOps => "in ops",
        ProfileSource::CudaKernels => "GPU busy, streams may overlap",
    };
    s += &format!(
        "  {:<44}{:>10.2}{:>7.1}%   (wall {:.2} ms/step; {:.0}% {covered})\n",
        "total",
        p.total_ms_per_step,
        100.0,
        p.wall_ms_per_step,
        if p.wall_ms_per_step > 0.0 {
            100.0 * p.total_ms_per_step / p.wall_ms_per_step
        } else {
            0.0
        }
    );
    s
}

mod ffi {
    use super::*;

    /// shim/profile.cpp's Rn50ProfileEvent.
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

    /// shim/profile.cpp's Rn50Profile, only ever behind a pointer.
    #[repr(C)]
    pub struct RawProfile {
        _private: [u8; 0],
    }

    extern "C" {
        pub fn rn50_profile_last_error() -> *const c_char;
        pub fn rn50_profile_start(cuda: c_int) -> c_int;
        pub fn rn50_profile_stop(out: *mut *mut RawProfile) -> c_int;
        pub fn rn50_profile_len(p: *const RawProfile) -> usize;
        pub fn rn50_profile_event(p: *const RawProfile, i: usize, out: *mut RawEvent) -> c_int;
        pub fn rn50_profile_free(p: *mut RawProfile);
    }
}

fn check(rc: c_int, what: &str) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the shim keeps a thread-local NUL-terminated message alive until the next call on this thread.
    let msg = unsafe { CStr::from_ptr(ffi::rn50_profile_last_error()) }
        .to_string_lossy()
        .into_owned();
    bail!("{what}: {msg}")
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
        check(
            unsafe { ffi::rn50_profile_start(device.is_cuda() as c_int) },
            "starting libtorch's profiler",
        )?;
        Ok(Profiler { active: true })
    }

    /// Stops recording and returns the events.
    pub fn stop(mut self) -> Result<Vec<Event>> {
        self.active = false;
        let mut raw: *mut ffi::RawProfile = std::ptr::null_mut();
        // SAFETY: out-parameter; on success the shim stores a heap profile freed below.
        check(
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
            check(
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
            events.push(Event {
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

#[cfg(test)]
mod tests {
    use super::*;
    use WorkKind::*;

    #[test]
    fn classifies_real_op_and_kernel_names() {
        let table: &[(&str, Option<WorkKind>)] = &[
            // aten ops and autograd nodes on CPU
            ("aten::conv2d", Some(Convolution)),
            ("aten::convolution", Some(Convolution)),
            ("aten::_convolution", Some(Convolution)),
            ("aten::mkldnn_convolution", Some(Convolution)),
            ("aten::cudnn_convolution", Some(Convolution)),
            ("aten::convolution_backward", Some(Convolution)),
            (
                "autograd::engine::evaluate_function: ConvolutionBackward0",
                Some(Convolution),
            ),
            ("ConvolutionBackward0", Some(Convolution)),
            ("aten::batch_norm", Some(BatchNorm)),
            ("aten::_batch_norm_impl_index", Some(BatchNorm)),
            ("aten::native_batch_norm", Some(BatchNorm)),
            ("aten::_native_batch_norm_legit", Some(BatchNorm)),
            ("aten::native_batch_norm_backward", Some(BatchNorm)),
            ("aten::cudnn_batch_norm", Some(BatchNorm)),
            (
                "autograd::engine::evaluate_function: NativeBatchNormBackward0",
                Some(BatchNorm),
            ),
            ("CudnnBatchNormBackward0", Some(BatchNorm)),
            ("aten::relu_", Some(Elementwise)),
            ("aten::relu", Some(Elementwise)),
            ("aten::threshold_backward", Some(Elementwise)),
            ("ReluBackward0", Some(Elementwise)),
            (
                "autograd::engine::evaluate_function: AddBackward0",
                Some(Elementwise),
            ),
            ("aten::add_", Some(Elementwise)),
            ("aten::add", Some(Elementwise)),
            ("aten::mul", Some(Elementwise)),
            ("aten::sub", Some(Elementwise)),
            ("aten::div_", Some(Elementwise)),
            ("aten::zero_", Some(Elementwise)),
            ("aten::fill_", Some(Elementwise)),
            ("aten::ones_like", Some(Elementwise)),
            ("aten::_foreach_add_", Some(Optimizer)),
            ("aten::_foreach_mul_", Some(Optimizer)),
            (
                "aten::_amp_foreach_non_finite_check_and_unscale_",
                Some(Optimizer),
            ),
            ("aten::_amp_update_scale_", Some(Optimizer)),
            ("Optimizer.step#SGD.step", Some(Optimizer)),
            ("aten::_autocast_to_reduced_precision", Some(Cast)),
            // a cast or a copy: the copy_ inside decides (classify_op)
            ("aten::to", Some(Copy)),
            ("aten::_to_copy", Some(Copy)),
            ("ToCopyBackward0", Some(Copy)),
            ("aten::copy_", Some(Copy)),
            ("aten::contiguous", Some(Copy)),
            ("aten::clone", Some(Copy)),
            ("c10d::allreduce_", Some(Communication)),
            ("gloo:all_reduce", Some(Communication)),
            ("nccl:all_reduce", Some(Communication)),
            ("record_param_comms", Some(Communication)),
            (
                "torch.distributed.ddp.reducer::copy_bucket_to_grad",
                Some(Communication),
            ),
            // not classified by name: the op around them decides, or they are "other"
            ("aten::addmm", None),
            ("aten::linear", None),
            ("aten::topk", None),
            ("aten::max_pool2d_with_indices", None),
            ("aten::adaptive_avg_pool2d", None),
            ("aten::mean", None),
            ("aten::sum", None),
            ("aten::log_softmax", None),
            ("aten::nll_loss_forward", None),
            ("aten::cross_entropy_loss", None),
            ("aten::empty", None),
            ("aten::empty_strided", None),
            ("aten::as_strided", None),
            ("aten::view", None),
            ("aten::t", None),
            ("aten::_convert_indices_from_coo_to_csr", None),
            ("aten::broadcast_to", None),
            (
                "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
                None,
            ),
            // CUDA kernels
            (
                "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float)",
                Some(BatchNorm),
            ),
            (
                "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, cudnnTensorStruct, float const*, cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float*, float*, float const*, float const*, float)",
                Some(BatchNorm),
            ),
            (
                "void at::native::batch_norm_collect_statistics_channels_last_kernel<at::native::Var, c10::Half, float, 4>(c10::Half const*, float*, float*, float*, int*, int, int, float)",
                Some(BatchNorm),
            ),
            (
                "void at::native::batch_norm_backward_elemt_channels_last_kernel<4, c10::Half, float, float>(c10::Half const*, c10::Half const*, float const*, float const*, float const*, float const*, float const*, c10::Half*, float, int, int)",
                Some(BatchNorm),
            ),
            (
                "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cudnn",
                Some(Convolution),
            ),
            (
                "sm80_xmma_dgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel_cudnn",
                Some(Convolution),
            ),
            (
                "sm80_xmma_wgrad_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize64x128x64_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel_cudnn",
                Some(Convolution),
            ),
            (
                "void cudnn::cnn::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)",
                Some(Convolution),
            ),
            (
                "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>(int, int, int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float const*, float const*, bool, int, int)",
                Some(Convolution),
            ),
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#14}::operator()() const::{lambda(c10::Half)#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#14}::operator()() const::{lambda(c10::Half)#1}, std::array<char*, 2ul>)",
                Some(Elementwise),
            ),
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::Half>, std::array<char*, 3ul>)",
                Some(Elementwise),
            ),
            (
                "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1})",
                Some(Elementwise),
            ),
            (
                "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)",
                Some(Copy),
            ),
            (
                "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)",
                Some(Optimizer),
            ),
            (
                "void at::native::amp_update_scale_cuda_kernel(float*, int*, float const*, double, double, int)",
                Some(Optimizer),
            ),
            ("Memcpy HtoD (Pageable -> Device)", Some(Copy)),
            ("Memcpy DtoD (Device -> Device)", Some(Copy)),
            ("Memset (Device)", Some(Copy)),
            ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", Some(Communication)),
            ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWork*)", Some(Communication)),
            (
                "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)",
                None,
            ),
            (
                "void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::Half, float>(c10::Half const*, int, long, long, long, int, int, int, int, int, int, int, int, int, int, int, c10::Half*, long*)",
                None,
            ),
            (
                "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
                None,
            ),
            ("void cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", None),
        ];
        for (name, want) in table {
            assert_eq!(classify(name), *want, "{name}");
        }
    }

    #[test]
    fn a_copy_between_dtypes_is_a_cast() {
        let d = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let table = [
            (
                "aten::copy_",
                d(&["float", "unsigned char", ""]),
                Some(Cast),
            ),
            ("aten::copy_", d(&["c10::Half", "float", ""]), Some(Cast)),
            (
                "aten::copy_",
                d(&["c10::BFloat16", "float", ""]),
                Some(Cast),
            ),
            ("aten::copy_", d(&["float", "float", ""]), Some(Copy)),
            ("aten::copy_", d(&[]), Some(Copy)),
            ("aten::copy_", d(&["float", ""]), Some(Copy)),
            ("aten::to", d(&["float", "", "", "", ""]), Some(Copy)),
            (
                "aten::add_",
                d(&["float", "c10::Half", "Scalar"]),
                Some(Elementwise),
            ),
            (
                "aten::convolution",
                d(&["float", "float"]),
                Some(Convolution),
            ),
        ];
        for (name, dtypes, want) in table {
            assert_eq!(classify_op(name, &dtypes), want, "{name} {dtypes:?}");
        }
    }

    #[test]
    fn other_rows_name_autograd_nodes_briefly() {
        assert_eq!(
            display_name("autograd::engine::evaluate_function: AddmmBackward0"),
            "AddmmBackward0"
        );
        assert_eq!(
            display_name("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"),
            "AccumulateGrad"
        );
        assert_eq!(display_name("aten::linear"), "aten::linear");
    }

    #[test]
    fn specific_context_claims_generic_work() {
        let table = [
            // the copy_ of aten::to is a cast; a memcpy inside NCCL's op is communication
            (Some(Copy), Some(Cast), Some(Cast)),
            (Some(Copy), Some(Communication), Some(Communication)),
            (Some(Elementwise), Some(BatchNorm), Some(BatchNorm)),
            (Some(Elementwise), Some(Optimizer), Some(Optimizer)),
            // a specific name wins: autocast's weight cast inside aten::conv2d stays a cast
            (Some(Cast), Some(Convolution), Some(Cast)),
            (Some(Convolution), Some(Elementwise), Some(Convolution)),
            // a generic context does not override
            (Some(Copy), Some(Elementwise), Some(Copy)),
            (Some(Elementwise), Some(Copy), Some(Elementwise)),
            // unnamed work takes any context
            (None, Some(Convolution), Some(Convolution)),
            (None, Some(Copy), Some(Copy)),
            (None, None, None),
            (Some(Elementwise), None, Some(Elementwise)),
        ];
        for (own, ctx, want) in table {
            assert_eq!(resolve(own, ctx), want, "{own:?} in {ctx:?}");
        }
    }

    #[test]
    fn kernel_names_are_shortened() {
        for (name, want) in [
            (
                "void at::native::(anonymous namespace)::max_pool_forward_nhwc<c10::Half, float>(c10::Half const*)",
                "at::native::max_pool_forward_nhwc",
            ),
            ("void cunn_SoftMaxForward<4, float>(float*)", "cunn_SoftMaxForward"),
            ("sm90_xmma_gemm_f16f16_kernel", "sm90_xmma_gemm_f16f16_kernel"),
            ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD"),
        ] {
            assert_eq!(short_kernel_name(name), want);
        }
    }

    fn op(name: &str, start: u64, dur: u64, corr: u64) -> Event {
        Event {
            name: name.into(),
            start_ns: start,
            duration_ns: dur,
            start_thread: 1,
            end_thread: 1,
            correlation: corr,
            ..Default::default()
        }
    }

    /// A copy_ from `src` into `dst` dtype.
    fn copy(start: u64, dur: u64, corr: u64, dst: &str, src: &str) -> Event {
        Event {
            dtypes: vec![dst.into(), src.into(), String::new()],
            ..op("aten::copy_", start, dur, corr)
        }
    }

    fn kernel(name: &str, dur: u64, linked: u64) -> Event {
        Event {
            name: name.into(),
            start_ns: 0,
            duration_ns: dur,
            linked_correlation: linked,
            device_type: DEVICE_CUDA,
            activity_type: ACTIVITY_KERNEL,
            ..Default::default()
        }
    }

    fn kind_ms(r: &ProfileReport, k: WorkKind) -> f64 {
        r.kinds.iter().find(|x| x.kind == k).unwrap().ms_per_step
    }

    #[test]
    fn cpu_self_time_is_counted_once_by_kind() {
        // Times in ms (x1e6 ns), 2 steps.
        let m = 1_000_000;
        let events = vec![
            // conv2d 10 ms: autocast's cast 2 ms (its copy_ 1.5 ms), the convolution 7 ms (an empty 1 ms and
            // a change of memory format by aten::to 2 ms in it)
            op("aten::conv2d", 0, 10 * m, 1),
            op("aten::to", m / 2, 2 * m, 2),
            copy(m, 3 * m / 2, 3, "c10::BFloat16", "float"),
            op("aten::mkldnn_convolution", 3 * m, 7 * m, 4),
            op("aten::empty", 4 * m, m, 5),
            op("aten::to", 6 * m, 2 * m, 11),
            copy(6 * m, 2 * m, 12, "float", "float"),
            // linear 4 ms with an addmm of 3 ms: both other, shown as aten::linear
            op("aten::linear", 10 * m, 4 * m, 6),
            op("aten::addmm", 11 * m, 3 * m, 7),
            // relu 1 ms at top level
            op("aten::relu_", 14 * m, m, 8),
            // a memory record and a CUDA runtime call do not count
            op("[memory]", 0, 0, 0),
            Event {
                linked_correlation: 4,
                ..op("cudaLaunchKernel", 5 * m, m, 9)
            },
            // another thread: 2 ms of SGD
            Event {
                start_thread: 2,
                end_thread: 2,
                ..op("aten::_foreach_add_", 0, 2 * m, 10)
            },
        ];
        let r = summarize(&events, false, 2, 40.0);
        assert_eq!(r.source, ProfileSource::CpuOps);
        assert_eq!(r.total_ms_per_step, (10.0 + 4.0 + 1.0 + 2.0) / 2.0);
        assert_eq!(kind_ms(&r, Convolution), (10.0 - 2.0) / 2.0);
        assert_eq!(kind_ms(&r, Cast), 2.0 / 2.0);
        assert_eq!(kind_ms(&r, Other), 4.0 / 2.0);
        assert_eq!(kind_ms(&r, Elementwise), 0.5);
        assert_eq!(kind_ms(&r, Optimizer), 1.0);
        assert_eq!(r.other_top.len(), 1);
        assert_eq!(r.other_top[0].name, "aten::linear");
        assert_eq!(r.wall_ms_per_step, 20.0);
        let shares: f64 = r.kinds.iter().map(|k| k.share).sum();
        assert!((shares - 1.0).abs() < 1e-9);
        // largest first, other last
        assert_eq!(r.kinds[0].kind, Convolution);
        assert_eq!(r.kinds.last().unwrap().kind, Other);
        assert_eq!(r.kinds.len(), WorkKind::ALL.len());
        assert!(render(&r).contains("convolution"));
    }

    #[test]
    fn cuda_kernels_are_summed_and_take_their_launching_op_s_kind() {
        let events = vec![
            op("aten::cudnn_convolution", 0, 100, 1),
            op("aten::to", 200, 100, 2),
            copy(210, 50, 3, "c10::Half", "float"),
            op("aten::native_batch_norm_backward", 400, 100, 4),
            op("aten::max_pool2d_with_indices", 600, 100, 5),
            kernel("sm90_xmma_fprop_implicit_gemm_f16f16_kernel", 5000, 1),
            kernel("void cudnn::engines_precompiled::nchwToNhwcKernel<float>(int)", 1000, 1),
            kernel(
                "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)",
                500,
                3,
            ),
            kernel("void at::native::reduce_kernel<512, 1>(int)", 700, 4),
            kernel("void at::native::(anonymous namespace)::max_pool_forward_nhwc<float>(int)", 300, 5),
            kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(int)", 400, 0),
            Event {
                activity_type: ACTIVITY_GPU_MEMCPY,
                ..kernel("Memcpy HtoD (Pageable -> Device)", 100, 0)
            },
            // GPU annotations are not work
            Event {
                activity_type: 2,
                ..kernel("gpu_user_annotation", 1_000_000, 0)
            },
        ];
        let r = summarize(&events, true, 1, 0.01);
        assert_eq!(r.source, ProfileSource::CudaKernels);
        let ns = |k| kind_ms(&r, k) * 1e6;
        assert_eq!(ns(Convolution).round(), 6000.0);
        assert_eq!(ns(Cast).round(), 500.0);
        assert_eq!(ns(BatchNorm).round(), 700.0);
        assert_eq!(ns(Other).round(), 300.0);
        assert_eq!(ns(Communication).round(), 400.0);
        assert_eq!(ns(Copy).round(), 100.0);
        assert_eq!(r.other_top[0].name, "aten::max_pool2d_with_indices");
        assert!((r.total_ms_per_step * 1e6 - 8000.0).abs() < 1e-6);
        // without CUDA activity, a CUDA run falls back to CPU op time and says so
        let cpu_only: Vec<Event> = events.into_iter().filter(|e| !e.is_gpu_work()).collect();
        let r = summarize(&cpu_only, true, 1, 0.01);
        assert_eq!(r.source, ProfileSource::CpuOps);
        assert!(r.note.is_some());
    }

    #[test]
    fn profiler_records_real_cpu_ops() {
        let x = tch::Tensor::randn([2, 3, 16, 16], (tch::Kind::Float, Device::Cpu));
        let w = tch::Tensor::randn([4, 3, 3, 3], (tch::Kind::Float, Device::Cpu));
        let p = Profiler::start(Device::Cpu).unwrap();
        let y = x
            .conv2d(&w, None::<&tch::Tensor>, [1, 1], [1, 1], [1, 1], 1)
            .relu();
        let events = p.stop().unwrap();
        assert_eq!(y.size(), [2, 4, 16, 16]);
        assert!(
            events.iter().any(|e| e.name == "aten::conv2d"),
            "{:?}",
            events.iter().map(|e| &e.name).collect::<Vec<_>>()
        );
        let r = summarize(&events, false, 1, 1.0);
        assert!(kind_ms(&r, Convolution) > 0.0, "{r:?}");
        assert!(kind_ms(&r, Elementwise) > 0.0, "{r:?}");
        // A dropped profiler stops itself, so the next can start.
        drop(Profiler::start(Device::Cpu).unwrap());
        let again = Profiler::start(Device::Cpu).unwrap();
        assert!(again.stop().is_ok());
    }
}
