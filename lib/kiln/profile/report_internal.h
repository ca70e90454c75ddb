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

// The per-component table of the traffic model (a sweep's point; explain's, which without
// `measured` leaves out the columns only a sweep measures: MB counted, measured ms).
std::vector<Column<ComponentRow>> component_columns(bool measured = true);

// The roofline in a JSON document (a sweep's, explain's).
json roofline_json(const cost::Roofline& r, const std::string& bandwidth_source);

bool ok(const ProfileRow& r);  // the point ran

// The sweep's charts beside report/chart.h's line charts (report_charts.cpp).
std::string breakdown_chart(const SweepReport& report);
std::string roofline_chart(const SweepReport& report);

}  // namespace kiln::profile::report_detail
