// The sweep's HTML report: the tables and the inline SVG charts (report_charts.cpp).
#include "kiln/profile/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/cost/flops.h"
#include "kiln/profile/report_internal.h"

namespace kiln::profile {

using json = nlohmann::json;
using namespace report_detail;

std::string to_html(const SweepReport& report) {
  std::map<std::string, Series> mem, mem_pred, speed;
  size_t color = 0;
  std::map<std::string, std::string> colors;
  for (const auto& r : report.rows) {
    const std::string name = series_name(r);
    if (!colors.count(name)) colors[name] = kColors[color++ % 8];
    mem_pred[name].name = name + " predicted";
    mem_pred[name].color = colors[name];
    mem_pred[name].dashed = true;
    mem_pred[name].points.emplace_back(static_cast<double>(r.point.cutoff_len), r.predicted.total() / 1e9);
    mem[name].name = name + " measured";
    mem[name].color = colors[name];
    speed[name].name = name;
    speed[name].color = colors[name];
    if (!ok(r)) continue;
    mem[name].points.emplace_back(static_cast<double>(r.point.cutoff_len), r.peak_allocated_bytes / 1e9);
    speed[name].points.emplace_back(static_cast<double>(r.point.cutoff_len), r.tokens_per_second);
  }
  std::vector<Series> mem_series, speed_series;
  for (auto& [n, s] : mem) {
    mem_series.push_back(s);
    mem_series.push_back(mem_pred[n]);
  }
  for (auto& [n, s] : speed) speed_series.push_back(s);

  std::string out = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kiln-profile report</title>
<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 12px 0; }
th, td { border: 1px solid #bbb; padding: 3px 7px; text-align: right; }
th { background: #eee; }
td.oom { color: #b00; font-weight: bold; }
svg.chart { display: block; margin: 16px 0; background: #fff; border: 1px solid #ccc; }
svg .title { font-weight: bold; font-size: 14px; }
svg .tick, svg .legend { font-size: 11px; }
svg .oom { fill: #b00; font-weight: bold; font-size: 12px; }
.note { color: #555; font-size: 13px; }
.warning { color: #b00; font-weight: bold; }
</style></head><body>
)";
  out += fmt::format("<h1>kiln-profile: {}</h1>\n", html_escape(report.config.model));
  out += fmt::format(
      "<p>{} parameters, compute dtype {}, device {}, peak {:.3g} TFLOP/s ({}), {} timed steps after {} warm-up, "
      "{} data{}.</p>\n",
      report.num_parameters, html_escape(report.config.dtype), html_escape(report.device), report.peak_tflops,
      html_escape(report.peak_source.empty() ? "unknown" : report.peak_source), report.config.steps,
      report.config.warmup, report.config.dataset_dir.empty() ? "synthetic" : "shard",
      report.config.gradient_checkpointing ? ", recomputation " + report.config.recomputation() : "");
  out += "<table id=\"results\"><thead><tr>";
  for (const auto& h : table_header(report)) out += "<th>" + html_escape(h) + "</th>";
  out += "</tr></thead><tbody>\n";
  for (const auto& row : table_rows(report)) {
    out += "<tr>";
    for (const auto& c : row) out += (c == "OOM" ? "<td class=\"oom\">" : "<td>") + html_escape(c) + "</td>";
    out += "</tr>\n";
  }
  out += "</tbody></table>\n";
  for (const auto& w : report.warnings) out += "<p class=\"warning\">WARNING: " + html_escape(w) + "</p>\n";
  for (const auto& l : describe(report)) out += "<p class=\"note\">" + html_escape(l) + "</p>\n";
  out +=
      "<p class=\"note\">Memory usage is the peak of one step; predicted is the analytic model of "
      "docs/performance.md.</p>\n";
  out += line_chart("chart-memory", "Peak memory against cutoff_len (solid: measured, dashed: predicted)", "cutoff_len",
                    "GB", mem_series);
  out += line_chart("chart-speed", "Tokens per second against cutoff_len", "cutoff_len", "tokens/s", speed_series);
  out += breakdown_chart(report);
  out += roofline_chart(report);
  bool heading = false;
  for (const auto& r : report.rows) {
    if (!ok(r) || r.components.empty()) continue;
    if (!heading) {
      out +=
          "<h2>Memory traffic and FLOPs per component</h2>\n<p class=\"note\">cost/traffic.h, per optimizer step: "
          "kiln's step, and the bytes of an unfused HF eager step beside it. Measured per component: from "
          "LibTorch's profiler with --component-times (on a CPU the ops' CPU time, on a GPU the time of the "
          "kernels, copies and memsets they launch), else n/a.</p>\n";
      heading = true;
    }
    out += fmt::format(
        "<details class=\"components\"><summary>{}: measured {:.3f} ms per step, modelled {:.3f} ms; {}</summary>\n"
        "<table class=\"components\"><thead><tr><th>component</th><th>pass</th><th>x</th><th>GEMM GFLOP</th>"
        "<th>other GFLOP</th><th>MB</th><th>MB eager</th><th>MB counted</th><th>FLOP/B</th><th>bound</th>"
        "<th>modelled ms</th><th>measured ms</th></tr></thead><tbody>\n",
        html_escape(point_label(r.point)), r.seconds_per_step * 1e3, r.modelled_step_seconds * 1e3,
        html_escape(component_times_note(r)));
    for (const ComponentRow& c : r.components) {
      out += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{:g}</td><td>{:.4f}</td><td>{:.4f}</td><td>{:.3f}</td><td>{:.3f}</td>"
          "<td>{}</td><td>{:.2f}</td><td>{}</td><td>{:.3f}</td><td>{}</td></tr>\n",
          html_escape(c.component), c.pass, c.repeats, c.gemm_flops / 1e9, c.other_flops / 1e9, c.bytes / 1e6,
          c.eager_bytes / 1e6, mb(c.counted_bytes), c.intensity, c.bound, c.modelled_seconds * 1e3,
          ms(c.measured_seconds));
    }
    out += "</tbody></table></details>\n";
  }
  heading = false;
  for (const auto& r : report.rows) {
    if (!ok(r) || !r.counters || r.counters->phases.empty()) continue;
    if (!heading) {
      out += "<h2>Counted per phase: forward, backward, optimizer</h2>\n";
      heading = true;
    }
    const int64_t steps = report.config.counted_steps();
    out += fmt::format("<p class=\"note\">{}: {}</p>\n<table class=\"phases\"><thead><tr>",
                       html_escape(point_label(r.point)), html_escape(phase_note(r, steps)));
    for (const auto& h : phase_header(r)) out += "<th>" + html_escape(h) + "</th>";
    out += "</tr></thead><tbody>\n";
    for (const auto& cells : phase_cells(r, steps)) {
      out += "<tr>";
      for (const auto& c : cells) out += "<td>" + html_escape(c) + "</td>";
      out += "</tr>\n";
    }
    out += "</tbody></table>\n";
  }
  out += "</body></html>\n";
  return out;
}

}  // namespace kiln::profile
