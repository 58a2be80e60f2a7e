// What the shims over cuDNN's legacy API share (fused_bn.cpp, pool.cpp): its functions resolved in the cuDNN that
// libtorch_cuda loads, a status check that tells "not supported" apart from an error, and their C boundary's
// convention: 0 done, 1 an error, 2 the op does not apply here (the caller runs PyTorch's ops), with the message
// or the reason in the shim's last_error. Include after rn50_shim_common.h, inside `#ifdef RN50_CUDA`.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <cudnn.h>
#include <torch/autograd.h>

#include <stdexcept>
#include <string>

// cuDNN is loaded by libtorch_cuda (a NEEDED entry of it): weak references resolve to that copy at load time
// without a link-time dependency on where the wheel keeps libcudnn.so.9. Each shim adds its own.
#pragma weak cudnnGetErrorString
#pragma weak cudnnSetStream
#pragma weak cudnnCreateTensorDescriptor
#pragma weak cudnnDestroyTensorDescriptor
#pragma weak cudnnSetTensor4dDescriptor

namespace {

// The op does not apply; the caller falls back to PyTorch's.
struct NotApplicable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  std::string msg = std::string(what) + ": " + cudnnGetErrorString(status);
  if (status == CUDNN_STATUS_NOT_SUPPORTED) throw NotApplicable(msg);
  throw std::runtime_error(msg);
}

// Runs `f` at the C boundary: `f` returns why the op does not apply (2), or an empty string once it has stored its
// output (0); an exception is an error (1), or, when cuDNN said "not supported", 2.
template <typename F>
int cudnn_call(F&& f) {
  try {
    auto why = f();
    if (why.empty()) return 0;
    last_error = why;
    return 2;
  } catch (const NotApplicable& e) {
    last_error = e.what();
    return 2;
  } catch (const c10::Error& e) {
    last_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    last_error = e.what();
  }
  return 1;
}

}  // namespace
