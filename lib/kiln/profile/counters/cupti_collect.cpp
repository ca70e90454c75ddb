// The CUDA counter session's decoding (cupti.h, cupti_internal.h): at stop(),
// the range profiler's ranges evaluated into a CounterReading: the interval's fractions, per
// kernel, per component, per phase, with the reason for every value it lacks. Apart from the
// session's CUPTI calls (cupti.cpp) since it is most of the arithmetic and the wording.
#include "kiln/profile/counters/cupti.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <cupti_profiler_host.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <fmt/format.h>

#include "kiln/profile/counters/cupti_internal.h"
#include "kiln/profile/counters/kernel_components.h"

namespace kiln::profile::cupti {

// Stops the range profiler, decodes the ranges and fills `r`.
void CuptiSession::collect(CounterReading& r) {
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
    if (timed && column_reason("tensor pipe").empty() && s.tensor_ok) out.tensor_core = s.tensor_pct / s.seconds / 100;
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

}  // namespace kiln::profile::cupti

namespace kiln::profile {

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

}  // namespace kiln::profile
