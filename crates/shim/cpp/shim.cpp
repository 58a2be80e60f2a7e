// rn50's C++ shim: the few libtorch calls that tch 0.26 does not expose.
//
// - autocast on CPU (bf16) and CUDA (fp16/bf16): tch::autocast only toggles CUDA;
// - TF32 and cuDNN-autotuning switches, pinning host memory;
// - multi-tensor (foreach) SGD and AMP unscale, the kernels torch.optim.SGD and GradScaler use;
// - build/config strings and where libtorch was loaded from, for `rn50 doctor`;
// - CUDA caching-allocator statistics;
// - reading torch.save files: the pickle, and its tensors wherever they sit in the pickled dicts and lists.
//
// Every entry point is extern "C", catches all exceptions, and reports failure as a non-zero return with
// the message available from rn50_last_error(). Tensors cross the boundary as tch's `at::Tensor*` handles.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Version.h>
#include <ATen/autocast_mode.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/headeronly/version.h>

#include <dlfcn.h>
#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/CachingDeviceAllocator.h>

#include "rn50_shim_common.h"

// rn50's shims share one translation unit (rn50shim.cpp): each file's code sits in a namespace of its own.
namespace rn50_shim {
namespace {
at::DeviceType device_type(int device) { return device == 1 ? at::kCUDA : at::kCPU; }

char* dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

// How deep each_tensor looks: a checkpoint's state_dict sits at depth 1 and an optimizer's momentum at depth 3; the
// limit keeps a crafted file's nesting from overflowing the stack.
constexpr int kMaxDepth = 32;

// Calls f(path, tensor) for each tensor in `v`, `path` being the dict keys (strings or integers) and list or tuple
// indices that lead to it, joined by '/'. Other values (numbers, strings, None, objects) hold no weights.
template <typename F>
void each_tensor(const c10::IValue& v, const std::string& path, int depth, F& f) {
  if (v.isTensor()) return f(path, v.toTensor());
  if (depth == kMaxDepth) return;
  auto child = [&](const std::string& key) { return path.empty() ? key : path + "/" + key; };
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      const auto& k = e.key();
      if (k.isString()) each_tensor(e.value(), child(k.toStringRef()), depth + 1, f);
      if (k.isInt()) each_tensor(e.value(), child(std::to_string(k.toInt())), depth + 1, f);
    }
  } else if (v.isList() || v.isTuple()) {
    auto items = v.isList() ? v.toListRef().vec() : v.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) each_tensor(items[i], child(std::to_string(i)), depth + 1, f);
  }
}
}  // namespace

extern "C" {

const char* rn50_last_error() { return last_error.c_str(); }
void rn50_free(char* p) { std::free(p); }

// Enters an autocast region on `device` (0 = CPU, 1 = CUDA) computing in `dtype` (0 = bf16, 1 = fp16).
// The previous state is written to prev_* so that exit can restore it (regions nest like Python's).
// torch.autocast(device, dtype, enabled).__enter__: `enabled` 0 opens a region without autocast (the dtype kept).
int rn50_autocast_enter(int device, int enabled, int dtype, int* prev_enabled, int* prev_dtype) {
  return guarded([&] {
    auto dt = device_type(device);
    *prev_enabled = at::autocast::is_autocast_enabled(dt) ? 1 : 0;
    *prev_dtype = static_cast<int>(at::autocast::get_autocast_dtype(dt));
    at::autocast::set_autocast_enabled(dt, enabled != 0);
    if (enabled != 0) at::autocast::set_autocast_dtype(dt, dtype == 1 ? at::kHalf : at::kBFloat16);
    at::autocast::increment_nesting();
  });
}

int rn50_autocast_exit(int device, int prev_enabled, int prev_dtype) {
  return guarded([&] {
    auto dt = device_type(device);
    // Like torch.autocast.__exit__: drop the cast-weight cache when the outermost region closes.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(dt, prev_enabled != 0);
    at::autocast::set_autocast_dtype(dt, static_cast<at::ScalarType>(prev_dtype));
  });
}

int rn50_autocast_is_enabled(int device) { return at::autocast::is_autocast_enabled(device_type(device)) ? 1 : 0; }

// TF32 for cuBLAS matmuls and cuDNN convolutions (Ampere and newer); a no-op on CPU.
int rn50_set_tf32(int on) {
  return guarded([&] {
    at::globalContext().setAllowTF32CuBLAS(on != 0);
    at::globalContext().setAllowTF32CuDNN(on != 0);
  });
}

int rn50_get_tf32() { return at::globalContext().allowTF32CuBLAS() && at::globalContext().allowTF32CuDNN() ? 1 : 0; }

// torch.backends.cudnn.benchmark (tch has the setter only).
int rn50_get_cudnn_benchmark() { return at::globalContext().benchmarkCuDNN() ? 1 : 0; }

// Tensor.pin_memory() without the device argument: passing one (all tch's pin_memory can do) is deprecated and
// makes libtorch print two warnings per call.
int rn50_pin_memory(at::Tensor* t, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(t->pin_memory()); });
}

// SGD with momentum, exactly torch.optim.SGD's multi-tensor path (dampening 0, maximize off):
//   g += wd*p;  buf = momentum*buf + g;  g = nesterov ? g + momentum*buf : buf;  p -= lr*g.
// `bufs` start as zeros, which equals PyTorch's "first step: buf = g.clone()". The grads are modified in place.
int rn50_sgd_foreach(at::Tensor** params, at::Tensor** grads, at::Tensor** bufs, size_t n, double lr,
                     double momentum, double weight_decay, int nesterov) {
  return guarded([&] {
    if (n == 0) return;
    at::NoGradGuard no_grad;
    auto p = gather(params, n);
    auto g = gather(grads, n);
    if (weight_decay != 0.0) at::_foreach_add_(g, p, weight_decay);
    if (momentum != 0.0) {
      auto b = gather(bufs, n);
      at::_foreach_mul_(b, momentum);
      at::_foreach_add_(b, g, 1.0);
      if (nesterov != 0) {
        at::_foreach_add_(g, b, momentum);
        at::_foreach_add_(p, g, -lr);
      } else {
        at::_foreach_add_(p, b, -lr);
      }
    } else {
      at::_foreach_add_(p, g, -lr);
    }
  });
}

// torch.optim.SGD(fused=True) on CUDA: the same update as rn50_sgd_foreach in one kernel per group of tensors,
// skipped on the device when found_inf (GradScaler's overflow flag; may be null) is 1, so the host never waits.
// The rate is `lr`, or where `lr_tensor` is not null the one-element fp32 tensor on the device it points to (the
// `_fused_sgd_.tensor_lr` overload, which reads it in the kernel: a captured CUDA graph's rate, set before each
// replay).
int rn50_sgd_fused(at::Tensor** params, at::Tensor** grads, at::Tensor** bufs, size_t n, double lr,
                   at::Tensor* lr_tensor, double momentum, double weight_decay, int nesterov, at::Tensor* found_inf) {
  return guarded([&] {
    if (n == 0) return;
    at::NoGradGuard no_grad;
    auto p = gather(params, n);
    auto g = gather(grads, n);
    auto b = momentum != 0.0 ? gather(bufs, n) : std::vector<at::Tensor>{};
    std::optional<at::Tensor> inf;
    if (found_inf) inf = *found_inf;
    // Zero-initialised buffers make every step a regular one (buf = m·0 + g on the first), as in rn50_sgd_foreach.
    if (lr_tensor) {
      TORCH_CHECK(lr_tensor->scalar_type() == at::kFloat && lr_tensor->numel() == 1 &&
                      lr_tensor->device() == p[0].device(),
                  "the learning rate tensor must be one fp32 element on the parameters' device, not ",
                  lr_tensor->numel(), " ", lr_tensor->dtype().name(), " on ", lr_tensor->device());
      at::_fused_sgd_(p, g, b, weight_decay, momentum, *lr_tensor, /*dampening=*/0.0, nesterov != 0,
                      /*maximize=*/false, /*is_first_step=*/false, /*grad_scale=*/std::nullopt, inf);
    } else {
      at::_fused_sgd_(p, g, b, weight_decay, momentum, lr, /*dampening=*/0.0, nesterov != 0, /*maximize=*/false,
                      /*is_first_step=*/false, /*grad_scale=*/std::nullopt, inf);
    }
  });
}

// AdamW, or RAdam where `rectified` is 1, each with decoupled weight decay, exactly torch.optim.AdamW's and
// torch.optim.RAdam(decoupled_weight_decay=True)'s multi-tensor paths (foreach=True; amsgrad, maximize and
// capturable off). `step` is the update's number, from 1: every tensor of a group steps together, so one count
// serves them all (PyTorch keeps one per tensor, all equal). `exp_avgs` and `exp_avg_sqs` start as zeros, as in
// PyTorch.
//   p *= 1 - lr·wd;  m = lerp(m, g, 1 - β1);  v = β2·v + (1 - β2)·g²
//   AdamW: p -= lr/(1 - β1^t) · m / (sqrt(v)/sqrt(1 - β2^t) + ε)
//   RAdam: ρ∞ = 2/(1 - β2) - 1, ρt = ρ∞ - 2t·β2^t/(1 - β2^t); while ρt ≤ 5 p -= lr/(1 - β1^t) · m, after it
//          p -= r·lr/(1 - β1^t) · sqrt(1 - β2^t) · m / (sqrt(v) + ε), r = sqrt((ρt-4)(ρt-2)ρ∞ / ((ρ∞-4)(ρ∞-2)ρt)).
int rn50_adam_foreach(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs, at::Tensor** exp_avg_sqs,
                      size_t n, double lr, double beta1, double beta2, double eps, double weight_decay, double step,
                      int rectified) {
  return guarded([&] {
    if (n == 0) return;
    at::NoGradGuard no_grad;
    auto p = gather(params, n);
    auto g = gather(grads, n);
    auto m = gather(exp_avgs, n);
    auto v = gather(exp_avg_sqs, n);
    if (weight_decay != 0.0) at::_foreach_mul_(p, 1.0 - lr * weight_decay);
    at::_foreach_lerp_(m, g, 1.0 - beta1);
    at::_foreach_mul_(v, beta2);
    at::_foreach_addcmul_(v, g, g, 1.0 - beta2);
    double bias_correction1 = 1.0 - std::pow(beta1, step);
    double bias_correction2 = 1.0 - std::pow(beta2, step);
    if (rectified == 0) {
      auto denom = at::_foreach_sqrt(v);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, eps);
      at::_foreach_addcdiv_(p, m, denom, -(lr / bias_correction1));
      return;
    }
    double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
    double rho_t = rho_inf - 2.0 * step * std::pow(beta2, step) / bias_correction2;
    if (rho_t <= 5.0) {
      // PyTorch's buffer is then 0·… + step size: the same update as adding m times it.
      at::_foreach_add_(p, m, -(lr / bias_correction1));
      return;
    }
    double rect = std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t));
    auto buffer = at::_foreach_sqrt(v);
    at::_foreach_add_(buffer, eps);
    at::_foreach_div_(buffer, std::sqrt(bias_correction2) * (lr * rect / bias_correction1) * -1.0);
    at::_foreach_reciprocal_(buffer);
    at::_foreach_addcmul_(p, m, buffer);
  });
}

// Lookahead's synchronisation, as timm's and fast.ai's: slow += α·(fast - slow); fast = slow.
int rn50_lookahead_sync(at::Tensor** slow, at::Tensor** fast, size_t n, double alpha) {
  return guarded([&] {
    if (n == 0) return;
    at::NoGradGuard no_grad;
    auto s = gather(slow, n);
    auto f = gather(fast, n);
    at::_foreach_add_(s, at::_foreach_sub(f, s), alpha);
    at::_foreach_copy_(f, s);
  });
}

// GradScaler.unscale_: grads *= inv_scale, found_inf := 1 if any grad holds inf/NaN.
int rn50_amp_unscale(at::Tensor** grads, size_t n, at::Tensor* found_inf, at::Tensor* inv_scale) {
  return guarded([&] {
    auto g = gather(grads, n);
    at::_amp_foreach_non_finite_check_and_unscale_(g, *found_inf, *inv_scale);
  });
}

int rn50_torch_version(int* major, int* minor, int* patch) {
  *major = TORCH_VERSION_MAJOR;
  *minor = TORCH_VERSION_MINOR;
  *patch = TORCH_VERSION_PATCH;
  return 0;
}

// at::show_config(): compiler, CPU capability, CUDA/cuDNN/NCCL versions libtorch was built with.
char* rn50_show_config() {
  try {
    return dup(at::show_config());
  } catch (...) {
    return nullptr;
  }
}

// The file libtorch_cpu was actually loaded from (rpath, LD_LIBRARY_PATH and all).
char* rn50_libtorch_path() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&at::show_config), &info) && info.dli_fname) return dup(info.dli_fname);
  return nullptr;
}

int rn50_cuda_compiled() {
#ifdef RN50_CUDA
  return 1;
#else
  return 0;
#endif
}

// Peak and current bytes allocated by the CUDA caching allocator on `device` (torch.cuda.max_memory_allocated).
// Through c10's device-generic allocator interface, so no CUDA headers are needed.
int rn50_cuda_memory(int device, int64_t* peak, int64_t* current) {
  return guarded([&] {
    auto stats = c10::getDeviceAllocator(at::kCUDA)->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *peak = stats.allocated_bytes[all].peak;
    *current = stats.allocated_bytes[all].current;
  });
}

int rn50_cuda_reset_peak(int device) {
  return guarded([&] { c10::getDeviceAllocator(at::kCUDA)->resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
}

// The pickle of a torch.save file (the zip format of PyTorch >= 1.6): its data.pkl, malloc'd into *out (*len bytes).
int rn50_torch_pickle(const char* path, char** out, size_t* len) {
  return guarded([&] {
    caffe2::serialize::PyTorchStreamReader reader{std::string(path)};
    TORCH_CHECK(!reader.hasRecord("constants.pkl"),
                "it is a TorchScript module (torch.jit.save, rn50 export), not weights saved with torch.save");
    auto [data, size] = reader.getRecord("data.pkl");
    *out = static_cast<char*>(std::malloc(size));
    TORCH_CHECK(*out || size == 0, "out of memory");
    std::memcpy(*out, data.get(), size);
    *len = size;
  });
}

// Unpickles `pickle` (the data.pkl of the torch.save file at `path`, as rn50 rewrote it) with that file's tensors,
// on the CPU whatever device they were saved from, and calls f(data, name, tensor) for each tensor in the result,
// `name` as each_tensor gives it ("conv1.weight" in a state_dict, "state_dict/module.conv1.weight" in pytorch/examples'
// checkpoint) and `tensor` a new heap tensor the callee owns. Python classes the pickle names (timm and
// torchvision's references save their argparse.Namespace as "args") become empty objects: they hold no weights.
int rn50_torch_unpickle(const char* path, const char* pickle, size_t len, void* data,
                        void (*f)(void*, const char*, at::Tensor*)) {
  return guarded([&] {
    caffe2::serialize::PyTorchStreamReader reader{std::string(path)};
    size_t pos = 0;
    auto read = [&](char* buf, size_t n) {
      n = std::min(n, len - pos);
      std::memcpy(buf, pickle + pos, n);
      pos += n;
      return n;
    };
    // Each record read, by the address of its bytes: its name and length. libtorch sizes a storage from the numel
    // the pickle gives, not from the record, so a record shorter than that would be read past its end.
    std::unordered_map<const void*, std::pair<std::string, size_t>> records;
    auto record = [&](const std::string& name) {
      auto [bytes, size] = reader.getRecord("data/" + name);
      records[bytes.get()] = {"data/" + name, size};
      return std::move(bytes);
    };
    auto cu = std::make_shared<torch::jit::CompilationUnit>();
    torch::jit::TypeResolver any_class = [cu](const c10::QualifiedName& name) {
      auto cls = cu->get_class(name);
      if (!cls) {
        cls = c10::ClassType::create(name, cu);
        cu->register_type(cls);
      }
      return c10::StrongTypePtr(cu, cls);
    };
    torch::jit::ObjLoader empty_object = [](const c10::StrongTypePtr& type, const c10::IValue&) {
      return c10::ivalue::Object::create(type, 0);
    };
    torch::jit::Unpickler unpickler(read, any_class, empty_object, record, at::Device(at::kCPU));
    unpickler.set_version(reader.version());
    auto value = unpickler.parse_ivalue();
    // Every tensor's storage must be exactly its record, checked before any tensor leaves: a damaged or crafted
    // file's short record would otherwise be read past its end (heap bytes as weights).
    auto check = [&](const std::string& name, const at::Tensor& t) {
      if (!t.has_storage()) return;
      const auto& storage = t.storage();
      auto it = records.find(storage.data());
      size_t have = it == records.end() ? 0 : it->second.second;
      TORCH_CHECK(storage.nbytes() == have, name, ": its storage is ", storage.nbytes() / t.element_size(), " x ",
                  t.element_size(), "-byte ", t.dtype().name(), " (", storage.nbytes(), " bytes) but its record",
                  it == records.end() ? std::string() : " " + it->second.first, " holds ", have,
                  " bytes: a damaged or crafted file");
    };
    each_tensor(value, "", 0, check);
    auto emit = [&](const std::string& name, const at::Tensor& t) { f(data, name.c_str(), new at::Tensor(t)); };
    each_tensor(value, "", 0, emit);
  });
}

}  // extern "C"
}  // namespace rn50_shim
