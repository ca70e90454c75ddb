// The SVG charts of the HTML report (report.cpp says how they are drawn and checked).
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

namespace kiln::profile::report_detail {

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

}  // namespace kiln::profile::report_detail
