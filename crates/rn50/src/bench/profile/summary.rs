//! The summary of a profile ([`summarize`]): each CPU op nested in its thread's ops and given its self time, each
//! op and GPU kernel given a kind of work ([`super::ops`]), and the time per step summed by kind, with the largest
//! unclassified ops.
use std::collections::{HashMap, HashSet};

use super::ops::{base_op, classify, classify_op, display_name, resolve, short_kernel_name};
use super::{KindTime, NameTime, ProfileReport, ProfileSource, WorkKind};
use crate::shim::KinetoEvent;

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
fn attribute_cpu_ops(events: &[KinetoEvent]) -> HashMap<usize, OpShare> {
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
pub fn summarize(events: &[KinetoEvent], cuda: bool, steps: usize, wall_ms: f64) -> ProfileReport {
    let ops = attribute_cpu_ops(events);
    let gpu: Vec<&KinetoEvent> = events.iter().filter(|e| e.is_gpu_work()).collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::{Profiler, ACTIVITY_GPU_MEMCPY, ACTIVITY_KERNEL, DEVICE_CUDA};
    use tch::Device;
    use WorkKind::*;

    fn op(name: &str, start: u64, dur: u64, corr: u64) -> KinetoEvent {
        KinetoEvent {
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
    fn copy(start: u64, dur: u64, corr: u64, dst: &str, src: &str) -> KinetoEvent {
        KinetoEvent {
            dtypes: vec![dst.into(), src.into(), String::new()],
            ..op("aten::copy_", start, dur, corr)
        }
    }

    fn kernel(name: &str, dur: u64, linked: u64) -> KinetoEvent {
        KinetoEvent {
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
            KinetoEvent {
                linked_correlation: 4,
                ..op("cudaLaunchKernel", 5 * m, m, 9)
            },
            // another thread: 2 ms of SGD
            KinetoEvent {
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
            KinetoEvent {
                activity_type: ACTIVITY_GPU_MEMCPY,
                ..kernel("Memcpy HtoD (Pageable -> Device)", 100, 0)
            },
            // GPU annotations are not work
            KinetoEvent {
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
        let cpu_only: Vec<KinetoEvent> = events.into_iter().filter(|e| !e.is_gpu_work()).collect();
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
