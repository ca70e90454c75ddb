// The planner's report files (kiln-profile plan; docs/performance.md): cost::make_plan computes,
// this formats.
#pragma once

#include <string>
#include <vector>

#include "kiln/cost/plan.h"

namespace kiln::profile {

using cost::PlanReport;

// Markdown: per cutoff_len the recommendation and, per policy, the largest micro-batch that fits.
std::string plan_markdown(const PlanReport& report);
std::string plan_csv(const PlanReport& report);
std::string plan_json(const PlanReport& report);
std::string plan_html(const PlanReport& report);
// Writes plan.{md,csv,json,html} (each atomically) for `formats`; returns the paths.
std::vector<std::string> write_plan_reports(const PlanReport& report, const std::string& dir,
                                            const std::vector<std::string>& formats);

}  // namespace kiln::profile
