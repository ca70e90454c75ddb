// The HTML report draws its charts as inline SVG written here, so it opens offline and renders
// the same in any browser; every chart is an <svg class="chart"> and every data series a
// <path class="series" data-series="..."> with a <circle class="point"> per point, which the
// tests check structurally (and, where Chromium is installed, by a headless screenshot).
#include "kiln/profile/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/cost/flops.h"

namespace kiln::profile {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string gb(double bytes) {
  return fmt::format("{:.3f}", bytes / 1e9);
}
std::string pct(const std::optional<double>& f) {
  return f ? fmt::format("{:.1f}%", *f * 100) : "n/a";
}
bool ok(const ProfileRow& r) {
  return r.status == "ok";
}

std::string dtype_column(const SweepReport& r) {
  return r.config.dtype == "bf16" ? "bf16" : "fp16";
}
std::string dtype_value(const SweepReport& r) {
  return r.config.dtype == "fp32" ? "false" : "true";
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

void write_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("{}: cannot write", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot rename into place: {}", path.string(), ec.message()));
}

// ---- SVG charts -----------------------------------------------------------------------------

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                   "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
  std::string color;
  bool dashed = false;
};

std::string nice(double v) {
  if (v == 0) return "0";
  if (std::abs(v) >= 1000 || std::abs(v) < 0.01) return fmt::format("{:.3g}", v);
  return fmt::format("{:.3g}", v);
}

std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const std::vector<Series>& series) {
  const double w = 640, h = 360, left = 70, right = 170, top = 36, bottom = 50;
  double x_min = INFINITY, x_max = -INFINITY, y_max = 0;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
      y_max = std::max(y_max, y);
    }
  }
  std::string out = fmt::format(
      R"(<svg class="chart" id="{}" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}">)"
      "\n<text x=\"{}\" y=\"22\" class=\"title\">{}</text>\n",
      id, w, h, w, h, left, html_escape(title));
  if (!std::isfinite(x_min)) return out + "<text x=\"70\" y=\"180\">no measured points</text></svg>\n";
  const bool log_x = x_min > 0 && x_max / x_min >= 16;
  auto fx = [&](double x) {
    const double a = log_x ? std::log2(x_min) : x_min, b = log_x ? std::log2(x_max) : x_max;
    const double v = log_x ? std::log2(x) : x;
    return left + (b > a ? (v - a) / (b - a) : 0.5) * (w - left - right);
  };
  y_max = y_max > 0 ? y_max * 1.1 : 1;
  auto fy = [&](double y) { return h - bottom - y / y_max * (h - top - bottom); };
  out +=
      fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, h - bottom, w - right, h - bottom);
  out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, top, left, h - bottom);
  for (int i = 0; i <= 4; ++i) {
    const double y = y_max * i / 4;
    out +=
        fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", left, fy(y), w - right, fy(y));
    out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick">{}</text>)", left - 6, fy(y) + 4,
                       nice(y));
  }
  std::vector<double> xs;
  for (const auto& s : series) {
    for (const auto& p : s.points) xs.push_back(p.first);
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  for (double x : xs) {
    out += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle" class="tick">{}</text>)", fx(x), h - bottom + 16,
                       nice(x));
  }
  out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", (left + w - right) / 2, h - 12,
                     html_escape(x_label + (log_x ? " (log scale)" : "")));
  out += fmt::format(R"svg(<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>)svg",
                     (top + h - bottom) / 2, (top + h - bottom) / 2, html_escape(y_label));
  int legend = 0;
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    std::string d;
    for (const auto& [x, y] : s.points) d += fmt::format("{}{:.1f},{:.1f} ", d.empty() ? "M" : "L", fx(x), fy(y));
    out += fmt::format(R"(<path class="series" data-series="{}" d="{}" fill="none" stroke="{}" stroke-width="2"{}/>)",
                       html_escape(s.name), d, s.color, s.dashed ? R"( stroke-dasharray="6 4")" : "");
    for (const auto& [x, y] : s.points) {
      out += fmt::format(
          R"(<circle class="point" cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>{}: {} at {}</title></circle>)",
          fx(x), fy(y), s.color, html_escape(s.name), nice(y), nice(x));
    }
    const double ly = top + 10 + 18 * legend++;
    out += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)",
                       w - right + 10, ly, w - right + 34, ly, s.color, s.dashed ? R"( stroke-dasharray="6 4")" : "");
    out +=
        fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", w - right + 40, ly + 4, html_escape(s.name));
  }
  return out + "</svg>\n";
}

// One stacked bar per point: the predicted components, with the measured peak as a black tick.
std::string breakdown_chart(const SweepReport& report) {
  std::vector<std::string> names;
  for (const auto& r : report.rows) {
    for (const auto& [n, b] : r.predicted.components) {
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  const double bar_h = 22, gap = 8, left = 170, right = 30, top = 36, legend_h = 22 * ((names.size() + 2) / 3) + 10;
  const double w = 820, h = top + report.rows.size() * (bar_h + gap) + 30 + legend_h;
  double max_bytes = 1;
  for (const auto& r : report.rows) max_bytes = std::max({max_bytes, r.predicted.total(), r.peak_allocated_bytes});
  auto fx = [&](double b) { return left + b / max_bytes * (w - left - right); };
  std::string out = fmt::format(
      R"(<svg class="chart" id="chart-breakdown" xmlns="http://www.w3.org/2000/svg" width="{}" height="{:.0f}" viewBox="0 0 {} {:.0f}">)"
      "\n<text x=\"{}\" y=\"22\" class=\"title\">Predicted memory per component (bars) and measured peak (black tick), "
      "GB</text>\n",
      w, h, w, h, 10);
  double y = top;
  for (const auto& r : report.rows) {
    out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick">T={} B={} GA={}</text>)", left - 6,
                       y + bar_h * 0.7, r.point.cutoff_len, r.point.batch_size, r.point.grad_accum);
    double x = 0;
    for (const auto& [n, b] : r.predicted.components) {
      const size_t ci = static_cast<size_t>(std::find(names.begin(), names.end(), n) - names.begin());
      out += fmt::format(
          R"(<rect class="component" data-component="{}" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{}" fill="{}"><title>{}: {} GB</title></rect>)",
          html_escape(n), fx(x), y, fx(x + b) - fx(x), bar_h, kColors[ci % 8], html_escape(n), gb(b));
      x += b;
    }
    if (ok(r)) {
      out += fmt::format(
          R"(<line class="measured" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#000" stroke-width="3"/>)",
          fx(r.peak_allocated_bytes), y - 3, fx(r.peak_allocated_bytes), y + bar_h + 3);
    } else {
      out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="oom">{}</text>)", fx(x) + 6, y + bar_h * 0.7,
                         html_escape(r.status));
    }
    y += bar_h + gap;
  }
  out += fmt::format(
      R"(<text x="{}" y="{:.1f}" class="tick">0</text><text x="{:.1f}" y="{:.1f}" text-anchor="end" class="tick">{} GB</text>)",
      left, y + 12, w - right, y + 12, gb(max_bytes));
  y += 30;
  for (size_t i = 0; i < names.size(); ++i) {
    const double lx = 10 + static_cast<double>(i % 3) * 270, ly = y + 22 * static_cast<double>(i / 3);
    out += fmt::format(
        R"(<rect x="{}" y="{:.1f}" width="14" height="14" fill="{}"/><text x="{}" y="{:.1f}" class="legend">{}</text>)",
        lx, ly, kColors[i % 8], lx + 20, ly + 12, html_escape(names[i]));
  }
  return out + "</svg>\n";
}

std::string series_name(const ProfileRow& r) {
  return fmt::format("batch {}, GA {}", r.point.batch_size, r.point.grad_accum);
}

}  // namespace

std::vector<std::string> table_header(const SweepReport& report) {
  return {"task",
          dtype_column(report),
          "speed",
          "num_gpu",
          "batch size per gpu",
          "gradient_accumulation_steps",
          "cutoff_len",
          "memory usage (GB)",
          "memory bandwidth",
          "tensor core",
          "fp engine",
          "tokens/s",
          "TFLOP/s",
          "MFU",
          "reserved (GB)",
          "predicted (GB)",
          "measured/predicted",
          "peak RSS (GB)",
          "ranks",
          "comm wait",
          "status"};
}

std::vector<std::vector<std::string>> table_rows(const SweepReport& report) {
  const bool cuda = report.device.rfind("cuda", 0) == 0;
  std::vector<std::vector<std::string>> out;
  for (const auto& r : report.rows) {
    const bool good = ok(r);
    out.push_back({report.config.task,
                   dtype_value(report),
                   r.speed(),
                   cuda ? std::to_string(report.world_size) : "0",
                   std::to_string(r.point.batch_size),
                   std::to_string(r.point.grad_accum),
                   std::to_string(r.point.cutoff_len),
                   good ? gb(r.peak_allocated_bytes) : r.status,
                   pct(r.dram_throughput),
                   pct(r.tensor_pipe),
                   "n/a",
                   good ? fmt::format("{:.0f}", r.tokens_per_second) : "",
                   good ? fmt::format("{:.3g}", r.tflops) : "",
                   good ? pct(r.mfu) : "",
                   r.peak_reserved_bytes && good ? gb(*r.peak_reserved_bytes) : "n/a",
                   gb(r.predicted.total()),
                   good ? fmt::format("{:.3f}", r.ratio()) : "",
                   gb(r.peak_rss_bytes),
                   std::to_string(report.world_size),
                   good && r.comm_wait_share ? pct(r.comm_wait_share) : "n/a",
                   r.status});
  }
  return out;
}

std::string to_markdown(const SweepReport& report) {
  const auto header = table_header(report);
  std::string out = fmt::format(
      "kiln-profile: {} ({} parameters), {}, kernels {}, device {}, peak {:.3g} TFLOP/s ({})\n"
      "memory usage = peak bytes held by tensors during one step ({}); GB = 1e9 bytes\n\n",
      report.config.model, report.num_parameters, report.config.dtype, report.config.kernels, report.device,
      report.peak_tflops, report.peak_source.empty() ? "unknown" : report.peak_source,
      report.device.rfind("cuda", 0) == 0 ? "CUDA caching allocator, allocated" : "counting CPU allocator");
  auto line = [](const std::vector<std::string>& cells) {
    std::string l = "|";
    for (const auto& c : cells) l += " " + c + " |";
    return l + "\n";
  };
  out += line(header);
  out += line(std::vector<std::string>(header.size(), "---"));
  for (const auto& row : table_rows(report)) out += line(row);
  for (const auto& r : report.rows) {
    if (!ok(r))
      out += fmt::format("\n{} at cutoff_len {}, batch {}, GA {}: {}", r.status, r.point.cutoff_len, r.point.batch_size,
                         r.point.grad_accum, r.message.substr(0, r.message.find('\n')));
  }
  return out + "\n";
}

std::string to_csv(const SweepReport& report) {
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) out += ',';
      out += csv_field(cells[i]);
    }
    out += "\n";
  };
  line(table_header(report));
  for (const auto& row : table_rows(report)) line(row);
  return out;
}

std::string to_json(const SweepReport& report) {
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json rows = json::array();
  for (const auto& r : report.rows) {
    json comps = json::object();
    for (const auto& [n, b] : r.predicted.components) comps[n] = b;
    const auto f = cost::flops_per_token(report.model, r.point.cutoff_len);
    rows.push_back({{"cutoff_len", r.point.cutoff_len},
                    {"batch_size", r.point.batch_size},
                    {"gradient_accumulation_steps", r.point.grad_accum},
                    {"status", r.status},
                    {"message", r.message},
                    {"speed", r.speed()},
                    {"seconds_per_step", ok(r) ? json(r.seconds_per_step) : json(nullptr)},
                    {"tokens_per_second", ok(r) ? json(r.tokens_per_second) : json(nullptr)},
                    {"tflops", ok(r) ? json(r.tflops) : json(nullptr)},
                    {"mfu", ok(r) ? opt(r.mfu) : json(nullptr)},
                    {"peak_allocated_bytes", ok(r) ? json(r.peak_allocated_bytes) : json(nullptr)},
                    {"peak_reserved_bytes", ok(r) ? opt(r.peak_reserved_bytes) : json(nullptr)},
                    {"peak_rss_bytes", r.peak_rss_bytes},
                    {"rss_peak_over_baseline_bytes", ok(r) ? opt(r.rss_peak_over_baseline_bytes) : json(nullptr)},
                    {"predicted_bytes", r.predicted.total()},
                    {"predicted_components", comps},
                    {"measured_over_predicted", ok(r) ? json(r.ratio()) : json(nullptr)},
                    {"flops_per_token",
                     {{"matmul_forward", f.matmul_forward},
                      {"attention_forward", f.attention_forward},
                      {"train", f.train()},
                      {"six_n", cost::six_n_per_token(report.model)}}},
                    {"comm_wait_share", opt(r.comm_wait_share)},
                    {"buckets_launched", r.buckets_launched ? json(*r.buckets_launched) : json(nullptr)},
                    {"buckets_overlapped", r.buckets_overlapped ? json(*r.buckets_overlapped) : json(nullptr)},
                    {"dram_throughput", opt(r.dram_throughput)},
                    {"tensor_pipe", opt(r.tensor_pipe)}});
  }
  const json doc = {{"model", report.config.model},
                    {"num_parameters", report.num_parameters},
                    {"dtype", report.config.dtype},
                    {"kernels", report.config.kernels},
                    {"device", report.device},
                    {"peak_tflops", report.peak_tflops > 0 ? json(report.peak_tflops) : json(nullptr)},
                    {"peak_name", report.peak_name},
                    {"peak_source", report.peak_source},
                    {"gradient_checkpointing", report.config.gradient_checkpointing},
                    {"recomputation", report.config.recomputation()},
                    {"steps", report.config.steps},
                    {"warmup", report.config.warmup},
                    {"synthetic_data", report.config.dataset_dir.empty()},
                    {"counters", report.counters_note},
                    {"world_size", report.world_size},
                    {"launcher", report.launcher},
                    {"backend", report.backend},
                    {"zero_stage", report.config.zero_stage},
                    {"ddp_overlap", report.config.ddp_overlap},
                    {"rows", rows}};
  return doc.dump(2) + "\n";
}

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
  out += "<p class=\"note\">" + html_escape(report.counters_note) +
         ". Memory usage is the peak of one step; "
         "predicted is the analytic model of docs/performance.md.</p>\n";
  out += line_chart("chart-memory", "Peak memory against cutoff_len (solid: measured, dashed: predicted)", "cutoff_len",
                    "GB", mem_series);
  out += line_chart("chart-speed", "Tokens per second against cutoff_len", "cutoff_len", "tokens/s", speed_series);
  out += breakdown_chart(report);
  out += "</body></html>\n";
  return out;
}

std::vector<std::string> write_report_files(const std::string& dir, const std::string& stem,
                                            const std::vector<std::string>& formats,
                                            const std::function<std::string(const std::string&)>& render) {
  for (const auto& f : formats) {
    if (f != "md" && f != "csv" && f != "json" && f != "html")
      throw std::invalid_argument(fmt::format("--format: '{}' is not md, csv, json or html", f));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot create the output directory: {}", dir, ec.message()));
  std::vector<std::string> written;
  for (const auto& f : formats) {
    const fs::path path = fs::path(dir) / (stem + "." + f);
    write_atomic(path, render(f));
    written.push_back(path.string());
  }
  return written;
}

std::vector<std::string> write_reports(const SweepReport& report, const std::string& dir,
                                       const std::vector<std::string>& formats) {
  return write_report_files(dir, "profile", formats, [&](const std::string& f) {
    return f == "md"     ? to_markdown(report)
           : f == "csv"  ? to_csv(report)
           : f == "json" ? to_json(report)
                         : to_html(report);
  });
}

}  // namespace kiln::profile
