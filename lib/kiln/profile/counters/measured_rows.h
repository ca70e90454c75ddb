// This directory's measurements beside the traffic model (cost/traffic.h), as the reports show
// them, each with its columns (report/table.h) said once for every format:
//   ComponentRow  a traffic-model row at the roofline, with the time component_times.h measured
//                 for it and the DRAM bytes the counters counted in its kernels (a sweep's point;
//                 explain's rows, which measure nothing);
//   PhaseRow      one phase of a --counter-phases interval, per step, beside the model's rows of
//                 that phase;
//   Utilisation   one of the user's three columns, modelled and counted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/cost/traffic.h"
#include "kiln/profile/counters/component_times.h"
#include "kiln/profile/counters/counters.h"
#include "kiln/report/table.h"

namespace kiln::profile {

// One row of the traffic model (cost::TrafficRow) at a point, per step, against the roofline.
struct ComponentRow {
  std::string component;
  std::string pass;  // fwd | bwd | recompute | step
  double repeats = 1;
  double gemm_flops = 0, other_flops = 0, bytes = 0;  // kiln's, per step (all repeats)
  double eager_bytes = 0;                             // an unfused eager step's, per step
  double intensity = 0;                               // FLOP per byte (0 when no bytes move)
  std::string bound;                                  // compute | memory | - (nothing to do)
  double modelled_seconds = 0;                        // per step, at the roofline
  double eager_modelled_seconds = 0;                  // an unfused eager step's, per step, at the roofline
  // Per step, from the profiler (--component-times); empty where not measured or where no scope
  // covers the row (autocast casts, autograd's sums: their time is inside the GEMM rows' and the nodes').
  std::optional<double> measured_seconds;
  // Per step, DRAM bytes the hardware counted in this row's kernels (--counters-per-kernel on a
  // GPU: CounterReading::components); empty where not counted.
  std::optional<double> counted_bytes;
};
// The model's rows, nothing measured yet.
std::vector<ComponentRow> component_rows(const cost::TrafficReport& report, const cost::Roofline& roof);
// Each row's measured time from `times` and, from `counters`' per-kernel components over
// `counted_steps` steps, its counted bytes per step (an empty optional: not measured).
void add_measurements(std::vector<ComponentRow>& rows, const std::optional<ComponentTimes>& times,
                      const std::optional<CounterReading>& counters, int64_t counted_steps);
// The per-component table; without `measured` (explain's Markdown) less the two measured columns.
std::vector<report::Column<ComponentRow>> component_columns(bool measured = true);

// Where a point's measured column comes from, one line ("measured per component: ...").
std::string component_times_note(const std::optional<ComponentTimes>& times);
// Measured (component, pass) pairs no row has: the fused Functions of selective recomputation,
// whose scopes merge several rows ("SwiGLU + down_proj").
std::vector<std::tuple<std::string, std::string, double>> unmatched_component_times(
    const std::optional<ComponentTimes>& times, const std::vector<ComponentRow>& rows);
report::json component_times_json(const std::optional<ComponentTimes>& times, const std::vector<ComponentRow>& rows);

// The traffic model's pass ("fwd", "bwd", "recompute", "step") as the phase of a step it runs in:
// "forward", "backward" (recomputation runs inside backward), "optimizer".
std::string phase_of_pass(const std::string& pass);

// One phase of a point's counted steps (--counter-phases): the interval's counts (`counted`), and
// per step its values beside the traffic model's rows of that phase (phase_of_pass).
struct PhaseRow {
  const PhaseCounters* counted = nullptr;
  double segments_per_step = 0;
  double wall_seconds = 0;                              // between the phase's boundaries, on the host
  std::optional<double> counted_seconds;                // GPU time (CUDA), or CPU time over all threads (CPU)
  std::optional<double> modelled_seconds;               // its rows at the roofline; empty when no row is of this phase
  std::optional<double> counted_bytes, modelled_bytes;  // DRAM bytes counted; compulsory bytes modelled
};
std::vector<PhaseRow> phase_rows(const CounterReading& reading, int64_t counted_steps,
                                 const std::vector<ComponentRow>& rows);
std::vector<report::Column<PhaseRow>> phase_columns(const CounterReading& reading);
// What the phase table holds, one line.
std::string phase_note(const CounterReading& reading, int64_t counted_steps);

// A reading in a JSON document: its totals, per range, per kernel, per component and per phase
// (null when not counted).
report::json counters_json(const std::optional<CounterReading>& reading, int64_t counted_steps,
                           const std::vector<ComponentRow>& rows);

// One of the user's three columns: the traffic model's value at the measured step time and what
// hardware counters counted, each a fraction of the device's peak.
struct Utilisation {
  std::optional<double> modelled;  // empty without a roofline (a GPU the table does not know)
  std::optional<double> counted;
  std::string counted_reason;  // why `counted` is empty ("" when present)
};
// The counted half of the three columns from a reading: each value, or why it is empty.
void set_counted(Utilisation& memory_bandwidth, Utilisation& tensor_core, Utilisation& fp_engine,
                 const CounterReading& reading);

}  // namespace kiln::profile
