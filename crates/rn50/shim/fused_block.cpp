// The ResNet bottleneck with its batch norms folded into the convolutions, as NVIDIA's MLPerf ResNet-50 runs it:
// one autograd function per block whose stages are the ones cuDNN's graph API fuses.
//
// Forward, for each conv i of the block (y_i its raw output, a_i = relu(scale_i·y_i + bias_i) the activation the
// next conv reads, never stored):
//   conv_stats   y_i = conv(a_{i-1}) with a_{i-1} recomputed from y_{i-1} as the conv loads it (prologue), and
//                the per-channel sum and sum of squares of y_i as it is written (epilogue, "genstats");
//   finalize     mean, inverse std, the running statistics (unbiased variance, momentum), and the scale and bias
//                that apply the batch norm: scale = γ·invstd, bias = β − mean·scale;
//   tail         out = relu(scale_3·y_3 + bias_3 + shortcut), shortcut = x or scale_d·y_d + bias_d.
// Backward:
//   the tail's ReLU and batch norms (PyTorch's batch-norm backward);
//   dgrad_drelu  dz_{i-1} = dgrad(dy_i) · [scale_{i-1}·y_{i-1} + bias_{i-1} > 0], the mask recomputed from the raw
//                input and the statistics, plus the batch-norm weight gradient dγ = Σ dz·x̂, dβ = Σ dz;
//   bn_input     dy_{i-1} = a·dz + b·y_{i-1} + c, the batch-norm input gradient as three per-channel coefficients
//                (cuDNN's eq_scale_dy, eq_scale_x, eq_bias): a = γ·invstd, b = −γ·invstd²·dγ/M,
//                c = γ·invstd·(invstd·mean·dγ − dβ)/M, M = N·H·W;
//   wgrad        dW_i from dy_i and a_{i-1} recomputed from y_{i-1} (prologue).
//
// Every stage has two implementations: ATen ops (any device and type: the decomposition's reference, tested on
// the CPU against PyTorch autograd of the plain block) and, in a CUDA build with the cuDNN frontend's headers, a
// cuDNN graph, built once per shape and cached. A graph cuDNN does not support for a shape (GPU generation,
// cuDNN version) runs that stage's ATen ops instead; each such fallback is reported once (rn50_block_report).
//
// rn50_bottleneck returns 0 on success, 1 on an error (message in rn50_block_last_error), 2 when the block does
// not apply to these tensors (the caller runs the separate ops).
#include "rn50_shim_common.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>

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
#include <dlfcn.h>

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

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Messages of stages that fell back to ATen ops, each kept once; drained by rn50_block_report.
std::mutex report_mutex;
std::set<std::string> reported;
std::vector<std::string> pending;

void report_once(const std::string& msg) {
  std::lock_guard<std::mutex> lock(report_mutex);
  if (reported.insert(msg).second) pending.push_back(msg);
}

// A per-channel [C] tensor shaped to broadcast against NCHW.
Tensor ch(const Tensor& t) { return t.view({1, -1, 1, 1}); }

const std::vector<int64_t> kDims{0, 2, 3};

// One batch norm of the block as the stages hand it on: fp32 [C] each, and the scale and bias in the activations'
// type for the graphs' prologues and tail (cast once per step).
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

bool graphs_wanted(const Tensor& t, bool use_graph) {
  return use_graph && t.is_cuda() && (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16);
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

Tensor tail_aten(const Tensor& y3, const Stats& s3, const Tensor& shortcut, const Stats* sd) {
  auto main = y3 * ch(s3.scale) + ch(s3.bias);
  auto side = sd ? shortcut * ch(sd->scale) + ch(sd->bias) : shortcut;
  return at::relu(main + side).to(y3.scalar_type()).contiguous(y3.suggest_memory_format());
}

// dz = dgrad(dy) masked by the ReLU of the activation recomputed from y_prev, and the batch-norm weight gradient.
std::pair<Tensor, BnGrad> dgrad_drelu_aten(const Tensor& dy, const Tensor& w, Geometry g, const Tensor& y_prev,
                                           const Stats& s) {
  auto da = std::get<0>(at::convolution_backward(dy, y_prev, w, std::nullopt, {g.stride, g.stride}, {g.pad, g.pad},
                                                 {1, 1}, false, {0, 0}, 1, {true, false, false}));
  auto pre = y_prev * ch(s.scale) + ch(s.bias);
  auto dz = at::threshold_backward(da, pre, 0).to(y_prev.scalar_type());
  auto dzf = dz.to(at::kFloat);
  auto dbeta = dzf.sum(kDims);
  auto dgamma = (dzf * (y_prev.to(at::kFloat) - ch(s.mean))).sum(kDims) * s.invstd;
  return {dz, {dgamma, dbeta}};
}

Tensor wgrad_aten(const Tensor& dy, const Tensor& input, const Tensor& w, Geometry g, const Stats* prologue) {
  auto a = prologue ? activation(input, *prologue) : input;
  return std::get<1>(at::convolution_backward(dy, a, w, std::nullopt, {g.stride, g.stride}, {g.pad, g.pad}, {1, 1},
                                              false, {0, 0}, 1, {false, true, false}));
}

// The three per-channel coefficients of the batch-norm input gradient, dy = a·dz + b·y + c.
struct InputCoefficients {
  Tensor a, b, c;
};

InputCoefficients input_coefficients(const Stats& s, const Tensor& gamma, const BnGrad& g, int64_t m) {
  auto a = gamma * s.invstd;
  auto b = -a * s.invstd * g.dgamma / static_cast<double>(m);
  auto c = a * (s.invstd * s.mean * g.dgamma - g.dbeta) / static_cast<double>(m);
  return {a, b, c};
}

Tensor bn_input_aten(const Tensor& dz, const Tensor& y, const InputCoefficients& k) {
  return (dz * ch(k.a) + y * ch(k.b) + ch(k.c)).to(y.scalar_type()).contiguous(y.suggest_memory_format());
}

// ---------------------------------------------------------------------------------------------------------------
// The stages as cuDNN graphs.

#ifdef RN50_CUDNN_GRAPH
namespace fe = cudnn_frontend;
using Attr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A built graph and its tensors in the order `run` binds pointers to them, or why it could not be built.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::vector<Attr> io;
  int64_t workspace = 0;
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
    if (st.is_good()) st = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (st.is_good()) st = g->check_support(h);
    if (st.is_good()) st = g->build_plans(h);
    if (st.is_good()) st = g->get_workspace_size(p.workspace);
    if (!st.is_good()) return st.get_message().empty() ? std::string("not supported") : st.get_message();
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

// The cached plan for `key`, built by `build` on first use. Null if it cannot be built (reported once).
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
    if (!slot->error.empty()) report_once(key + ": cuDNN graph not available (" + slot->error + "); ATen ops instead");
  }
  return slot->error.empty() ? slot.get() : nullptr;
}

void run(Plan& p, const std::vector<const Tensor*>& ts) {
  std::unordered_map<Attr, void*> pack;
  for (size_t i = 0; i < p.io.size(); ++i) pack[p.io[i]] = ts[i]->data_ptr();
  auto opts = ts[0]->options().dtype(at::kByte);
  auto ws = at::empty({std::max<int64_t>(p.workspace, 1)}, opts);
  auto st = p.graph->execute(handle(), pack, ws.data_ptr());
  if (!st.is_good()) throw std::runtime_error("cuDNN graph execution failed: " + st.get_message());
}

std::string shape_key(const char* stage, std::initializer_list<int64_t> v, at::ScalarType t) {
  std::ostringstream s;
  s << stage << " [";
  const char* sep = "";
  for (auto x : v) s << sep << x, sep = ",";
  s << "] " << (t == at::kHalf ? "fp16" : "bf16");
  return s.str();
}

std::optional<ConvOut> conv_stats_graph(const Tensor& x, const Tensor& w, Geometry g, const Stats* prologue) {
  int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), k = w.size(0), r = w.size(2);
  int64_t p = (h + 2 * g.pad - r) / g.stride + 1, q = (wd + 2 * g.pad - r) / g.stride + 1;
  auto type = x.scalar_type();
  auto key = shape_key(prologue ? "scale-bias-relu-conv-genstats" : "conv-genstats",
                       {n, c, h, wd, k, r, g.stride, g.pad}, type);
  auto* pl = plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto X = b.image("x", n, c, h, wd);
    auto W = b.filter("w", k, c, r);
    auto in = X;
    Attr S, B;
    if (prologue) {
      S = b.channels("scale", c, b.io);
      B = b.channels("bias", c, b.io);
      in = b.sbr(X, S, B);
    }
    auto Y = b.g->conv_fprop(in, W,
                             fe::graph::Conv_fprop_attributes()
                                 .set_padding({g.pad, g.pad})
                                 .set_stride({g.stride, g.stride})
                                 .set_dilation({1, 1}));
    Y->set_dim({n, k, p, q}).set_stride(nhwc(n, k, p, q));
    b.out(Y, b.io);
    auto [SUM, SQ] = b.g->genstats(Y, fe::graph::Genstats_attributes());
    b.out(SUM, fe::DataType_t::FLOAT);
    b.out(SQ, fe::DataType_t::FLOAT);
    pl.io = {X, W, Y, SUM, SQ};
    if (prologue) pl.io.insert(pl.io.end(), {S, B});
    return b.finish(pl, hd);
  });
  if (!pl) return std::nullopt;
  auto y = at::empty({n, k, p, q}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  auto sum = at::empty({k}, x.options().dtype(at::kFloat));
  auto sumsq = at::empty({k}, x.options().dtype(at::kFloat));
  if (prologue) {
    run(*pl, {&x, &w, &y, &sum, &sumsq, &prologue->io_scale, &prologue->io_bias});
  } else {
    run(*pl, {&x, &w, &y, &sum, &sumsq});
  }
  return ConvOut{y, sum, sumsq};
}

std::optional<Stats> finalize_graph(const ConvOut& co, const Tensor& gamma, const Tensor& beta,
                                    const Tensor& running_mean, const Tensor& running_var, double momentum,
                                    double eps) {
  int64_t c = co.sum.size(0), m = count(co.y);
  auto key = shape_key("bn-finalize", {c, m}, co.y.scalar_type());
  auto* pl = plan(key, [&](Plan& pl, cudnnHandle_t hd) {
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
  if (!pl) return std::nullopt;
  auto e = [&] { return at::empty({c}, co.sum.options()); };
  Stats s{e(), e(), e(), e(), {}, {}};
  auto next_mean = e(), next_var = e();
  run(*pl, {&co.sum, &co.sumsq, &gamma, &beta, &running_mean, &running_var, &s.scale, &s.bias, &s.mean, &s.invstd,
            &next_mean, &next_var});
  running_mean.copy_(next_mean);
  running_var.copy_(next_var);
  return s;
}

std::optional<Tensor> tail_graph(const Tensor& y3, const Stats& s3, const Tensor& shortcut, const Stats* sd) {
  int64_t n = y3.size(0), k = y3.size(1), p = y3.size(2), q = y3.size(3);
  auto type = y3.scalar_type();
  auto key = shape_key(sd ? "scale-bias-add-scale-bias-relu" : "scale-bias-add-relu", {n, k, p, q}, type);
  auto* pl = plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto Y = b.image("y", n, k, p, q), S = b.channels("scale", k, b.io), B = b.channels("bias", k, b.io);
    auto R = b.image("shortcut", n, k, p, q);
    auto main = b.pw(fe::PointwiseMode_t::ADD, b.pw(fe::PointwiseMode_t::MUL, Y, S), B);
    auto side = R;
    Attr SD, BD;
    if (sd) {
      SD = b.channels("scale_d", k, b.io);
      BD = b.channels("bias_d", k, b.io);
      side = b.pw(fe::PointwiseMode_t::ADD, b.pw(fe::PointwiseMode_t::MUL, R, SD), BD);
    }
    auto OUT = b.relu(b.pw(fe::PointwiseMode_t::ADD, main, side));
    OUT->set_dim({n, k, p, q}).set_stride(nhwc(n, k, p, q));
    b.out(OUT, b.io);
    pl.io = {Y, S, B, R, OUT};
    if (sd) pl.io.insert(pl.io.end(), {SD, BD});
    return b.finish(pl, hd);
  });
  if (!pl) return std::nullopt;
  auto out = at::empty_like(y3, at::MemoryFormat::ChannelsLast);
  if (sd) {
    run(*pl, {&y3, &s3.io_scale, &s3.io_bias, &shortcut, &out, &sd->io_scale, &sd->io_bias});
  } else {
    run(*pl, {&y3, &s3.io_scale, &s3.io_bias, &shortcut, &out});
  }
  return out;
}

std::optional<std::pair<Tensor, BnGrad>> dgrad_drelu_graph(const Tensor& dy, const Tensor& w, Geometry g,
                                                           const Tensor& y_prev, const Stats& s,
                                                           const Tensor& gamma, const Tensor& beta) {
  int64_t n = y_prev.size(0), c = y_prev.size(1), h = y_prev.size(2), wd = y_prev.size(3);
  int64_t k = dy.size(1), p = dy.size(2), q = dy.size(3), r = w.size(2);
  auto type = dy.scalar_type();
  auto key = shape_key("dgrad-drelu-dbn-weight", {n, c, h, wd, k, r, g.stride, g.pad}, type);
  auto* pl = plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe::DataType_t::FLOAT);
    auto f = fe::DataType_t::FLOAT;
    auto DY = b.image("dy", n, k, p, q);
    auto W = b.filter("w", k, c, r);
    auto DG = b.g->conv_dgrad(DY, W,
                              fe::graph::Conv_dgrad_attributes()
                                  .set_padding({g.pad, g.pad})
                                  .set_stride({g.stride, g.stride})
                                  .set_dilation({1, 1}));
    DG->set_dim({n, c, h, wd});
    auto X = b.image("y_prev", n, c, h, wd);
    auto M = b.channels("mean", c, f), V = b.channels("invstd", c, f);
    auto G = b.channels("gamma", c, f), BE = b.channels("beta", c, f);
    auto xhat = b.pw(fe::PointwiseMode_t::MUL, b.pw(fe::PointwiseMode_t::SUB, X, M), V);
    auto pre = b.pw(fe::PointwiseMode_t::ADD, b.pw(fe::PointwiseMode_t::MUL, xhat, G), BE);
    auto DZ = b.pw(fe::PointwiseMode_t::RELU_BWD, DG, pre);
    DZ->set_dim({n, c, h, wd}).set_stride(nhwc(n, c, h, wd));
    b.out(DZ, b.io);
    auto [DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B] = b.g->dbn_weight(DZ, X, M, V, G, fe::graph::DBN_weight_attributes());
    for (auto& t : {DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B}) b.out(t, f);
    pl.io = {DY, W, X, M, V, G, BE, DZ, DGAMMA, DBETA, EQ_DY, EQ_X, EQ_B};
    return b.finish(pl, hd);
  });
  if (!pl) return std::nullopt;
  auto dz = at::empty_like(y_prev, at::MemoryFormat::ChannelsLast);
  auto e = [&] { return at::empty({c}, s.mean.options()); };
  BnGrad grad{e(), e()};
  // cuDNN's own input-gradient coefficients are computed too (the graph needs every output bound); rn50 derives
  // them from dγ and dβ (input_coefficients), one definition for both implementations.
  auto eq_dy = e(), eq_x = e(), eq_b = e();
  run(*pl, {&dy, &w, &y_prev, &s.mean, &s.invstd, &gamma, &beta, &dz, &grad.dgamma, &grad.dbeta, &eq_dy, &eq_x,
            &eq_b});
  return std::make_pair(dz, grad);
}

std::optional<Tensor> wgrad_sbr_graph(const Tensor& dy, const Tensor& y_prev, const Tensor& w, Geometry g,
                                      const Stats& s) {
  int64_t n = y_prev.size(0), c = y_prev.size(1), h = y_prev.size(2), wd = y_prev.size(3);
  int64_t k = dy.size(1), p = dy.size(2), q = dy.size(3), r = w.size(2);
  auto type = dy.scalar_type();
  auto key = shape_key("scale-bias-relu-wgrad", {n, c, h, wd, k, r, g.stride, g.pad}, type);
  auto* pl = plan(key, [&](Plan& pl, cudnnHandle_t hd) {
    Builder b(fe_type(type), fe_type(type));
    auto X = b.image("y_prev", n, c, h, wd);
    auto S = b.channels("scale", c, b.io), B = b.channels("bias", c, b.io);
    auto DY = b.image("dy", n, k, p, q);
    auto DW = b.g->conv_wgrad(DY, b.sbr(X, S, B),
                              fe::graph::Conv_wgrad_attributes()
                                  .set_padding({g.pad, g.pad})
                                  .set_stride({g.stride, g.stride})
                                  .set_dilation({1, 1}));
    DW->set_dim({k, c, r, r}).set_stride({c * r * r, 1, c * r, c});
    b.out(DW, b.io);
    pl.io = {DY, X, S, B, DW};
    return b.finish(pl, hd);
  });
  if (!pl) return std::nullopt;
  auto dw = at::empty_like(w, at::MemoryFormat::ChannelsLast);
  run(*pl, {&dy, &y_prev, &s.io_scale, &s.io_bias, &dw});
  return dw;
}

std::optional<Tensor> bn_input_graph(const Tensor& dz, const Tensor& y, const InputCoefficients& kf) {
  int64_t n = y.size(0), c = y.size(1), h = y.size(2), w = y.size(3);
  auto type = y.scalar_type();
  auto key = shape_key("bn-input-gradient", {n, c, h, w}, type);
  auto* pl = plan(key, [&](Plan& pl, cudnnHandle_t hd) {
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
  if (!pl) return std::nullopt;
  auto dy = at::empty_like(y, at::MemoryFormat::ChannelsLast);
  run(*pl, {&dz, &y, &kf.a, &kf.b, &kf.c, &dy});
  return dy;
}
#endif  // RN50_CUDNN_GRAPH

// ---------------------------------------------------------------------------------------------------------------
// Each stage: its cuDNN graph where wanted and built, else its ATen ops.

ConvOut conv_stats(const Tensor& x, const Tensor& w, Geometry g, const Stats* prologue, bool graph) {
#ifdef RN50_CUDNN_GRAPH
  if (graphs_wanted(x, graph))
    if (auto r = conv_stats_graph(x, w, g, prologue)) return *r;
#endif
  return conv_stats_aten(x, w, g, prologue);
}

Stats finalize(const ConvOut& c, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
               const Tensor& running_var, double momentum, double eps, bool graph) {
#ifdef RN50_CUDNN_GRAPH
  if (graphs_wanted(c.y, graph))
    if (auto r = finalize_graph(c, gamma, beta, running_mean, running_var, momentum, eps)) return *r;
#endif
  return finalize_aten(c, gamma, beta, running_mean, running_var, momentum, eps);
}

Tensor tail(const Tensor& y3, const Stats& s3, const Tensor& shortcut, const Stats* sd, bool graph) {
#ifdef RN50_CUDNN_GRAPH
  if (graphs_wanted(y3, graph))
    if (auto r = tail_graph(y3, s3, shortcut, sd)) return *r;
#endif
  return tail_aten(y3, s3, shortcut, sd);
}

std::pair<Tensor, BnGrad> dgrad_drelu(const Tensor& dy, const Tensor& w, Geometry g, const Tensor& y_prev,
                                      const Stats& s, const Tensor& gamma, const Tensor& beta, bool graph) {
#ifdef RN50_CUDNN_GRAPH
  if (graphs_wanted(dy, graph))
    if (auto r = dgrad_drelu_graph(dy, w, g, y_prev, s, gamma, beta)) return *r;
#endif
  return dgrad_drelu_aten(dy, w, g, y_prev, s);
}

Tensor wgrad(const Tensor& dy, const Tensor& input, const Tensor& w, Geometry g, const Stats* prologue, bool graph) {
#ifdef RN50_CUDNN_GRAPH
  // A plain wgrad is PyTorch's own (cuDNN underneath); the graph earns its place with the prologue.
  if (prologue && graphs_wanted(dy, graph))
    if (auto r = wgrad_sbr_graph(dy, input, w, g, *prologue)) return *r;
#endif
  return wgrad_aten(dy, input, w, g, prologue);
}

Tensor bn_input(const Tensor& dz, const Tensor& y, const InputCoefficients& k, bool graph) {
#ifdef RN50_CUDNN_GRAPH
  if (graphs_wanted(y, graph))
    if (auto r = bn_input_graph(dz, y, k)) return *r;
#endif
  return bn_input_aten(dz, y, k);
}

// ---------------------------------------------------------------------------------------------------------------
// The block.

// Parameters in the order the caller passes them: conv weights (fp32) conv1, conv2, conv3[, downsample], then
// γ, β of bn1, bn2, bn3[, downsample]. Buffers: running mean, var of each batch norm in the same order.
struct Layout {
  bool downsample;
  size_t convs() const { return downsample ? 4 : 3; }
  const Tensor& gamma(const at::TensorList& p, size_t i) const { return p[convs() + 2 * i]; }
  const Tensor& beta(const at::TensorList& p, size_t i) const { return p[convs() + 2 * i + 1]; }
};

// The conv geometry of unit i: conv1 1x1, conv2 3x3 with the block's stride (v1.5), conv3 1x1, downsample 1x1/s.
Geometry geometry(size_t i, int64_t stride) {
  switch (i) {
    case 1:
      return {stride, 1};
    case 3:
      return {stride, 0};
    default:
      return {1, 0};
  }
}

// Stats in the saved-tensor list, kStats tensors each.
constexpr size_t kStats = 6;
void save(std::vector<Tensor>& saved, const Stats& s) {
  saved.insert(saved.end(), {s.mean, s.invstd, s.scale, s.bias, s.io_scale, s.io_bias});
}
Stats load(const std::vector<Tensor>& saved, size_t o) {
  return {saved[o], saved[o + 1], saved[o + 2], saved[o + 3], saved[o + 4], saved[o + 5]};
}

// Autocast off inside the block: every stage runs in the types it is written for.
struct NoAutocast {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autocast_dispatch_keyset};
};

struct Bottleneck : public torch::autograd::Function<Bottleneck> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, at::TensorList params,
                        std::vector<Tensor> buffers, int64_t stride, double momentum, double eps, bool graph) {
    NoAutocast no_autocast;
    Layout l{params.size() == 12};
    auto type = x.scalar_type();
    auto fmt = x.suggest_memory_format();
    std::vector<Tensor> w;
    for (size_t i = 0; i < l.convs(); ++i) w.push_back(params[i].to(type).contiguous(fmt));
    auto bn = [&](size_t i, const ConvOut& c) {
      auto s = finalize(c, l.gamma(params, i), l.beta(params, i), buffers[2 * i], buffers[2 * i + 1], momentum,
                        eps, graph);
      s.io_scale = s.scale.to(type);
      s.io_bias = s.bias.to(type);
      return s;
    };
    auto c1 = conv_stats(x, w[0], geometry(0, stride), nullptr, graph);
    auto s1 = bn(0, c1);
    auto c2 = conv_stats(c1.y, w[1], geometry(1, stride), &s1, graph);
    auto s2 = bn(1, c2);
    auto c3 = conv_stats(c2.y, w[2], geometry(2, stride), &s2, graph);
    auto s3 = bn(2, c3);
    Tensor out, yd;
    Stats sd;
    if (l.downsample) {
      auto cd = conv_stats(x, w[3], geometry(3, stride), nullptr, graph);
      sd = bn(3, cd);
      yd = cd.y;
      out = tail(c3.y, s3, yd, &sd, graph);
    } else {
      out = tail(c3.y, s3, x, nullptr, graph);
    }
    // Saved: x, the raw conv outputs, out; each batch norm's Stats (kStats tensors); the weights in x's type.
    std::vector<Tensor> saved{x, c1.y, c2.y, c3.y, out};
    for (auto* s : {&s1, &s2, &s3}) save(saved, *s);
    saved.insert(saved.end(), w.begin(), w.end());
    if (l.downsample) {
      saved.push_back(yd);
      save(saved, sd);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["graph"] = graph;
    ctx->saved_data["downsample"] = l.downsample;
    // γ and β are read again in backward; they are parameters the caller keeps alive and unchanged until then.
    ctx->saved_data["params"] = c10::List<Tensor>(std::vector<Tensor>(params.begin(), params.end()));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    NoAutocast no_autocast;
    auto saved = ctx->get_saved_variables();
    int64_t stride = ctx->saved_data["stride"].toInt();
    double eps = ctx->saved_data["eps"].toDouble();
    bool graph = ctx->saved_data["graph"].toBool();
    Layout l{ctx->saved_data["downsample"].toBool()};
    auto params_list = ctx->saved_data["params"].toTensorList();
    std::vector<Tensor> params(params_list.begin(), params_list.end());
    const auto &x = saved[0], &y1 = saved[1], &y2 = saved[2], &y3 = saved[3], &out = saved[4];
    Stats s1 = load(saved, 5), s2 = load(saved, 5 + kStats), s3 = load(saved, 5 + 2 * kStats);
    size_t weights = 5 + 3 * kStats;
    std::vector<Tensor> w(saved.begin() + weights, saved.begin() + weights + l.convs());
    auto fmt = x.suggest_memory_format();
    auto dout = grads[0].to(x.scalar_type()).contiguous(fmt);

    // The tail: ReLU, then the batch norms of conv3 and the downsample (PyTorch's batch-norm backward).
    auto dtail = at::threshold_backward(dout, out, 0);
    auto bn_backward = [&](const Tensor& y, size_t i, const Stats& s) {
      auto r = at::native_batch_norm_backward(dtail, y, l.gamma(params, i), {}, {}, s.mean, s.invstd, true, eps,
                                              {true, true, true});
      return std::make_tuple(std::get<0>(r).contiguous(fmt), std::get<1>(r), std::get<2>(r));
    };
    auto [dy3, dg3, db3] = bn_backward(y3, 2, s3);

    std::vector<Tensor> dparams(params.size());
    auto set_bn = [&](size_t i, Tensor dg, Tensor db) {
      dparams[l.convs() + 2 * i] = std::move(dg);
      dparams[l.convs() + 2 * i + 1] = std::move(db);
    };
    set_bn(2, dg3, db3);

    Tensor dx_shortcut;
    if (l.downsample) {
      size_t o = weights + l.convs();
      auto [dyd, dgd, dbd] = bn_backward(saved[o], 3, load(saved, o + 1));
      set_bn(3, dgd, dbd);
      auto g = geometry(3, stride);
      auto r = at::convolution_backward(dyd, x, w[3], std::nullopt, {g.stride, g.stride}, {g.pad, g.pad}, {1, 1},
                                        false, {0, 0}, 1, {true, true, false});
      dx_shortcut = std::get<0>(r);
      dparams[3] = std::get<1>(r);
    } else {
      dx_shortcut = dtail;
    }

    // conv3 and bn2, then conv2 and bn1: wgrad with the prologue; dgrad + ReLU backward + dγ, dβ; the input
    // gradient of the batch norm.
    auto inner = [&](size_t conv, const Tensor& dy, const Tensor& y_prev, const Stats& s, size_t bn_index) {
      auto g = geometry(conv, stride);
      dparams[conv] = wgrad(dy, y_prev, w[conv], g, &s, graph);
      const auto& gamma = l.gamma(params, bn_index);
      auto [dz, bg] = dgrad_drelu(dy, w[conv], g, y_prev, s, gamma, l.beta(params, bn_index), graph);
      set_bn(bn_index, bg.dgamma, bg.dbeta);
      return bn_input(dz, y_prev, input_coefficients(s, gamma, bg, count(y_prev)), graph);
    };
    auto dy2 = inner(2, dy3, y2, s2, 1);
    auto dy1 = inner(1, dy2, y1, s1, 0);

    // conv1 reads the block's input as it is.
    auto g1 = geometry(0, stride);
    auto r1 = at::convolution_backward(dy1, x, w[0], std::nullopt, {g1.stride, g1.stride}, {g1.pad, g1.pad}, {1, 1},
                                       false, {0, 0}, 1, {true, true, false});
    dparams[0] = std::get<1>(r1);
    auto dx = std::get<0>(r1) + dx_shortcut;

    // One gradient per forward input: x, each parameter (in their own type), then buffers, stride, momentum, eps,
    // graph (none).
    variable_list result{dx};
    for (size_t i = 0; i < params.size(); ++i) result.push_back(dparams[i].to(params[i].scalar_type()));
    result.resize(1 + params.size() + 5);
    return result;
  }
};

// Why the block does not apply to these tensors, or empty if it does.
std::string not_applicable(const Tensor& x, size_t nparams, size_t nbuffers) {
  if (nparams != 9 && nparams != 12) return "not a bottleneck's parameters";
  if (nbuffers != (nparams == 12 ? 8 : 6)) return "running statistics do not match the parameters";
  if (x.dim() != 4) return "input not NCHW";
  if (x.is_cuda() && !x.is_contiguous(at::MemoryFormat::ChannelsLast)) return "not NHWC-contiguous";
  return {};
}

}  // namespace

extern "C" {

const char* rn50_block_last_error() { return last_error.c_str(); }

// relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x)) in training, as one autograd function of
// the stages above. params/buffers as in Layout; use_graph: cuDNN graphs where they build (else the ATen stages).
int rn50_bottleneck(at::Tensor* x, at::Tensor** params, size_t nparams, at::Tensor** buffers, size_t nbuffers,
                    int64_t stride, double momentum, double eps, int use_graph, at::Tensor** out) {
  auto why = not_applicable(*x, nparams, nbuffers);
  if (!why.empty()) {
    last_error = why;
    return 2;
  }
  return guarded([&] {
    auto p = gather(params, nparams);
    auto b = gather(buffers, nbuffers);
    *out = new at::Tensor(Bottleneck::apply(*x, at::TensorList(p), b, stride, momentum, eps, use_graph != 0));
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
