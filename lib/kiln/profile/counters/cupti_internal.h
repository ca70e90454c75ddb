// The CUDA counter session's internals shared by its files (not installed; compiled only where
// CMake found CUPTI, with CUPTI's headers first on the include path): the session class, the
// CUPTI helpers, the host object that configures and evaluates metrics, and the launch names of
// per-kernel mode. cupti.cpp: the session (open, start, phase, stop, teardown);
// cupti_collect.cpp: decoding an interval's ranges into a CounterReading;
// cupti_metrics.cpp: the metric plan (host side, no GPU); cupti_launches.cpp:
// kernel names from CUPTI's launch callbacks. Split by job so that each reads on its own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_callbacks.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>

#include "kiln/profile/counters/counters.h"
#include "kiln/profile/counters/cupti.h"
#include "kiln/profile/counters/kernel_components.h"

namespace kiln::profile::cupti {

// A CUPTI or CUDA failure, carried to the session's boundary as its one-line reason.
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failed CUPTI call as a one-line reason, and the checks that throw Unavailable for a failed
// CUPTI or CUDA call (cupti.cpp).
std::string failure(const char* call, CUptiResult r);
void check(const char* call, CUptiResult r);
void check_cuda(const char* call, cudaError_t e);

// A CUPTI parameter struct: zeroed, with its size set (what every CUPTI call checks first).
template <typename T>
T params(size_t struct_size) {
  T p{};
  p.structSize = struct_size;
  return p;
}
#define KILN_CUPTI_PARAMS(type) params<type>(type##_STRUCT_SIZE)

// ---- host side: metric configuration and evaluation ------------------------------------------

class HostObject {
 public:
  HostObject(const std::string& chip, const std::vector<uint8_t>& availability) {
    auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_Initialize_Params);
    p.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    p.pChipName = chip.c_str();
    p.pCounterAvailabilityImage = availability.empty() ? nullptr : availability.data();
    status_ = cuptiProfilerHostInitialize(&p);
    if (status_ == CUPTI_SUCCESS) object_ = p.pHostObject;
  }
  ~HostObject() {
    if (object_) {
      auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_Deinitialize_Params);
      p.pHostObject = object_;
      cuptiProfilerHostDeinitialize(&p);
    }
  }
  HostObject(const HostObject&) = delete;
  HostObject& operator=(const HostObject&) = delete;

  CUptiResult status() const { return status_; }
  CUpti_Profiler_Host_Object* get() const { return object_; }

  CUptiResult add(const std::vector<std::string>& metrics) {
    std::vector<const char*> names;
    for (const std::string& m : metrics) names.push_back(m.c_str());
    auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_ConfigAddMetrics_Params);
    p.pHostObject = object_;
    p.ppMetricNames = names.data();
    p.numMetrics = names.size();
    return cuptiProfilerHostConfigAddMetrics(&p);
  }

  CUptiResult config_image(std::vector<uint8_t>* image) {
    auto s = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImageSize_Params);
    s.pHostObject = object_;
    if (CUptiResult r = cuptiProfilerHostGetConfigImageSize(&s); r != CUPTI_SUCCESS) return r;
    image->assign(s.configImageSize, 0);
    auto g = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImage_Params);
    g.pHostObject = object_;
    g.configImageSize = image->size();
    g.pConfigImage = image->data();
    return cuptiProfilerHostGetConfigImage(&g);
  }

  // The metric's dimension unit ("nanosecond", "byte", "percent"), "" when CUPTI does not say.
  std::string unit(const std::string& metric) const {
    auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_GetMetricProperties_Params);
    p.pHostObject = object_;
    p.pMetricName = metric.c_str();
    if (cuptiProfilerHostGetMetricProperties(&p) != CUPTI_SUCCESS || p.pDimUnit == nullptr) return "";
    return p.pDimUnit;
  }

 private:
  CUptiResult status_ = CUPTI_ERROR_UNKNOWN;
  CUpti_Profiler_Host_Object* object_ = nullptr;
};

// Builds the config image of `metrics`: CUPTI_SUCCESS and the passes it needs, or the failure.
CUptiResult try_config(const std::string& chip, const std::vector<uint8_t>& availability,
                       const std::vector<std::string>& metrics, std::vector<uint8_t>* image, size_t* passes);

// ---- kernel names from the launch callbacks ----------------------------------------------------

struct LaunchNames {
  std::mutex mutex;
  std::vector<std::string> names;  // mangled, in launch order
  std::vector<int> phases;         // per launch: the phase current at it (-1: before the first phase())
  std::vector<LaunchSite> sites;   // per launch: what ran on the launching thread (its component)
  CUcontext context = nullptr;
  std::atomic<uint64_t> interval{0};  // which start() the callbacks belong to
  std::atomic<int> phase{-1};         // the current phase's index (CuptiSession::phase)
};

// Per kernel, in cupti_launches.cpp: the launch callback (userdata: a LaunchNames), the
// launch APIs it is enabled for, and a kernel's name from its mangled symbol.
void CUPTIAPI on_launch(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data);
const std::vector<std::pair<CUpti_CallbackDomain, CUpti_CallbackId>>& launch_callbacks();
std::string kernel_name(const std::string& mangled);

// The session (cupti.cpp; collect() in cupti_collect.cpp).
class CuptiSession final : public CounterSession {
 public:
  CuptiSession(const c10::Device& device, double peak_bandwidth, const CounterOptions& options);
  ~CuptiSession() override { close(); }

  bool available() const override { return reason_.empty(); }
  std::string reason() const override { return reason_; }

  void start() override;
  void phase(const std::string& name) override;
  CounterReading stop() override;

 private:
  static double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  int64_t range_capacity() const { return per_kernel_ ? max_kernels_ : phases_ ? max_phase_ranges_ : 1; }
  CUpti_ProfilerReplayMode replay_mode() const;
  std::string replay_name() const { return replay_ == CUPTI_UserReplay ? "user replay" : "kernel replay"; }

  void open(const c10::Device& device);
  void push_range(const char* name);
  CUptiResult pop_range();
  void abandon_interval();
  void close();
  void set_callbacks(bool on);
  void collect(CounterReading& r);

  double peak_bandwidth_ = 0;
  bool per_kernel_ = false;
  int64_t max_kernels_ = 8192;
  CUpti_ProfilerReplayMode replay_ = CUPTI_UserReplay;
  bool phases_ = false;
  int64_t max_phase_ranges_ = 1024;
  // Phases: names in the order first entered, per phase its segments and wall seconds; per pushed
  // range (one range per segment) its phase; the current phase and when it began.
  std::vector<std::string> phase_names_;
  std::vector<int64_t> phase_segments_;
  std::vector<double> phase_seconds_;
  std::vector<int> range_phases_;
  std::ptrdiff_t current_phase_ = -1;
  std::chrono::steady_clock::time_point phase_mark_ = std::chrono::steady_clock::now();
  bool pushed_ = false;  // a user range (the interval's, or the current phase segment's) is open
  c10::DeviceIndex device_index_ = 0;
  std::string reason_, failure_, device_name_, chip_, names_note_, duration_note_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  bool initialized_ = false, callbacks_on_ = false, started_ = false, running_ = false;
  CUpti_RangeProfiler_Object* profiler_ = nullptr;
  std::vector<uint8_t> availability_, config_, image_;
  CuptiMetricPlan plan_;
  std::vector<std::string> metrics_;
  std::unique_ptr<HostObject> host_;
  double duration_scale_ = 0;
  size_t counter_data_size_ = 0;
  LaunchNames names_;
  std::unique_ptr<ScopeLog> scopes_;  // per kernel: the component scopes closed in the interval
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace kiln::profile::cupti
