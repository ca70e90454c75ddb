// The SVG charts of the HTML reports (report.cpp says how they are drawn and checked). Axes
// tick at round numbers (1, 2 or 5 times a power of ten) labelled with SI prefixes.
#include <algorithm>
#include <cmath>

#include "kiln/profile/report_internal.h"

namespace kiln::profile::report_detail {

std::string si(double v, double resolution, const std::string& unit) {
  if (v == 0) return unit.empty() ? "0" : "0 " + unit;
  const double a = std::abs(v), e3 = std::floor(std::log10(a) / 3 + 1e-9);
  const int e = a >= 1e3 ? static_cast<int>(std::min(e3, 5.0)) : a < 1e-3 ? static_cast<int>(std::max(e3, -3.0)) : 0;
  const double scale = std::pow(1000.0, e);
  std::string s = fmt::format("{:.{}f}", v / scale,
                              std::max(0, static_cast<int>(std::ceil(-std::log10(resolution / scale) - 1e-9))));
  if (s.find('.') != std::string::npos) s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  const std::string prefix = e == 0 ? "" : std::string(1, e > 0 ? "kMGTP"[e - 1] : "mun"[-e - 1]);
  return unit.empty() ? s + prefix : s + " " + prefix + unit;
}

std::vector<double> linear_ticks(double lo, double hi, int count) {
  const double raw = (hi - lo) / count, p = std::pow(10.0, std::floor(std::log10(raw))), f = raw / p;
  const double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  std::vector<double> out;
  for (double k = std::floor(lo / step + 1e-9); k <= std::ceil(hi / step - 1e-9); ++k) out.push_back(k * step);
  return out;
}

std::vector<double> log_ticks(double lo, double hi) {
  const bool decades = hi / lo > 1000;
  std::vector<double> out;
  for (double d = std::pow(10.0, std::floor(std::log10(lo))); out.empty() || out.back() < hi * (1 - 1e-9); d *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (decades && m > 1) continue;
      if (m * d <= lo * (1 + 1e-9)) out.clear();  // the last tick at or below lo starts the axis
      if (out.empty() || out.back() < hi * (1 - 1e-9)) out.push_back(m * d);
    }
  }
  return out;
}

namespace {

// An axis over its first to its last tick.
struct Axis {
  std::vector<double> ticks;
  bool log = false;
  double fraction(double v) const {
    auto f = [&](double x) { return log ? std::log10(x) : x; };
    return (f(v) - f(ticks.front())) / (f(ticks.back()) - f(ticks.front()));
  }
  std::string label(double t) const {
    return si(t, log ? std::pow(10.0, std::floor(std::log10(t) + 1e-9)) : ticks[1] - ticks[0]);
  }
};
Axis linear_axis(double lo, double hi) {
  if (!(hi > lo)) lo = std::min(0.0, lo), hi = lo == hi ? hi + 1 : 2 * hi;  // one value: from 0 to twice it
  return {linear_ticks(lo, hi)};
}

// A chart's frame: its size and margins, its axes, the SVG's opening and title.
struct Plot {
  double w, h, left, right, top, bottom;
  Axis x{}, y{};
  double px(double v) const { return left + x.fraction(v) * (w - left - right); }
  double py(double v) const { return h - bottom - y.fraction(v) * (h - top - bottom); }
  // The grid and labels at the ticks, the axes and their titles.
  std::string axes(const std::string& x_title, const std::string& y_title) const {
    std::string out;
    for (double t : x.ticks) {
      out += fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)", px(t), top, px(t),
                         h - bottom);
      out += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle" class="tick" data-axis="x">{}</text>)", px(t),
                         h - bottom + 16, x.label(t));
    }
    for (double t : y.ticks) {
      out += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", left, py(t), w - right,
                         py(t));
      out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick" data-axis="y">{}</text>)", left - 6,
                         py(t) + 4, y.label(t));
    }
    out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, h - bottom, w - right,
                       h - bottom);
    out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, top, left, h - bottom);
    out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", (left + w - right) / 2, h - 12,
                       html_escape(x_title));
    return out +
           fmt::format(R"svg(<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>)svg",
                       (top + h - bottom) / 2, (top + h - bottom) / 2, html_escape(y_title));
  }
};
std::string svg_open(const std::string& id, double w, double h) {
  return fmt::format(
      R"(<svg class="chart" id="{}" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}">)",
      id, w, h, w, h);
}
// Text of 11px sans-serif is about 6px a character.
double text_width(size_t chars) {
  return 6.0 * static_cast<double>(chars);
}

}  // namespace

std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const std::vector<Series>& series) {
  double x_min = INFINITY, x_max = -INFINITY, y_max = 0;
  size_t longest = 0;
  for (const auto& s : series) {
    longest = std::max(longest, s.name.size());
    for (const auto& [x, y] : s.points)
      x_min = std::min(x_min, x), x_max = std::max(x_max, x), y_max = std::max(y_max, y);
  }
  const double right = std::max(170.0, 50 + text_width(longest));  // room for the legend
  Plot p{470 + right, 360, 70, right, 36, 50};
  std::string out = svg_open(id, p.w, p.h) +
                    fmt::format("\n<text x=\"{}\" y=\"22\" class=\"title\">{}</text>\n", p.left, html_escape(title));
  if (!std::isfinite(x_min)) return out + "<text x=\"70\" y=\"180\">no measured points</text></svg>\n";
  const bool log_x = x_min > 0 && x_max / x_min >= 16;
  p.x = log_x ? Axis{log_ticks(x_min, x_max), true} : linear_axis(x_min, x_max);
  p.y = linear_axis(0, y_max > 0 ? y_max * 1.05 : 1);
  out += p.axes(x_label + (log_x ? " (log scale)" : ""), y_label);
  int legend = 0;
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    const std::string dash = s.dashed ? R"( stroke-dasharray="6 4")" : "";
    std::string d;
    for (const auto& [x, y] : s.points) d += fmt::format("{}{:.1f},{:.1f} ", d.empty() ? "M" : "L", p.px(x), p.py(y));
    out += fmt::format(R"(<path class="series" data-series="{}" d="{}" fill="none" stroke="{}" stroke-width="2"{}/>)",
                       html_escape(s.name), d, s.color, dash);
    for (const auto& [x, y] : s.points) {
      out += fmt::format(
          R"(<circle class="point" cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"><title>{}: {} at {:g}</title></circle>)",
          p.px(x), p.py(y), s.color, html_escape(s.name), si(y, std::abs(y) / 100), x);
    }
    const double ly = p.top + 10 + 18 * legend++, lx = p.w - right;
    out += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)", lx + 10, ly,
                       lx + 34, ly, s.color, dash);
    out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", lx + 40, ly + 4, html_escape(s.name));
  }
  return out + "</svg>\n";
}

// One stacked bar per point: the predicted components, with the measured peak as a black tick.
std::string breakdown_chart(const SweepReport& report) {
  std::vector<std::string> names, labels;
  double max_bytes = 1;
  for (const auto& r : report.rows) {
    labels.push_back(fmt::format("cutoff_len={} batch={} gradient_accumulation_steps={}", r.point.cutoff_len,
                                 r.point.batch_size, r.point.gradient_accumulation_steps));
    max_bytes = std::max({max_bytes, r.predicted.total(), r.peak_allocated_bytes});
    for (const auto& [n, b] : r.predicted.components) {
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  size_t longest = 0;
  for (const auto& l : labels) longest = std::max(longest, l.size());
  const double bar_h = 22, gap = 8, left = std::max(170.0, 12 + text_width(longest)), right = 30, top = 36;
  const double w = left + 650, h = top + report.rows.size() * (bar_h + gap) + 30 + 22 * ((names.size() + 2) / 3) + 10;
  const Axis axis = linear_axis(0, max_bytes / 1e9);
  auto fx = [&](double b) { return left + axis.fraction(b / 1e9) * (w - left - right); };
  std::string out = svg_open("chart-breakdown", w, h) +
                    "\n<text x=\"10\" y=\"22\" class=\"title\">Predicted memory per component (bars) and measured "
                    "peak (black tick), GB</text>\n";
  const double bottom = top + report.rows.size() * (bar_h + gap);
  for (double t : axis.ticks) {
    out += fmt::format(
        R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/><text x="{:.1f}" y="{}" text-anchor="middle" class="tick" data-axis="x">{}</text>)",
        fx(t * 1e9), top - 4, fx(t * 1e9), bottom, fx(t * 1e9), bottom + 12, axis.label(t));
  }
  double y = top;
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const ProfileRow& r = report.rows[i];
    out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick">{}</text>)", left - 6, y + bar_h * 0.7,
                       labels[i]);
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
  Plot p{780, 440, 80, 230, 52, 52};
  // Its own font sizes, so that the chart lays out the same outside the report's page.
  std::string out = svg_open("chart-roofline", p.w, p.h) +
                    "<style>#chart-roofline text { font-family: sans-serif; font-size: 11px; } #chart-roofline "
                    ".title { font-size: 14px; font-weight: bold; }</style>\n";
  const ProfileRow* last = nullptr;
  for (const auto& r : report.rows) {
    if (ok(r) && !r.components.empty()) last = &r;
  }
  if (!report.roofline || !last) {
    return out +
           fmt::format(R"(<text x="{}" y="22" class="title">Roofline</text><text x="{}" y="120">{}</text></svg>)",
                       p.left, p.left,
                       report.roofline ? "no measured point" : "no roofline: the device has no row in the table") +
           "\n";
  }
  const cost::Roofline& roof = *report.roofline;
  const bool measured = std::any_of(last->components.begin(), last->components.end(),
                                    [](const ComponentRow& c) { return c.measured_seconds.has_value(); });
  out += fmt::format(R"(<text x="10" y="20" class="title">Roofline: {}, {}, {}</text>)", html_escape(roof.device),
                     html_escape(report.config.dtype), html_escape(point_label(last->point)));
  out += fmt::format(
      R"(<text x="10" y="38" class="tick">dots: components, modelled time (on the roof){}; black: measured steps</text>)",
      measured ? "; rings: measured time" : "");
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
    const std::string attrs = fmt::format(R"( data-component="{}" data-pass="{}")", html_escape(c.component), c.pass);
    dots.push_back({c.intensity, flops / c.modelled_seconds, pass_color(c.pass), "roofline-component", attrs,
                    fmt::format("{} ({}): {:.3g} FLOP/byte, {:.3g} GFLOP/s modelled, {} bound", c.component, c.pass,
                                c.intensity, flops / c.modelled_seconds / 1e9, c.bound)});
    if (!c.measured_seconds || !(*c.measured_seconds > 0)) continue;
    dots.push_back({c.intensity, flops / *c.measured_seconds, pass_color(c.pass), "roofline-measured", attrs,
                    fmt::format("{} ({}): {:.3g} GFLOP/s measured, {:.0f}% of its modelled rate", c.component, c.pass,
                                flops / *c.measured_seconds / 1e9, 100 * c.modelled_seconds / *c.measured_seconds)});
    gaps.emplace_back(dots.size() - 2, dots.size() - 1);
  }
  for (const auto& r : report.rows) {
    if (!ok(r) || !(r.traffic_bytes > 0) || !(r.executed_flops > 0) || !(r.seconds_per_step > 0)) continue;
    const double x = r.executed_flops / r.traffic_bytes, y = r.executed_flops / r.seconds_per_step;
    dots.push_back({x, y, "#000", "roofline-step",
                    fmt::format(R"( data-point="cutoff_len={} batch={} gradient_accumulation_steps={}")",
                                r.point.cutoff_len, r.point.batch_size, r.point.gradient_accumulation_steps),
                    fmt::format("measured step, {}: {:.3g} FLOP/byte, {:.3g} GFLOP/s executed", point_label(r.point), x,
                                y / 1e9)});
  }
  const double peak = std::max(roof.gemm_flops_per_s, roof.other_flops_per_s);
  // Room right of the ridge for the flat roof; above everything; the roof's slope from the left edge.
  double x_min = std::min(roof.ridge(), roof.other_flops_per_s / roof.bandwidth), x_max = 8 * roof.ridge();
  double y_min = peak, y_max = peak;
  for (const Dot& d : dots) {
    x_min = std::min(x_min, d.x), x_max = std::max(x_max, d.x);
    y_min = std::min(y_min, d.y), y_max = std::max(y_max, d.y);
  }
  p.x = {log_ticks(x_min, x_max * 1.01), true};
  p.y = {log_ticks(std::min(y_min, p.x.ticks.front() * roof.bandwidth), y_max * 1.5), true};
  out += p.axes("arithmetic intensity, FLOP/byte (log scale)", "FLOP/s (log scale)");
  // A roof: the bandwidth slope from the left edge (or where it enters the plot) to the ridge,
  // then flat at the peak.
  auto roof_path = [&](double flops_per_s, const std::string& name, const std::string& color, bool dashed) {
    const double x_lo = std::max(p.x.ticks.front(), p.y.ticks.front() / roof.bandwidth), x_hi = p.x.ticks.back();
    const double ridge = flops_per_s / roof.bandwidth;
    std::string d = fmt::format("M{:.1f},{:.1f} ", p.px(x_lo), p.py(std::min(flops_per_s, x_lo * roof.bandwidth)));
    if (ridge > x_lo && ridge < x_hi) d += fmt::format("L{:.1f},{:.1f} ", p.px(ridge), p.py(flops_per_s));
    d += fmt::format("L{:.1f},{:.1f}", p.px(x_hi), p.py(std::min(flops_per_s, x_hi * roof.bandwidth)));
    return fmt::format(R"(<path class="roof" data-roof="{}" d="{}" fill="none" stroke="{}" stroke-width="2.5"{}/>)",
                       name, d, color, dashed ? R"( stroke-dasharray="6 4")" : "");
  };
  out += roof_path(roof.gemm_flops_per_s, "gemm", "#444", false);
  const bool two_roofs = std::abs(roof.other_flops_per_s - roof.gemm_flops_per_s) > 1e-9 * roof.gemm_flops_per_s;
  if (two_roofs) out += roof_path(roof.other_flops_per_s, "vector", "#999", true);
  const double ridge = roof.ridge();
  out += fmt::format(
      R"(<line class="ridge" data-ridge="{:.4g}" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{}" stroke="#888" stroke-dasharray="3 3"/>)",
      ridge, p.px(ridge), p.py(roof.gemm_flops_per_s), p.px(ridge), p.h - p.bottom);
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="tick">ridge {}</text>)", p.px(ridge) + 4,
                     p.py(roof.gemm_flops_per_s) + 16, si(ridge, ridge / 100, "FLOP/B"));
  for (const auto& [model, ring] : gaps) {
    out += fmt::format(
        R"(<line class="roofline-gap" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-opacity="0.5"/>)",
        p.px(dots[model].x), p.py(dots[model].y), p.px(dots[ring].x), p.py(dots[ring].y), dots[ring].color);
  }
  for (const Dot& d : dots) {
    const bool ring = d.cls == "roofline-measured";
    out += fmt::format(R"(<circle class="{}"{} cx="{:.1f}" cy="{:.1f}" r="{}" fill="{}"{}><title>{}</title></circle>)",
                       d.cls, d.attrs, p.px(d.x), p.py(d.y), d.cls == "roofline-step" ? 6 : 4, ring ? "none" : d.color,
                       ring ? fmt::format(R"( stroke="{}" stroke-width="2")", d.color) : "", html_escape(d.title));
  }
  // Legend.
  const double lx = p.w - p.right;
  double ly = p.top + 10;
  auto legend = [&](const std::string& mark, const std::string& text) {
    out +=
        mark + fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", lx + 26, ly + 4, html_escape(text));
    ly += 18;
  };
  for (const auto& [name, color] : std::vector<std::pair<std::string, std::string>>{
           {"GEMM roof, " + si(roof.gemm_flops_per_s, roof.gemm_flops_per_s / 100, "FLOP/s"), "#444"},
           {"fwd components", kColors[0]},
           {"bwd components", kColors[1]},
           {"recompute components", kColors[2]},
           {"step (optimizer)", kColors[3]},
           {"measured step", "#000"}}) {
    legend(fmt::format(R"(<circle cx="{}" cy="{:.1f}" r="4" fill="{}"/>)", lx + 16, ly, color), name);
  }
  if (measured) {
    legend(
        fmt::format(R"(<circle cx="{}" cy="{:.1f}" r="4" fill="none" stroke="#333" stroke-width="2"/>)", lx + 16, ly),
        "component, measured");
  }
  if (two_roofs) {
    legend(
        fmt::format(
            R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#999" stroke-width="2" stroke-dasharray="6 4"/>)",
            lx + 8, ly, lx + 22, ly),
        "vector roof, " + si(roof.other_flops_per_s, roof.other_flops_per_s / 100, "FLOP/s"));
  }
  out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">memory {}</text>)", lx + 8, ly + 4,
                     si(roof.bandwidth, roof.bandwidth / 100, "B/s"));
  out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", lx + 8, ly + 22,
                     roof.tensor_cores ? "GEMMs on tensor cores" : "no tensor cores: GEMMs on vector units");
  return out + "</svg>\n";
}

}  // namespace kiln::profile::report_detail
