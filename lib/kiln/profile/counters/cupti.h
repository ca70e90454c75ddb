// The CUDA counter session (CUPTI's range profiler), defined in cupti*.cpp (the session in
// cupti.cpp, the metric plan in cupti_metrics.cpp, cupti_range_phases in cupti_collect.cpp), which
// are compiled only where CMake found CUPTI and KILN_PROFILE_COUNTERS is on (KILN_WITH_CUPTI,
// third_party/kiln_cupti.cmake); counters.cpp calls it from CounterSession::open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/profile/counters/counters.h"

namespace kiln::profile {

std::unique_ptr<CounterSession> open_cupti_session(const c10::Device& device, double peak_bandwidth_bytes_per_s,
                                                   const CounterOptions& options);

// The metrics a session collects on a chip (host side only: no GPU needed, so the tests check it
// for every chip). One entry per column, in this order: "duration" (gpu__time_duration), "dram
// throughput", "tensor pipe", "fma pipe", "dram bytes"; each takes the first of its candidate
// metric sets that the chip has and that keeps the whole set within one pass (so no kernel is
// replayed), else it stays empty with the reason.
struct CuptiColumn {
  std::string column;
  std::vector<std::string> metrics;  // the chosen set, its values summed; empty when none
  std::string reason;                // why none ("" when chosen)
};
struct CuptiMetricPlan {
  std::string chip;
  std::vector<CuptiColumn> columns;
  size_t passes = 0;  // of the chosen set (1, or 0 when nothing was chosen)
  std::string error;  // the host API itself failed ("" when it did not)
  std::vector<std::string> metric_names() const;
  const CuptiColumn* find(const std::string& column) const;
};
// `counter_availability` is the device's image (cuptiProfilerGetCounterAvailability), empty for a
// chip named without a device.
CuptiMetricPlan plan_cupti_metrics(const std::string& chip, const std::vector<uint8_t>& counter_availability);

// One range per phase segment (CounterOptions::phases): the phase of each counted range, as an
// index into `phase_names`. `stored` holds the name CUPTI kept for each range ("" where it gave
// none; a nested name "outer/inner" is matched by its last part too); a range whose name is not a
// phase's takes the phase of the segment pushed at its position, when every pushed segment
// (`pushed`: each one's phase, in push order) came back as a range or was dropped. CUPTI may also
// merge same-named segments into one range: then the names place them. Empty when some range
// cannot be placed.
std::vector<int> cupti_range_phases(const std::vector<std::string>& stored, const std::vector<int>& pushed,
                                    size_t dropped, const std::vector<std::string>& phase_names);

}  // namespace kiln::profile
