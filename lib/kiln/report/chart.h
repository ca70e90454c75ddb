// SVG charts for the HTML reports: inline, so a page opens offline and renders the same in any
// browser. Every chart is an <svg class="chart"> and every data series of a line chart a <path
// class="series" data-series="..."> with a <circle class="point"> per point, which tests check
// structurally. An axis's ticks are round numbers: multiples of 1, 2 or 5 times a power of ten (a
// log axis: its decades, or 1-2-5 in each), labelled with an SI prefix.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::report {

inline constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                          "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
  std::string color;
  bool dashed = false;
};

// `v` to the digits of `resolution`, with an SI prefix from k (1e3) to P and below 1e-3 m, u, n,
// and then the unit: si(15000, 5000) = "15k", si(1.5e9, 5e8) = "1.5G", si(0.02, 0.01) = "0.02",
// si(2.039e12, 2e10, "B/s") = "2.04 TB/s".
std::string si(double v, double resolution, const std::string& unit = "");
// The ticks of a linear axis over [lo, hi]: multiples of a 1-2-5 step, about `count` of them.
std::vector<double> linear_ticks(double lo, double hi, int count = 5);
// The ticks of a log axis over [lo, hi]: 1, 2 and 5 in each decade, or the decades alone over
// more than three.
std::vector<double> log_ticks(double lo, double hi);

// An axis over its first to its last tick.
struct Axis {
  std::vector<double> ticks;
  bool log = false;
  double fraction(double v) const;  // where v lies, 0 at the first tick and 1 at the last
  std::string label(double tick) const;
};
// A linear axis over [lo, hi] (one value: from 0 to twice it).
Axis linear_axis(double lo, double hi);

// A chart's frame: its size and margins, its axes.
struct Plot {
  double w, h, left, right, top, bottom;
  Axis x{}, y{};
  double px(double v) const { return left + x.fraction(v) * (w - left - right); }
  double py(double v) const { return h - bottom - y.fraction(v) * (h - top - bottom); }
  // The grid and labels at the ticks, the axes and their titles.
  std::string axes(const std::string& x_title, const std::string& y_title) const;
};
// `<svg class="chart" id=... width=... height=... viewBox=...>`.
std::string svg_open(const std::string& id, double w, double h);
// Text of 11px sans-serif is about 6px a character.
inline double text_width(size_t chars) {
  return 6.0 * static_cast<double>(chars);
}

// y against x, one line per series (dashed where asked) with a dot per point and a legend; the x
// axis logarithmic over a range of 16x or more.
std::string line_chart(const std::string& id, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const std::vector<Series>& series);

// Horizontal stacked bars, one per row, on one linear axis from 0 (values / scale, in `unit`):
// each segment coloured by its name (the palette in first-seen order, a legend of three columns
// below), and on each bar a black tick at `marker` where it has one, else `note` after it.
struct Bar {
  std::string label;
  std::vector<std::pair<std::string, double>> segments;  // (name, value)
  std::optional<double> marker;
  std::string note;
};
std::string bar_chart(const std::string& id, const std::string& title, const std::vector<Bar>& bars, double scale,
                      const std::string& unit);

// A roofline: log-log arithmetic intensity (FLOP/byte) against FLOP/s; the roofs min(peak,
// intensity x bandwidth) of the GEMMs and, dashed where it differs, of the vector units; the
// ridge; the dots (rings where `ring`), pairs of them joined by `links`; a legend: the GEMM roof,
// `legend`'s dots, the ring, the vector roof, the bandwidth. With `missing` set, the title and
// that line only.
struct RoofDot {
  double x, y;                           // FLOP/byte, FLOP/s
  std::string color, cls, attrs, title;  // attrs: more SVG attributes, each with a leading space
  double radius = 4;
  bool ring = false;
};
struct RoofChart {
  std::string title, subtitle, missing;
  double gemm_flops_per_s = 0, other_flops_per_s = 0, bandwidth = 0;
  bool tensor_cores = false;
  std::vector<RoofDot> dots;
  std::vector<std::pair<size_t, size_t>> links;             // indices into dots
  std::vector<std::pair<std::string, std::string>> legend;  // (text, colour) of the dots
  std::string ring_legend;                                  // the rings' legend line, if any
};
std::string roofline_chart(const std::string& id, const RoofChart& chart);

}  // namespace kiln::report
