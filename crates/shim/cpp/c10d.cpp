// rn50-distributed's C++ shim: PyTorch's c10d (TCPStore, ProcessGroupGloo, ProcessGroupNCCL, Reducer) behind a C ABI.
//
// Every entry point is extern "C", catches all exceptions and reports failure as a non-zero return with the
// message available from rn50d_last_error() (thread-local). Tensors cross the boundary as tch's `at::Tensor*`
// handles; stores, groups, work handles and reducers as opaque heap pointers freed by their *_free function.
// Nothing here implements a collective: all communication is c10d's.
#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef RN50_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "rn50_shim_common.h"

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using StorePtr = c10::intrusive_ptr<c10d::Store>;
using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

struct Store {
  StorePtr store;
};
struct Group {
  GroupPtr pg;
};
struct Work {
  WorkPtr work;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Times shared between the comm hook (called from autograd threads) and the backward call.
struct Timing {
  std::atomic<int64_t> first_launch_ns{0};
  std::atomic<int64_t> last_launch_ns{0};
  std::atomic<int64_t> launches{0};
};

// DDP's default all-reduce hook (divide by world size first, then sum, like c10d::AllReduceCommHook), plus a note
// of when each bucket was launched so that the backward call can report how long it waited for communication after
// the last bucket was handed to the process group.
class TimedAllReduceHook : public c10d::CppCommHookInterface<GroupPtr> {
 public:
  TimedAllReduceHook(GroupPtr pg, std::shared_ptr<Timing> timing)
      : c10d::CppCommHookInterface<GroupPtr>(std::move(pg)), timing_(std::move(timing)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors = {bucket.getBufferRef()};
    tensors[0].div_(state_->getSize());
    auto fut = state_->allreduce(tensors)->getFuture();
    int64_t t = now_ns(), zero = 0;
    timing_->first_launch_ns.compare_exchange_strong(zero, t);
    timing_->last_launch_ns.store(t);
    timing_->launches.fetch_add(1);
    return fut;
  }

 private:
  std::shared_ptr<Timing> timing_;
};

struct Reducer {
  std::unique_ptr<c10d::Reducer> reducer;
  std::shared_ptr<Timing> timing;
};

// ---- differentiable all-gather ---------------------------------------------------------------------------------
// torch.distributed.nn.functional.all_gather, stacked: every rank's `x` in rank order ([world, ...x's shape]),
// recorded for autograd. Backward: this rank's x was copied to every rank, so its gradient is the sum over ranks
// of the gradient of that copy: the output's gradient all-reduced (summed), this rank's row kept. Every rank must
// call it in the same order, and run its backward (forward's all-gather, backward's all-reduce).
struct AllGatherFn : public torch::autograd::Function<AllGatherFn> {
  // `group` is the Group* of the process group, which outlives every forward and backward of the model.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    auto pg = reinterpret_cast<Group*>(group)->pg;
    std::vector<at::Tensor> in = {x.contiguous()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int i = 0; i < pg->getSize(); ++i) out[0].push_back(at::empty_like(in[0]));
    pg->allgather(out, in)->wait();
    ctx->saved_data["group"] = group;
    return at::stack(out[0]);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto pg = reinterpret_cast<Group*>(ctx->saved_data["group"].toInt())->pg;
    std::vector<at::Tensor> sum = {grads[0].clone(at::MemoryFormat::Contiguous)};
    pg->allreduce(sum)->wait();
    // One gradient per forward argument: x, group.
    return {sum[0].select(0, pg->getRank()), at::Tensor()};
  }
};
}  // namespace

extern "C" {

const char* rn50d_last_error() { return last_error.c_str(); }
void rn50d_free(void* p) { std::free(p); }

// c10's log threshold (0 info, 1 warning, 2 error, 3 fatal). c10d logs every retry and timeout with a C++
// backtrace; the errors returned to Rust carry the same messages.
void rn50d_set_log_level(int level) { FLAGS_caffe2_log_level = level; }

int rn50d_cuda_compiled() {
#ifdef RN50_CUDA
  return 1;
#else
  return 0;
#endif
}

// ---- TCPStore -------------------------------------------------------------------------------------------------

// Rank 0 (is_server) listens on host:port; the others connect, retrying until timeout_ms. The store does not wait
// for all workers itself: rendezvous (who joined, who is missing) is done with keys on the Rust side so that the
// error can name the missing ranks.
// `prefix` (may be empty) namespaces every key, e.g. per torchelastic restart attempt on torchrun's agent store.
int rn50d_store_new(const char* host, int port, int is_server, int world, int64_t timeout_ms, const char* prefix,
                    void** out) {
  return guarded([&] {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = is_server != 0;
    opts.numWorkers = static_cast<std::size_t>(world);
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    StorePtr store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    std::string p = prefix ? prefix : "";
    if (!p.empty()) store = c10::make_intrusive<c10d::PrefixStore>(p, store);
    *out = new Store{store};
  });
}

// A second client connection to the same store (for the heartbeat thread: its own socket, its own timeout).
int rn50d_store_clone(void* s, void** out) {
  return guarded([&] { *out = new Store{static_cast<Store*>(s)->store->clone()}; });
}

void rn50d_store_free(void* s) { delete static_cast<Store*>(s); }

int rn50d_store_set_timeout(void* s, int64_t timeout_ms) {
  return guarded([&] { static_cast<Store*>(s)->store->setTimeout(std::chrono::milliseconds(timeout_ms)); });
}

int rn50d_store_set(void* s, const char* key, const uint8_t* data, size_t len) {
  return guarded([&] { static_cast<Store*>(s)->store->set(key, std::vector<uint8_t>(data, data + len)); });
}

// Blocks until the key exists (up to the store's timeout). *data is malloc'ed; free it with rn50d_free.
int rn50d_store_get(void* s, const char* key, uint8_t** data, size_t* len) {
  return guarded([&] {
    auto v = static_cast<Store*>(s)->store->get(key);
    *len = v.size();
    *data = static_cast<uint8_t*>(std::malloc(v.empty() ? 1 : v.size()));
    if (!*data) throw std::bad_alloc();
    if (!v.empty()) std::memcpy(*data, v.data(), v.size());
  });
}

int rn50d_store_add(void* s, const char* key, int64_t delta, int64_t* out) {
  return guarded([&] { *out = static_cast<Store*>(s)->store->add(key, delta); });
}

int rn50d_store_check(void* s, const char* key, int* exists) {
  return guarded([&] { *exists = static_cast<Store*>(s)->store->check({std::string(key)}) ? 1 : 0; });
}

int rn50d_store_wait(void* s, const char** keys, size_t n, int64_t timeout_ms) {
  return guarded([&] {
    std::vector<std::string> k(keys, keys + n);
    static_cast<Store*>(s)->store->wait(k, std::chrono::milliseconds(timeout_ms));
  });
}

// ---- process group --------------------------------------------------------------------------------------------

// backend 0: Gloo for CPU tensors. backend 1 (cuda builds only): NCCL for CUDA tensors, plus Gloo for CPU tensors
// (small metadata), like init_process_group("cpu:gloo,cuda:nccl").
// Gloo's network device: the interfaces in `ifnames` (GLOO_SOCKET_IFNAME, comma-separated) if any, else the address
// `hostname` if given, else c10d's default (this machine's hostname, falling back to loopback).
// `device`: the CUDA device of this rank for NCCL (made current; NCCL communicators are created lazily on it).
int rn50d_pg_new(void* s, int rank, int world, int backend, int64_t timeout_ms, const char* ifnames,
                 const char* hostname, int device, void** out) {
  return guarded([&] {
    auto base = static_cast<Store*>(s)->store;
    auto timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(base, rank, world);

    auto gloo_opts = c10d::ProcessGroupGloo::Options::create(timeout);
    auto ifs = split(ifnames ? ifnames : "", ',');
    std::string host = hostname ? hostname : "";
    if (!ifs.empty()) {
      for (const auto& i : ifs) gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(i));
    } else if (!host.empty()) {
      gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    } else {
      gloo_opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("rn50/gloo/", base);
    auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, rank, world, gloo_opts);
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);

    if (backend == 1) {
#ifdef RN50_CUDA
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
      auto nccl_opts = c10d::ProcessGroupNCCL::Options::create();
      nccl_opts->timeout = timeout;
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("rn50/nccl/", base);
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nccl_store, rank, world, nccl_opts);
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#else
      throw std::runtime_error("NCCL requested but rn50 was built without the `cuda` feature");
#endif
    } else {
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    }
    pg->setGroupName("0");
    *out = new Group{pg};
  });
}

void rn50d_pg_free(void* g) {
  try {
    delete static_cast<Group*>(g);
  } catch (...) {
  }
}

// op: 0 sum, 1 max, 2 min, 3 product. The work handle is written to *work.
int rn50d_allreduce(void* g, at::Tensor** ts, size_t n, int op, void** work) {
  return guarded([&] {
    auto v = gather(ts, n);
    c10d::AllreduceOptions opts;
    switch (op) {
      case 1: opts.reduceOp = c10d::ReduceOp::MAX; break;
      case 2: opts.reduceOp = c10d::ReduceOp::MIN; break;
      case 3: opts.reduceOp = c10d::ReduceOp::PRODUCT; break;
      default: opts.reduceOp = c10d::ReduceOp::SUM; break;
    }
    *work = new Work{static_cast<Group*>(g)->pg->allreduce(v, opts)};
  });
}

int rn50d_broadcast(void* g, at::Tensor** ts, size_t n, int root, void** work) {
  return guarded([&] {
    auto v = gather(ts, n);
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    *work = new Work{static_cast<Group*>(g)->pg->broadcast(v, opts)};
  });
}

// outputs: world_size tensors shaped like input, filled with every rank's input in rank order.
int rn50d_allgather(void* g, at::Tensor* input, at::Tensor** outputs, size_t n, void** work) {
  return guarded([&] {
    std::vector<std::vector<at::Tensor>> out = {gather(outputs, n)};
    std::vector<at::Tensor> in = {*input};
    *work = new Work{static_cast<Group*>(g)->pg->allgather(out, in)};
  });
}

int rn50d_barrier(void* g, void** work) {
  return guarded([&] { *work = new Work{static_cast<Group*>(g)->pg->barrier()}; });
}

// DDP's start-of-training sync: rank `root`'s tensors copied to every rank, packed into buffers of buffer_size bytes.
int rn50d_broadcast_coalesced(void* g, at::Tensor** ts, size_t n, size_t buffer_size, int root) {
  return guarded([&] {
    auto v = gather(ts, n);
    c10d::broadcast_coalesced(static_cast<Group*>(g)->pg, v, buffer_size, root);
  });
}

// Same number, shapes and dtypes of parameters on every rank (DDP's construction-time check).
int rn50d_verify_params(void* g, at::Tensor** ts, size_t n) {
  return guarded([&] {
    auto v = gather(ts, n);
    c10d::verify_params_across_processes(static_cast<Group*>(g)->pg, v, std::nullopt);
  });
}

// timeout_ms <= 0: no timeout beyond the process group's own.
int rn50d_work_wait(void* w, int64_t timeout_ms) {
  return guarded([&] {
    auto& work = static_cast<Work*>(w)->work;
    if (timeout_ms > 0) {
      work->wait(std::chrono::milliseconds(timeout_ms));
    } else {
      work->wait();
    }
  });
}

int rn50d_work_is_completed(void* w, int* done) {
  return guarded([&] { *done = static_cast<Work*>(w)->work->isCompleted() ? 1 : 0; });
}

void rn50d_work_free(void* w) {
  try {
    delete static_cast<Work*>(w);
  } catch (...) {
  }
}

// ---- DDP: c10d::Reducer ---------------------------------------------------------------------------------------

// The Reducer registers hooks on the parameters' gradient accumulators: during backward, as soon as every gradient
// of a bucket is ready the bucket is all-reduced (asynchronously, overlapping the rest of backward); the end of
// backward waits for all buckets and writes the averaged gradients back into .grad. Buckets are assigned like
// Python DDP does (first bucket first_bucket_cap bytes, then bucket_cap, in reverse parameter order) and rebuilt
// once, after the first iteration, in the order gradients actually became ready.
int rn50d_reducer_new(void* g, at::Tensor** params, size_t n, int64_t bucket_cap, int64_t first_bucket_cap,
                      int find_unused, void** out, size_t* nbuckets) {
  return guarded([&] {
    auto pg = static_cast<Group*>(g)->pg;
    auto v = gather(params, n);
    std::vector<bool> sparse(n, false);
    std::vector<size_t> limits = {static_cast<size_t>(first_bucket_cap), static_cast<size_t>(bucket_cap)};
    auto [indices, per_bucket_limits] = c10d::compute_bucket_assignment_by_size(v, limits, sparse);
    std::reverse(indices.begin(), indices.end());
    *nbuckets = indices.size();
    auto r = std::make_unique<c10d::Reducer>(v, indices, pg, sparse, bucket_cap, find_unused != 0,
                                             /*gradient_as_bucket_view=*/false,
                                             std::unordered_map<size_t, std::string>{}, first_bucket_cap,
                                             /*skip_all_reduce_unused_params=*/false,
                                             /*use_python_reducer=*/false, std::vector<int64_t>{});
    auto timing = std::make_shared<Timing>();
    r->register_comm_hook(std::make_unique<TimedAllReduceHook>(pg, timing));
    *out = new Reducer{std::move(r), timing};
  });
}

// What DDP.forward does before running the module: rebuild the buckets once (after the first backward; a
// collective), note the forward start.
int rn50d_reducer_prepare_forward(void* r, int* rebuilt) {
  return guarded([&] {
    auto& red = static_cast<Reducer*>(r)->reducer;
    *rebuilt = red->rebuild_buckets() ? 1 : 0;
    red->prepare_for_forward();
  });
}

// loss.backward() with gradient synchronisation (sync != 0; DDP's prepare_for_backward, as at the end of
// DDP.forward) or without (no_sync: gradients only accumulate locally). Reports the backward time and the
// time backward spent after the last bucket was launched: the all-reduce wait not hidden behind computation.
int rn50d_reducer_backward(void* r, at::Tensor* loss, int sync, int64_t* backward_ns, int64_t* wait_ns,
                           int64_t* first_bucket_ns, int64_t* buckets) {
  return guarded([&] {
    auto* red = static_cast<Reducer*>(r);
    red->timing->launches.store(0);
    red->timing->first_launch_ns.store(0);
    red->timing->last_launch_ns.store(0);
    if (sync != 0) red->reducer->prepare_for_backward({});
    int64_t t0 = now_ns();
    torch::autograd::backward({*loss});
    int64_t t1 = now_ns();
    int64_t first = red->timing->first_launch_ns.load();
    int64_t last = red->timing->last_launch_ns.load();
    *backward_ns = t1 - t0;
    *first_bucket_ns = first > 0 ? std::max<int64_t>(first - t0, 0) : 0;
    *wait_ns = last > 0 ? t1 - std::max(last, t0) : 0;
    *buckets = red->timing->launches.load();
  });
}

// *out = every rank's x stacked in rank order, recorded for autograd (see AllGatherFn).
int rn50d_allgather_autograd(void* g, at::Tensor* x, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(AllGatherFn::apply(*x, reinterpret_cast<int64_t>(g))); });
}

void rn50d_reducer_free(void* r) {
  try {
    delete static_cast<Reducer*>(r);
  } catch (...) {
  }
}

}  // extern "C"
