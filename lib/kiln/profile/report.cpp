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
#include <tuple>

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
// A counter column of the resource table: counted beside modelled, or the model's value marked as such.
std::string utilisation_cell(const Utilisation& u) {
  if (u.counted && u.modelled) return fmt::format("{:.1f}% (model {:.1f}%)", *u.counted * 100, *u.modelled * 100);
  if (u.counted) return pct(u.counted);
  if (u.modelled) return fmt::format("{:.1f}% (model)", *u.modelled * 100);
  return "n/a";
}
std::string point_label(const SweepPoint& p) {
  return fmt::format("cutoff_len {}, batch {}, GA {}", p.cutoff_len, p.batch_size, p.grad_accum);
}
std::string ms(const std::optional<double>& seconds) {
  return seconds ? fmt::format("{:.3f}", *seconds * 1e3) : "n/a";
}
std::string mb(const std::optional<double>& bytes) {
  return bytes ? fmt::format("{:.3f}", *bytes / 1e6) : "n/a";
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

// The roofline: log-log arithmetic intensity (FLOP/byte) against FLOP/s. The device's roof
// min(peak, intensity x bandwidth) for the GEMMs (tensor cores where the dtype has them), the
// vector units' roof dashed where it differs, the ridge point; one dot per component of the last
// measured point at its modelled time (on its roof by construction), and where --component-times
// measured it, a ring at the same intensity at its measured time (below the roof by how much the
// component falls short of it; above it where the model's bytes overstate the traffic, e.g. a
// CPU's caches), joined to the dot; and one black dot per measured step: its executed FLOPs (the
// model's, recomputation included) per measured second at the step's intensity.
std::string roofline_chart(const SweepReport& report) {
  const double w = 780, h = 440, left = 80, right = 230, top = 52, bottom = 52;
  // Its own font sizes, so that the chart lays out the same outside the report's page.
  std::string out = fmt::format(
      R"(<svg class="chart" id="chart-roofline" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" viewBox="0 0 {} {}">)"
      "<style>#chart-roofline text {{ font-family: sans-serif; font-size: 11px; }} #chart-roofline .title {{ "
      "font-size: 14px; font-weight: bold; }}</style>\n",
      w, h, w, h);
  const ProfileRow* last = nullptr;
  for (const auto& r : report.rows) {
    if (ok(r) && !r.components.empty()) last = &r;
  }
  if (!report.roofline || !last) {
    return out +
           fmt::format(R"(<text x="{}" y="22" class="title">Roofline</text><text x="{}" y="120">{}</text></svg>)", left,
                       left,
                       report.roofline ? "no measured point" : "no roofline: the device has no row in the table") +
           "\n";
  }
  const cost::Roofline& roof = *report.roofline;
  out += fmt::format(R"(<text x="{}" y="20" class="title">Roofline: {}, {}</text>)", 10, html_escape(roof.device),
                     html_escape(report.config.dtype));
  const bool measured = std::any_of(last->components.begin(), last->components.end(),
                                    [](const ComponentRow& c) { return c.measured_seconds.has_value(); });
  out += fmt::format(
      R"(<text x="{}" y="38" class="tick">dots: components at {}, modelled time (on the roof){}; black: measured steps</text>)",
      10, html_escape(point_label(last->point)), measured ? "; rings: measured time" : "");
  struct Dot {
    double x, y;
    std::string color, cls, attrs, title;
  };
  std::vector<Dot> dots;
  std::vector<std::pair<size_t, size_t>> gaps;  // (modelled dot, measured ring)
  auto pass_color = [](const std::string& pass) {
    return pass == "fwd" ? kColors[0] : pass == "bwd" ? kColors[1] : pass == "recompute" ? kColors[2] : kColors[3];
  };
  for (const ComponentRow& c : last->components) {
    const double flops = c.gemm_flops + c.other_flops;
    if (!(c.intensity > 0) || !(flops > 0) || !(c.modelled_seconds > 0)) continue;
    dots.push_back({c.intensity, flops / c.modelled_seconds, pass_color(c.pass), "roofline-component",
                    fmt::format(R"( data-component="{}" data-pass="{}")", html_escape(c.component), c.pass),
                    fmt::format("{} ({}): {:.3g} FLOP/byte, {:.3g} GFLOP/s modelled, {} bound", c.component, c.pass,
                                c.intensity, flops / c.modelled_seconds / 1e9, c.bound)});
    if (!c.measured_seconds || !(*c.measured_seconds > 0)) continue;
    dots.push_back({c.intensity, flops / *c.measured_seconds, pass_color(c.pass), "roofline-measured",
                    fmt::format(R"( data-component="{}" data-pass="{}")", html_escape(c.component), c.pass),
                    fmt::format("{} ({}): {:.3g} GFLOP/s measured, {:.0f}% of its modelled rate", c.component, c.pass,
                                flops / *c.measured_seconds / 1e9, 100 * c.modelled_seconds / *c.measured_seconds)});
    gaps.emplace_back(dots.size() - 2, dots.size() - 1);
  }
  for (const auto& r : report.rows) {
    if (!ok(r) || !(r.traffic_bytes > 0) || !(r.executed_flops > 0) || !(r.seconds_per_step > 0)) continue;
    const double x = r.executed_flops / r.traffic_bytes, y = r.executed_flops / r.seconds_per_step;
    dots.push_back(
        {x, y, "#000", "roofline-step",
         fmt::format(R"( data-point="T={} B={} GA={}")", r.point.cutoff_len, r.point.batch_size, r.point.grad_accum),
         fmt::format("measured step, {}: {:.3g} FLOP/byte, {:.3g} GFLOP/s executed", point_label(r.point), x,
                     y / 1e9)});
  }
  const double peak = std::max(roof.gemm_flops_per_s, roof.other_flops_per_s);
  // Room right of the ridge for the flat roof.
  double x_min = std::min(roof.ridge(), roof.other_flops_per_s / roof.bandwidth), x_max = 8 * roof.ridge();
  double y_min = peak, y_max = peak;
  for (const Dot& d : dots) {
    x_min = std::min(x_min, d.x);
    x_max = std::max(x_max, d.x);
    y_min = std::min(y_min, d.y);
    y_max = std::max(y_max, d.y);
  }
  // Whole decades around everything, the roof's slope included from the left edge.
  const double lx0 = std::floor(std::log10(x_min)), lx1 = std::max(lx0 + 1, std::ceil(std::log10(x_max * 1.01)));
  y_min = std::min(y_min, std::pow(10.0, lx0) * roof.bandwidth);
  const double ly0 = std::floor(std::log10(y_min)), ly1 = std::max(ly0 + 1, std::ceil(std::log10(y_max * 1.5)));
  auto fx = [&](double x) { return left + (std::log10(x) - lx0) / (lx1 - lx0) * (w - left - right); };
  auto fy = [&](double y) { return h - bottom - (std::log10(y) - ly0) / (ly1 - ly0) * (h - top - bottom); };
  for (double k = lx0; k <= lx1; ++k) {
    out += fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)", fx(std::pow(10, k)), top,
                       fx(std::pow(10, k)), h - bottom);
    out += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle" class="tick">{:g}</text>)", fx(std::pow(10, k)),
                       h - bottom + 16, std::pow(10, k));
  }
  for (double k = ly0; k <= ly1; ++k) {
    const double y = std::pow(10, k);
    out +=
        fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", left, fy(y), w - right, fy(y));
    out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick">{:g}</text>)", left - 6, fy(y) + 4,
                       y / 1e9);
  }
  out +=
      fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, h - bottom, w - right, h - bottom);
  out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, top, left, h - bottom);
  out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">arithmetic intensity, FLOP/byte (log scale)</text>)",
                     (left + w - right) / 2, h - 14);
  out += fmt::format(
      R"svg(<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">GFLOP/s (log scale)</text>)svg",
      (top + h - bottom) / 2, (top + h - bottom) / 2);
  // A roof: the bandwidth slope from the left edge (or where it enters the plot) to the ridge,
  // then flat at the peak.
  auto roof_path = [&](double flops_per_s, const std::string& name, const std::string& color, bool dashed) {
    const double x_lo = std::max(std::pow(10, lx0), std::pow(10, ly0) / roof.bandwidth);
    const double ridge = flops_per_s / roof.bandwidth, x_hi = std::pow(10, lx1);
    std::string d = fmt::format("M{:.1f},{:.1f} ", fx(x_lo), fy(std::min(flops_per_s, x_lo * roof.bandwidth)));
    if (ridge > x_lo && ridge < x_hi) d += fmt::format("L{:.1f},{:.1f} ", fx(ridge), fy(flops_per_s));
    d += fmt::format("L{:.1f},{:.1f}", fx(x_hi), fy(std::min(flops_per_s, x_hi * roof.bandwidth)));
    return fmt::format(R"(<path class="roof" data-roof="{}" d="{}" fill="none" stroke="{}" stroke-width="2.5"{}/>)",
                       name, d, color, dashed ? R"( stroke-dasharray="6 4")" : "");
  };
  out += roof_path(roof.gemm_flops_per_s, "gemm", "#444", false);
  const bool two_roofs = std::abs(roof.other_flops_per_s - roof.gemm_flops_per_s) > 1e-9 * roof.gemm_flops_per_s;
  if (two_roofs) out += roof_path(roof.other_flops_per_s, "vector", "#999", true);
  const double ridge = roof.ridge();
  out += fmt::format(
      R"(<line class="ridge" data-ridge="{:.4g}" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{}" stroke="#888" stroke-dasharray="3 3"/>)",
      ridge, fx(ridge), fy(roof.gemm_flops_per_s), fx(ridge), h - bottom);
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="tick">ridge {:.3g} FLOP/B</text>)", fx(ridge) + 4,
                     fy(roof.gemm_flops_per_s) + 16, ridge);
  for (const auto& [model, ring] : gaps) {
    out += fmt::format(
        R"(<line class="roofline-gap" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-opacity="0.5"/>)",
        fx(dots[model].x), fy(dots[model].y), fx(dots[ring].x), fy(dots[ring].y), dots[ring].color);
  }
  for (const Dot& d : dots) {
    const bool ring = d.cls == "roofline-measured";
    out += fmt::format(R"(<circle class="{}"{} cx="{:.1f}" cy="{:.1f}" r="{}" fill="{}"{}><title>{}</title></circle>)",
                       d.cls, d.attrs, fx(d.x), fy(d.y), d.cls == "roofline-step" ? 6 : 4, ring ? "none" : d.color,
                       ring ? fmt::format(R"( stroke="{}" stroke-width="2")", d.color) : "", html_escape(d.title));
  }
  // Legend.
  const std::vector<std::pair<std::string, std::string>> legend = {
      {fmt::format("GEMM roof, {:.3g} TFLOP/s", roof.gemm_flops_per_s / 1e12), "#444"},
      {"fwd components", kColors[0]},
      {"bwd components", kColors[1]},
      {"recompute components", kColors[2]},
      {"step (optimizer)", kColors[3]},
      {"measured step", "#000"}};
  double ly = top + 10;
  for (const auto& [name, color] : legend) {
    out +=
        fmt::format(R"(<circle cx="{}" cy="{:.1f}" r="4" fill="{}"/><text x="{}" y="{:.1f}" class="legend">{}</text>)",
                    w - right + 16, ly, color, w - right + 26, ly + 4, html_escape(name));
    ly += 18;
  }
  if (measured) {
    out += fmt::format(
        R"(<circle cx="{}" cy="{:.1f}" r="4" fill="none" stroke="#333" stroke-width="2"/><text x="{}" y="{:.1f}" class="legend">component, measured</text>)",
        w - right + 16, ly, w - right + 26, ly + 4);
    ly += 18;
  }
  if (two_roofs) {
    out += fmt::format(
        R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#999" stroke-width="2" stroke-dasharray="6 4"/><text x="{}" y="{:.1f}" class="legend">vector roof, {:.3g} TFLOP/s</text>)",
        w - right + 8, ly, w - right + 22, ly, w - right + 26, ly + 4, roof.other_flops_per_s / 1e12);
    ly += 18;
  }
  out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">memory {:.3g} GB/s</text>)", w - right + 8, ly + 4,
                     roof.bandwidth / 1e9);
  out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", w - right + 8, ly + 22,
                     roof.tensor_cores ? "GEMMs on tensor cores" : "no tensor cores: GEMMs on vector units");
  return out + "</svg>\n";
}

std::string series_name(const ProfileRow& r) {
  return fmt::format("batch {}, GA {}", r.point.batch_size, r.point.grad_accum);
}

// What the peak, the roofline and the three columns are, one line each (Markdown and HTML).
std::vector<std::string> describe(const SweepReport& report) {
  std::vector<std::string> lines;
  if (report.cpu_peak) {
    const cost::CpuPeak& p = *report.cpu_peak;
    std::string line = fmt::format("peak: theoretical fp32 = {}; {}", p.formula(), p.layout.row);
    if (report.config.dtype != "fp32")
      line += fmt::format("; {} = {:.4g} GFLOP/s ({})", report.config.dtype, p.flops(report.config.dtype) / 1e9,
                          report.config.dtype == "bf16" ? p.bf16_source : p.fp16_source);
    if (report.measured_gemm_tflops)
      line += fmt::format("; measured fp32 GEMM (1024^3 at::mm) {:.4g} GFLOP/s = {:.0f}% of the theoretical fp32 peak",
                          *report.measured_gemm_tflops * 1e3, *report.measured_gemm_tflops * 1e12 / p.fp32 * 100);
    if (report.peak_source == "--peak-tflops") line += "; MFU divides by --peak-tflops instead";
    lines.push_back(line);
  } else if (report.measured_gemm_tflops) {
    lines.push_back(fmt::format("peak: no theoretical CPU peak ({}); measured fp32 GEMM {:.4g} GFLOP/s",
                                report.cpu_peak_missing, *report.measured_gemm_tflops * 1e3));
  }
  if (report.roofline) {
    const cost::Roofline& r = *report.roofline;
    lines.push_back(fmt::format(
        "roofline ({}): GEMMs {:.4g} TFLOP/s ({}), other ops {:.4g} TFLOP/s (vector units), memory {:.4g} GB/s ({}); "
        "ridge point {:.3g} FLOP/byte",
        r.device, r.gemm_flops_per_s / 1e12, r.tensor_cores ? "tensor cores" : "vector units",
        r.other_flops_per_s / 1e12, r.bandwidth / 1e9, report.bandwidth_source, r.ridge()));
    lines.push_back(
        "memory bandwidth, tensor core, fp engine: \"x% (model)\" is the traffic model (cost/traffic.h) at the "
        "measured step time: modelled bytes / step time / peak bandwidth, GEMM FLOPs / tensor-core peak / step time, "
        "the other FLOPs (and GEMMs without tensor cores) / vector peak / step time" +
        std::string(
            r.tensor_cores
                ? ""
                : "; no tensor cores for this dtype here (a CPU's are AMX tiles): the tensor core column is 0"));
  } else {
    lines.push_back(
        "memory bandwidth, tensor core, fp engine: no roofline for this device (no row in cost/hardware.cpp): "
        "n/a unless counted");
  }
  lines.push_back("counters: " + report.counters_note);
  return lines;
}

// Where the measured column comes from, for one point.
std::string component_times_note(const ProfileRow& r) {
  if (!r.component_times) return "measured per component: n/a (--component-times measures it: docs/performance.md)";
  const ComponentTimes& t = *r.component_times;
  if (t.source == "gpu") {
    return fmt::format(
        "measured per component: LibTorch's profiler over as many steps again, {:.3f} ms of GPU kernels, copies and "
        "memsets per step, {:.3f} ms of them launched in no component's scope ({:g} of {:g} activities per step "
        "placed by their launch's time, {:g} unplaced)",
        t.profiled_seconds * 1e3, t.unattributed_seconds * 1e3, t.timed_activities,
        t.linked_activities + t.timed_activities + t.unplaced_activities, t.unplaced_activities);
  }
  return fmt::format(
      "measured per component: LibTorch's profiler over as many steps again, {:.3f} ms of CPU ops per step, "
      "{:.3f} ms of them in no component's scope",
      t.profiled_seconds * 1e3, t.unattributed_seconds * 1e3);
}

// Measured (component, pass) pairs no traffic-model row has: the fused Functions of selective
// recomputation, whose scopes merge several rows ("SwiGLU + down_proj").
std::vector<std::tuple<std::string, std::string, double>> unmatched_component_times(const ProfileRow& r) {
  std::vector<std::tuple<std::string, std::string, double>> out;
  if (!r.component_times) return out;
  for (const auto& [key, seconds] : r.component_times->seconds) {
    const bool matched = std::any_of(r.components.begin(), r.components.end(), [&](const ComponentRow& c) {
      return c.component == key.first && c.pass == key.second;
    });
    if (!matched) out.emplace_back(key.first, key.second, seconds);
  }
  return out;
}

// One point's per-component table (Markdown).
std::string components_markdown(const ProfileRow& r) {
  std::string out = fmt::format("\n### Components: {} (per step: measured {:.3f} ms, modelled {:.3f} ms; {})\n\n",
                                point_label(r.point), r.seconds_per_step * 1e3, r.modelled_step_seconds * 1e3,
                                component_times_note(r));
  out +=
      "| component | pass | x | GEMM GFLOP | other GFLOP | MB | MB eager | MB counted | FLOP/B | bound | modelled ms | "
      "measured ms |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n";
  for (const ComponentRow& c : r.components) {
    out += fmt::format("| {} | {} | {:g} | {:.4f} | {:.4f} | {:.3f} | {:.3f} | {} | {:.2f} | {} | {:.3f} | {} |\n",
                       c.component, c.pass, c.repeats, c.gemm_flops / 1e9, c.other_flops / 1e9, c.bytes / 1e6,
                       c.eager_bytes / 1e6, mb(c.counted_bytes), c.intensity, c.bound, c.modelled_seconds * 1e3,
                       ms(c.measured_seconds));
  }
  const auto merged = unmatched_component_times(r);
  if (!merged.empty()) {
    out += "\nMeasured in scopes that merge the rows above (fused Functions):";
    for (const auto& [component, pass, seconds] : merged)
      out += fmt::format(" {} ({}) {:.3f} ms;", component, pass, seconds * 1e3);
    out.back() = '\n';
  }
  return out;
}

// One point's per-phase table (--counter-phases): header and cells, shared by Markdown and HTML.
std::vector<std::string> phase_header(const ProfileRow& r) {
  const bool cuda = r.counters && r.counters->source == "cupti";
  return {"phase",
          "entered per step",
          "wall ms",
          cuda ? "GPU ms (counted)" : "CPU ms (counted, all threads)",
          "modelled ms",
          "DRAM GB counted",
          "GB modelled",
          "counted/modelled",
          "memory bandwidth",
          "tensor core",
          "fp engine"};
}
std::vector<std::vector<std::string>> phase_cells(const ProfileRow& r, int64_t counted_steps) {
  std::vector<std::vector<std::string>> out;
  for (const PhaseRow& p : phase_rows(r, counted_steps)) {
    out.push_back({p.phase, fmt::format("{:g}", p.segments_per_step), fmt::format("{:.3f}", p.wall_seconds * 1e3),
                   ms(p.counted_seconds), ms(p.modelled_seconds), p.counted_bytes ? gb(*p.counted_bytes) : "n/a",
                   p.modelled_bytes ? gb(*p.modelled_bytes) : "n/a",
                   p.counted_bytes && p.modelled_bytes && *p.modelled_bytes > 0
                       ? fmt::format("{:.2f}", *p.counted_bytes / *p.modelled_bytes)
                       : "n/a",
                   pct(p.memory_bandwidth), pct(p.tensor_core), pct(p.fp_engine)});
  }
  return out;
}
std::string phase_note(const ProfileRow& r, int64_t counted_steps) {
  return fmt::format(
      "counted per phase over {} step{}, per step; modelled: the traffic model's fwd rows (forward), bwd and "
      "recompute rows (backward), step rows (optimizer); the model counts compulsory bytes, a lower bound of what "
      "DRAM moves; {}",
      counted_steps, counted_steps == 1 ? "" : "s", r.counters->detail);
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
                   good ? utilisation_cell(r.memory_bandwidth) : "",
                   good ? utilisation_cell(r.tensor_core) : "",
                   good ? utilisation_cell(r.fp_engine) : "",
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
      "memory usage = peak bytes held by tensors during one step ({}); GB = 1e9 bytes\n",
      report.config.model, report.num_parameters, report.config.dtype, report.config.kernels, report.device,
      report.peak_tflops, report.peak_source.empty() ? "unknown" : report.peak_source,
      report.device.rfind("cuda", 0) == 0 ? "CUDA caching allocator, allocated" : "counting CPU allocator");
  for (const auto& l : describe(report)) out += l + "\n";
  out += "\n";
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
  out += "\n";
  for (const auto& w : report.warnings) out += "\nWARNING: " + w + "\n";
  bool heading = false;
  for (const auto& r : report.rows) {
    if (!ok(r) || r.components.empty()) continue;
    if (!heading) {
      out +=
          "\n## Memory traffic and FLOPs per component (cost/traffic.h, per optimizer step, kiln's step; "
          "\"eager\" an unfused HF eager step)\n";
      heading = true;
    }
    out += components_markdown(r);
  }
  heading = false;
  for (const auto& r : report.rows) {
    if (!ok(r) || !r.counters || r.counters->phases.empty()) continue;
    if (!heading) {
      out += "\n## Counted per phase (--counter-phases): forward, backward, optimizer\n";
      heading = true;
    }
    const int64_t steps = report.config.counted_steps();
    out += fmt::format("\n### Phases: {} ({})\n\n", point_label(r.point), phase_note(r, steps));
    const auto header = phase_header(r);
    out += line(header);
    out += line(std::vector<std::string>(header.size(), "---"));
    for (const auto& cells : phase_cells(r, steps)) out += line(cells);
  }
  return out;
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

std::string to_components_csv(const SweepReport& report) {
  std::string out =
      "cutoff_len,batch_size,gradient_accumulation_steps,component,pass,repeats,gemm_flops,other_flops,bytes,"
      "eager_bytes,intensity,bound,modelled_seconds,measured_seconds,counted_bytes\n";
  for (const auto& r : report.rows) {
    for (const ComponentRow& c : r.components) {
      out += fmt::format("{},{},{},{},{},{:g},{:.17g},{:.17g},{:.17g},{:.17g},{:.17g},{},{:.17g},{},{}\n",
                         r.point.cutoff_len, r.point.batch_size, r.point.grad_accum, csv_field(c.component), c.pass,
                         c.repeats, c.gemm_flops, c.other_flops, c.bytes, c.eager_bytes, c.intensity, c.bound,
                         c.modelled_seconds, c.measured_seconds ? fmt::format("{:.17g}", *c.measured_seconds) : "n/a",
                         c.counted_bytes ? fmt::format("{:.17g}", *c.counted_bytes) : "n/a");
    }
  }
  return out;
}

namespace {
json components_json(const std::vector<ComponentRow>& rows) {
  json out = json::array();
  for (const ComponentRow& c : rows) {
    out.push_back({{"component", c.component},
                   {"pass", c.pass},
                   {"repeats", c.repeats},
                   {"gemm_flops", c.gemm_flops},
                   {"other_flops", c.other_flops},
                   {"bytes", c.bytes},
                   {"eager_bytes", c.eager_bytes},
                   {"intensity", c.intensity},
                   {"bound", c.bound},
                   {"modelled_seconds", c.modelled_seconds},
                   {"measured_seconds", c.measured_seconds ? json(*c.measured_seconds) : json(nullptr)},
                   {"counted_bytes", c.counted_bytes ? json(*c.counted_bytes) : json(nullptr)}});
  }
  return out;
}

json roofline_json(const cost::Roofline& r, const std::string& bandwidth_source) {
  return {
      {"device", r.device},       {"gemm_flops_per_s", r.gemm_flops_per_s}, {"other_flops_per_s", r.other_flops_per_s},
      {"bandwidth", r.bandwidth}, {"bandwidth_source", bandwidth_source},   {"tensor_cores", r.tensor_cores},
      {"ridge", r.ridge()}};
}
}  // namespace

std::string explain_json(const std::string& model_name, const cost::TrafficReport& traffic, const cost::Roofline& roof,
                         const std::string& bandwidth_source) {
  const cost::TrafficOptions& o = traffic.options;
  const cost::Cost k = traffic.kiln_step(), e = traffic.eager_step();
  const json doc = {{"model", model_name},
                    {"num_parameters", traffic.num_parameters},
                    {"cutoff_len", o.seq_len},
                    {"batch_size", o.batch},
                    {"gradient_accumulation_steps", o.grad_accum},
                    {"dtype", o.dtype},
                    {"attention", o.attention},
                    {"recompute", o.recompute},
                    {"tokens_per_step", traffic.tokens_per_step},
                    {"roofline", roofline_json(roof, bandwidth_source)},
                    {"components", components_json(component_rows(traffic, roof))},
                    {"totals",
                     {{"gemm_flops", k.gemm_flops},
                      {"other_flops", k.other_flops},
                      {"model_flops", traffic.model_flops_step()},
                      {"bytes", k.bytes},
                      {"eager_bytes", e.bytes},
                      {"modelled_seconds", cost::modelled_step_seconds(traffic, roof)},
                      {"eager_modelled_seconds", cost::modelled_step_seconds(traffic, roof, true)}}}};
  return doc.dump(2) + "\n";
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
                    {"mfu_exceeds_peak", r.mfu_exceeds_peak},
                    {"losses", r.losses}});
    json& row = rows.back();
    const std::pair<std::string, const Utilisation*> columns[] = {
        {"memory_bandwidth", &r.memory_bandwidth}, {"tensor_core", &r.tensor_core}, {"fp_engine", &r.fp_engine}};
    for (const auto& [name, u] : columns) {
      row[name + "_modelled"] = opt(u->modelled);
      row[name + "_counted"] = opt(u->counted);
      row[name + "_counted_reason"] = u->counted ? json(nullptr) : json(u->counted_reason);
    }
    row["modelled_step_seconds"] = r.components.empty() ? json(nullptr) : json(r.modelled_step_seconds);
    row["executed_flops_per_step"] = ok(r) ? json(r.executed_flops) : json(nullptr);
    row["traffic_bytes_per_step"] = ok(r) ? json(r.traffic_bytes) : json(nullptr);
    row["components"] = components_json(r.components);
    if (r.component_times) {
      json merged = json::array();
      for (const auto& [component, pass, seconds] : unmatched_component_times(r))
        merged.push_back({{"component", component}, {"pass", pass}, {"measured_seconds", seconds}});
      row["component_times"] = {{"source", r.component_times->source},
                                {"linked_activities", r.component_times->linked_activities},
                                {"timed_activities", r.component_times->timed_activities},
                                {"unplaced_activities", r.component_times->unplaced_activities},
                                {"profiled_seconds", r.component_times->profiled_seconds},
                                {"unattributed_seconds", r.component_times->unattributed_seconds},
                                {"merged_rows", merged}};
    } else {
      row["component_times"] = nullptr;
    }
    if (r.counters) {
      const CounterReading& c = *r.counters;
      json per_range = json::array();
      for (const auto& [name, seconds] : c.per_range) per_range.push_back({name, seconds});
      row["counters"] = {{"source", c.source},
                         {"memory_bandwidth", opt(c.memory_bandwidth)},
                         {"tensor_core", opt(c.tensor_core)},
                         {"fp_engine", opt(c.fp_engine)},
                         {"dram_bytes", opt(c.dram_bytes)},
                         {"cycles", opt(c.cycles)},
                         {"instructions", opt(c.instructions)},
                         {"cpu_seconds", opt(c.cpu_seconds)},
                         {"memory_throughput", opt(c.memory_throughput)},
                         {"gpu_seconds", opt(c.gpu_seconds)},
                         {"ranges", c.ranges},
                         {"collect_seconds", c.collect_seconds},
                         {"seconds", c.seconds},
                         {"reason", c.reason},
                         {"detail", c.detail},
                         {"per_range", per_range}};
      auto kernel_json = [&](const KernelCounters& k) {
        json j = {{"name", k.name},
                  {"launches", k.launches},
                  {"seconds", k.seconds},
                  {"dram_bytes", opt(k.dram_bytes)},
                  {"memory_bandwidth", opt(k.memory_bandwidth)},
                  {"memory_throughput", opt(k.memory_throughput)},
                  {"tensor_core", opt(k.tensor_core)},
                  {"fp_engine", opt(k.fp_engine)}};
        if (!k.pass.empty()) j["pass"] = k.pass;
        return j;
      };
      json kernels = json::array(), components = json::array();
      for (const KernelCounters& k : c.kernels) kernels.push_back(kernel_json(k));
      for (const KernelCounters& k : c.components) components.push_back(kernel_json(k));
      row["counters"]["kernels"] = kernels;
      row["counters"]["components"] = components;
      row["counters"]["unattributed"] = c.unattributed ? kernel_json(*c.unattributed) : json(nullptr);
      json phases = json::array();
      const std::vector<PhaseRow> modelled = phase_rows(r, report.config.counted_steps());
      for (size_t i = 0; i < c.phases.size(); ++i) {
        const PhaseCounters& p = c.phases[i];
        phases.push_back({{"name", p.name},
                          {"segments", p.segments},
                          {"seconds", p.seconds},
                          {"gpu_seconds", opt(p.gpu_seconds)},
                          {"cpu_seconds", opt(p.cpu_seconds)},
                          {"cycles", opt(p.cycles)},
                          {"instructions", opt(p.instructions)},
                          {"dram_bytes", opt(p.dram_bytes)},
                          {"memory_bandwidth", opt(p.memory_bandwidth)},
                          {"memory_throughput", opt(p.memory_throughput)},
                          {"tensor_core", opt(p.tensor_core)},
                          {"fp_engine", opt(p.fp_engine)},
                          {"kernels", p.kernels},
                          {"modelled_bytes_per_step", opt(modelled[i].modelled_bytes)},
                          {"modelled_seconds_per_step", opt(modelled[i].modelled_seconds)}});
      }
      row["counters"]["phases"] = phases;
    } else {
      row["counters"] = nullptr;
    }
  }
  json cpu = nullptr;
  if (report.cpu_peak) {
    const cost::CpuPeak& p = *report.cpu_peak;
    const cost::CpuFeatures& f = p.features;
    cpu = {{"vendor", f.vendor},
           {"family", f.family},
           {"model", f.model},
           {"model_name", f.model_name},
           {"flags",
            {{"sse2", f.sse2},
             {"avx", f.avx},
             {"fma", f.fma},
             {"avx2", f.avx2},
             {"avx512f", f.avx512f},
             {"avx512_bf16", f.avx512_bf16},
             {"avx512_fp16", f.avx512_fp16},
             {"amx_bf16", f.amx_bf16},
             {"amx_fp16", f.amx_fp16}}},
           {"width_bits", p.layout.width_bits},
           {"fma_units", p.layout.units},
           {"flop_per_instruction", p.layout.flop_per_instruction},
           {"table_row", p.layout.row},
           {"clock_hz", p.clock.hz},
           {"clock_source", p.clock.source},
           {"clock_reported_hz", p.clock.reported_hz},
           {"clock_reported_source", p.clock.reported_source},
           {"clock_measured_hz", p.clock.measured_hz > 0 ? json(p.clock.measured_hz) : json(nullptr)},
           {"threads", p.threads},
           {"cores", p.cores},
           {"fp32_flops", p.fp32},
           {"bf16_flops", p.bf16},
           {"fp16_flops", p.fp16},
           {"bf16_source", p.bf16_source},
           {"fp16_source", p.fp16_source},
           {"formula", p.formula()}};
  }
  json hardware = nullptr;
  if (report.hardware) {
    const cost::HardwareSpec& h = *report.hardware;
    hardware = {{"name", h.name},
                {"source", h.source},
                {"tensor_tflops",
                 {{"bf16", h.tensor_bf16 ? json(h.bf16) : json(nullptr)},
                  {"fp16", h.tensor_fp16 ? json(h.fp16) : json(nullptr)},
                  {"tf32", h.tf32 > 0 ? json(h.tf32) : json(nullptr)}}},
                {"vector_tflops", {{"bf16", h.bf16_vector}, {"fp16", h.fp16_vector}, {"fp32", h.fp32}}},
                {"memory_bandwidth", h.memory_bandwidth}};
  }
  json roofline = nullptr;
  if (report.roofline) roofline = roofline_json(*report.roofline, report.bandwidth_source);
  const json doc = {
      {"model", report.config.model},
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
      {"counters_requested", report.config.counters},
      {"counter_steps", report.config.counters ? json(report.config.counted_steps()) : json(nullptr)},
      {"counters_per_kernel", report.config.counters_per_kernel},
      {"cpu_peak", cpu},
      {"cpu_peak_missing", report.cpu_peak_missing},
      {"measured_gemm_tflops", report.measured_gemm_tflops ? json(*report.measured_gemm_tflops) : json(nullptr)},
      {"measured_gemm_exceeds_peak", report.measured_gemm_exceeds_peak},
      {"hardware", hardware},
      {"roofline", roofline},
      {"warnings", report.warnings},
      {"world_size", report.world_size},
      {"launcher", report.launcher},
      {"backend", report.backend},
      {"zero_stage", report.config.zero_stage},
      {"ddp_overlap", report.config.ddp_overlap},
      {"optimisation",
       {{"learning_rate", report.config.training.learning_rate},
        {"lr_scheduler_type", report.config.training.lr_scheduler_type},
        {"warmup_ratio", report.config.training.warmup_ratio},
        {"warmup_steps", report.config.training.warmup_steps},
        {"weight_decay", report.config.training.weight_decay},
        {"max_grad_norm", report.config.training.max_grad_norm}}},
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
  std::vector<std::string> written = write_report_files(dir, "profile", formats, [&](const std::string& f) {
    return f == "md"     ? to_markdown(report)
           : f == "csv"  ? to_csv(report)
           : f == "json" ? to_json(report)
                         : to_html(report);
  });
  if (std::find(formats.begin(), formats.end(), "csv") != formats.end()) {
    const fs::path path = fs::path(dir) / "profile_components.csv";
    write_atomic(path, to_components_csv(report));
    written.push_back(path.string());
  }
  return written;
}

}  // namespace kiln::profile
