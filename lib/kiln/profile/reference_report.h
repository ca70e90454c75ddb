// kiln-profile reference: every row of the reference runs' data file
// (configs/reference/llamafactory_runs.yaml) with its measured figures, the reference stack's
// prediction (cost/reference.h) and the ratio, and beside them kiln's own prediction for the same
// work on the same GPU. Nothing runs: the models, the data file and the host costs
// (configs/reference/host_costs.yaml) only. docs/performance.md, "The reference runs, predicted".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cost/reference_runs.h"

namespace kiln::profile {

using cost::kMemoryTolerance;
using cost::kSpeedTolerance;
using cost::parse_speed_seconds;
using cost::ReferenceReport;
using cost::ReferenceRow;

// The reference runs predicted (cost/reference_runs.h), kiln's run of each described as kiln-profile
// explain describes one (settings.h, explain_run).
ReferenceReport reference_report(const std::string& data_path = "", const std::string& host_costs_path = "");

std::string reference_markdown(const ReferenceReport& report);
std::string reference_json(const ReferenceReport& report);
std::string reference_html(const ReferenceReport& report);
// Writes reference.{md,json,html} (each atomically) for `formats`; returns the paths.
std::vector<std::string> write_reference_reports(const ReferenceReport& report, const std::string& dir,
                                                 const std::vector<std::string>& formats);

}  // namespace kiln::profile
