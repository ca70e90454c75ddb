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
#include "kiln/profile/counters_cupti.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_runtime_cbid.h>
#include <cupti_target.h>
#include <cupti_version.h>
#include <fmt/format.h>

#include "kiln/profile/kernel_components.h"

namespace kiln::profile {

namespace {

// A CUPTI or CUDA failure, carried to the session's boundary as its one-line reason.
struct Unavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

// An exception's message as a one-line reason (c10's errors carry a backtrace after their first line).
std::string one_line(const std::exception& e) {
  if (dynamic_cast<const Unavailable*>(&e)) return e.what();
  const std::string what = e.what();
  return "n/a: CUDA: " + what.substr(0, what.find('\n'));
}

void check(const char* call, CUptiResult r) {
  if (r != CUPTI_SUCCESS) throw Unavailable(failure(call, r));
}

void check_cuda(const char* call, cudaError_t e) {
  if (e != cudaSuccess) throw Unavailable(fmt::format("n/a: CUDA: {} failed: {}", call, cudaGetErrorString(e)));
}

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

size_t passes_of(std::vector<uint8_t>& image) {
  auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_GetNumOfPasses_Params);
  p.configImageSize = image.size();
  p.pConfigImage = image.data();
  return cuptiProfilerHostGetNumOfPasses(&p) == CUPTI_SUCCESS ? p.numOfPasses : 0;
}

// Builds the config image of `metrics`: CUPTI_SUCCESS and the passes it needs, or the failure.
CUptiResult try_config(const std::string& chip, const std::vector<uint8_t>& availability,
                       const std::vector<std::string>& metrics, std::vector<uint8_t>* image, size_t* passes) {
  HostObject host(chip, availability);
  if (host.status() != CUPTI_SUCCESS) return host.status();
  if (CUptiResult r = host.add(metrics); r != CUPTI_SUCCESS) return r;
  if (CUptiResult r = host.config_image(image); r != CUPTI_SUCCESS) return r;
  *passes = passes_of(*image);
  return *passes > 0 ? CUPTI_SUCCESS : CUPTI_ERROR_UNKNOWN;
}

double seconds_per_unit(const std::string& unit) {
  if (unit == "nanosecond" || unit == "nsecond" || unit == "ns") return 1e-9;
  if (unit == "microsecond" || unit == "usecond" || unit == "us") return 1e-6;
  if (unit == "millisecond" || unit == "msecond" || unit == "ms") return 1e-3;
  if (unit == "second" || unit == "s") return 1;
  return 0;
}

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

// Runtime launches call the driver's: a launch is recorded at the outermost launch API only. The
// depth is per thread and restarts with each interval (a launch in flight when the callbacks were
// switched off never saw its exit).
struct LaunchDepth {
  int depth = 0;
  uint64_t interval = 0;
};
thread_local LaunchDepth t_launch;

void CUPTIAPI on_launch(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  auto* names = static_cast<LaunchNames*>(userdata);
  const uint64_t interval = names->interval.load(std::memory_order_relaxed);
  if (t_launch.interval != interval) t_launch = {0, interval};
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite == CUPTI_API_EXIT) {
    if (t_launch.depth > 0) --t_launch.depth;
    return;
  }
  const bool outermost = t_launch.depth++ == 0;
  if (!outermost || cb->symbolName == nullptr) return;
  std::lock_guard<std::mutex> lock(names->mutex);
  if (cb->context != nullptr && cb->context != names->context) return;
  names->names.emplace_back(cb->symbolName);
  names->phases.push_back(names->phase.load(std::memory_order_relaxed));
  names->sites.push_back(current_launch_site());  // on the launching thread, as CUPTI calls back
}

const std::vector<std::pair<CUpti_CallbackDomain, CUpti_CallbackId>>& launch_callbacks() {
  static const std::vector<std::pair<CUpti_CallbackDomain, CUpti_CallbackId>> ids = {
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000},
#if CUPTI_API_VERSION >= 130000
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000},
    {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000},
#endif
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel},
    {CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz},
  };
  return ids;
}

// "void kiln::kernels::rmsnorm_forward<float>(Params)" -> "kiln::kernels::rmsnorm_forward<float>".
std::string kernel_name(const std::string& mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // Cut the parameter list: the first '(' outside template brackets.
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '<') ++depth;
    if (c == '>' && depth > 0) --depth;
    if (c == '(' && depth == 0 && i > 0) {
      name.resize(i);
      break;
    }
  }
  // A leading return type ("void ") of a demangled template.
  if (name.rfind("void ", 0) == 0) name = name.substr(5);
  if (name.size() > 200) name = name.substr(0, 197) + "...";
  return name;
}

// ---- the session ---------------------------------------------------------------------------------

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

class CuptiSession final : public CounterSession {
 public:
  CuptiSession(const c10::Device& device, double peak_bandwidth, const CounterOptions& options)
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
  ~CuptiSession() override { close(); }

  bool available() const override { return reason_.empty(); }
  std::string reason() const override { return reason_; }

  void start() override {
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

  void phase(const std::string& name) override {
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

  CounterReading stop() override {
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

 private:
  static double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  int64_t range_capacity() const { return per_kernel_ ? max_kernels_ : phases_ ? max_phase_ranges_ : 1; }

  // One user range: user replay (a user range cannot be replayed per kernel). Per kernel: kernel
  // replay unless KILN_CUPTI_REPLAY=user; with one pass neither replays anything.
  CUpti_ProfilerReplayMode replay_mode() const {
    if (!per_kernel_) return CUPTI_UserReplay;
    const char* env = std::getenv("KILN_CUPTI_REPLAY");
    const std::string mode = env ? env : "";
    if (mode.empty() || mode == "kernel") return CUPTI_KernelReplay;
    if (mode == "user") return CUPTI_UserReplay;
    throw Unavailable("n/a: KILN_CUPTI_REPLAY='" + mode + "' is not 'kernel' or 'user'");
  }
  std::string replay_name() const { return replay_ == CUPTI_UserReplay ? "user replay" : "kernel replay"; }

  void open(const c10::Device& device) {
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
        duration_note_ = fmt::format("n/a: CUPTI: {} has unit '{}', not a time", d->metrics.front(),
                                     host_->unit(d->metrics.front()));
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
  void push_range(const char* name) {
    auto push = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_PushRange_Params);
    push.pRangeProfilerObject = profiler_;
    push.pRangeName = name;
    check("cuptiRangeProfilerPushRange", cuptiRangeProfilerPushRange(&push));
    pushed_ = true;
  }
  // Closes the open user range; the caller decides whether a failure matters.
  CUptiResult pop_range() {
    pushed_ = false;
    auto pop = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_PopRange_Params);
    pop.pRangeProfilerObject = profiler_;
    return cuptiRangeProfilerPopRange(&pop);
  }
  // Stops a running profiler without reading it (a failure mid-interval, or teardown), so that the
  // next start() can begin afresh.
  void abandon_interval() {
    pushed_ = false;
    if (!running_) return;
    auto p = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
    p.pRangeProfilerObject = profiler_;
    cuptiRangeProfilerStop(&p);
    running_ = false;
  }

  void close() {
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
  void set_callbacks(bool on) {
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

  // Stops the range profiler, decodes the ranges and fills `r`.
  void collect(CounterReading& r) {
    const c10::cuda::CUDAGuard guard(device_index_);
    if (pushed_) {
      // The range ends when its work has: every kernel of the interval inside it.
      pushed_ = false;
      check_cuda("cudaDeviceSynchronize", cudaDeviceSynchronize());
      check("cuptiRangeProfilerPopRange", pop_range());
    }
    auto stop = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
    stop.pRangeProfilerObject = profiler_;
    running_ = false;
    check("cuptiRangeProfilerStop", cuptiRangeProfilerStop(&stop));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    set_callbacks(false);
    if (!stop.isAllPassSubmitted) throw Unavailable("n/a: CUPTI: the kernels' passes were not all submitted");
    auto decode = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_DecodeData_Params);
    decode.pRangeProfilerObject = profiler_;
    check("cuptiRangeProfilerDecodeData", cuptiRangeProfilerDecodeData(&decode));
    auto info = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataInfo_Params);
    info.pCounterDataImage = image_.data();
    info.counterDataImageSize = image_.size();
    check("cuptiRangeProfilerGetCounterDataInfo", cuptiRangeProfilerGetCounterDataInfo(&info));
    const size_t ranges = info.numTotalRanges, dropped = decode.numOfRangeDropped;
    r.ranges = static_cast<int64_t>(ranges);

    std::vector<std::string> launches;
    std::vector<int> launch_phases;
    std::vector<LaunchSite> sites;
    {
      std::lock_guard<std::mutex> lock(names_.mutex);
      launches.swap(names_.names);
      launch_phases.swap(names_.phases);
      sites.swap(names_.sites);
    }
    const std::vector<ClosedScope> closed = scopes_ ? scopes_->scopes() : std::vector<ClosedScope>{};
    const bool scoped = scopes_ && scopes_->active();
    scopes_.reset();
    const bool named = per_kernel_ && names_note_.empty() && launches.size() == ranges + dropped;

    // Each range's phase (-1: none). Per kernel: the phase current at its launch (a launch before
    // the first phase() goes to the first phase). One range per phase segment: the range's name as
    // CUPTI stored it, else the order the segments were pushed in.
    std::vector<int> phase_of(ranges, -1);
    std::string phase_note;
    if (phases_ && !phase_names_.empty()) {
      if (per_kernel_) {
        if (named && launch_phases.size() == launches.size()) {
          for (size_t i = 0; i < ranges; ++i) phase_of[i] = std::max(0, launch_phases[i]);
        } else {
          phase_note = "per phase: n/a (kernels not matched to their launches)";
        }
      } else {
        std::vector<std::string> stored(ranges);
        for (size_t i = 0; i < ranges; ++i) {
          auto info = KILN_CUPTI_PARAMS(CUpti_RangeProfiler_CounterData_GetRangeInfo_Params);
          info.pCounterDataImage = image_.data();
          info.counterDataImageSize = image_.size();
          info.rangeIndex = i;
          info.rangeDelimiter = "/";
          if (cuptiRangeProfilerCounterDataGetRangeInfo(&info) == CUPTI_SUCCESS && info.rangeName != nullptr) {
            stored[i] = info.rangeName;
          }
        }
        phase_of = cupti_range_phases(stored, range_phases_, dropped, phase_names_);
        if (phase_of.size() != ranges) {
          phase_note =
              fmt::format("per phase: n/a ({} ranges, {} of them named, for {} pushed segments)", ranges,
                          std::count_if(stored.begin(), stored.end(), [](const std::string& s) { return !s.empty(); }),
                          range_phases_.size());
          phase_of.assign(ranges, -1);
        }
      }
    }

    // Where each column's metrics sit among the evaluated values.
    std::map<std::string, std::vector<size_t>> at;
    for (const CuptiColumn& c : plan_.columns) {
      for (const std::string& m : c.metrics) {
        at[c.column].push_back(std::find(metrics_.begin(), metrics_.end(), m) - metrics_.begin());
      }
    }
    auto value = [&](const std::vector<double>& v, const std::string& column) -> std::optional<double> {
      const auto it = at.find(column);
      if (it == at.end() || it->second.empty()) return std::nullopt;
      double sum = 0;
      for (size_t i : it->second) {
        if (!std::isfinite(v[i])) return std::nullopt;
        sum += v[i];
      }
      return sum;
    };

    struct Sums {
      int64_t launches = 0;
      double seconds = 0, bytes = 0, dram_pct = 0, tensor_pct = 0, fma_pct = 0;
      bool bytes_ok = true, dram_ok = true, tensor_ok = true, fma_ok = true;
    };
    std::map<std::string, Sums> by_name;
    std::vector<std::string> order;
    Sums total;
    // Per kernel with named launches: each kernel's (component, pass) at its launch.
    const bool components = named && scoped && sites.size() == launches.size();
    std::map<std::pair<std::string, std::string>, Sums> by_component;
    std::vector<Sums> by_phase(phase_names_.size());
    std::vector<const char*> metric_ptrs;
    for (const std::string& m : metrics_) metric_ptrs.push_back(m.c_str());
    std::vector<double> values(metrics_.size());
    for (size_t i = 0; i < ranges; ++i) {
      auto eval = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
      eval.pHostObject = host_->get();
      eval.pCounterDataImage = image_.data();
      eval.counterDataImageSize = image_.size();
      eval.rangeIndex = i;
      eval.ppMetricNames = metric_ptrs.data();
      eval.numMetrics = metric_ptrs.size();
      eval.pMetricValues = values.data();
      check("cuptiProfilerHostEvaluateToGpuValues", cuptiProfilerHostEvaluateToGpuValues(&eval));
      const std::string name = named ? kernel_name(launches[i]) : fmt::format("kernel {}", i);
      if (!by_name.count(name)) order.push_back(name);
      const std::optional<double> duration = value(values, "duration");
      const double seconds = duration && duration_scale_ > 0 ? *duration * duration_scale_ : 0;
      Sums* in_phase = phase_of[i] >= 0 ? &by_phase[static_cast<size_t>(phase_of[i])] : nullptr;
      Sums* in_component = components ? &by_component[launch_component(sites[i], closed)] : nullptr;
      for (Sums* s : {&by_name[name], &total, in_phase, in_component}) {
        if (s == nullptr) continue;
        s->launches += 1;
        s->seconds += seconds;
        const auto bytes = value(values, "dram bytes"), dram = value(values, "dram throughput"),
                   tensor = value(values, "tensor pipe"), fma = value(values, "fma pipe");
        s->bytes_ok &= bytes.has_value();
        s->dram_ok &= dram.has_value();
        s->tensor_ok &= tensor.has_value();
        s->fma_ok &= fma.has_value();
        s->bytes += bytes.value_or(0);
        s->dram_pct += seconds * dram.value_or(0);
        s->tensor_pct += seconds * tensor.value_or(0);
        s->fma_pct += seconds * fma.value_or(0);
      }
    }

    auto column_reason = [&](const std::string& column) -> std::string {
      const CuptiColumn* c = plan_.find(column);
      return c && !c->reason.empty() ? c->reason : "";
    };
    const std::string time_reason = !column_reason("duration").empty() ? column_reason("duration")
                                    : !duration_note_.empty()          ? duration_note_
                                    : ranges == 0                      ? "n/a: no range was counted in the interval"
                                                                       : "";
    auto fill = [&](const Sums& s, auto& out) {
      const bool timed = time_reason.empty() && s.seconds > 0;
      if (column_reason("dram bytes").empty() && s.bytes_ok && s.launches > 0) {
        out.dram_bytes = s.bytes;
        if (timed && peak_bandwidth_ > 0) out.memory_bandwidth = s.bytes / s.seconds / peak_bandwidth_;
      }
      if (timed && column_reason("dram throughput").empty() && s.dram_ok)
        out.memory_throughput = s.dram_pct / s.seconds / 100;
      if (timed && column_reason("tensor pipe").empty() && s.tensor_ok)
        out.tensor_core = s.tensor_pct / s.seconds / 100;
      if (timed && column_reason("fma pipe").empty() && s.fma_ok) out.fp_engine = s.fma_pct / s.seconds / 100;
    };
    fill(total, r);
    if (time_reason.empty()) r.gpu_seconds = total.seconds;
    for (const std::string& name : per_kernel_ ? order : std::vector<std::string>{}) {
      const Sums& s = by_name[name];
      KernelCounters k;
      k.name = name;
      k.launches = s.launches;
      k.seconds = s.seconds;
      fill(s, k);
      r.kernels.push_back(std::move(k));
    }
    std::stable_sort(r.kernels.begin(), r.kernels.end(),
                     [](const KernelCounters& a, const KernelCounters& b) { return a.seconds > b.seconds; });
    for (const KernelCounters& k : r.kernels) r.per_range.emplace_back(k.name, k.seconds);
    for (const auto& [key, s] : by_component) {
      KernelCounters k;
      k.name = key.first;
      k.pass = key.second;
      k.launches = s.launches;
      k.seconds = s.seconds;
      fill(s, k);
      if (key.first.empty()) {
        r.unattributed = std::move(k);
      } else {
        r.components.push_back(std::move(k));
      }
    }
    std::stable_sort(r.components.begin(), r.components.end(),
                     [](const KernelCounters& a, const KernelCounters& b) { return a.seconds > b.seconds; });
    if (phases_ && phase_note.empty()) {
      for (size_t p = 0; p < phase_names_.size(); ++p) {
        PhaseCounters out;
        out.name = phase_names_[p];
        out.segments = phase_segments_[p];
        out.seconds = phase_seconds_[p];
        out.kernels = per_kernel_ ? by_phase[p].launches : 0;
        if (time_reason.empty()) out.gpu_seconds = by_phase[p].seconds;
        fill(by_phase[p], out);
        r.phases.push_back(std::move(out));
      }
    }

    auto why = [&](const std::optional<double>& v, std::initializer_list<const char*> columns) -> std::string {
      if (v) return "";
      if (!time_reason.empty()) return time_reason;
      for (const char* c : columns) {
        if (!column_reason(c).empty()) return column_reason(c);
      }
      if (std::string(*columns.begin()) == "dram bytes" && peak_bandwidth_ <= 0) {
        return "n/a: DRAM bytes counted, but no peak bandwidth was given to divide them by";
      }
      return "n/a: CUPTI returned no value for it";
    };
    r.memory_reason = why(r.memory_bandwidth, {"dram bytes"});
    r.tensor_reason = why(r.tensor_core, {"tensor pipe"});
    r.fp_reason = why(r.fp_engine, {"fma pipe"});
    std::vector<std::string> reasons;
    if (!r.memory_reason.empty()) reasons.push_back("memory bandwidth: " + r.memory_reason);
    if (!r.tensor_reason.empty()) reasons.push_back("tensor core: " + r.tensor_reason);
    if (!r.fp_reason.empty()) reasons.push_back("fp engine: " + r.fp_reason);
    if (dropped > 0) {
      reasons.push_back(per_kernel_
                            ? fmt::format("{} kernel launches past the {} the counter data holds were not counted",
                                          dropped, max_kernels_)
                            : fmt::format("{} phase segments past the {} ranges the counter data holds were not "
                                          "counted",
                                          dropped, max_phase_ranges_));
    }
    r.reason = fmt::format("{}", fmt::join(reasons, "; "));
    const std::string phases_detail = !phases_               ? ""
                                      : !phase_note.empty()  ? "; " + phase_note
                                      : phase_names_.empty() ? "; per phase: none (phase() was not called)"
                                      : per_kernel_ ? "; per phase: each kernel in the phase current at its launch"
                                                    : "";
    if (!per_kernel_ && phases_) {
      r.detail = fmt::format(
          "cupti: range profiler on {} ({}), one user range per phase segment ({} ranges, a device synchronisation at "
          "each boundary; user replay, {} pass, kernels not serialised; shares over the ranges' GPU time), metrics "
          "{}{}",
          device_name_, chip_, ranges, plan_.passes, fmt::join(metrics_, ", "), phases_detail);
      return;
    }
    if (!per_kernel_) {
      r.detail = fmt::format(
          "cupti: range profiler on {} ({}), one user range over the interval (user replay, {} pass, kernels not "
          "serialised; shares over the range's GPU time, gaps between kernels included), metrics {}",
          device_name_, chip_, plan_.passes, fmt::join(metrics_, ", "));
      return;
    }
    r.detail = fmt::format(
        "cupti: range profiler on {} ({}), one range per kernel (auto range, {}, {} pass), metrics {}; {} "
        "kernel launches, {}",
        device_name_, chip_, replay_name(), plan_.passes, fmt::join(metrics_, ", "), ranges,
        named ? std::string("named from the launch callbacks")
        : !names_note_.empty()
            ? names_note_
            : fmt::format("named by index ({} launches reported for {} ranges)", launches.size(), ranges + dropped));
    r.detail += phases_detail;
    r.detail += components ? fmt::format(
                                 "; per component: each kernel in the component running where it was launched "
                                 "({} of {} launches in none)",
                                 r.unattributed ? r.unattributed->launches : 0, ranges)
                           : "; per component: n/a (kernels not matched to their launches)";
  }

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

}  // namespace

std::vector<std::string> CuptiMetricPlan::metric_names() const {
  std::vector<std::string> out;
  for (const CuptiColumn& c : columns) out.insert(out.end(), c.metrics.begin(), c.metrics.end());
  return out;
}

const CuptiColumn* CuptiMetricPlan::find(const std::string& column) const {
  for (const CuptiColumn& c : columns) {
    if (c.column == column) return &c;
  }
  return nullptr;
}

CuptiMetricPlan plan_cupti_metrics(const std::string& chip, const std::vector<uint8_t>& counter_availability) {
  // Percentages "of peak sustained elapsed": over every cycle of the kernel on every unit, so an
  // idle SM counts as idle and GPU-time weighting is exact (a kernel's elapsed cycles are its time).
  static const std::vector<std::pair<std::string, std::vector<std::vector<std::string>>>> candidates = {
      {"duration", {{"gpu__time_duration.sum"}}},
      {"dram throughput",
       {{"dram__throughput.avg.pct_of_peak_sustained_elapsed"},
        {"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"}}},
      // WGMMA and HMMA together where the chip has the combined counter (Ampere and newer).
      {"tensor pipe",
       {{"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"},
        {"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"}}},
      {"fma pipe", {{"sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_elapsed"}}},
      {"dram bytes", {{"dram__bytes_read.sum", "dram__bytes_write.sum"}, {"dram__bytes.sum"}}},
  };
  CuptiMetricPlan plan;
  plan.chip = chip;
  {
    HostObject probe(chip, counter_availability);
    if (probe.status() != CUPTI_SUCCESS) {
      plan.error = failure(("cuptiProfilerHostInitialize(" + chip + ")").c_str(), probe.status());
      return plan;
    }
  }
  std::vector<std::string> chosen;
  for (const auto& [column, variants] : candidates) {
    CuptiColumn c;
    c.column = column;
    std::vector<std::string> tried, too_many_passes;
    for (const std::vector<std::string>& variant : variants) {
      std::vector<std::string> metrics = chosen;
      metrics.insert(metrics.end(), variant.begin(), variant.end());
      std::vector<uint8_t> image;
      size_t passes = 0;
      const std::string label = fmt::format("{}", fmt::join(variant, " + "));
      if (try_config(chip, counter_availability, metrics, &image, &passes) != CUPTI_SUCCESS) {
        tried.push_back(label);
      } else if (passes > 1) {
        too_many_passes.push_back(label);
      } else {
        c.metrics = variant;
        chosen = metrics;
        plan.passes = passes;
        break;
      }
    }
    if (c.metrics.empty()) {
      c.reason =
          !too_many_passes.empty()
              ? fmt::format(
                    "n/a: CUPTI: {} needs a second pass on {} beside the other metrics (not collected: "
                    "it would replay every kernel)",
                    too_many_passes.front(), chip)
              : fmt::format("n/a: CUPTI: no {} metric on {} ({} not available)", column, chip, fmt::join(tried, ", "));
    }
    plan.columns.push_back(std::move(c));
  }
  return plan;
}

std::vector<int> cupti_range_phases(const std::vector<std::string>& stored, const std::vector<int>& pushed,
                                    size_t dropped, const std::vector<std::string>& phase_names) {
  auto index = [&](const std::string& name) {
    const auto it = std::find(phase_names.begin(), phase_names.end(), name);
    return it == phase_names.end() ? -1 : static_cast<int>(it - phase_names.begin());
  };
  const bool in_order = stored.size() + dropped == pushed.size();
  std::vector<int> out(stored.size(), -1);
  for (size_t i = 0; i < stored.size(); ++i) {
    out[i] = index(stored[i]);
    if (const size_t slash = stored[i].rfind('/'); out[i] < 0 && slash != std::string::npos)
      out[i] = index(stored[i].substr(slash + 1));
    if (out[i] < 0 && in_order) out[i] = pushed[i];
    if (out[i] < 0 || out[i] >= static_cast<int>(phase_names.size())) return {};
  }
  return out;
}

std::unique_ptr<CounterSession> open_cupti_session(const c10::Device& device, double peak_bandwidth_bytes_per_s,
                                                   const CounterOptions& options) {
  return std::make_unique<CuptiSession>(device, peak_bandwidth_bytes_per_s, options);
}

}  // namespace kiln::profile
