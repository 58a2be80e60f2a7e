// BatchNorm (+ residual add) + ReLU in one cuDNN call, forward and backward, for training on CUDA.
//
// PyTorch eager runs a ResNet block's tail as three kernels each way (cuDNN batch norm, add, ReLU; backward:
// threshold_backward, the add's gradient, batch-norm backward), each a full pass over the activations. cuDNN's
// fused batch norm (cudnnBatchNormalizationForwardTrainingEx / BackwardEx with CUDNN_BATCHNORM_OPS_BN_ACTIVATION
// or _BN_ADD_ACTIVATION, what MXNet's and NVIDIA's NHWC ResNets use) does it in one pass, the ReLU mask kept as
// a bitmask in cuDNN's reserve space. The batch norm itself is the one PyTorch's fp16 path already calls
// (CUDNN_BATCHNORM_SPATIAL_PERSISTENT, running statistics updated by cuDNN with the unbiased variance), so the
// numbers are those of `relu(batch_norm(x) + z)` in PyTorch.
//
// rn50_bn_relu returns 0 on success, 1 on an error (message in rn50_fused_last_error), and 2 when the fused path
// does not apply to these tensors (not CUDA, not NHWC-contiguous fp16/bf16, a cuDNN that does not support the
// case): the caller then runs the unfused ops. Built without CUDA (a CPU-only libtorch), it always returns 2.
#include "rn50_shim_common.h"

#include <ATen/ATen.h>

#ifdef RN50_CUDA
#include "rn50_cudnn.h"

#pragma weak cudnnDeriveBNTensorDescriptor
#pragma weak cudnnCreateActivationDescriptor
#pragma weak cudnnDestroyActivationDescriptor
#pragma weak cudnnSetActivationDescriptor
#pragma weak cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize
#pragma weak cudnnGetBatchNormalizationBackwardExWorkspaceSize
#pragma weak cudnnGetBatchNormalizationTrainingExReserveSpaceSize
#pragma weak cudnnBatchNormalizationForwardTrainingEx
#pragma weak cudnnBatchNormalizationBackwardEx
#endif

// rn50's shims share one translation unit (rn50shim.cpp): each file's code sits in a namespace of its own.
namespace rn50_fused_bn {
#ifdef RN50_CUDA
namespace {

constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

cudnnBatchNormOps_t bn_ops(bool add) {
  return add ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
}

// The descriptors of one call: x (and y, z, their gradients: same shape and layout), the per-channel
// parameters (fp32), the ReLU. Also points cuDNN at the current stream.
struct Call {
  cudnnHandle_t handle;
  cudnnTensorDescriptor_t x = nullptr, param = nullptr;
  cudnnActivationDescriptor_t relu = nullptr;

  explicit Call(const at::Tensor& t) {
    handle = at::native::getCudnnHandle();
    check(cudnnSetStream(handle, at::cuda::getCurrentCUDAStream()), "cudnnSetStream");
    auto type = t.scalar_type() == at::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    check(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&param), "cudnnCreateTensorDescriptor");
    check(cudnnCreateActivationDescriptor(&relu), "cudnnCreateActivationDescriptor");
    auto n = static_cast<int>(t.size(0)), c = static_cast<int>(t.size(1));
    auto h = static_cast<int>(t.size(2)), w = static_cast<int>(t.size(3));
    check(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, type, n, c, h, w), "cudnnSetTensor4dDescriptor");
    check(cudnnDeriveBNTensorDescriptor(param, x, kMode), "cudnnDeriveBNTensorDescriptor");
    check(cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
          "cudnnSetActivationDescriptor");
  }
  ~Call() {
    if (relu) cudnnDestroyActivationDescriptor(relu);
    if (param) cudnnDestroyTensorDescriptor(param);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
};

at::Tensor bytes(size_t n, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(n)}, like.options().dtype(at::kByte));
}

bool nhwc(const at::Tensor& t) { return t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast); }

struct BnAddRelu : public torch::autograd::Function<BnAddRelu> {
  // No z: relu(bn(x)); else relu(bn(x) + z). running_mean/var are updated in place. z is optional rather than
  // undefined because autograd asks every Tensor argument for its device.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& z,
                            const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
                            const at::Tensor& running_var, double momentum, double eps) {
    bool add = z.has_value();
    auto ops = bn_ops(add);
    Call call(x);
    auto zdesc = add ? call.x : nullptr;
    size_t ws_size = 0, reserve_size = 0;
    check(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(call.handle, kMode, ops, call.x, zdesc, call.x,
                                                                   call.param, call.relu, &ws_size),
          "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize");
    check(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(call.handle, kMode, ops, call.relu, call.x,
                                                               &reserve_size),
          "cudnnGetBatchNormalizationTrainingExReserveSpaceSize");
    auto y = at::empty_like(x, at::MemoryFormat::ChannelsLast);
    auto ws = bytes(ws_size, x);
    auto reserve = bytes(reserve_size, x);
    auto save_mean = at::empty_like(weight);
    auto save_invstd = at::empty_like(weight);
    float one = 1.0f, zero = 0.0f;
    check(cudnnBatchNormalizationForwardTrainingEx(
              call.handle, kMode, ops, &one, &zero, call.x, x.data_ptr(), zdesc, add ? z->data_ptr() : nullptr,
              call.x, y.data_ptr(), call.param, weight.data_ptr(), bias.data_ptr(), momentum,
              running_mean.data_ptr(), running_var.data_ptr(), eps, save_mean.data_ptr(), save_invstd.data_ptr(),
              call.relu, ws.data_ptr(), ws_size, reserve.data_ptr(), reserve_size),
          "cudnnBatchNormalizationForwardTrainingEx");
    ctx->save_for_backward({x, y, weight, bias, save_mean, save_invstd, reserve});
    ctx->saved_data["add"] = add;
    ctx->saved_data["eps"] = eps;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1], &weight = saved[2], &bias = saved[3];
    const auto &save_mean = saved[4], &save_invstd = saved[5], &reserve = saved[6];
    bool add = ctx->saved_data["add"].toBool();
    double eps = ctx->saved_data["eps"].toDouble();
    auto dy = grads[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    auto ops = bn_ops(add);
    Call call(x);
    auto zdesc = add ? call.x : nullptr;
    size_t ws_size = 0;
    check(cudnnGetBatchNormalizationBackwardExWorkspaceSize(call.handle, kMode, ops, call.x, call.x, call.x, zdesc,
                                                            call.x, call.param, call.relu, &ws_size),
          "cudnnGetBatchNormalizationBackwardExWorkspaceSize");
    auto ws = bytes(ws_size, x);
    auto dx = at::empty_like(x, at::MemoryFormat::ChannelsLast);
    auto dz = add ? at::empty_like(x, at::MemoryFormat::ChannelsLast) : at::Tensor();
    auto dweight = at::empty_like(weight);
    auto dbias = at::empty_like(bias);
    float one = 1.0f, zero = 0.0f;
    check(cudnnBatchNormalizationBackwardEx(
              call.handle, kMode, ops, &one, &zero, &one, &zero, call.x, x.data_ptr(), call.x, y.data_ptr(), call.x,
              dy.data_ptr(), zdesc, add ? dz.data_ptr() : nullptr, call.x, dx.data_ptr(), call.param,
              weight.data_ptr(), bias.data_ptr(), dweight.data_ptr(), dbias.data_ptr(), eps, save_mean.data_ptr(),
              save_invstd.data_ptr(), call.relu, ws.data_ptr(), ws_size, reserve.data_ptr(),
              static_cast<size_t>(reserve.numel())),
          "cudnnBatchNormalizationBackwardEx");
    // One gradient per forward argument: x, z, weight, bias, running_mean, running_var, momentum, eps.
    return {dx, dz, dweight, dbias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Why the fused path does not apply to these tensors, or empty if it does.
std::string not_applicable(const at::Tensor& x, const at::Tensor* z, const at::Tensor& weight) {
  if (!x.is_cuda()) return "not on CUDA";
  if (x.scalar_type() != at::kHalf && x.scalar_type() != at::kBFloat16) return "not fp16/bf16";
  if (!nhwc(x)) return "not NHWC-contiguous";
  // cuDNN's fused NHWC kernels need whole groups of 4 channels.
  if (x.size(1) % 4 != 0) return "channels not a multiple of 4";
  if (z && (!nhwc(*z) || z->sizes() != x.sizes() || z->scalar_type() != x.scalar_type()))
    return "residual of another shape, type or layout";
  if (weight.scalar_type() != at::kFloat) return "parameters not fp32";
  if (!cudnnBatchNormalizationForwardTrainingEx) return "cuDNN not loaded";
  return {};
}

}  // namespace
#endif

extern "C" {

const char* rn50_fused_last_error() { return last_error.c_str(); }

// out = relu(batch_norm(x) + z) in training mode (z may be null: relu(batch_norm(x))), recorded for autograd.
int rn50_bn_relu(at::Tensor* x, at::Tensor* z, at::Tensor* weight, at::Tensor* bias, at::Tensor* running_mean,
                 at::Tensor* running_var, double momentum, double eps, at::Tensor** out) {
#ifdef RN50_CUDA
  return cudnn_call([&] {
    auto why = not_applicable(*x, z, *weight);
    if (!why.empty()) return why;
    auto zt = z ? std::optional<at::Tensor>(*z) : std::nullopt;
    *out = new at::Tensor(BnAddRelu::apply(*x, zt, *weight, *bias, *running_mean, *running_var, momentum, eps));
    return std::string();
  });
#else
  last_error = "built without CUDA (a CPU-only libtorch)";
  return 2;
#endif
}

}  // extern "C"
}  // namespace rn50_fused_bn
