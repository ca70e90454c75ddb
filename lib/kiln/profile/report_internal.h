// Internal to the report files (report.cpp: the sweep's report; report_charts.cpp: its SVG charts;
// explain_report.cpp, plan_report.cpp, reference_report.cpp): what they share beyond the generic
// tables and charts (report/table.h, report/chart.h). Not installed.
#pragma once

#include <string>

#include "kiln/profile/report.h"
#include "kiln/report/chart.h"
#include "kiln/report/table.h"

namespace kiln::profile::report_detail {

using namespace kiln::report;

// The roofline in a JSON document (a sweep's, explain's).
json roofline_json(const cost::Roofline& r, const std::string& bandwidth_source);

// "12.35": bytes in GB (1e9) to 0.01 (the plan's and the reference runs' memory cells).
inline std::string gb2(double bytes) {
  return cell(bytes, 'G', "{:.2f}");
}

// The predicted memory's components as {name: bytes} (a sweep's rows, the plan's).
json components_json(const cost::MemoryEstimate& m);

bool ok(const ProfileRow& r);  // the point ran

// The sweep's charts beside report/chart.h's line charts (report_charts.cpp).
std::string breakdown_chart(const SweepReport& report);
std::string roofline_chart(const SweepReport& report);

}  // namespace kiln::profile::report_detail
