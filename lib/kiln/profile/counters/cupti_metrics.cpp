// The CUDA counter session's metric plan (cupti.h): which CUPTI metrics a chip's session
// collects, each column's first candidate set that fits one pass (so nothing is replayed). Host
// side only, no GPU, so the tests check it for every chip; its own file for that reason.
#include "kiln/profile/counters/cupti.h"

#include <utility>

#include <cupti_profiler_host.h>
#include <cupti_result.h>
#include <fmt/format.h>

#include "kiln/profile/counters/cupti_internal.h"

namespace kiln::profile::cupti {

namespace {

size_t passes_of(std::vector<uint8_t>& image) {
  auto p = KILN_CUPTI_PARAMS(CUpti_Profiler_Host_GetNumOfPasses_Params);
  p.configImageSize = image.size();
  p.pConfigImage = image.data();
  return cuptiProfilerHostGetNumOfPasses(&p) == CUPTI_SUCCESS ? p.numOfPasses : 0;
}

}  // namespace

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

}  // namespace kiln::profile::cupti

namespace kiln::profile {

using cupti::failure;
using cupti::HostObject;
using cupti::try_config;

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

}  // namespace kiln::profile
