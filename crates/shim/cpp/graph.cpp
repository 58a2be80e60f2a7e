// A training step as one CUDA graph: libtorch's at::cuda::CUDAGraph (the graph-safe allocator pool included) and
// the side stream a graph is warmed up and captured on, for src/step/graph.rs.
//
// What torch.cuda.graph does, in pieces the Rust side puts together:
// - rn50_side_stream_enter/exit: a stream from libtorch's pool made current on this thread after it waited for the
//   current one (`s.wait_stream(torch.cuda.current_stream())`, `with torch.cuda.stream(s)`); on exit the original
//   stream waits for it and is current again. Eager warm-up steps and the capture run inside one.
// - rn50_graph_capture_begin: a device-wide synchronize and an emptied allocator cache (as torch.cuda.graph's
//   __enter__), then capture of the current stream begins; every CUDA allocation on it from then on comes from the
//   graph's private memory pool, kept as long as the graph. Captured in cudaStreamCaptureModeThreadLocal: the
//   loader's threads keep pinning memory and copying batches while a step is captured, which the global mode
//   (torch's default) would make fail; a capture-unsafe call on this thread still fails the capture.
// - rn50_graph_capture_end: ends the capture and instantiates the graph; rn50_graph_replay launches it on the
//   current stream.
// Built without CUDA, every entry point fails with a message saying so.
//
// Every entry point is extern "C", catches all exceptions, and reports failure as a non-zero return with the
// message available from rn50_graph_last_error() (the convention of shim.cpp).
#include "rn50_shim_common.h"

#include <ATen/ATen.h>

#include <memory>

#ifdef RN50_CUDA
// The stream guard and the events are c10's device-generic ones (c10::StreamGuard, c10::Event), which reach CUDA
// through libc10_cuda: CUDA's runtime (libcudart) is not linked, and c10's CUDA-specific guard and event classes
// call it from inline code.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

// rn50's shims share one translation unit (rn50shim.cpp): each file's code sits in a namespace of its own.
namespace rn50_graph {
namespace {
#ifdef RN50_CUDA
// `after` waits (on the device) for the work queued so far on `before`.
void wait(const c10::cuda::CUDAStream& after, const c10::cuda::CUDAStream& before) {
  c10::Event done(c10::DeviceType::CUDA);
  done.record(before.unwrap());
  done.block(after.unwrap());
}
#else
void no_cuda() { throw std::runtime_error("this binary was built without CUDA (a CPU-only libtorch)"); }
#endif
}  // namespace

#ifdef RN50_CUDA
struct Rn50SideStream {
  c10::cuda::CUDAStream origin;
  c10::cuda::CUDAStream side;
  // Makes `side` the current stream (and its device the current device) on this thread; its destructor makes
  // `origin` current again.
  c10::StreamGuard guard;
  Rn50SideStream(c10::cuda::CUDAStream origin, c10::cuda::CUDAStream side)
      : origin(origin), side(side), guard(side.unwrap()) {}
};

struct Rn50Graph {
  at::cuda::CUDAGraph graph;
  bool capturing = false;
};
#else
struct Rn50SideStream {};
struct Rn50Graph {};
#endif

extern "C" {

const char* rn50_graph_last_error() { return last_error.c_str(); }

// Makes a side stream of CUDA device `device` current on this thread, after what is queued on the current stream.
int rn50_side_stream_enter(int device, Rn50SideStream** out) {
  return guarded([&] {
#ifdef RN50_CUDA
    auto index = static_cast<c10::DeviceIndex>(device);
    auto origin = c10::cuda::getCurrentCUDAStream(index);
    auto side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
    wait(side, origin);
    *out = new Rn50SideStream(origin, side);
#else
    no_cuda();
#endif
  });
}

// The stream current before `s` waits for the work queued on the side stream and is current again; frees `s`.
int rn50_side_stream_exit(Rn50SideStream* s) {
  return guarded([&] {
    std::unique_ptr<Rn50SideStream> owned(s);
#ifdef RN50_CUDA
    wait(s->origin, s->side);
#endif
  });
}

// Synchronizes the device, empties the allocator's cache and begins capturing the current stream (which must not be
// the default stream: inside rn50_side_stream_enter) into a new graph, stored in *out.
int rn50_graph_capture_begin(Rn50Graph** out) {
  return guarded([&] {
#ifdef RN50_CUDA
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    auto g = std::make_unique<Rn50Graph>();
    g->graph.capture_begin(/*pool=*/{0, 0}, cudaStreamCaptureModeThreadLocal);
    g->capturing = true;
    *out = g.release();
#else
    no_cuda();
#endif
  });
}

// Ends the capture begun by rn50_graph_capture_begin (on the same stream) and instantiates the graph. Also the
// way out of a capture whose work failed: the capture ends whether or not the graph could be made.
int rn50_graph_capture_end(Rn50Graph* g) {
  return guarded([&] {
#ifdef RN50_CUDA
    TORCH_CHECK(g->capturing, "the CUDA graph is not being captured");
    g->capturing = false;
    g->graph.capture_end();
#else
    no_cuda();
#endif
  });
}

// Launches the captured graph on the current stream.
int rn50_graph_replay(Rn50Graph* g) {
  return guarded([&] {
#ifdef RN50_CUDA
    TORCH_CHECK(!g->capturing, "the CUDA graph is still being captured");
    g->graph.replay();
#else
    no_cuda();
#endif
  });
}

void rn50_graph_free(Rn50Graph* g) { delete g; }

}  // extern "C"
}  // namespace rn50_graph
