// rn50's profiler shim: libtorch's Kineto profiler around a few training steps, for `rn50 bench --profile`.
//
// rn50_profile_start() prepares and enables the profiler on the calling thread (CPU ops always; with `cuda`,
// CUDA activity too: kernels, memcpys and memsets timed on the GPU through CUPTI). rn50_profile_stop() disables
// it and keeps the events as a flat list the Rust side reads one by one (rn50_profile_len/rn50_profile_event)
// and frees with rn50_profile_free(). What the events mean (nesting, self time, kinds of work) is worked out
// in Rust (src/bench/profile.rs), where it can be unit-tested.
//
// Every entry point is extern "C", catches all exceptions, and reports failure as a non-zero return with the
// message available from rn50_profile_last_error() (the convention of shim.cpp).
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rn50_shim_common.h"

// rn50's shims share one translation unit (rn50shim.cpp): each file's code sits in a namespace of its own.
namespace rn50_profile {
namespace {
namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// One event as Rust sees it (#[repr(C)] struct RawEvent in src/bench/profile.rs: keep the two in step).
struct Rn50ProfileEvent {
  const char* name;    // owned by the Rn50Profile it came from
  const char* dtypes;  // an op's input dtypes, comma-separated ("float,unsigned char" for a cast's copy_)
  uint64_t start_ns;
  uint64_t duration_ns;
  uint64_t start_thread;
  uint64_t end_thread;
  uint64_t correlation;         // a CPU op's id (what kernels it launched link to)
  uint64_t linked_correlation;  // for GPU activity and runtime calls: the CPU op that launched them; else 0
  int32_t device_type;          // c10::DeviceType: 0 CPU, 1 CUDA
  uint8_t activity_type;        // libkineto::ActivityType: 0 cpu_op, 3 memcpy, 4 memset, 5 kernel, 7 runtime
  uint8_t is_async;
};

struct Rn50Profile {
  std::vector<std::string> names;
  std::vector<std::string> dtypes;
  std::vector<Rn50ProfileEvent> events;
};

std::set<ActivityType> activities(int cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda != 0) a.insert(ActivityType::CUDA);
  return a;
}
}  // namespace

extern "C" {

const char* rn50_profile_last_error() { return last_error.c_str(); }

// Starts recording on this thread (and the threads libtorch hands its state to, such as autograd's device
// threads). `cuda` != 0 adds CUDA activity, timed on the device.
int rn50_profile_start(int cuda) {
  return guarded([&] {
    // Kineto logs every start and stop (and, without a GPU, a failed CUDA device count) on stderr; it reads
    // KINETO_LOG_LEVEL when first used, and 6 is above its highest level. A level set by the user is kept.
    setenv("KINETO_LOG_LEVEL", "6", /*overwrite=*/0);
    // Input shapes and dtypes recorded: a copy_ between dtypes is how a cast is told from a copy.
    ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
    auto acts = activities(cuda);
    prof::prepareProfiler(config, acts);
    prof::enableProfiler(config, acts);
  });
}

// Stops recording; on success *out holds the events, to be freed with rn50_profile_free.
int rn50_profile_stop(Rn50Profile** out) {
  return guarded([&] {
    *out = nullptr;
    std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
    auto profile = std::make_unique<Rn50Profile>();
    if (result) {
      const auto& events = result->events();
      profile->names.reserve(events.size());
      profile->dtypes.reserve(events.size());
      profile->events.reserve(events.size());
      for (const auto& e : events) {
        if (e.isHiddenEvent()) continue;
        profile->names.push_back(e.name());
        std::string dtypes;
        if (e.hasTypes()) {
          for (const auto& d : e.dtypes()) {
            if (!dtypes.empty()) dtypes += ',';
            dtypes += d;
          }
        }
        profile->dtypes.push_back(std::move(dtypes));
        Rn50ProfileEvent ev{};
        ev.start_ns = e.startNs();
        ev.duration_ns = e.durationNs();
        ev.start_thread = e.startThreadId();
        ev.end_thread = e.endThreadId();
        ev.correlation = e.correlationId();
        ev.linked_correlation = e.linkedCorrelationId();
        ev.device_type = static_cast<int32_t>(e.deviceType());
        ev.activity_type = e.activityType();
        ev.is_async = e.isAsync() ? 1 : 0;
        profile->events.push_back(ev);
      }
      // Strings are pointed at only once their vectors stop growing.
      for (size_t i = 0; i < profile->events.size(); ++i) {
        profile->events[i].name = profile->names[i].c_str();
        profile->events[i].dtypes = profile->dtypes[i].c_str();
      }
    }
    *out = profile.release();
  });
}

size_t rn50_profile_len(const Rn50Profile* p) { return p ? p->events.size() : 0; }

// The i-th event (i < rn50_profile_len); its strings live as long as the profile.
int rn50_profile_event(const Rn50Profile* p, size_t i, Rn50ProfileEvent* out) {
  return guarded([&] {
    TORCH_CHECK(p != nullptr && i < p->events.size(), "profile event ", i, " out of range");
    *out = p->events[i];
  });
}

void rn50_profile_free(Rn50Profile* p) { delete p; }

}  // extern "C"
}  // namespace rn50_profile
