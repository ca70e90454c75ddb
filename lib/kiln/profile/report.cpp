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
#include "kiln/io/safetensors.h"
#include "kiln/profile/report_internal.h"

namespace kiln::profile {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace report_detail {

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

}  // namespace report_detail

using namespace report_detail;

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
    io::write_file_atomic(path.string(), render(f));
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
    io::write_file_atomic(path.string(), to_components_csv(report));
    written.push_back(path.string());
  }
  return written;
}

}  // namespace kiln::profile
