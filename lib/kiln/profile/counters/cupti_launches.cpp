// The CUDA counter session's kernel names, per kernel (CounterOptions::per_kernel): CUPTI's launch
// callbacks record each launch's symbol, phase and launch site in launch order, and the mangled
// symbol becomes a readable name. Its own file: the only code that runs inside CUPTI's callbacks.
#include "kiln/profile/counters/cupti_internal.h"

#include <cxxabi.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <utility>

#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>

#include "kiln/profile/counters/kernel_components.h"

namespace kiln::profile::cupti {

namespace {

// Runtime launches call the driver's: a launch is recorded at the outermost launch API only. The
// depth is per thread and restarts with each interval (a launch in flight when the callbacks were
// switched off never saw its exit).
struct LaunchDepth {
  int depth = 0;
  uint64_t interval = 0;
};
thread_local LaunchDepth t_launch;

}  // namespace

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

}  // namespace kiln::profile::cupti
