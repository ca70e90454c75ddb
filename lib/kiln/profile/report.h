// kiln-profile's reports. A sweep's: a Markdown table (stdout), CSV and JSON (machine-readable,
// every field), and a self-contained HTML report (no network: inline SVG charts of memory and
// tokens/s against cutoff_len, the predicted memory breakdown per point and the roofline).
// explain's: the traffic model of one step in Markdown or JSON. Each table's columns are described
// once (report_internal.h) and rendered to every format from that description.
//
// The sweep table's first columns follow the user's hand-made tables (task, fp16/bf16, speed,
// num_gpu, batch size per gpu, gradient_accumulation_steps, cutoff_len, memory usage, memory
// bandwidth, tensor core, fp engine); kiln's own columns follow. GB = 1e9 bytes. The three counter
// columns hold the counted value with the traffic model's beside it ("41.0% (model 38.2%)"), or
// the model's alone marked as such ("38.2% (model)"); the JSON has both (`*_modelled`,
// `*_counted`, `*_counted_reason`). Each point's per-component traffic table (cost/traffic.h)
// follows the main table (Markdown, JSON, HTML; profile_components.csv).
#pragma once

#include <string>
#include <vector>

#include "kiln/cost/traffic.h"
#include "kiln/profile/sweep.h"

namespace kiln::profile {

std::vector<std::string> table_header(const SweepReport& report);
std::vector<std::vector<std::string>> table_rows(const SweepReport& report);

std::string to_markdown(const SweepReport& report);
std::string to_csv(const SweepReport& report);
// One line per (point, component, pass): the traffic model's rows (profile_components.csv).
std::string to_components_csv(const SweepReport& report);
std::string to_json(const SweepReport& report);
std::string to_html(const SweepReport& report);

// kiln-profile explain: the traffic model of one step (traffic.run is the step), against `roof`.
struct ExplainReport {
  std::string model_name;
  std::string kernels;  // the kernels key as given
  std::string device;   // the hardware row's name
  cost::TrafficReport traffic;
  cost::Roofline roof;
  std::string bandwidth_source;
  double step_seconds = 0;  // > 0: the modelled counters at this measured step time
};
// Markdown: the run, the ops, the roofline, the per-component table, the totals per step and per
// token, per pass, and with step_seconds the modelled counters at it.
std::string explain_markdown(const ExplainReport& e);
// JSON: the per-component rows as a sweep's point has them, the roofline and the step's totals
// (and `modelled_counters` with step_seconds).
std::string explain_json(const ExplainReport& e);

// Writes profile.{md,csv,json,html} (those in `formats`; with csv also profile_components.csv)
// into `dir` (created), each through a temporary file and a rename. Returns the paths written.
std::vector<std::string> write_reports(const SweepReport& report, const std::string& dir,
                                       const std::vector<std::string>& formats);

}  // namespace kiln::profile
