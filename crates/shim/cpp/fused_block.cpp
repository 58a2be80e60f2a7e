// A ResNet bottleneck, conv1 → bn1 → ReLU → conv2 → bn2 → ReLU → conv3 → bn3 (+ shortcut) → ReLU, with its batch
// norms folded into the convolutions as NVIDIA's MLPerf ResNet-50 runs them: one autograd function whose stages
// are the ones cuDNN's graph API fuses. Two reaches: the body alone (conv1 to conv3, bn1 and bn2; the caller runs
// the tail as cuDNN's per-layer fused batch norm + add + ReLU, fused_bn.cpp), or the whole block, whose tail folds
// bn3 and the projection shortcut's batch norm too (the caller falls back to the body alone where cuDNN lacks the
// tail's graphs).
//
// Forward, for conv i (y_i its raw output, a_i = relu(scale_i·y_i + bias_i) the activation the next conv reads,
// never stored):
//   conv_stats   y_i = conv(a_{i-1}) with a_{i-1} recomputed from y_{i-1} as the conv loads it (prologue), and
//                the per-channel sum and sum of squares of y_i as it is written (epilogue, "genstats");
//   finalize     mean, inverse std, the running statistics (unbiased variance, momentum), and the scale and bias
//                that apply the batch norm: scale = γ·invstd, bias = β − mean·scale;
//   tail         out = relu(scale_3·y_3 + bias_3 + r), r the shortcut as it is, or the projection conv's raw output
//                (conv_stats, finalize) times its own scale plus bias: one pass over both branches.
// Backward, from dy_3 (the body alone) or from dout:
//   tail         dz = dout·[out > 0] (the output is its own ReLU mask), then the batch-norm weight gradient of bn3
//                and of the projection's batch norm, both from dz, in one pass; their input gradients (bn_input);
//                the projection conv's wgrad and dgrad as PyTorch runs them;
//   wgrad        dW_i from dy_i and a_{i-1} recomputed from y_{i-1} (prologue);
//   dgrad_drelu  dz_{i-1} = dgrad(dy_i) · [scale_{i-1}·y_{i-1} + bias_{i-1} > 0], the mask recomputed from the raw
//                input and the statistics, plus the batch-norm weight gradient dγ = Σ dz·x̂, dβ = Σ dz, and the
//                input gradient's three per-channel coefficients a = γ·invstd, b = −γ·invstd²·dγ/M,
//                c = γ·invstd·(invstd·mean·dγ − dβ)/M, M = N·H·W (in the cuDNN graph, its dBN-weight node's
//                eq_scale_dy, eq_scale_x and eq_bias outputs, in the same pass);
//   bn_input     dy_{i-1} = a·dz + b·y_{i-1} + c, the batch-norm input gradient;
//   conv1's wgrad and dgrad as PyTorch runs them (its input is the block's, already activated).
//
// Every stage has two implementations: ATen ops (any device and type: the decomposition's reference, tested on
// the CPU against PyTorch autograd of the plain block) and, in a CUDA build with the cuDNN frontend's headers, a
// cuDNN graph, built once per shape and cached. On CUDA every graph of a block's shape is built before its first
// use; if cuDNN supports one of them not (GPU generation, cuDNN version, bf16), the block declines, said once
// (rn50_block_report).
//
// rn50_bottleneck returns 0 on success, 1 on an error (message in rn50_block_last_error), 2 when the block does
// not apply to these tensors (the caller runs the per-layer ops).
#include "rn50_shim_common.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#if defined(RN50_CUDA) && __has_include(<cudnn_frontend.h>)
#define RN50_CUDNN_GRAPH 1
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAFunctions.h>
#include <dlfcn.h>

#include <chrono>

#include <memory>
#include <unordered_map>
// The frontend reaches cuDNN and the CUDA runtime through dlsym on the copies libtorch_cuda already loaded.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>
#pragma weak cudnnSetStream
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

// rn50's shims share one translation unit (rn50shim.cpp): each file's code sits in a namespace of its own.
namespace rn50_fused_block {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Shapes the body declined because cuDNN lacks one of their graphs, each said once; drained by rn50_block_report.
std::mutex report_mutex;
std::set<std::string> reported;
std::vector<std::string> pending;

void report_once(const std::string& msg) {
  std::lock_guard<std::mutex> lock(report_mutex);
  if (reported.insert(msg).second) pending.push_back(msg);
}

// guarded() for an entry point that may decline: `f` returns why it does not apply (2, kept as the last error) or
// nothing (0); an exception is 1.
template <typename F>
int guarded_applicable(F&& f) {
  std::string why;
  int rc = guarded([&] { why = f(); });
  if (rc == 0 && !why.empty()) {
    last_error = why;
    return 2;
  }
  return rc;
}

// A per-channel [C] tensor shaped to broadcast against NCHW.
Tensor ch(const Tensor& t) { return t.view({1, -1, 1, 1}); }

const std::vector<int64_t> kDims{0, 2, 3};

// One batch norm of the body as the stages hand it on: fp32 [C] each, and the scale and bias in the activations'
// type for the graphs' prologues (cast once per step).
struct Stats {
  Tensor mean, invstd, scale, bias;  // scale = γ·invstd, bias = β − mean·scale
  Tensor io_scale, io_bias;
};

// A convolution's output with its per-channel sum and sum of squares (fp32 [K]).
struct ConvOut {
  Tensor y, sum, sumsq;
};

// The batch-norm weight gradient of one batch norm, fp32 [C].
struct BnGrad {
  Tensor dgamma, dbeta;
};

struct Geometry {
  int64_t stride, pad;
};

int64_t count(const Tensor& y) { return y.size(0) * y.size(2) * y.size(3); }

// The conv geometry of conv i of the body: conv1 1x1, conv2 3x3 with the block's stride (v1.5), conv3 1x1.
Geometry geometry(size_t i, int64_t stride) { return i == 1 ? Geometry{stride, 1} : Geometry{1, 0}; }

// How many execution plans each cuDNN graph builds and times on its first run (rn50_block_set_plans).
constexpr int64_t kDefaultPlans = 4;
std::atomic<int64_t> max_plans{kDefaultPlans};

// The shape of one convolution of the body: input [n, c, h, w], filter [k, c, r, r].
struct ConvShape {
  int64_t n, c, h, w, k, r;
  Geometry g;
  int64_t p() const { return (h + 2 * g.pad - r) / g.stride + 1; }
  int64_t q() const { return (w + 2 * g.pad - r) / g.stride + 1; }
  static ConvShape of(const Tensor& x, const Tensor& w, Geometry g) {
    return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), g};
  }
};

// The shapes of the body's three convolutions for input x, weights w1, w2, w3 and the stride on conv2.
std::array<ConvShape, 3> body_shapes(const Tensor& x, at::TensorList w, int64_t stride) {
  auto s1 = ConvShape::of(x, w[0], geometry(0, stride));
  ConvShape s2{s1.n, s1.k, s1.p(), s1.q(), w[1].size(0), w[1].size(2), geometry(1, stride)};
  ConvShape s3{s2.n, s2.k, s2.p(), s2.q(), w[2].size(0), w[2].size(2), geometry(2, stride)};
  return {s1, s2, s3};
}

// Whether the stages of a body whose input is t would be cuDNN graphs: fp16/bf16 on CUDA.
bool graph_input(const Tensor& t) {
  return t.is_cuda() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
}

// ---------------------------------------------------------------------------------------------------------------
// The stages in ATen ops: the reference decomposition.

// relu(scale·y + bias) in y's type: the activation a prologue recomputes.
Tensor activation(const Tensor& y, const Stats& s) {
  return at::relu(y * ch(s.scale) + ch(s.bias)).to(y.scalar_type());
}

ConvOut conv_stats_aten(const Tensor& x, const Tensor& w, Geometry g, const Stats* prologue) {
  auto a = prologue ? activation(x, *prologue) : x;
  auto y = at::convolution(a, w, {}, {g.stride, g.stride}, {g.pad, g.pad}, {1, 1}, false, {0, 0}, 1);
  auto yf = y.to(at::kFloat);
  return {y, yf.sum(kDims), yf.square().sum(kDims)};
}

// Updates running_mean and running_var in place, as batch_norm in training does.
Stats finalize_aten(const ConvOut& c, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                    const Tensor& running_var, double momentum, double eps) {
  double m = static_cast<double>(count(c.y));
  auto mean = c.sum / m;
  auto var = (c.sumsq / m - mean.square()).clamp_min(0);
  auto invstd = (var + eps).rsqrt();
  auto scale = gamma * invstd;
  auto bias = beta - mean * scale;
  running_mean.mul_(1 - momentum).add_(mean, momentum);
  running_var.mul_(1 - momentum).add_(var * (m / std::max(m - 1, 1.0)), momentum);
  return {mean, invstd, scale, bias};
}

// The three per-channel coefficients of the batch-norm input gradient, dy = a·dz + b·y + c (fp32 [C]).
struct InputCoefficients {
  Tensor a, b, c;
};

// One batch norm's backward up to its input gradient: dz, the gradient at its output (the ReLU's mask applied),
// its weight gradient, and the coefficients that turn dz into the gradient at its input.
struct BnBackward {
  Tensor dz;
  BnGrad grad;
  InputCoefficients k;
};

// The batch-norm backward from dz, the gradient at its output: its weight gradient and the coefficients that turn
// dz into the gradient at its input (y its input, s its statistics).
BnBackward bn_weight_aten(const Tensor& dz, const Tensor& y, const Stats& s, const Tensor& gamma) {
  auto dzf = dz.to(at::kFloat);
  auto dbeta = dzf.sum(kDims);
  auto dgamma = (dzf * (y.to(at::kFloat) - ch(s.mean))).sum(kDims) * s.invstd;
  double m = static_cast<double>(count(y));
  auto a = gamma * s.invstd;
  auto b = -a * s.invstd * dgamma / m;
  auto c = a * (s.invstd * s.mean * dgamma - dbeta) / m;
  return {dz, {dgamma, dbeta}, {a, b, c}};
}

// dz = dgrad(dy) masked by the ReLU of the activation recomputed from y_prev, then the batch norm's backward.
BnBackward dgrad_drelu_aten(const Tensor& dy, const Tensor& w, Geometry g, const Tensor& y_prev, const Stats& s,
                            const Tensor& gamma) {
  auto da = std::get<0>(at::convolution_backward(dy, y_prev, w, std::nullopt, {g.stride, g.stride}, {g.pad, g.pad},
                                                 {1, 1}, false, {0, 0}, 1, {true, false, false}));
  auto pre = y_prev * ch(s.scale) + ch(s.bias);
  auto dz = at::threshold_backward(da, pre, 0).to(y_prev.scalar_type());
  return bn_weight_aten(dz, y_prev, s, gamma);
}

// The block's tail reads bn3's input y3 and the shortcut: the block's input itself (identity, `norm` null), or the
// projection's raw output normalised by its own batch norm.
struct Shortcut {
  Tensor y;
  const Stats* norm;
};

// relu(scale3·y3 + bias3 + shortcut), in y3's type.
Tensor tail_aten(const Tensor& y3, const Stats& s3, const Shortcut& r) {
  auto pre = y3 * ch(s3.scale) + ch(s3.bias);
  pre = r.norm ? pre + r.y * ch(r.norm->scale) + ch(r.norm->bias) : pre + r.y;
  return at::relu(pre).to(y3.scalar_type()).contiguous(y3.suggest_memory_format());
}

// The tail's backward up to the batch norms' inputs: dz = dout where the block's output is positive (out > 0
// exactly where relu's input is), then bn3's backward and, for a projection, the shortcut batch norm's, both
// from the same dz.
struct TailBackward {
  BnBackward main, shortcut;  // `shortcut` undefined for an identity shortcut
};

TailBackward tail_backward_aten(const Tensor& dout, const Tensor& out, const Tensor& y3, const Stats& s3,
                                const Tensor& gamma3, const Shortcut& r, const Tensor& gamma_r) {
  auto dz = at::threshold_backward(dout, out, 0);
  TailBackward t{bn_weight_aten(dz, y3, s3, gamma3), {}};
  if (r.norm) t.shortcut = bn_weight_aten(dz, r.y, *r.norm, gamma_r);
  return t;
}

Tensor wgrad_aten(const Tensor& dy, const Tensor& input, const Tensor& w, Geometry g, const Stats* prologue) {
  auto a = prologue ? activation(input, *prologue) : input;
  return std::get<1>(at::convolution_backward(dy, a, w, std::nullopt, {g.stride, g.stride}, {g.pad, g.pad}, {1, 1},
                                              false, {0, 0}, 1, {false, true, false}));
}

Tensor bn_input_aten(const Tensor& dz, const Tensor& y, const InputCoefficients& k) {
  return (dz * ch(k.a) + y * ch(k.b) + ch(k.c)).to(y.scalar_type()).contiguous(y.suggest_memory_format());
}

// ---------------------------------------------------------------------------------------------------------------
// The stages as cuDNN graphs.

#ifdef RN50_CUDNN_GRAPH
namespace fe = cudnn_frontend;
using Attr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A built graph and its tensors in the order `run` binds pointers to them, or why it could not be built. Its
// execution plans: the first max_plans that cuDNN's heuristics propose and that build; the first run times
// each and keeps the fastest, as cudnn.benchmark does for PyTorch's convolutions.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<Attr> io;
  std::vector<int64_t> candidates;
  int64_t chosen = -1;
  int64_t workspace = 0;  // the largest of the candidates'
  std::string error;
};

std::mutex plans_mutex;
std::unordered_map<std::string, std::unique_ptr<Plan>> plans;

cudnnHandle_t handle() {
  auto h = at::native::getCudnnHandle();
  cudnnSetStream(h, at::cuda::getCurrentCUDAStream());
  return h;
}

std::vector<int64_t> nhwc(int64_t n, int64_t c, int64_t h, int64_t w) { return {c * h * w, 1, w * c, c}; }

fe::DataType_t fe_type(at::ScalarType t) {
  return t == at::kHalf ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

struct Builder {
  std::shared_ptr<fe::graph::Graph> g = std::make_shared<fe::graph::Graph>();
  fe::DataType_t io;
  Builder(fe::DataType_t io_type, fe::DataType_t intermediate) : io(io_type) {
    g->set_io_data_type(io_type).set_intermediate_data_type(intermediate).set_compute_data_type(
        fe::DataType_t::FLOAT);
  }
  Attr image(const char* name, int64_t n, int64_t c, int64_t h, int64_t w) {
    return g->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim({n, c, h, w}).set_stride(nhwc(n, c, h, w)));
  }
  Attr filter(const char* name, int64_t k, int64_t c, int64_t r) {
    return g->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_dim({k, c, r, r}).set_stride({c * r * r, 1, c * r, c}));
  }
  Attr channels(const char* name, int64_t c, fe::DataType_t type) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_dim({1, c, 1, 1}).set_stride({c, 1, c, c}).set_data_type(type));
  }
  Attr pw(fe::PointwiseMode_t mode, const Attr& a, const Attr& b) {
    return g->pointwise(a, b, fe::graph::Pointwise_attributes().set_mode(mode));
  }
  Attr relu(const Attr& a) {
    return g->pointwise(a, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_FWD));
  }
  // relu(x·s + b)
  Attr sbr(const Attr& x, const Attr& s, const Attr& b) {
    return relu(pw(fe::PointwiseMode_t::ADD, pw(fe::PointwiseMode_t::MUL, x, s), b));
  }
  void out(const Attr& t, fe::DataType_t type) { t->set_output(true).set_data_type(type); }

  std::string finish(Plan& p, cudnnHandle_t h) {
    auto st = g->validate();
    if (st.is_good()) st = g->build_operation_graph(h);
    int64_t wanted = max_plans.load();
    using H = fe::HeurMode_t;
    if (st.is_good()) {
      // Past the default, heuristics mode B's engine configurations too (every one cuDNN's heuristics know); where
      // cuDNN has no mode B list for the graph, mode A's and the fallback list, as by default.
      if (wanted > kDefaultPlans) st = g->create_execution_plans({H::A, H::B, H::FALLBACK});
      if (wanted <= kDefaultPlans || !st.is_good()) st = g->create_execution_plans({H::A, H::FALLBACK});
    }
    if (st.is_good()) st = g->check_support(h);
    if (!st.is_good()) return st.get_message().empty() ? std::string("not supported") : st.get_message();
    std::string why;
    for (int64_t i = 0; i < g->get_execution_plan_count() && static_cast<int64_t>(p.candidates.size()) < wanted;
         ++i) {
      int64_t ws = 0;
      auto built = g->build_plan_at_index(h, i);
      if (built.is_good()) built = g->get_workspace_size_plan_at_index(i, ws);
      if (!built.is_good()) {
        why = built.get_message();
        continue;
      }
      p.candidates.push_back(i);
      p.workspace = std::max(p.workspace, ws);
    }
    if (p.candidates.empty()) return why.empty() ? std::string("no plan builds") : why;
    p.chosen = p.candidates.size() == 1 ? p.candidates[0] : -1;
    p.graph = g;
    return {};
  }
};

bool load_cudnn() {
  if (cudnn_frontend::cudnn_dlhandle) return true;
  // libtorch_cuda has loaded libcudnn.so.9; take that copy.
  void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcudnn.so.9", RTLD_NOW);
  cudnn_frontend::cudnn_dlhandle = lib;
  return lib != nullptr;
}

// The cached plan for `key`, built by `build` on first use; its `error` says why cuDNN cannot run it.
template <typename F>
Plan* plan(const std::string& key, F&& build) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  auto& slot = plans[key];
  if (!slot) {
    slot = std::make_unique<Plan>();
    if (!load_cudnn()) {
      slot->error = "libcudnn.so.9 not loaded";
    } else {
      try {
        slot->error = build(*slot, handle());
      } catch (const std::exception& e) {
        slot->error = e.what();
      }
    }
    // cuDNN's messages run over many lines; the first says what failed.
    if (!slot->error.empty()) slot->error = key + ": " + slot->error.substr(0, slot->error.find('\n'));
  }
  return slot.get();
}

void check(fe::error_t st) {
  if (!st.is_good()) throw std::runtime_error("cuDNN graph execution failed: " + st.get_message());
}

// Times each candidate plan on these buffers (every graph here writes only its outputs, so running it again is
// harmless) and keeps the fastest; a plan that fails to run is passed over, unless every one does.
void choose(Plan& p, cudnnHandle_t h, std::unordered_map<Attr, void*>& pack, void* ws) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  if (p.chosen >= 0) return;
  double best = 0;
  fe::error_t failed;
  for (auto i : p.candidates) {
    auto st = p.graph->execute_plan_at_index(h, pack, ws, i);
    if (!st.is_good()) {
      failed = st;
      continue;
    }
    c10::cuda::device_synchronize();
    auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < 3; ++k) check(p.graph->execute_plan_at_index(h, pack, ws, i));
    c10::cuda::device_synchronize();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (p.chosen < 0 || t < best) best = t, p.chosen = i;
  }
  if (p.chosen < 0) check(failed);
}

void run(Plan& p, const std::vector<const Tensor*>& ts) {
  std::unordered_map<Attr, void*> pack;
  for (size_t i = 0; i < p.io.size(); ++i) pack[p.io[i]] = ts[i]->data_ptr();
  auto opts = ts[0]->options().dtype(at::kByte);
  auto ws = at::empty({std::max<int64_t>(p.workspace, 1)}, opts);
  auto h = handle();
  if (p.chosen < 0) choose(p, h, pack, ws.data_ptr());
  check(p.graph->execute_plan_at_index(h, pack, ws.data_ptr(), p.chosen));
}

std::string shape_key(const char* stage, std::initializer_list<int64_t> v, at::ScalarType t) {
  std::ostringstream s;
  s << stage << " [";
  const char* sep = "";
  for (auto x : v) s << sep << x, sep = ",";
  s << "] " << (t == at::kHalf ? "fp16" : "bf16");
  return s.str();
}

std::string shape_key(const char* stage, const ConvShape& s, at::ScalarType t) {
  return shape_key(stage, {s.n, s.c, s.h, s.w, s.k, s.r, s.g.stride, s.g.pad}, t);
}

// conv (with the scale-bias-ReLU prologue or without) + genstats. io: x, w, y, sum, sumsq[, scale, bias].
Plan* conv_stats_plan(const ConvShape& s, bool prologue, at::ScalarType type) {
  auto key = shape_key(prologue ? "scale-bias-relu-conv-genstats" : "conv-genstats", s, type);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto X = b.image("x", s.n, s.c, s.h, s.w);
    auto W = b.filter("w", s.k, s.c, s.r);
    auto in = X;
    Attr S, B;
    if (prologue) {
      S = b.channels("scale", s.c, b.io);
      B = b.channels("bias", s.c, b.io);
      in = b.sbr(X, S, B);
    }
    auto Y = b.g->conv_fprop(in, W,
                             fe::graph::Conv_fprop_attributes()
                                 .set_padding({s.g.pad, s.g.pad})
                                 .set_stride({s.g.stride, s.g.stride})
                                 .set_dilation({1, 1}));
    Y->set_dim({s.n, s.k, s.p(), s.q()}).set_stride(nhwc(s.n, s.k, s.p(), s.q()));
    b.out(Y, b.io);
    auto [SUM, SQ] = b.g->genstats(Y, fe::graph::Genstats_attributes());
    b.out(SUM, fe::DataType_t::FLOAT);
    b.out(SQ, fe::DataType_t::FLOAT);
    pl.io = {X, W, Y, SUM, SQ};
    if (prologue) pl.io.insert(pl.io.end(), {S, B});
    return b.finish(pl, hd);
  });
}

// BN finalize for c channels over m values each. io: sum, sumsq, γ, β, running mean, var, then scale, bias, mean,
// invstd, next running mean, var.
Plan* finalize_plan(int64_t c, int64_t m, double momentum, double eps) {
  auto key = shape_key("bn-finalize", {c, m}, at::kHalf);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe::DataType_t::FLOAT, fe::DataType_t::FLOAT);
    auto f = fe::DataType_t::FLOAT;
    auto SUM = b.channels("sum", c, f), SQ = b.channels("sq_sum", c, f);
    auto G = b.channels("gamma", c, f), BE = b.channels("beta", c, f);
    auto RM = b.channels("running_mean", c, f), RV = b.channels("running_var", c, f);
    auto EPS = b.g->tensor(static_cast<float>(eps));
    auto MOM = b.g->tensor(static_cast<float>(momentum));
    auto CNT = b.g->tensor(m);
    auto [SCALE, BIAS, MEAN, INVSTD, NRM, NRV] = b.g->bn_finalize(
        SUM, SQ, G, BE, EPS, CNT, fe::graph::BN_finalize_attributes().set_previous_running_stats(RM, RV, MOM));
    for (auto& t : {SCALE, BIAS, MEAN, INVSTD, NRM, NRV}) b.out(t, f);
    pl.io = {SUM, SQ, G, BE, RM, RV, SCALE, BIAS, MEAN, INVSTD, NRM, NRV};
    return b.finish(pl, hd);
  });
}

// dgrad + ReLU backward (activation recomputed from y_prev and the statistics) + the batch-norm weight gradient.
// s is the shape of the forward conv (input y_prev). io: dy, w, y_prev, mean, invstd, γ, β, then dz, dγ, dβ and
// cuDNN's own three input-gradient coefficients.
Plan* dgrad_drelu_plan(const ConvShape& s, at::ScalarType type) {
  auto key = shape_key("dgrad-drelu-dbn-weight", s, type);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto f = fe::DataType_t::FLOAT;
    auto DY = b.image("dy", s.n, s.k, s.p(), s.q());
    auto W = b.filter("w", s.k, s.c, s.r);
    auto DG = b.g->conv_dgrad(DY, W,
                              fe::graph::Conv_dgrad_attributes()
                                  .set_padding({s.g.pad, s.g.pad})
                                  .set_stride({s.g.stride, s.g.stride})
                                  .set_dilation({1, 1}));
    DG->set_dim({s.n, s.c, s.h, s.w});
    auto X = b.image("y_prev", s.n, s.c, s.h, s.w);
    auto M = b.channels("mean", s.c, f), V = b.channels("invstd", s.c, f);
    auto G = b.channels("gamma", s.c, f), BE = b.channels("beta", s.c, f);
    auto xhat = b.pw(fe::PointwiseMode_t::MUL, b.pw(fe::PointwiseMode_t::SUB, X, M), V);
    auto pre = b.pw(fe::PointwiseMode_t::ADD, b.pw(fe::PointwiseMode_t::MUL, xhat, G), BE);
    auto DZ = b.pw(fe::PointwiseMode_t::RELU_BWD, DG, pre);
    DZ->set_dim({s.n, s.c, s.h, s.w}).set_stride(nhwc(s.n, s.c, s.h, s.w));
    b.out(DZ, b.io);
    auto [DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B] = b.g->dbn_weight(DZ, X, M, V, G, fe::graph::DBN_weight_attributes());
    for (auto& t : {DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B}) b.out(t, f);
    pl.io = {DY, W, X, M, V, G, BE, DZ, DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B};
    return b.finish(pl, hd);
  });
}

// wgrad with the scale-bias-ReLU prologue on its input. io: dy, y_prev, scale, bias, dw.
Plan* wgrad_sbr_plan(const ConvShape& s, at::ScalarType type) {
  auto key = shape_key("scale-bias-relu-wgrad", s, type);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe_type(type));
    auto X = b.image("y_prev", s.n, s.c, s.h, s.w);
    auto S = b.channels("scale", s.c, b.io), B = b.channels("bias", s.c, b.io);
    auto DY = b.image("dy", s.n, s.k, s.p(), s.q());
    auto DW = b.g->conv_wgrad(DY, b.sbr(X, S, B),
                              fe::graph::Conv_wgrad_attributes()
                                  .set_padding({s.g.pad, s.g.pad})
                                  .set_stride({s.g.stride, s.g.stride})
                                  .set_dilation({1, 1}));
    DW->set_dim({s.k, s.c, s.r, s.r}).set_stride({s.c * s.r * s.r, 1, s.c * s.r, s.c});
    b.out(DW, b.io);
    pl.io = {DY, X, S, B, DW};
    return b.finish(pl, hd);
  });
}

// dy = a·dz + b·y + c over [n, c, h, w]. io: dz, y, a, b, c, dy.
Plan* bn_input_plan(int64_t n, int64_t c, int64_t h, int64_t w, at::ScalarType type) {
  auto key = shape_key("bn-input-gradient", {n, c, h, w}, type);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto f = fe::DataType_t::FLOAT;
    auto DZ = b.image("dz", n, c, h, w), Y = b.image("y", n, c, h, w);
    auto A = b.channels("a", c, f), B = b.channels("b", c, f), C = b.channels("c", c, f);
    auto sum = b.pw(fe::PointwiseMode_t::ADD, b.pw(fe::PointwiseMode_t::MUL, DZ, A),
                    b.pw(fe::PointwiseMode_t::MUL, Y, B));
    auto DY = b.pw(fe::PointwiseMode_t::ADD, sum, C);
    DY->set_dim({n, c, h, w}).set_stride(nhwc(n, c, h, w));
    b.out(DY, b.io);
    pl.io = {DZ, Y, A, B, C, DY};
    return b.finish(pl, hd);
  });
}

// The block's tail: out = relu(y3·scale3 + bias3 + r), r the shortcut as it is (identity) or, for a projection,
// its raw output times its own scale plus bias: one pass over both branches. io: y3, scale3, bias3, r, [scale_r,
// bias_r,] out.
Plan* tail_plan(int64_t n, int64_t c, int64_t h, int64_t w, bool projection, at::ScalarType type) {
  auto key = shape_key(projection ? "dual-scale-bias-add-relu" : "scale-bias-add-relu", {n, c, h, w}, type);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto f = fe::DataType_t::FLOAT;
    using M = fe::PointwiseMode_t;
    auto Y = b.image("y3", n, c, h, w), R = b.image("shortcut", n, c, h, w);
    auto S = b.channels("scale3", c, f), B = b.channels("bias3", c, f);
    pl.io = {Y, S, B, R};
    auto side = R;
    if (projection) {
      auto SR = b.channels("scale_r", c, f), BR = b.channels("bias_r", c, f);
      side = b.pw(M::ADD, b.pw(M::MUL, R, SR), BR);
      pl.io.insert(pl.io.end(), {SR, BR});
    }
    auto OUT = b.relu(b.pw(M::ADD, b.pw(M::ADD, b.pw(M::MUL, Y, S), B), side));
    OUT->set_dim({n, c, h, w}).set_stride(nhwc(n, c, h, w));
    b.out(OUT, b.io);
    pl.io.push_back(OUT);
    return b.finish(pl, hd);
  });
}

// The tail's backward: dz = dReLU(dout, out), then the batch-norm weight gradient (with cuDNN's input-gradient
// coefficients) of bn3 and, for a projection, of the shortcut's batch norm from the same dz. io: dout, out, y3,
// mean3, invstd3, γ3, [y_r, mean_r, invstd_r, γ_r,] then dz, dγ3, dβ3, a3, b3, c3[, dγ_r, dβ_r, a_r, b_r, c_r].
Plan* tail_backward_plan(int64_t n, int64_t c, int64_t h, int64_t w, bool projection, at::ScalarType type) {
  auto key = shape_key(projection ? "drelu-dual-dbn-weight" : "drelu-dbn-weight", {n, c, h, w}, type);
  return plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto f = fe::DataType_t::FLOAT;
    auto DOUT = b.image("dout", n, c, h, w), OUT = b.image("out", n, c, h, w);
    auto DZ = b.pw(fe::PointwiseMode_t::RELU_BWD, DOUT, OUT);
    DZ->set_dim({n, c, h, w}).set_stride(nhwc(n, c, h, w));
    b.out(DZ, b.io);
    pl.io = {DOUT, OUT};
    std::vector<Attr> outputs{DZ};
    auto weight = [&](const char* y, const char* mean, const char* invstd, const char* gamma) {
      auto X = b.image(y, n, c, h, w);
      auto M = b.channels(mean, c, f), V = b.channels(invstd, c, f), G = b.channels(gamma, c, f);
      auto [DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B] = b.g->dbn_weight(DZ, X, M, V, G, fe::graph::DBN_weight_attributes());
      for (auto& t : {DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B}) b.out(t, f);
      pl.io.insert(pl.io.end(), {X, M, V, G});
      outputs.insert(outputs.end(), {DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B});
    };
    weight("y3", "mean3", "invstd3", "gamma3");
    if (projection) weight("y_r", "mean_r", "invstd_r", "gamma_r");
    pl.io.insert(pl.io.end(), outputs.begin(), outputs.end());
    return b.finish(pl, hd);
  });
}

const Plan* first_error(std::initializer_list<const Plan*> plans) {
  for (const Plan* p : plans)
    if (!p->error.empty()) return p;
  return nullptr;
}

// Every graph of a body whose input is x (weights w1, w2, w3, the stride on conv2), built (or found) now. The
// first one cuDNN does not support, or null if it supports them all.
const Plan* first_unsupported(const Tensor& x, at::TensorList w, int64_t stride, double momentum, double eps) {
  auto type = x.scalar_type();
  auto [s1, s2, s3] = body_shapes(x, w, stride);
  return first_error({conv_stats_plan(s1, false, type), finalize_plan(s1.k, s1.n * s1.p() * s1.q(), momentum, eps),
                      conv_stats_plan(s2, true, type), finalize_plan(s2.k, s2.n * s2.p() * s2.q(), momentum, eps),
                      conv_stats_plan(s3, true, type), wgrad_sbr_plan(s3, type), dgrad_drelu_plan(s3, type),
                      bn_input_plan(s3.n, s3.c, s3.h, s3.w, type), wgrad_sbr_plan(s2, type),
                      dgrad_drelu_plan(s2, type), bn_input_plan(s2.n, s2.c, s2.h, s2.w, type)});
}

// The graphs the tail adds to that body: bn3's finalize, the tail each way, bn3's input gradient, and for a
// projection of `shortcut` (weight wd at `shortcut_stride`) its conv + genstats, finalize and input gradient.
const Plan* first_unsupported_tail(const Tensor& x, at::TensorList w, int64_t stride, const Tensor& shortcut,
                                   int64_t shortcut_stride, double momentum, double eps) {
  auto type = x.scalar_type();
  auto s3 = body_shapes(x, w, stride)[2];
  int64_t n = s3.n, c = s3.k, h = s3.p(), wd = s3.q();
  bool projection = w.size() == 4;
  if (auto* p = first_error({finalize_plan(c, n * h * wd, momentum, eps), tail_plan(n, c, h, wd, projection, type),
                             tail_backward_plan(n, c, h, wd, projection, type), bn_input_plan(n, c, h, wd, type)}))
    return p;
  if (!projection) return nullptr;
  auto sr = ConvShape::of(shortcut, w[3], Geometry{shortcut_stride, 0});
  return first_error({conv_stats_plan(sr, false, type)});
}

ConvOut conv_stats_graph(const Tensor& x, const Tensor& w, Geometry g, const Stats* prologue) {
  auto s = ConvShape::of(x, w, g);
  auto* pl = conv_stats_plan(s, prologue != nullptr, x.scalar_type());
  auto y = at::empty({s.n, s.k, s.p(), s.q()}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  auto sum = at::empty({s.k}, x.options().dtype(at::kFloat));
  auto sumsq = at::empty({s.k}, x.options().dtype(at::kFloat));
  if (prologue) {
    run(*pl, {&x, &w, &y, &sum, &sumsq, &prologue->io_scale, &prologue->io_bias});
  } else {
    run(*pl, {&x, &w, &y, &sum, &sumsq});
  }
  return ConvOut{y, sum, sumsq};
}

Stats finalize_graph(const ConvOut& co, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                     const Tensor& running_var, double momentum, double eps) {
  int64_t c = co.sum.size(0);
  auto* pl = finalize_plan(c, count(co.y), momentum, eps);
  auto e = [&] { return at::empty({c}, co.sum.options()); };
  Stats s{e(), e(), e(), e(), {}, {}};
  auto next_mean = e(), next_var = e();
  run(*pl, {&co.sum, &co.sumsq, &gamma, &beta, &running_mean, &running_var, &s.scale, &s.bias, &s.mean, &s.invstd,
            &next_mean, &next_var});
  running_mean.copy_(next_mean);
  running_var.copy_(next_var);
  return s;
}

// The input gradient's coefficients are cuDNN's own (dBN weight's eq_scale_dy, eq_scale_x, eq_bias), computed in
// the same pass as dγ and dβ.
BnBackward dgrad_drelu_graph(const Tensor& dy, const Tensor& w, Geometry g, const Tensor& y_prev, const Stats& s,
                             const Tensor& gamma, const Tensor& beta) {
  auto* pl = dgrad_drelu_plan(ConvShape::of(y_prev, w, g), dy.scalar_type());
  auto e = [&] { return at::empty({y_prev.size(1)}, s.mean.options()); };
  BnBackward out{at::empty_like(y_prev, at::MemoryFormat::ChannelsLast), {e(), e()}, {e(), e(), e()}};
  run(*pl, {&dy, &w, &y_prev, &s.mean, &s.invstd, &gamma, &beta, &out.dz, &out.grad.dgamma, &out.grad.dbeta,
            &out.k.a, &out.k.b, &out.k.c});
  return out;
}

Tensor wgrad_sbr_graph(const Tensor& dy, const Tensor& y_prev, const Tensor& w, Geometry g, const Stats& s) {
  auto* pl = wgrad_sbr_plan(ConvShape::of(y_prev, w, g), dy.scalar_type());
  auto dw = at::empty_like(w, at::MemoryFormat::ChannelsLast);
  run(*pl, {&dy, &y_prev, &s.io_scale, &s.io_bias, &dw});
  return dw;
}

Tensor bn_input_graph(const Tensor& dz, const Tensor& y, const InputCoefficients& kf) {
  auto* pl = bn_input_plan(y.size(0), y.size(1), y.size(2), y.size(3), y.scalar_type());
  auto dy = at::empty_like(y, at::MemoryFormat::ChannelsLast);
  run(*pl, {&dz, &y, &kf.a, &kf.b, &kf.c, &dy});
  return dy;
}

Tensor tail_graph(const Tensor& y3, const Stats& s3, const Shortcut& r) {
  auto* pl = tail_plan(y3.size(0), y3.size(1), y3.size(2), y3.size(3), r.norm != nullptr, y3.scalar_type());
  auto out = at::empty_like(y3, at::MemoryFormat::ChannelsLast);
  if (r.norm) {
    run(*pl, {&y3, &s3.scale, &s3.bias, &r.y, &r.norm->scale, &r.norm->bias, &out});
  } else {
    run(*pl, {&y3, &s3.scale, &s3.bias, &r.y, &out});
  }
  return out;
}

TailBackward tail_backward_graph(const Tensor& dout, const Tensor& out, const Tensor& y3, const Stats& s3,
                                 const Tensor& gamma3, const Shortcut& r, const Tensor& gamma_r) {
  auto* pl = tail_backward_plan(y3.size(0), y3.size(1), y3.size(2), y3.size(3), r.norm != nullptr,
                                y3.scalar_type());
  auto e = [&] { return at::empty({y3.size(1)}, s3.mean.options()); };
  auto dz = at::empty_like(y3, at::MemoryFormat::ChannelsLast);
  TailBackward t{{dz, {e(), e()}, {e(), e(), e()}}, {}};
  std::vector<const Tensor*> io{&dout, &out, &y3, &s3.mean, &s3.invstd, &gamma3};
  if (r.norm) {
    t.shortcut = {dz, {e(), e()}, {e(), e(), e()}};
    io.insert(io.end(), {&r.y, &r.norm->mean, &r.norm->invstd, &gamma_r});
  }
  auto outputs = [&](BnBackward& b) {
    io.insert(io.end(), {&b.grad.dgamma, &b.grad.dbeta, &b.k.a, &b.k.b, &b.k.c});
  };
  io.push_back(&dz);
  outputs(t.main);
  if (r.norm) outputs(t.shortcut);
  run(*pl, io);
  return t;
}
#endif  // RN50_CUDNN_GRAPH

// ---------------------------------------------------------------------------------------------------------------
// Each stage: its cuDNN graph (the caller checked that cuDNN supports every graph of the body) or its ATen ops.

#ifdef RN50_CUDNN_GRAPH
#define RN50_STAGE(graph, call) \
  if (graph) return call
#else
#define RN50_STAGE(graph, call)
#endif

ConvOut conv_stats(const Tensor& x, const Tensor& w, Geometry g, const Stats* prologue, bool graph) {
  RN50_STAGE(graph, conv_stats_graph(x, w, g, prologue));
  return conv_stats_aten(x, w, g, prologue);
}

Stats finalize(const ConvOut& c, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
               const Tensor& running_var, double momentum, double eps, bool graph) {
  RN50_STAGE(graph, finalize_graph(c, gamma, beta, running_mean, running_var, momentum, eps));
  return finalize_aten(c, gamma, beta, running_mean, running_var, momentum, eps);
}

BnBackward dgrad_drelu(const Tensor& dy, const Tensor& w, Geometry g, const Tensor& y_prev, const Stats& s,
                       const Tensor& gamma, const Tensor& beta, bool graph) {
  RN50_STAGE(graph, dgrad_drelu_graph(dy, w, g, y_prev, s, gamma, beta));
  return dgrad_drelu_aten(dy, w, g, y_prev, s, gamma);
}

Tensor wgrad(const Tensor& dy, const Tensor& y_prev, const Tensor& w, Geometry g, const Stats& prologue, bool graph) {
  RN50_STAGE(graph, wgrad_sbr_graph(dy, y_prev, w, g, prologue));
  return wgrad_aten(dy, y_prev, w, g, &prologue);
}

Tensor bn_input(const Tensor& dz, const Tensor& y, const InputCoefficients& k, bool graph) {
  RN50_STAGE(graph, bn_input_graph(dz, y, k));
  return bn_input_aten(dz, y, k);
}

Tensor tail(const Tensor& y3, const Stats& s3, const Shortcut& r, bool graph) {
  RN50_STAGE(graph, tail_graph(y3, s3, r));
  return tail_aten(y3, s3, r);
}

TailBackward tail_backward(const Tensor& dout, const Tensor& out, const Tensor& y3, const Stats& s3,
                           const Tensor& gamma3, const Shortcut& r, const Tensor& gamma_r, bool graph) {
  RN50_STAGE(graph, tail_backward_graph(dout, out, y3, s3, gamma3, r, gamma_r));
  return tail_backward_aten(dout, out, y3, s3, gamma3, r, gamma_r);
}

// ---------------------------------------------------------------------------------------------------------------
// The block: conv1 → bn1 → ReLU → conv2 → bn2 → ReLU → conv3, then (with the tail) bn3 + shortcut + ReLU.

// What the caller passes, told apart by the counts. Parameters: the conv weights (fp32) of conv1, conv2, conv3 and,
// for a projection shortcut, its conv; then γ, β of each batch norm: bn1, bn2, [bn3, [the shortcut's]]. Buffers:
// the running mean and var of the same batch norms.
//   body        7 parameters, 4 buffers: returns conv3's raw output; the caller runs the tail;
//   identity    9 parameters, 6 buffers: the whole block, its shortcut the `shortcut` tensor as it is;
//   projection 12 parameters, 8 buffers: the whole block, its shortcut conv + batch norm of `shortcut` (the
//               block's input, or ResNet-D's average-pooled input) at `shortcut_stride`.
struct Form {
  size_t convs, norms;
  bool tail() const { return norms > 2; }
  bool projection() const { return convs == 4; }
  size_t params() const { return convs + 2 * norms; }
  const Tensor& gamma(at::ArrayRef<Tensor> p, size_t bn) const { return p[gamma_index(bn)]; }
  const Tensor& beta(at::ArrayRef<Tensor> p, size_t bn) const { return p[gamma_index(bn) + 1]; }
  size_t gamma_index(size_t bn) const { return convs + 2 * bn; }
};
constexpr Form kForms[] = {{3, 2}, {3, 3}, {4, 4}};
// Indices of the batch norms and convs past the body's.
constexpr size_t kBn3 = 2, kShortcut = 3;

const Form* form_of(size_t nparams) {
  for (const auto& f : kForms)
    if (f.params() == nparams) return &f;
  return nullptr;
}

// Stats in the saved-tensor list, kStats tensors each.
constexpr size_t kStats = 6;
void save(std::vector<Tensor>& saved, const Stats& s) {
  saved.insert(saved.end(), {s.mean, s.invstd, s.scale, s.bias, s.io_scale, s.io_bias});
}
Stats load(const std::vector<Tensor>& saved, size_t o) {
  return {saved[o], saved[o + 1], saved[o + 2], saved[o + 3], saved[o + 4], saved[o + 5]};
}
// The saved list: x, y1, y2, w1, w2, w3, Stats of bn1 and bn2; with the tail then y3, the output, Stats of bn3;
// with a projection then its input, its raw output, its weight, the Stats of its batch norm.
constexpr size_t kSavedBody = 6 + 2 * kStats, kSavedTail = kSavedBody + 2 + kStats;

// Autocast off inside the body: every stage runs in the types it is written for.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

struct Body : public torch::autograd::Function<Body> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& shortcut, at::TensorList params,
                        std::vector<Tensor> buffers, int64_t stride, int64_t shortcut_stride, double momentum,
                        double eps, bool graph) {
    NoAutocast no_autocast;
    const Form& f = *form_of(params.size());
    auto type = x.scalar_type();
    auto fmt = x.suggest_memory_format();
    std::vector<Tensor> w;
    for (size_t i = 0; i < f.convs; ++i) w.push_back(params[i].to(type).contiguous(fmt));
    auto bn = [&](size_t i, const ConvOut& c) {
      auto s = finalize(c, f.gamma(params, i), f.beta(params, i), buffers[2 * i], buffers[2 * i + 1], momentum, eps,
                        graph);
      s.io_scale = s.scale.to(type);
      s.io_bias = s.bias.to(type);
      return s;
    };
    auto c1 = conv_stats(x, w[0], geometry(0, stride), nullptr, graph);
    auto s1 = bn(0, c1);
    auto c2 = conv_stats(c1.y, w[1], geometry(1, stride), &s1, graph);
    auto s2 = bn(1, c2);
    // Without the tail conv3's statistics go unused (the caller's fused batch norm computes bn3's): the graph is
    // the one verified with them.
    auto c3 = conv_stats(c2.y, w[2], geometry(2, stride), &s2, graph);
    std::vector<Tensor> saved{x, c1.y, c2.y, w[0], w[1], w[2]};
    save(saved, s1);
    save(saved, s2);
    auto result = c3.y;
    if (f.tail()) {
      auto s3 = bn(kBn3, c3);
      auto input = shortcut.to(type).contiguous(fmt);
      Stats sr;
      Shortcut r{input, nullptr};
      if (f.projection()) {
        auto cr = conv_stats(input, w[kShortcut], Geometry{shortcut_stride, 0}, nullptr, graph);
        sr = bn(kShortcut, cr);
        r = {cr.y, &sr};
      }
      result = tail(c3.y, s3, r, graph);
      saved.insert(saved.end(), {c3.y, result});
      save(saved, s3);
      if (f.projection()) {
        saved.insert(saved.end(), {input, r.y, w[kShortcut]});
        save(saved, sr);
      }
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["shortcut_stride"] = shortcut_stride;
    ctx->saved_data["graph"] = graph;
    // γ and β are read again in backward: parameters, unchanged until the optimizer steps after it.
    ctx->saved_data["params"] = c10::List<Tensor>(std::vector<Tensor>(params.begin(), params.end()));
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    auto saved = ctx->get_saved_variables();
    int64_t stride = ctx->saved_data["stride"].toInt();
    int64_t shortcut_stride = ctx->saved_data["shortcut_stride"].toInt();
    bool graph = ctx->saved_data["graph"].toBool();
    auto list = ctx->saved_data["params"].toTensorList();
    std::vector<Tensor> params(list.begin(), list.end());
    const Form& f = *form_of(params.size());
    const auto &x = saved[0], &y1 = saved[1], &y2 = saved[2];
    std::vector<Tensor> w{saved[3], saved[4], saved[5]};
    Stats s1 = load(saved, 6), s2 = load(saved, 6 + kStats);
    auto dresult = grads[0].to(x.scalar_type()).contiguous(x.suggest_memory_format());

    std::vector<Tensor> dparams(f.params());
    auto set_bn_grad = [&](size_t bn, const BnGrad& g) {
      dparams[f.gamma_index(bn)] = g.dgamma;
      dparams[f.gamma_index(bn) + 1] = g.dbeta;
    };
    // The gradient at conv3's output: the caller's, or through the tail, which also gives the shortcut's.
    Tensor dy3 = dresult, dshortcut;
    if (f.tail()) {
      const auto &y3 = saved[kSavedBody], &out = saved[kSavedBody + 1];
      Stats s3 = load(saved, kSavedBody + 2), sr;
      Shortcut r{Tensor(), nullptr};
      if (f.projection()) {
        sr = load(saved, kSavedTail + 3);
        r = {saved[kSavedTail + 1], &sr};
      }
      const auto& gamma_r = f.projection() ? f.gamma(params, kShortcut) : Tensor();
      auto t = tail_backward(dresult, out, y3, s3, f.gamma(params, kBn3), r, gamma_r, graph);
      set_bn_grad(kBn3, t.main.grad);
      dy3 = bn_input(t.main.dz, y3, t.main.k, graph);
      if (f.projection()) {
        set_bn_grad(kShortcut, t.shortcut.grad);
        auto dyr = bn_input(t.shortcut.dz, r.y, t.shortcut.k, graph);
        const auto &input = saved[kSavedTail], &wr = saved[kSavedTail + 2];
        auto d = at::convolution_backward(dyr, input, wr, std::nullopt, {shortcut_stride, shortcut_stride}, {0, 0},
                                          {1, 1}, false, {0, 0}, 1, {true, true, false});
        dshortcut = std::get<0>(d);
        dparams[kShortcut] = std::get<1>(d);
      } else {
        dshortcut = t.main.dz;
      }
    }

    // conv i and the batch norm before it: wgrad with the prologue; dgrad + ReLU backward + dγ, dβ; the batch
    // norm's input gradient.
    auto inner = [&](size_t conv, const Tensor& dy, const Tensor& y_prev, const Stats& s) {
      size_t bn = conv - 1;
      auto g = geometry(conv, stride);
      dparams[conv] = wgrad(dy, y_prev, w[conv], g, s, graph);
      auto b = dgrad_drelu(dy, w[conv], g, y_prev, s, f.gamma(params, bn), f.beta(params, bn), graph);
      set_bn_grad(bn, b.grad);
      return bn_input(b.dz, y_prev, b.k, graph);
    };
    auto dy2 = inner(2, dy3, y2, s2);
    auto dy1 = inner(1, dy2, y1, s1);
    // conv1 reads the block's input as it is.
    auto g1 = geometry(0, stride);
    auto r1 = at::convolution_backward(dy1, x, w[0], std::nullopt, {g1.stride, g1.stride}, {g1.pad, g1.pad}, {1, 1},
                                       false, {0, 0}, 1, {true, true, false});
    dparams[0] = std::get<1>(r1);

    // One gradient per forward input: x, the shortcut (none without the tail), each parameter (in its own type),
    // then none for buffers, stride, shortcut_stride, momentum, eps, graph.
    variable_list result{std::get<0>(r1), dshortcut};
    for (size_t i = 0; i < dparams.size(); ++i) result.push_back(dparams[i].to(params[i].scalar_type()));
    result.resize(2 + dparams.size() + 6);
    return result;
  }
};

// Why the block does not apply to these tensors (2), or empty if it does; throws (1) for tensors that cannot be
// one block's.
std::string not_applicable(const Tensor& x, const Tensor& shortcut, at::TensorList params, size_t nbuffers,
                           int64_t stride, int64_t shortcut_stride, double momentum, double eps, bool use_graph) {
  const Form* f = form_of(params.size());
  if (!f) return "not a bottleneck's parameters";
  if (nbuffers != 2 * f->norms) return "running statistics do not match the parameters";
  if (x.dim() != 4) return "input not NCHW";
  if (f->tail()) {
    auto s3 = body_shapes(x, params.slice(0, 3), stride)[2];
    std::vector<int64_t> want{s3.n, s3.k, s3.p(), s3.q()};
    auto got = f->projection() ? std::vector<int64_t>{shortcut.size(0), params[kShortcut].size(0),
                                                      (shortcut.size(2) - 1) / shortcut_stride + 1,
                                                      (shortcut.size(3) - 1) / shortcut_stride + 1}
                               : shortcut.sizes().vec();
    TORCH_CHECK(got == want, "the shortcut gives ", at::IntArrayRef(got), ", the body ", at::IntArrayRef(want));
  }
  if (!use_graph || !x.is_cuda()) return {};
#ifdef RN50_CUDNN_GRAPH
  if (!graph_input(x)) return "not fp16/bf16";
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) return "not NHWC-contiguous";
  auto w = params.slice(0, f->convs);
  if (auto* p = first_unsupported(x, w.slice(0, 3), stride, momentum, eps)) {
    report_once(p->error + " is not supported by this cuDNN: these blocks run the per-layer fused batch norm");
    return p->error;
  }
  if (f->tail()) {
    if (auto* p = first_unsupported_tail(x, w, stride, shortcut, shortcut_stride, momentum, eps)) {
      report_once(p->error + " is not supported by this cuDNN: these blocks' tails run the fused batch norm + add + "
                  "ReLU");
      return p->error;
    }
  }
  return {};
#else
  report_once("this binary was built without the cuDNN frontend's headers (the nvidia-cudnn-frontend wheel, in "
              "site-packages/include beside torch/): every block runs the per-layer fused batch norm");
  return "built without the cuDNN frontend";
#endif
}

}  // namespace

extern "C" {

const char* rn50_block_last_error() { return last_error.c_str(); }

// A bottleneck in training as one autograd function of the stages above: its body
// conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))), and with the tail relu(bn3(that) + shortcut branch). params and
// buffers as Form says; use_graph: cuDNN graphs (on CUDA: if cuDNN lacks one, the block declines with 2), else
// the ATen stages.
int rn50_bottleneck(at::Tensor* x, at::Tensor* shortcut, at::Tensor** params, size_t nparams, at::Tensor** buffers,
                    size_t nbuffers, int64_t stride, int64_t shortcut_stride, double momentum, double eps,
                    int use_graph, at::Tensor** out) {
  return guarded_applicable([&]() -> std::string {
    auto p = gather(params, nparams);
    auto b = gather(buffers, nbuffers);
    auto why = not_applicable(*x, *shortcut, p, nbuffers, stride, shortcut_stride, momentum, eps, use_graph != 0);
    if (!why.empty()) return why;
    bool graph = use_graph != 0 && graph_input(*x);
    *out = new at::Tensor(
        Body::apply(*x, *shortcut, at::TensorList(p), b, stride, shortcut_stride, momentum, eps, graph));
    return {};
  });
}

// How many of cuDNN's execution plans each graph built from now on times on its first run, the fastest kept:
// cuDNN's heuristics in order, mode A, then past the default of 4 mode B, then the fallback list.
int rn50_block_set_plans(int64_t n) {
  return guarded([&] {
    TORCH_CHECK(n >= 1, "the fused block's plans per graph: at least 1, not ", n);
    max_plans = n;
  });
}

// Whether this build has the cuDNN graph stages (a CUDA build with the cuDNN frontend's headers).
int rn50_block_graphs_compiled() {
#ifdef RN50_CUDNN_GRAPH
  return 1;
#else
  return 0;
#endif
}

// The stages that fell back to ATen ops since the last call, one per line (each reported once per process), or
// null if none. Free with rn50_free.
char* rn50_block_report() {
  std::lock_guard<std::mutex> lock(report_mutex);
  if (pending.empty()) return nullptr;
  std::string all;
  for (auto& m : pending) all += m + "\n";
  pending.clear();
  return strdup(all.c_str());
}

}  // extern "C"
}  // namespace rn50_fused_block
