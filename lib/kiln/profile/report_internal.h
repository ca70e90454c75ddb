// Internal to the report files (report.cpp: helpers, tables, writing; report_charts.cpp: the SVG
// charts; report_json.cpp; report_html.cpp): what they share. Not installed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/profile/report.h"

namespace kiln::profile::report_detail {

using json = nlohmann::json;

// Cells and labels.
std::string gb(double bytes);
std::string pct(const std::optional<double>& f);
bool ok(const ProfileRow& r);
std::string utilisation_cell(const Utilisation& u);
std::string point_label(const SweepPoint& p);
std::string ms(const std::optional<double>& seconds);
std::string mb(const std::optional<double>& bytes);
std::string dtype_column(const SweepReport& r);
std::string dtype_value(const SweepReport& r);
std::string html_escape(const std::string& s);
std::string csv_field(const std::string& s);

// The SVG charts (report_charts.cpp).
inline constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                          "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
  std::string color;
  bool dashed = false;
};
std::string nice(double v);
std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const std::vector<Series>& series);
std::string breakdown_chart(const SweepReport& report);
std::string roofline_chart(const SweepReport& report);

// Texts the Markdown and the HTML share.
std::string series_name(const ProfileRow& r);
std::vector<std::string> describe(const SweepReport& report);
std::string component_times_note(const ProfileRow& r);
std::vector<std::tuple<std::string, std::string, double>> unmatched_component_times(const ProfileRow& r);
std::string components_markdown(const ProfileRow& r);
std::vector<std::string> phase_header(const ProfileRow& r);
std::vector<std::vector<std::string>> phase_cells(const ProfileRow& r, int64_t counted_steps);
std::string phase_note(const ProfileRow& r, int64_t counted_steps);

// JSON pieces (report_json.cpp).
json components_json(const std::vector<ComponentRow>& rows);
json roofline_json(const cost::Roofline& r, const std::string& bandwidth_source);

}  // namespace kiln::profile::report_detail
