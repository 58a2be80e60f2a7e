//! The tables of kinds of work: which kind (convolution, batch norm, elementwise, optimizer, cast, copy,
//! communication) an aten op, autograd node or GPU kernel does, from its name ([`classify`], [`classify_op`]), how
//! work takes the kind of the op around it ([`resolve`]), and the names the "other" rows show.
use super::WorkKind;

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
pub(crate) fn base_op(lower: &str) -> &str {
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
}
