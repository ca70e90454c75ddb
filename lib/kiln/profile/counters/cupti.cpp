// The CUDA counter session: CUPTI's range profiler over an interval (counters.h).
//
// Metrics: chosen by plan_cupti_metrics to fit one pass, so nothing is ever replayed.
// Collection, by default: one user range from start() to stop() (user replay): CUPTI neither
// serialises the kernels nor saves memory, so a counted training step runs at its own speed.
// Per kernel (CounterOptions::per_kernel): auto range, each kernel launch a range; CUPTI
// synchronizes the context after each kernel (its guide says so), which serialises a whole
// training step (the first H200 run's kiln-profile points, counted that way under kernel replay,
// did not finish in 90 s; whether kernel replay also saves memory when one pass suffices is not
// documented: KILN_CUPTI_REPLAY=user tells the two costs apart). Evaluation: per range the metrics' GPU values
// (cuptiProfilerHostEvaluateToGpuValues); per kernel, the interval's fractions are the ranges'
// values weighted by their gpu__time_duration. Names (per kernel): from CUPTI's launch callbacks
// (runtime and driver launch APIs, in launch order, which auto range serializes); when their count
// differs from the ranges' (a launch CUPTI did not report, or another CUPTI subscriber), kernels
// are named by their index instead, and the detail says so.
//
// Compiled only where CMake found CUPTI's range profiler (KILN_WITH_CUPTI); the CUcontext comes
// from the runtime's driver entry point, so nothing links libcuda.
//
// Here: the session itself (open, start, phase, stop, teardown) and the CUPTI error helpers.
// Decoding an interval's ranges is cupti_collect.cpp, the metric plan cupti_metrics.cpp, the
// launch callbacks cupti_launches.cpp; what they share is cupti_internal.h.
#include "kiln/profile/counters/cupti.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <utility>

#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_callbacks.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>
#include <fmt/format.h>

#include "kiln/common/env.h"
#include "kiln/profile/counters/cupti_internal.h"
#include "kiln/profile/counters/kernel_components.h"

namespace kiln::profile::cupti {

namespace {

std::string result_name(CUptiResult r) {
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == nullptr)
    return fmt::format("CUPTI error {}", static_cast<int>(r));
  return s;
}

// The driver's profiling restriction, when /proc/driver/nvidia/params shows it.
std::string admin_only_note() {
  std::ifstream in("/proc/driver/nvidia/params");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RmProfilingAdminOnly:", 0) == 0) {
      const std::string value = line.substr(line.find(':') + 1);
      if (value.find('1') != std::string::npos) {
        return "; the driver has RmProfilingAdminOnly=1, i.e. NVreg_RestrictProfilingToAdminUsers=1";
      }
      return "";
    }
  }
  return "";
}

// An exception's message as a one-line reason (c10's errors carry a backtrace after their first line).
std::string one_line(const std::exception& e) {
  if (dynamic_cast<const Unavailable*>(&e)) return e.what();
  const std::string what = e.what();
  return "n/a: CUDA: " + what.substr(0, what.find('\n'));
}

double seconds_per_unit(const std::string& unit) {
  if (unit == "nanosecond" || unit == "nsecond" || unit == "ns") return 1e-9;
  if (unit == "microsecond" || unit == "usecond" || unit == "us") return 1e-6;
  if (unit == "millisecond" || unit == "msecond" || unit == "ms") return 1e-3;
  if (unit == "second" || unit == "s") return 1;
  return 0;
}

using CtxGetCurrent = CUresult (*)(CUcontext*);

CUcontext current_context() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  check_cuda("cudaGetDriverEntryPointByVersion(cuCtxGetCurrent)",
             cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found));
#else
  check_cuda("cudaGetDriverEntryPoint(cuCtxGetCurrent)",
             cudaGetDriverEntryPoint("cuCtxGetCurrent", &fn, cudaEnableDefault, &found));
#endif
  if (fn == nullptr || found != cudaDriverEntryPointSuccess)
    throw Unavailable("n/a: CUDA: no cuCtxGetCurrent entry point");
  CUcontext context = nullptr;
  if (reinterpret_cast<CtxGetCurrent>(fn)(&context) != CUDA_SUCCESS || context == nullptr) {
    throw Unavailable("n/a: CUDA: no current context");
  }
  return context;
}

std::string support_problems(const CUpti_Profiler_DeviceSupported_Params& p) {
  std::vector<std::string> problems;
  auto note = [&](CUpti_Profiler_Support_Level level, const char* what) {
    if (level == CUPTI_PROFILER_CONFIGURATION_UNSUPPORTED) problems.push_back(std::string(what) + " unsupported");
    if (level == CUPTI_PROFILER_CONFIGURATION_DISABLED)
      problems.push_back(std::string(what) + " has profiling disabled");
  };
  note(p.architecture, "the architecture (needs compute capability 7.5 or newer)");
  note(p.sli, "SLI");
  note(p.vGpu, "vGPU");
  note(p.confidentialCompute, "confidential compute");
  note(p.cmp, "a CMP device");
  note(p.wsl, "WSL");
  return problems.empty() ? "unknown" : fmt::format("{}", fmt::join(problems, ", "));
}

}  // namespace

std::string failure(const char* call, CUptiResult r) {
  switch (r) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      return "n/a: CUPTI: GPU performance counters are restricted to admin users (ERR_NVGPUCTRPERM, " + result_name(r) +
             " from " + call + admin_only_note() + ")";
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      return std::string(
                 "n/a: CUPTI: another CUPTI client in this process holds its one callback subscription (Nsight "
                 "Systems or Compute, or LibTorch's profiler): ") +
             call;
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
      return std::string("n/a: CUPTI: profiling is not supported on this virtualized GPU (") + call + ")";
    case CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED:
      return std::string("n/a: CUPTI: profiling is not supported on a CMP device (") + call + ")";
    default:
      return fmt::format("n/a: CUPTI: {} failed: {}", call, result_name(r));
  }
}

void check(const char* call, CUptiResult r) {
  if (r != CUPTI_SUCCESS) throw Unavailable(failure(call, r));
}

void check_cuda(const char* call, cudaError_t e) {
  if (e != cudaSuccess) throw Unavailable(fmt::format("n/a: CUDA: {} failed: {}", call, cudaGetErrorString(e)));
}

CuptiSession::CuptiSession(const c10::Device& device, double peak_bandwidth, const CounterOptions& options)
    : peak_bandwidth_(peak_bandwidth),
      per_kernel_(options.per_kernel),
      max_kernels_(std::max<int64_t>(1, options.max_kernels)),
      phases_(options.phases),
      max_phase_ranges_(std::max<int64_t>(1, options.max_phase_ranges)) {
  try {
    replay_ = replay_mode();
    open(device);
  } catch (const std::exception& e) {
    reason_ = one_line(e);
  }
  if (!reason_.empty()) close();
}

void CuptiSession::start() {
  start_ = std::chrono::steady_clock::now();
  failure_.clear();
  started_ = true;
  phase_names_.clear();
  phase_segments_.clear();
  phase_seconds_.clear();
  range_phases_.clear();
  current_phase_ = -1;
  names_.phase.store(-1);
  if (!available()) return;
  try {
    const c10::cuda::CUDAGuard guard(device_index_);
    image_.assign(counter_data_size_, 0);
    auto init = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_CounterDataImage_Initialize_Params);
    init.pRangeProfilerObject = profiler_;
    init.counterDataSize = image_.size();
    init.pCounterData = image_.data();
    check("cuptiRangeProfilerCounterDataImageInitialize", cuptiRangeProfilerCounterDataImageInitialize(&init));
    auto config = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_SetConfig_Params);
    config.pRangeProfilerObject = profiler_;
    config.configSize = config_.size();
    config.pConfig = config_.data();
    config.counterDataImageSize = image_.size();
    config.pCounterDataImage = image_.data();
    config.range = per_kernel_ ? CUPTI_AutoRange : CUPTI_UserRange;
    config.replayMode = replay_;
    config.maxRangesPerPass = static_cast<size_t>(range_capacity());
    config.numNestingLevels = 1;
    config.minNestingLevel = 1;
    config.passIndex = 0;
    config.targetNestingLevel = 1;  // = minNestingLevel, as NVIDIA's sample and Kineto set it in both modes
    check("cuptiRangeProfilerSetConfig", cuptiRangeProfilerSetConfig(&config));
    if (per_kernel_) {
      {
        std::lock_guard<std::mutex> lock(names_.mutex);
        names_.names.clear();
        names_.phases.clear();
        names_.sites.clear();
      }
      scopes_ = std::make_unique<ScopeLog>();  // the scopes' sequence numbers, for backward's kernels
      names_.interval.fetch_add(1);
      // The launch callbacks name the kernels. Subscribed for the interval only, so that another
      // CUPTI client (LibTorch's profiler) can subscribe between intervals; without them kernels
      // are named by index.
      const CUptiResult subscribed = cuptiSubscribe(&subscriber_, on_launch, &names_);
      if (subscribed != CUPTI_SUCCESS) {
        subscriber_ = nullptr;
        names_note_ = "kernel names unknown (" + failure("cuptiSubscribe", subscribed) + ")";
      } else {
        names_note_.clear();
      }
      set_callbacks(true);
    }
    // The interval's range holds the interval's work only: what earlier calls queued ends first.
    check_cuda("cudaDeviceSynchronize", cudaDeviceSynchronize());
    start_ = std::chrono::steady_clock::now();
    phase_mark_ = start_;
    auto s = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_Start_Params);
    s.pRangeProfilerObject = profiler_;
    check("cuptiRangeProfilerStart", cuptiRangeProfilerStart(&s));
    running_ = true;
    if (!per_kernel_ && !phases_) push_range("kiln interval");  // with phases, each phase() opens one
  } catch (const std::exception& e) {
    set_callbacks(false);
    scopes_.reset();
    abandon_interval();  // started, but its range could not be opened: stopped, so the next start() can
    failure_ = one_line(e);
  }
}

void CuptiSession::phase(const std::string& name) {
  if (!phases_ || !started_ || !running_ || !failure_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (current_phase_ >= 0) phase_seconds_[static_cast<size_t>(current_phase_)] += seconds_between(phase_mark_, now);
  phase_mark_ = now;
  auto it = std::find(phase_names_.begin(), phase_names_.end(), name);
  if (it == phase_names_.end()) {
    phase_names_.push_back(name);
    phase_segments_.push_back(0);
    phase_seconds_.push_back(0);
    it = std::prev(phase_names_.end());
  }
  current_phase_ = it - phase_names_.begin();
  phase_segments_[static_cast<size_t>(current_phase_)] += 1;
  // Per kernel: the launch callbacks tag each kernel with the current phase.
  names_.phase.store(static_cast<int>(current_phase_), std::memory_order_relaxed);
  if (per_kernel_) return;
  try {
    // One range per segment: the previous segment's kernels end inside its range.
    const c10::cuda::CUDAGuard guard(device_index_);
    check_cuda("cudaDeviceSynchronize", cudaDeviceSynchronize());
    if (pushed_) check("cuptiRangeProfilerPopRange", pop_range());
    push_range(phase_names_[static_cast<size_t>(current_phase_)].c_str());
    range_phases_.push_back(static_cast<int>(current_phase_));
  } catch (const std::exception& e) {
    abandon_interval();  // the interval cannot be counted: stopped here, and stop() says why
    failure_ = one_line(e);
  }
}

CounterReading CuptiSession::stop() {
  CounterReading r;
  r.source = available() ? "cupti" : "";
  const auto stop_called = std::chrono::steady_clock::now();
  r.seconds = std::chrono::duration<double>(stop_called - start_).count();
  std::string why = !available() ? reason_ : !started_ ? "n/a: stop() without start()" : failure_;
  if (started_ && current_phase_ >= 0)
    phase_seconds_[static_cast<size_t>(current_phase_)] += seconds_between(phase_mark_, stop_called);
  started_ = false;
  if (why.empty()) {
    try {
      collect(r);
    } catch (const std::exception& e) {
      why = one_line(e);
    }
  }
  r.collect_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stop_called).count();
  set_callbacks(false);
  scopes_.reset();
  if (!why.empty()) {
    r.memory_reason = r.tensor_reason = r.fp_reason = r.reason = why;
    r.memory_bandwidth = r.tensor_core = r.fp_engine = r.dram_bytes = r.memory_throughput = r.gpu_seconds =
        std::nullopt;
    r.per_range.clear();
    r.kernels.clear();
    r.phases.clear();
    r.components.clear();
    r.unattributed.reset();
  }
  return r;
}

// One user range: user replay (a user range cannot be replayed per kernel). Per kernel: kernel
// replay unless KILN_CUPTI_REPLAY=user; with one pass neither replays anything.
CUpti_ProfilerReplayMode CuptiSession::replay_mode() const {
  if (!per_kernel_) return CUPTI_UserReplay;
  const std::string mode = kiln::env::string("KILN_CUPTI_REPLAY").value_or("");  // common/env.h
  if (mode.empty() || mode == "kernel") return CUPTI_KernelReplay;
  if (mode == "user") return CUPTI_UserReplay;
  throw Unavailable("n/a: KILN_CUPTI_REPLAY='" + mode + "' is not 'kernel' or 'user'");
}

void CuptiSession::open(const c10::Device& device) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    throw Unavailable(std::string("n/a: CUDA: no device (cudaGetDeviceCount: ") +
                      (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
  }
  device_index_ = device.has_index() ? device.index() : 0;
  if (!device.has_index()) {
    int current = 0;
    check_cuda("cudaGetDevice", cudaGetDevice(&current));
    device_index_ = static_cast<c10::DeviceIndex>(current);
  }
  const c10::cuda::CUDAGuard guard(device_index_);
  check_cuda("cudaFree(nullptr)", cudaFree(nullptr));  // the primary context, current on this thread
  cudaDeviceProp prop{};
  check_cuda("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device_index_));
  device_name_ = prop.name;
  names_.context = current_context();

  auto init = KILN_CUPTI_PARAMS(CUpti_Profiler_Initialize_Params);
  check("cuptiProfilerInitialize", cuptiProfilerInitialize(&init));
  initialized_ = true;

  auto supported = KILN_CUPTI_PARAMS(CUpti_Profiler_DeviceSupported_Params);
  supported.cuDevice = static_cast<CUdevice>(device_index_);
  supported.api = CUPTI_PROFILER_RANGE_PROFILING;
  check("cuptiProfilerDeviceSupported", cuptiProfilerDeviceSupported(&supported));
  if (supported.isSupported != CUPTI_PROFILER_CONFIGURATION_SUPPORTED) {
    throw Unavailable(fmt::format("n/a: CUPTI: range profiling is not supported on {} (compute capability {}.{}): {}",
                                  device_name_, prop.major, prop.minor, support_problems(supported)));
  }

  auto chip = KILN_CUPTI_PARAMS(CUpti_Device_GetChipName_Params);
  chip.deviceIndex = static_cast<size_t>(device_index_);
  check("cuptiDeviceGetChipName", cuptiDeviceGetChipName(&chip));
  chip_ = chip.pChipName ? chip.pChipName : "";

  // The counters' availability before the range profiler is enabled: the target header says the
  // query may fail while a profiling session is active on the context (NVIDIA's range-profiling
  // sample reads it first too).
  auto avail = KILN_CUPTI_PARAMS(CUpti_Profiler_GetCounterAvailability_Params);
  avail.ctx = names_.context;
  check("cuptiProfilerGetCounterAvailability", cuptiProfilerGetCounterAvailability(&avail));
  availability_.assign(avail.counterAvailabilityImageSize, 0);
  avail.pCounterAvailabilityImage = availability_.data();
  check("cuptiProfilerGetCounterAvailability", cuptiProfilerGetCounterAvailability(&avail));

  auto enable = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_Enable_Params);
  enable.ctx = names_.context;
  check("cuptiRangeProfilerEnable", cuptiRangeProfilerEnable(&enable));
  profiler_ = enable.pRangeProfilerObject;

  plan_ = plan_cupti_metrics(chip_, availability_);
  if (!plan_.error.empty()) throw Unavailable(plan_.error);
  metrics_ = plan_.metric_names();
  if (metrics_.empty()) throw Unavailable("n/a: CUPTI: none of the metrics is available on " + chip_);
  std::vector<uint8_t> image;
  size_t passes = 0;
  check("cuptiProfilerHostGetConfigImage", try_config(chip_, availability_, metrics_, &image, &passes));
  config_ = std::move(image);

  host_ = std::make_unique<HostObject>(chip_, availability_);
  check("cuptiProfilerHostInitialize", host_->status());
  if (const CuptiColumn* d = plan_.find("duration"); d && !d->metrics.empty()) {
    duration_scale_ = seconds_per_unit(host_->unit(d->metrics.front()));
    if (duration_scale_ == 0) {
      duration_note_ =
          fmt::format("n/a: CUPTI: {} has unit '{}', not a time", d->metrics.front(), host_->unit(d->metrics.front()));
    }
  }

  std::vector<const char*> names;
  for (const std::string& m : metrics_) names.push_back(m.c_str());
  auto size = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataSize_Params);
  size.pRangeProfilerObject = profiler_;
  size.pMetricNames = names.data();
  size.numMetrics = names.size();
  size.maxNumOfRanges = static_cast<size_t>(range_capacity());
  size.maxNumRangeTreeNodes = static_cast<uint32_t>(range_capacity());
  check("cuptiRangeProfilerGetCounterDataSize", cuptiRangeProfilerGetCounterDataSize(&size));
  counter_data_size_ = size.counterDataSize;
}

// Opens a user range (CUPTI copies the name); throws Unavailable when CUPTI refuses.
void CuptiSession::push_range(const char* name) {
  auto push = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_PushRange_Params);
  push.pRangeProfilerObject = profiler_;
  push.pRangeName = name;
  check("cuptiRangeProfilerPushRange", cuptiRangeProfilerPushRange(&push));
  pushed_ = true;
}
// Closes the open user range; the caller decides whether a failure matters.
CUptiResult CuptiSession::pop_range() {
  pushed_ = false;
  auto pop = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_PopRange_Params);
  pop.pRangeProfilerObject = profiler_;
  return cuptiRangeProfilerPopRange(&pop);
}
// Stops a running profiler without reading it (a failure mid-interval, or teardown), so that the
// next start() can begin afresh.
void CuptiSession::abandon_interval() {
  pushed_ = false;
  if (!running_) return;
  auto p = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
  p.pRangeProfilerObject = profiler_;
  cuptiRangeProfilerStop(&p);
  running_ = false;
}

void CuptiSession::close() {
  set_callbacks(false);
  scopes_.reset();
  host_.reset();
  if (pushed_) pop_range();  // destroyed inside an interval
  abandon_interval();
  if (profiler_) {
    auto p = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_Disable_Params);
    p.pRangeProfilerObject = profiler_;
    cuptiRangeProfilerDisable(&p);
    profiler_ = nullptr;
  }
  if (initialized_) {
    auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_DeInitialize_Params);
    cuptiProfilerDeInitialize(&p);
    initialized_ = false;
  }
}

// On: the launch callbacks of the subscriber. Off: disabled and unsubscribed.
void CuptiSession::set_callbacks(bool on) {
  if (!subscriber_) return;
  if (callbacks_on_ != on) {
    for (const auto& [domain, id] : launch_callbacks()) cuptiEnableCallback(on ? 1 : 0, subscriber_, domain, id);
    callbacks_on_ = on;
  }
  if (!on) {
    cuptiUnsubscribe(subscriber_);
    subscriber_ = nullptr;
  }
}

}  // namespace kiln::profile::cupti

namespace kiln::profile {

std::unique_ptr<CounterSession> open_cupti_session(const c10::Device& device, double peak_bandwidth_bytes_per_s,
                                                   const CounterOptions& options) {
  return std::make_unique<cupti::CuptiSession>(device, peak_bandwidth_bytes_per_s, options);
}

}  // namespace kiln::profile
