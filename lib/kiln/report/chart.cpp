// See chart.h.
#include "kiln/report/chart.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kiln/report/table.h"

namespace kiln::report {

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

double Axis::fraction(double v) const {
  auto f = [&](double x) { return log ? std::log10(x) : x; };
  return (f(v) - f(ticks.front())) / (f(ticks.back()) - f(ticks.front()));
}
std::string Axis::label(double t) const {
  return si(t, log ? std::pow(10.0, std::floor(std::log10(t) + 1e-9)) : ticks[1] - ticks[0]);
}
Axis linear_axis(double lo, double hi) {
  if (!(hi > lo)) lo = std::min(0.0, lo), hi = lo == hi ? hi + 1 : 2 * hi;  // one value: from 0 to twice it
  return {linear_ticks(lo, hi)};
}

std::string Plot::axes(const std::string& x_title, const std::string& y_title) const {
  std::string out;
  for (double t : x.ticks) {
    out +=
        fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/>)", px(t), top, px(t), h - bottom);
    out += fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle" class="tick" data-axis="x">{}</text>)", px(t),
                       h - bottom + 16, x.label(t));
  }
  for (double t : y.ticks) {
    out +=
        fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", left, py(t), w - right, py(t));
    out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick" data-axis="y">{}</text>)", left - 6,
                       py(t) + 4, y.label(t));
  }
  out +=
      fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, h - bottom, w - right, h - bottom);
  out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", left, top, left, h - bottom);
  out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">{}</text>)", (left + w - right) / 2, h - 12,
                     html_escape(x_title));
  return out + fmt::format(R"svg(<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>)svg",
                           (top + h - bottom) / 2, (top + h - bottom) / 2, html_escape(y_title));
}
std::string svg_open(const std::string& id, double w, double h) {
  return fmt::format(
      R"(<svg class="chart" id="{}" xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" viewBox="0 0 {:.0f} {:.0f}">)",
      id, w, h, w, h);
}
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

std::string bar_chart(const std::string& id, const std::string& title, const std::vector<Bar>& bars, double scale,
                      const std::string& unit) {
  std::vector<std::string> names;
  double max_value = 1;
  size_t longest = 0;
  for (const Bar& b : bars) {
    longest = std::max(longest, b.label.size());
    double total = 0;
    for (const auto& [n, v] : b.segments) {
      total += v;
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    max_value = std::max({max_value, total, b.marker.value_or(0)});
  }
  const double bar_h = 22, gap = 8, left = std::max(170.0, 12 + text_width(longest)), right = 30, top = 36;
  const double w = left + 650, h = top + bars.size() * (bar_h + gap) + 30 + 22 * ((names.size() + 2) / 3) + 10;
  const Axis axis = linear_axis(0, max_value / scale);
  auto fx = [&](double v) { return left + axis.fraction(v / scale) * (w - left - right); };
  std::string out =
      svg_open(id, w, h) + fmt::format("\n<text x=\"10\" y=\"22\" class=\"title\">{}</text>\n", html_escape(title));
  const double bottom = top + bars.size() * (bar_h + gap);
  for (double t : axis.ticks) {
    out += fmt::format(
        R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="#ddd"/><text x="{:.1f}" y="{}" text-anchor="middle" class="tick" data-axis="x">{}</text>)",
        fx(t * scale), top - 4, fx(t * scale), bottom, fx(t * scale), bottom + 12, axis.label(t));
  }
  double y = top;
  for (const Bar& b : bars) {
    out += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="tick">{}</text>)", left - 6, y + bar_h * 0.7,
                       html_escape(b.label));
    double x = 0;
    for (const auto& [n, v] : b.segments) {
      const size_t ci = static_cast<size_t>(std::find(names.begin(), names.end(), n) - names.begin());
      out += fmt::format(
          R"(<rect class="component" data-component="{}" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{}" fill="{}"><title>{}: {:.3f} {}</title></rect>)",
          html_escape(n), fx(x), y, fx(x + v) - fx(x), bar_h, kColors[ci % 8], html_escape(n), v / scale, unit);
      x += v;
    }
    if (b.marker) {
      out += fmt::format(
          R"(<line class="measured" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#000" stroke-width="3"/>)",
          fx(*b.marker), y - 3, fx(*b.marker), y + bar_h + 3);
    } else {
      out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="oom">{}</text>)", fx(x) + 6, y + bar_h * 0.7,
                         html_escape(b.note));
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

std::string roofline_chart(const std::string& id, const RoofChart& c) {
  Plot p{780, 440, 80, 230, 52, 52};
  // Its own font sizes, so that the chart lays out the same outside a report's page.
  std::string out = svg_open(id, p.w, p.h) + fmt::format(
                                                 "<style>#{0} text {{ font-family: sans-serif; font-size: 11px; }} "
                                                 "#{0} .title {{ font-size: 14px; font-weight: bold; }}</style>\n",
                                                 id);
  if (!c.missing.empty()) {
    return out +
           fmt::format(R"(<text x="{}" y="22" class="title">Roofline</text><text x="{}" y="120">{}</text></svg>)",
                       p.left, p.left, html_escape(c.missing)) +
           "\n";
  }
  out += fmt::format(R"(<text x="10" y="20" class="title">{}</text>)", html_escape(c.title));
  out += fmt::format(R"(<text x="10" y="38" class="tick">{}</text>)", html_escape(c.subtitle));
  const double bw = c.bandwidth, ridge = c.gemm_flops_per_s / bw,
               peak = std::max(c.gemm_flops_per_s, c.other_flops_per_s);
  // Room right of the ridge for the flat roof; above everything; the roof's slope from the left edge.
  double x_min = std::min(ridge, c.other_flops_per_s / bw), x_max = 8 * ridge, y_min = peak, y_max = peak;
  for (const RoofDot& d : c.dots) {
    x_min = std::min(x_min, d.x), x_max = std::max(x_max, d.x);
    y_min = std::min(y_min, d.y), y_max = std::max(y_max, d.y);
  }
  p.x = {log_ticks(x_min, x_max * 1.01), true};
  p.y = {log_ticks(std::min(y_min, p.x.ticks.front() * bw), y_max * 1.5), true};
  out += p.axes("arithmetic intensity, FLOP/byte (log scale)", "FLOP/s (log scale)");
  // A roof: the bandwidth slope from the left edge (or where it enters the plot) to the ridge,
  // then flat at the peak.
  auto roof_path = [&](double flops_per_s, const std::string& name, const std::string& color, bool dashed) {
    const double x_lo = std::max(p.x.ticks.front(), p.y.ticks.front() / bw), x_hi = p.x.ticks.back();
    const double knee = flops_per_s / bw;
    std::string d = fmt::format("M{:.1f},{:.1f} ", p.px(x_lo), p.py(std::min(flops_per_s, x_lo * bw)));
    if (knee > x_lo && knee < x_hi) d += fmt::format("L{:.1f},{:.1f} ", p.px(knee), p.py(flops_per_s));
    d += fmt::format("L{:.1f},{:.1f}", p.px(x_hi), p.py(std::min(flops_per_s, x_hi * bw)));
    return fmt::format(R"(<path class="roof" data-roof="{}" d="{}" fill="none" stroke="{}" stroke-width="2.5"{}/>)",
                       name, d, color, dashed ? R"( stroke-dasharray="6 4")" : "");
  };
  out += roof_path(c.gemm_flops_per_s, "gemm", "#444", false);
  const bool two_roofs = std::abs(c.other_flops_per_s - c.gemm_flops_per_s) > 1e-9 * c.gemm_flops_per_s;
  if (two_roofs) out += roof_path(c.other_flops_per_s, "vector", "#999", true);
  out += fmt::format(
      R"(<line class="ridge" data-ridge="{:.4g}" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{}" stroke="#888" stroke-dasharray="3 3"/>)",
      ridge, p.px(ridge), p.py(c.gemm_flops_per_s), p.px(ridge), p.h - p.bottom);
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="tick">ridge {}</text>)", p.px(ridge) + 4,
                     p.py(c.gemm_flops_per_s) + 16, si(ridge, ridge / 100, "FLOP/B"));
  for (const auto& [a, b] : c.links) {
    out += fmt::format(
        R"(<line class="roofline-gap" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-opacity="0.5"/>)",
        p.px(c.dots[a].x), p.py(c.dots[a].y), p.px(c.dots[b].x), p.py(c.dots[b].y), c.dots[b].color);
  }
  for (const RoofDot& d : c.dots) {
    out += fmt::format(R"(<circle class="{}"{} cx="{:.1f}" cy="{:.1f}" r="{}" fill="{}"{}><title>{}</title></circle>)",
                       d.cls, d.attrs, p.px(d.x), p.py(d.y), d.radius, d.ring ? "none" : d.color,
                       d.ring ? fmt::format(R"( stroke="{}" stroke-width="2")", d.color) : "", html_escape(d.title));
  }
  const double lx = p.w - p.right;
  double ly = p.top + 10;
  auto legend = [&](const std::string& mark, const std::string& text) {
    out +=
        mark + fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", lx + 26, ly + 4, html_escape(text));
    ly += 18;
  };
  std::vector<std::pair<std::string, std::string>> dots = {
      {"GEMM roof, " + si(c.gemm_flops_per_s, c.gemm_flops_per_s / 100, "FLOP/s"), "#444"}};
  dots.insert(dots.end(), c.legend.begin(), c.legend.end());
  for (const auto& [name, color] : dots)
    legend(fmt::format(R"(<circle cx="{}" cy="{:.1f}" r="4" fill="{}"/>)", lx + 16, ly, color), name);
  if (!c.ring_legend.empty()) {
    legend(
        fmt::format(R"(<circle cx="{}" cy="{:.1f}" r="4" fill="none" stroke="#333" stroke-width="2"/>)", lx + 16, ly),
        c.ring_legend);
  }
  if (two_roofs) {
    legend(
        fmt::format(
            R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#999" stroke-width="2" stroke-dasharray="6 4"/>)",
            lx + 8, ly, lx + 22, ly),
        "vector roof, " + si(c.other_flops_per_s, c.other_flops_per_s / 100, "FLOP/s"));
  }
  out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">memory {}</text>)", lx + 8, ly + 4,
                     si(bw, bw / 100, "B/s"));
  out += fmt::format(R"(<text x="{}" y="{:.1f}" class="legend">{}</text>)", lx + 8, ly + 22,
                     c.tensor_cores ? "GEMMs on tensor cores" : "no tensor cores: GEMMs on vector units");
  return out + "</svg>\n";
}

}  // namespace kiln::report
