// The stem's 3x3 stride-2 max-pool on NHWC CUDA tensors through cuDNN, forward and backward, without an index
// tensor.
//
// PyTorch's channels_last `max_pool2d_with_indices` writes an int64 index per output element in forward (4x the
// bytes of an fp16 output) and reads it back in backward. cuDNN's pooling (cudnnPoolingForward/Backward, what
// MXNet's and NVIDIA's NHWC ResNet-50 run) keeps nothing: its backward finds each window's maximum again from x and
// y. The output equals PyTorch's (a maximum is exact in any type; NaN propagates as PyTorch's does, padding never
// wins, as PyTorch's -inf padding never does). The input gradient equals PyTorch's wherever a window's maximum is
// unique. Where several elements of a window tie for it, PyTorch credits the first one in scan order; cuDNN 9.19
// on an H200 credited the same one, in all-zero input (tests/cuda_fused.rs prints both), but documents no rule.
// In a ResNet the pool reads a ReLU's output, whose ties are zeros the ReLU's backward masks out anyway.
//
// rn50_max_pool returns 0 on success, 1 on an error (message in rn50_pool_last_error), and 2 where this path does
// not apply (not CUDA, not NHWC-contiguous, a type other than fp16/bf16/fp32, a window PyTorch would refuse): the
// caller then runs PyTorch's max_pool2d (floor mode, no dilation, as here). Built without CUDA, it always returns 2.
#include "rn50_shim_common.h"

#include <ATen/ATen.h>

#ifdef RN50_CUDA
#include "rn50_cudnn.h"

#include <array>
#include <vector>

#pragma weak cudnnCreatePoolingDescriptor
#pragma weak cudnnDestroyPoolingDescriptor
#pragma weak cudnnSetPooling2dDescriptor
#pragma weak cudnnPoolingForward
#pragma weak cudnnPoolingBackward
#endif

// rn50's shims share one translation unit (rn50shim.cpp): each file's code sits in a namespace of its own.
namespace rn50_pool {
#ifdef RN50_CUDA
namespace {

cudnnDataType_t data_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return CUDNN_DATA_HALF;
    case at::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

using Window = std::array<int64_t, 6>;  // kernel h, w; stride h, w; padding h, w

// The descriptors of one call: x and y (NHWC, with their gradients the same) and the pooling window. Also points
// cuDNN at the current stream.
struct Call {
  cudnnHandle_t handle;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;

  Call(const at::Tensor& xt, const at::Tensor& yt, const Window& w) {
    handle = at::native::getCudnnHandle();
    check(cudnnSetStream(handle, at::cuda::getCurrentCUDAStream()), "cudnnSetStream");
    check(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
    check(cudnnCreatePoolingDescriptor(&pool), "cudnnCreatePoolingDescriptor");
    describe(x, xt);
    describe(y, yt);
    // The deterministic mode: backward writes each input gradient once instead of accumulating with atomics. On
    // an H200 (cuDNN 9.19) CUDNN_POOLING_MAX's backward took the same 1.70 ms at ResNet-50's b256 stem.
    check(cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN,
                                      static_cast<int>(w[0]), static_cast<int>(w[1]), static_cast<int>(w[4]),
                                      static_cast<int>(w[5]), static_cast<int>(w[2]), static_cast<int>(w[3])),
          "cudnnSetPooling2dDescriptor");
  }
  static void describe(cudnnTensorDescriptor_t d, const at::Tensor& t) {
    check(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, data_type(t), static_cast<int>(t.size(0)),
                                     static_cast<int>(t.size(1)), static_cast<int>(t.size(2)),
                                     static_cast<int>(t.size(3))),
          "cudnnSetTensor4dDescriptor");
  }
  ~Call() {
    if (pool) cudnnDestroyPoolingDescriptor(pool);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
};

// PyTorch's output side without ceil mode: floor((in + 2 * pad - kernel) / stride) + 1.
int64_t out_side(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

struct MaxPool : public torch::autograd::Function<MaxPool> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::vector<int64_t>& window) {
    Window w;
    std::copy(window.begin(), window.end(), w.begin());
    auto y = at::empty({x.size(0), x.size(1), out_side(x.size(2), w[0], w[2], w[4]),
                        out_side(x.size(3), w[1], w[3], w[5])},
                       x.options().memory_format(at::MemoryFormat::ChannelsLast));
    Call call(x, y, w);
    float one = 1.0f, zero = 0.0f;
    check(cudnnPoolingForward(call.handle, call.pool, &one, call.x, x.data_ptr(), &zero, call.y, y.data_ptr()),
          "cudnnPoolingForward");
    ctx->save_for_backward({x, y});
    ctx->saved_data["window"] = window;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1];
    auto list = ctx->saved_data["window"].toIntVector();
    Window w;
    std::copy(list.begin(), list.end(), w.begin());
    auto dy = grads[0].to(y.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    auto dx = at::empty_like(x, at::MemoryFormat::ChannelsLast);
    Call call(x, y, w);
    float one = 1.0f, zero = 0.0f;
    check(cudnnPoolingBackward(call.handle, call.pool, &one, call.y, y.data_ptr(), call.y, dy.data_ptr(), call.x,
                               x.data_ptr(), &zero, call.x, dx.data_ptr()),
          "cudnnPoolingBackward");
    return {dx, at::Tensor()};
  }
};

// Why this path does not apply, or empty if it does.
std::string not_applicable(const at::Tensor& x, const Window& w) {
  if (!x.is_cuda()) return "not on CUDA";
  auto t = x.scalar_type();
  if (t != at::kHalf && t != at::kBFloat16 && t != at::kFloat) return "not fp16/bf16/fp32";
  if (x.dim() != 4 || !x.is_contiguous(at::MemoryFormat::ChannelsLast)) return "not NHWC-contiguous";
  for (auto v : w)
    if (v < 0 || v > (1 << 20)) return "window out of range";
  if (w[0] < 1 || w[1] < 1 || w[2] < 1 || w[3] < 1) return "empty window or stride";
  // PyTorch's own limit: padding at most half the kernel.
  if (2 * w[4] > w[0] || 2 * w[5] > w[1]) return "padding over half the kernel";
  if (out_side(x.size(2), w[0], w[2], w[4]) < 1 || out_side(x.size(3), w[1], w[3], w[5]) < 1)
    return "input smaller than the window";
  if (!cudnnPoolingForward) return "cuDNN not loaded";
  return {};
}

}  // namespace
#endif

extern "C" {

const char* rn50_pool_last_error() { return last_error.c_str(); }

// out = max_pool2d(x, kernel, stride, padding) (no dilation, floor mode), recorded for autograd. window: kernel
// h, w, stride h, w, padding h, w.
int rn50_max_pool(at::Tensor* x, const int64_t* window, at::Tensor** out) {
#ifdef RN50_CUDA
  return cudnn_call([&] {
    Window w;
    std::copy(window, window + 6, w.begin());
    auto why = not_applicable(*x, w);
    if (!why.empty()) return why;
    *out = new at::Tensor(MaxPool::apply(*x, std::vector<int64_t>(w.begin(), w.end())));
    return std::string();
  });
#else
  (void)x;
  (void)window;
  (void)out;
  last_error = "built without CUDA (a CPU-only libtorch)";
  return 2;
#endif
}

}  // extern "C"
}  // namespace rn50_pool
