// The sweep's own SVG charts, drawn by report/chart.h: the memory breakdown and the roofline.
#include <algorithm>

#include "kiln/profile/report_internal.h"

namespace kiln::profile::report_detail {

namespace {

std::string point_attrs(const SweepPoint& p) {
  return fmt::format("cutoff_len={} batch={} gradient_accumulation_steps={}", p.cutoff_len, p.batch_size,
                     p.gradient_accumulation_steps);
}

}  // namespace

// One stacked bar per point: the predicted components, with the measured peak as a black tick.
std::string breakdown_chart(const SweepReport& report) {
  std::vector<Bar> bars;
  for (const auto& r : report.rows) {
    bars.push_back({point_attrs(r.point), r.predicted.components,
                    ok(r) ? std::optional(r.peak_allocated_bytes) : std::nullopt, r.status});
  }
  return bar_chart("chart-breakdown", "Predicted memory per component (bars) and measured peak (black tick), GB", bars,
                   1e9, "GB");
}

// The roofline of the device, with one dot per component of the last measured point at its
// modelled time (on its roof by construction), and where --component-times measured it, a ring
// at the same intensity at its measured time (below the roof by how much the component falls short
// of it; above it where the model's bytes overstate the traffic, e.g. a CPU's caches), joined to
// the dot; and one black dot per measured step: its executed FLOPs (the model's, recomputation
// included) per measured second at the step's intensity.
std::string roofline_chart(const SweepReport& report) {
  const ProfileRow* last = nullptr;
  for (const auto& r : report.rows) {
    if (ok(r) && !r.components.empty()) last = &r;
  }
  RoofChart c;
  if (!report.roofline || !last) {
    c.missing = report.roofline ? "no measured point" : "no roofline: the device has no row in the table";
    return report::roofline_chart("chart-roofline", c);
  }
  const cost::Roofline& roof = *report.roofline;
  const bool measured = std::any_of(last->components.begin(), last->components.end(),
                                    [](const ComponentRow& c) { return c.measured_seconds.has_value(); });
  c.title = fmt::format("Roofline: {}, {}, {}", roof.device, report.config.dtype, point_label(last->point));
  c.subtitle = fmt::format("dots: components, modelled time (on the roof){}; black: measured steps",
                           measured ? "; rings: measured time" : "");
  c.gemm_flops_per_s = roof.gemm_flops_per_s, c.other_flops_per_s = roof.other_flops_per_s;
  c.bandwidth = roof.bandwidth, c.tensor_cores = roof.tensor_cores;
  auto pass_color = [](const std::string& pass) {
    return pass == "fwd" ? kColors[0] : pass == "bwd" ? kColors[1] : pass == "recompute" ? kColors[2] : kColors[3];
  };
  for (const ComponentRow& row : last->components) {
    const double flops = row.gemm_flops + row.other_flops;
    if (!(row.intensity > 0) || !(flops > 0) || !(row.modelled_seconds > 0)) continue;
    const std::string attrs =
        fmt::format(R"( data-component="{}" data-pass="{}")", html_escape(row.component), row.pass);
    c.dots.push_back({row.intensity, flops / row.modelled_seconds, pass_color(row.pass), "roofline-component", attrs,
                      fmt::format("{} ({}): {:.3g} FLOP/byte, {:.3g} GFLOP/s modelled, {} bound", row.component,
                                  row.pass, row.intensity, flops / row.modelled_seconds / 1e9, row.bound)});
    if (!row.measured_seconds || !(*row.measured_seconds > 0)) continue;
    c.dots.push_back(
        {row.intensity, flops / *row.measured_seconds, pass_color(row.pass), "roofline-measured", attrs,
         fmt::format("{} ({}): {:.3g} GFLOP/s measured, {:.0f}% of its modelled rate", row.component, row.pass,
                     flops / *row.measured_seconds / 1e9, 100 * row.modelled_seconds / *row.measured_seconds),
         4, true});
    c.links.emplace_back(c.dots.size() - 2, c.dots.size() - 1);
  }
  for (const auto& r : report.rows) {
    if (!ok(r) || !(r.traffic_bytes > 0) || !(r.executed_flops > 0) || !(r.seconds_per_step > 0)) continue;
    const double x = r.executed_flops / r.traffic_bytes, y = r.executed_flops / r.seconds_per_step;
    c.dots.push_back(
        {x, y, "#000", "roofline-step", fmt::format(R"( data-point="{}")", point_attrs(r.point)),
         fmt::format("measured step, {}: {:.3g} FLOP/byte, {:.3g} GFLOP/s executed", point_label(r.point), x, y / 1e9),
         6});
  }
  c.legend = {{"fwd components", kColors[0]},
              {"bwd components", kColors[1]},
              {"recompute components", kColors[2]},
              {"step (optimizer)", kColors[3]},
              {"measured step", "#000"}};
  if (measured) c.ring_legend = "component, measured";
  return report::roofline_chart("chart-roofline", c);
}

}  // namespace kiln::profile::report_detail
