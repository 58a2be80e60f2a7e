// rn50_torch_compat.h: lets rn50 build against the PyTorch a cluster already has, 2.11, 2.12 or 2.13.
//
// .cargo/config.toml force-includes this header into every C++ file cargo compiles for rn50
// (HOST_CXXFLAGS = "-include rn50_torch_compat.h", found through CPLUS_INCLUDE_PATH = this folder), which is how it
// reaches torch-sys's C wrapper without a copy of tch's sources. It does two things, and nothing for C++ files
// compiled without libtorch's headers:
//
// 1. Refuses a libtorch outside 2.11-2.13 at the first file compiled, naming the version found (torch-sys's own
//    check only knows 2.13.0, and config.toml bypasses it so that 2.11 and 2.12 libtorch zips pass).
// 2. On 2.11, declares the 15 operators tch 0.26's generated wrapper (written for 2.13) calls and 2.11 lacks, so
//    that it compiles. They throw when called; rn50 uses none of them. 2.12 already has all 15 with 2.13's
//    signatures (checked against the torch 2.12.0 wheel's ATen/ops headers).
#pragma once

#if defined(__cplusplus) && defined(__has_include)
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#if defined(TORCH_VERSION_MAJOR) && defined(TORCH_VERSION_MINOR)
#if TORCH_VERSION_MAJOR != 2 || TORCH_VERSION_MINOR < 11 || TORCH_VERSION_MINOR > 13
#pragma message("rn50: LIBTORCH is PyTorch " TORCH_VERSION)
#error "rn50 builds against PyTorch 2.11, 2.12 or 2.13: point LIBTORCH at such a torch/ (README: Using your own PyTorch)"
#endif

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 11
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <tuple>

namespace torch {
namespace rn50_compat {
[[noreturn]] inline void missing(const char* op) {
  throw std::runtime_error(std::string(op) + " is not in PyTorch " TORCH_VERSION
                                             " (tch 0.26 was generated for 2.13; rn50 does not use it)");
}
}  // namespace rn50_compat

inline at::Tensor _philox_key_fold_in(const at::Tensor&, int64_t) { rn50_compat::missing("_philox_key_fold_in"); }
inline at::Tensor _philox_key_split(const at::Tensor&, int64_t) { rn50_compat::missing("_philox_key_split"); }
inline at::Tensor _philox_normal(const at::Tensor&, const at::Tensor&, double, double) {
  rn50_compat::missing("_philox_normal");
}
inline at::Tensor& _philox_normal_(at::Tensor&, const at::Tensor&, double, double) {
  rn50_compat::missing("_philox_normal_");
}
inline at::Tensor& _philox_normal_out(at::Tensor&, const at::Tensor&, const at::Tensor&, double, double) {
  rn50_compat::missing("_philox_normal_out");
}
inline at::Tensor _philox_uniform(const at::Tensor&, const at::Tensor&, double, double) {
  rn50_compat::missing("_philox_uniform");
}
inline at::Tensor& _philox_uniform_(at::Tensor&, const at::Tensor&, double, double) {
  rn50_compat::missing("_philox_uniform_");
}
inline at::Tensor& _philox_uniform_out(at::Tensor&, const at::Tensor&, const at::Tensor&, double, double) {
  rn50_compat::missing("_philox_uniform_out");
}
inline at::Tensor _upsample_lanczos2d_aa(const at::Tensor&, at::IntArrayRef, bool, std::optional<double>,
                                         std::optional<double>) {
  rn50_compat::missing("_upsample_lanczos2d_aa");
}
inline at::Tensor _upsample_lanczos2d_aa(const at::Tensor&, at::OptionalIntArrayRef, bool,
                                         std::optional<at::ArrayRef<double>>) {
  rn50_compat::missing("_upsample_lanczos2d_aa");
}
inline at::Tensor& _upsample_lanczos2d_aa_out(at::Tensor&, const at::Tensor&, at::IntArrayRef, bool,
                                              std::optional<double>, std::optional<double>) {
  rn50_compat::missing("_upsample_lanczos2d_aa_out");
}
inline at::Tensor _upsample_lanczos2d_aa_backward(const at::Tensor&, at::IntArrayRef, at::IntArrayRef, bool,
                                                  std::optional<double>, std::optional<double>) {
  rn50_compat::missing("_upsample_lanczos2d_aa_backward");
}
inline at::Tensor& _upsample_lanczos2d_aa_backward_out(at::Tensor&, const at::Tensor&, at::IntArrayRef,
                                                       at::IntArrayRef, bool, std::optional<double>,
                                                       std::optional<double>) {
  rn50_compat::missing("_upsample_lanczos2d_aa_backward_out");
}
inline at::Tensor _flash_attention_forward_no_dropout_inplace(
    at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, int64_t, int64_t, double, bool, bool, std::optional<double>,
    std::optional<int64_t>, std::optional<int64_t>, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, std::optional<int64_t>) {
  rn50_compat::missing("_flash_attention_forward_no_dropout_inplace");
}
// 2.13 added `enable_gqa`; without it this is 2.11's operator.
inline std::tuple<at::Tensor, at::Tensor> _scaled_dot_product_attention_math_for_mps(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
    const std::optional<at::Tensor>& dropout_mask, std::optional<double> scale, bool enable_gqa) {
  if (enable_gqa) rn50_compat::missing("_scaled_dot_product_attention_math_for_mps(enable_gqa=true)");
  return at::_scaled_dot_product_attention_math_for_mps(query, key, value, attn_mask, dropout_p, is_causal,
                                                        dropout_mask, scale);
}
}  // namespace torch
#endif  // 2.11
#endif  // TORCH_VERSION_MAJOR
#endif  // __cplusplus && __has_include
