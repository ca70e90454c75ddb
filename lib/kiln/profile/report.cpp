// The sweep's report in Markdown, CSV, JSON and HTML. The HTML draws its charts as inline SVG
// (report/chart.h, report_charts.cpp), which the tests check structurally (and, where Chromium is
// installed, by a headless screenshot).
#include "kiln/profile/report.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>

#include "kiln/cost/flops.h"
#include "kiln/profile/report_internal.h"

namespace kiln::profile {

namespace report_detail {

bool ok(const ProfileRow& r) {
  return r.status == "ok";
}
json roofline_json(const cost::Roofline& r, const std::string& bandwidth_source) {
  return object("device", r.device, "gemm_flops_per_s", r.gemm_flops_per_s, "other_flops_per_s", r.other_flops_per_s,
                "bandwidth", r.bandwidth, "bandwidth_source", bandwidth_source, "tensor_cores", r.tensor_cores, "ridge",
                r.ridge());
}

json components_json(const cost::MemoryEstimate& m) {
  json out = json::object();
  for (const auto& [name, bytes] : m.components) out[name] = bytes;
  return out;
}

}  // namespace report_detail

using namespace report_detail;

namespace {

// Cells: "1.234" (GB = 1e9 bytes); "41.0%" or "n/a".
std::string gb(double bytes) {
  return cell(bytes, 'G');
}
std::string pct(const std::optional<double>& f) {
  return cell(f, '%', "{:.1f}%");
}

bool cuda(const SweepReport& r) {
  return r.device.rfind("cuda", 0) == 0;
}
// A counter column of the resource table: counted beside modelled, or the model's value marked as such.
std::string utilisation_cell(const Utilisation& u) {
  if (u.counted && u.modelled) return fmt::format("{:.1f}% (model {:.1f}%)", *u.counted * 100, *u.modelled * 100);
  if (u.counted) return pct(u.counted);
  if (u.modelled) return fmt::format("{:.1f}% (model)", *u.modelled * 100);
  return "n/a";
}

// What the peak, the roofline and the three columns are, one line each (Markdown and HTML).
std::vector<std::string> describe(const SweepReport& report) {
  std::vector<std::string> lines;
  const std::string& dtype = report.config.dtype;
  if (report.machine.cpu_peak) {
    const cost::CpuPeak& p = *report.machine.cpu_peak;
    std::string line = fmt::format("peak: theoretical fp32 = {}; {}", p.formula(), p.layout.row);
    if (dtype != "fp32")
      line += fmt::format("; {} = {:.4g} GFLOP/s ({})", dtype, p.flops(dtype) / 1e9,
                          dtype == "bf16" ? p.bf16_source : p.fp16_source);
    if (report.measured_gemm_tflops)
      line += fmt::format("; measured fp32 GEMM (1024^3 at::mm) {:.4g} GFLOP/s = {:.0f}% of the theoretical fp32 peak",
                          *report.measured_gemm_tflops * 1e3, *report.measured_gemm_tflops * 1e12 / p.fp32 * 100);
    if (report.peak_source == "--peak-tflops") line += "; MFU divides by --peak-tflops instead";
    lines.push_back(line);
  } else if (report.measured_gemm_tflops) {
    lines.push_back(fmt::format("peak: no theoretical CPU peak ({}); measured fp32 GEMM {:.4g} GFLOP/s",
                                report.machine.cpu_peak_missing, *report.measured_gemm_tflops * 1e3));
  }
  if (report.roofline) {
    const cost::Roofline& r = *report.roofline;
    lines.push_back(fmt::format(
        "roofline ({}): GEMMs {:.4g} TFLOP/s ({}), other ops {:.4g} TFLOP/s (vector units), memory {:.4g} GB/s ({}); "
        "ridge point {:.3g} FLOP/byte",
        r.device, r.gemm_flops_per_s / 1e12, r.tensor_cores ? "tensor cores" : "vector units",
        r.other_flops_per_s / 1e12, r.bandwidth / 1e9, report.machine.bandwidth_source, r.ridge()));
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

// The main table: the user's columns, kiln's, and the JSON's fields of a point.
std::vector<Column<ProfileRow>> sweep_columns(const SweepReport& report) {
  using R = const ProfileRow&;
  auto when_ok = [](auto get) { return [get](R r) { return ok(r) ? opt(std::invoke(get, r)) : json(nullptr); }; };
  auto count = [](const char* name, const char* key, int64_t SweepPoint::*m) -> Column<ProfileRow> {
    return {name, [m](R r) { return std::to_string(r.point.*m); }, key, [m](R r) { return json(r.point.*m); }};
  };
  auto utilisation = [](const char* name, std::string key, Utilisation ProfileRow::*m) -> Column<ProfileRow> {
    return {name, [m](R r) { return ok(r) ? utilisation_cell(r.*m) : ""; }, "",
            [key, m](R r) {
              const Utilisation& u = r.*m;
              return object(key + "_modelled", u.modelled, key + "_counted", u.counted, key + "_counted_reason",
                            u.counted ? json(nullptr) : json(u.counted_reason));
            }};
  };
  const int64_t steps = report.config.counted_steps();
  std::vector<Column<ProfileRow>> columns = {
      {"task", [&](R) { return report.config.task; }},
      {report.config.dtype == "bf16" ? "bf16" : "fp16",
       [&](R) { return report.config.dtype == "fp32" ? "false" : "true"; }},
      {"speed", [](R r) { return r.speed(); }, "speed", [](R r) { return json(r.speed()); }},
      {"num_gpu", [&](R) { return cuda(report) ? std::to_string(report.world_size) : "0"; }},
      count("batch size per gpu", "batch_size", &SweepPoint::batch_size),
      count("gradient_accumulation_steps", "gradient_accumulation_steps", &SweepPoint::gradient_accumulation_steps),
      count("cutoff_len", "cutoff_len", &SweepPoint::cutoff_len),
      {"memory usage (GB)", [](R r) { return ok(r) ? gb(r.peak_allocated_bytes) : r.status; }, "peak_allocated_bytes",
       when_ok(&ProfileRow::peak_allocated_bytes)},
      utilisation("memory bandwidth", "memory_bandwidth", &ProfileRow::memory_bandwidth),
      utilisation("tensor core", "tensor_core", &ProfileRow::tensor_core),
      utilisation("fp engine", "fp_engine", &ProfileRow::fp_engine),
      {"tokens/s", [](R r) { return ok(r) ? fmt::format("{:.0f}", r.tokens_per_second) : ""; }, "tokens_per_second",
       when_ok(&ProfileRow::tokens_per_second)},
      {"TFLOP/s", [](R r) { return ok(r) ? fmt::format("{:.3g}", r.tflops) : ""; }, "tflops",
       when_ok(&ProfileRow::tflops)},
      {"MFU", [](R r) { return ok(r) ? pct(r.mfu) : ""; }, "mfu", when_ok(&ProfileRow::mfu)},
      {"reserved (GB)", [](R r) { return r.peak_reserved_bytes && ok(r) ? gb(*r.peak_reserved_bytes) : "n/a"; },
       "peak_reserved_bytes", when_ok(&ProfileRow::peak_reserved_bytes)},
      {"predicted (GB)", [](R r) { return gb(r.predicted.total()); }, "predicted_bytes",
       [](R r) { return r.predicted.total(); }},
      {"measured/predicted", [](R r) { return ok(r) ? fmt::format("{:.3f}", r.ratio()) : ""; },
       "measured_over_predicted", when_ok(&ProfileRow::ratio)},
      {"peak RSS (GB)", [](R r) { return gb(r.peak_rss_bytes); }, "peak_rss_bytes",
       [](R r) { return r.peak_rss_bytes; }},
      {"ranks", [&](R) { return std::to_string(report.world_size); }},
      {"comm wait", [](R r) { return ok(r) && r.comm_wait_share ? pct(r.comm_wait_share) : "n/a"; }, "comm_wait_share",
       [](R r) { return opt(r.comm_wait_share); }},
      {"status", [](R r) { return r.status; }, "status", [](R r) { return json(r.status); }},
      field<ProfileRow>("message", &ProfileRow::message),
      {"", {}, "seconds_per_step", when_ok(&ProfileRow::seconds_per_step)},
      {"", {}, "rss_peak_over_baseline_bytes", when_ok(&ProfileRow::rss_peak_over_baseline_bytes)},
      field<ProfileRow>("predicted_components", [](R r) { return components_json(r.predicted); }),
      field<ProfileRow>("flops_per_token",
                        [&](R r) {
                          const auto f = cost::flops_per_token(report.model, r.point.cutoff_len);
                          return object("matmul_forward", f.matmul_forward, "attention_forward", f.attention_forward,
                                        "train", f.train(), "six_n", cost::six_n_per_token(report.model));
                        }),
      field<ProfileRow>("buckets_launched", &ProfileRow::buckets_launched),
      field<ProfileRow>("buckets_overlapped", &ProfileRow::buckets_overlapped),
      field<ProfileRow>("mfu_exceeds_peak", &ProfileRow::mfu_exceeds_peak),
      field<ProfileRow>("losses", &ProfileRow::losses),
      field<ProfileRow>("modelled_step_seconds",
                        [](R r) { return r.components.empty() ? json(nullptr) : json(r.modelled_step_seconds); }),
      {"", {}, "executed_flops_per_step", when_ok(&ProfileRow::executed_flops)},
      {"", {}, "traffic_bytes_per_step", when_ok(&ProfileRow::traffic_bytes)},
      field<ProfileRow>("components", [](R r) { return json_rows(component_columns(), r.components); }),
      field<ProfileRow>("component_times", [](R r) { return component_times_json(r.component_times, r.components); }),
      field<ProfileRow>("counters", [=](R r) { return counters_json(r.counters, steps, r.components); })};
  // A grid that lists recomputations (settings.h): each row's, after cutoff_len.
  if (!report.config.recomputation.empty()) {
    columns.insert(columns.begin() + 7, {"recomputation", [](R r) { return r.point.recomputation; }, "recomputation",
                                         [](R r) { return json(r.point.recomputation); }});
  }
  return columns;
}

// The points that have a per-component table, and those counted per phase.
bool has_components(const ProfileRow& r) {
  return ok(r) && !r.components.empty();
}
bool has_phases(const ProfileRow& r) {
  return ok(r) && r.counters && !r.counters->phases.empty();
}

json cpu_peak_json(const cost::CpuPeak& p) {
  const cost::CpuFeatures& f = p.features;
  return object("vendor", f.vendor, "family", f.family, "model", f.model, "model_name", f.model_name, "flags",
                object("sse2", f.sse2, "avx", f.avx, "fma", f.fma, "avx2", f.avx2, "avx512f", f.avx512f, "avx512_bf16",
                       f.avx512_bf16, "avx512_fp16", f.avx512_fp16, "amx_bf16", f.amx_bf16, "amx_fp16", f.amx_fp16),
                "width_bits", p.layout.width_bits, "fma_units", p.layout.units, "flop_per_instruction",
                p.layout.flop_per_instruction, "table_row", p.layout.row, "clock_hz", p.clock.hz, "clock_source",
                p.clock.source, "clock_reported_hz", p.clock.reported_hz, "clock_reported_source",
                p.clock.reported_source, "clock_measured_hz",
                p.clock.measured_hz > 0 ? json(p.clock.measured_hz) : json(nullptr), "threads", p.threads, "cores",
                p.cores, "fp32_flops", p.fp32, "bf16_flops", p.bf16, "fp16_flops", p.fp16, "bf16_source", p.bf16_source,
                "fp16_source", p.fp16_source, "formula", p.formula());
}

json hardware_json(const cost::HardwareSpec& h) {
  auto tensor = [](bool has, double tflops) { return has ? json(tflops) : json(nullptr); };
  return object("name", h.name, "source", h.source, "tensor_tflops",
                object("bf16", tensor(h.tensor_bf16, h.bf16), "fp16", tensor(h.tensor_fp16, h.fp16), "tf32",
                       tensor(h.tf32 > 0, h.tf32)),
                "vector_tflops", object("bf16", h.bf16_vector, "fp16", h.fp16_vector, "fp32", h.fp32),
                "memory_bandwidth", h.memory_bandwidth);
}

// The sections after the main table, one text in both formats: per point its component table
// (the traffic model's rows beside what was measured; in the HTML each in a <details>) and, where
// counted per phase, its phase table.
std::string point_sections(const SweepReport& report, bool html) {
  std::string out;
  auto heading = [&](int level, const std::string& text) {
    out += html ? fmt::format("<h{0}>{1}</h{0}>\n", level, html_escape(text))
                : fmt::format("\n{} {}\n", std::string(static_cast<size_t>(level), '#'), text);
  };
  auto note = [&](const std::string& text) {
    out += html ? "<p class=\"note\">" + html_escape(text) + "</p>\n" : "\n" + text + "\n";
  };
  bool first = true;
  for (const auto& r : report.rows) {
    if (!has_components(r)) continue;
    if (std::exchange(first, false)) {
      heading(2, "Memory traffic and FLOPs per component");
      note(
          "cost/traffic.h, per optimizer step: kiln's step, and the bytes and modelled time of an unfused HF eager "
          "step beside it. Measured per component: from LibTorch's profiler with --component-times (on a CPU the ops' "
          "CPU time, on a GPU the time of the kernels, copies and memsets they launch), else n/a.");
    }
    const std::string title =
        fmt::format("Components: {} (per step: measured {:.3f} ms, modelled {:.3f} ms; {})", point_label(r.point),
                    r.seconds_per_step * 1e3, r.modelled_step_seconds * 1e3, component_times_note(r.component_times));
    if (html) {
      out += "<details class=\"components\"><summary>" + html_escape(title) + "</summary>\n" +
             html_table("<table class=\"components\">", component_columns(), r.components) + "\n";
    } else {
      heading(3, title);
      out += "\n" + markdown_table(component_columns(), r.components, true);
    }
    std::string merged;
    for (const auto& [component, pass, seconds] : unmatched_component_times(r.component_times, r.components))
      merged += fmt::format(" {} ({}) {:.3f} ms;", component, pass, seconds * 1e3);
    if (!merged.empty())
      note("Measured in scopes that merge the rows above (fused Functions):" + merged.substr(0, merged.size() - 1));
    if (html) out += "</details>\n";
  }
  first = true;
  const int64_t steps = report.config.counted_steps();
  for (const auto& r : report.rows) {
    if (!has_phases(r)) continue;
    if (std::exchange(first, false)) heading(2, "Counted per phase (--counter-phases): forward, backward, optimizer");
    const CounterReading& c = *r.counters;
    heading(3, fmt::format("Phases: {} ({})", point_label(r.point), phase_note(c, steps)));
    out += html ? html_table("<table class=\"phases\">", phase_columns(c), phase_rows(c, steps, r.components)) + "\n"
                : "\n" + markdown_table(phase_columns(c), phase_rows(c, steps, r.components));
  }
  return out;
}

}  // namespace

std::vector<std::string> table_header(const SweepReport& report) {
  return text_cells<ProfileRow>(sweep_columns(report), nullptr);
}

std::vector<std::vector<std::string>> table_rows(const SweepReport& report) {
  const auto columns = sweep_columns(report);
  std::vector<std::vector<std::string>> out;
  for (const auto& r : report.rows) out.push_back(text_cells(columns, &r));
  return out;
}

std::string to_markdown(const SweepReport& report) {
  std::string out = fmt::format(
      "kiln-profile: {} ({} parameters), {}, kernels {}, device {}, peak {:.3g} TFLOP/s ({})\n"
      "memory usage = peak bytes held by tensors during one step ({}); GB = 1e9 bytes\n",
      report.config.run.model, report.num_parameters, report.config.dtype, report.config.run.kernels, report.device,
      report.peak_tflops, report.peak_source.empty() ? "unknown" : report.peak_source,
      cuda(report) ? "CUDA caching allocator, allocated" : "counting CPU allocator");
  for (const auto& l : describe(report)) out += l + "\n";
  out += "\n" + markdown_table(sweep_columns(report), report.rows);
  for (const auto& r : report.rows) {
    if (!ok(r))
      out += fmt::format("\n{} at {}: {}", r.status, point_label(r.point), r.message.substr(0, r.message.find('\n')));
  }
  out += "\n";
  for (const auto& w : report.warnings) out += "\nWARNING: " + w + "\n";
  return out + point_sections(report, false);
}

std::string to_csv(const SweepReport& report) {
  return csv_table(sweep_columns(report), report.rows);
}

// The point's shape, then the component columns' JSON values: strings as they are, numbers to
// 17 digits, "n/a" for none.
std::string to_components_csv(const SweepReport& report) {
  const auto columns = component_columns();
  std::string out = "cutoff_len,batch_size,gradient_accumulation_steps";
  for (const auto& c : columns) out += c.key.empty() ? "" : "," + c.key;
  out += "\n";
  for (const auto& r : report.rows) {
    for (const ComponentRow& row : r.components) {
      out += fmt::format("{},{},{}", r.point.cutoff_len, r.point.batch_size, r.point.gradient_accumulation_steps);
      for (const auto& c : columns) {
        if (c.key.empty()) continue;
        const json v = c.value(row);
        out += ',';
        out += v.is_null()     ? "n/a"
               : v.is_string() ? csv_field(v.get<std::string>())
                               : fmt::format("{:.17g}", v.get<double>());
      }
      out += "\n";
    }
  }
  return out;
}

std::string to_json(const SweepReport& report) {
  const auto& c = report.config;
  const json doc =
      object("model", c.run.model, "num_parameters", report.num_parameters, "dtype", c.dtype, "kernels", c.run.kernels,
             "device", report.device, "peak_tflops", report.peak_tflops > 0 ? json(report.peak_tflops) : json(nullptr),
             "peak_name", report.peak_name, "peak_source", report.peak_source, "gradient_checkpointing",
             c.run.gradient_checkpointing, "recomputation", c.run_recomputation(), "steps", c.steps, "warmup", c.warmup,
             "synthetic_data", c.run.dataset_dir.empty(), "counters", report.counters_note, "counters_requested",
             c.counters, "counter_steps", c.counters ? json(c.counted_steps()) : json(nullptr), "counters_per_kernel",
             c.counters_per_kernel, "cpu_peak",
             report.machine.cpu_peak ? cpu_peak_json(*report.machine.cpu_peak) : json(nullptr), "cpu_peak_missing",
             report.machine.cpu_peak_missing, "measured_gemm_tflops", report.measured_gemm_tflops,
             "measured_gemm_exceeds_peak", report.measured_gemm_exceeds_peak, "hardware",
             report.machine.spec ? hardware_json(*report.machine.spec) : json(nullptr), "roofline",
             report.roofline ? roofline_json(*report.roofline, report.machine.bandwidth_source) : json(nullptr),
             "warnings", report.warnings, "world_size", report.world_size, "launcher", report.launcher, "backend",
             report.backend, "zero_stage", c.run.zero_stage, "ddp_overlap", c.ddp_overlap, "optimisation",
             object("learning_rate", c.run.learning_rate, "lr_scheduler_type", c.run.lr_scheduler_type, "warmup_ratio",
                    c.run.warmup_ratio, "warmup_steps", c.run.warmup_steps, "weight_decay", c.run.weight_decay,
                    "max_grad_norm", c.run.max_grad_norm),
             "rows", json_rows(sweep_columns(report), report.rows));
  return doc.dump(2) + "\n";
}

std::string to_html(const SweepReport& report) {
  std::map<std::string, Series> mem, mem_pred, speed;
  size_t color = 0;
  std::map<std::string, std::string> colors;
  for (const auto& r : report.rows) {
    const std::string name = fmt::format(
        "batch {}, gradient_accumulation_steps {}{}", r.point.batch_size, r.point.gradient_accumulation_steps,
        r.point.recomputation.empty() ? "" : ", recomputation " + r.point.recomputation);
    if (!colors.count(name)) colors[name] = kColors[color++ % 8];
    mem_pred[name] = {name + " predicted", mem_pred[name].points, colors[name], true};
    mem_pred[name].points.emplace_back(static_cast<double>(r.point.cutoff_len), r.predicted.total() / 1e9);
    mem[name] = {name + " measured", mem[name].points, colors[name]};
    speed[name] = {name, speed[name].points, colors[name]};
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

  const auto& c = report.config;
  std::string out = fmt::format("<h1>kiln-profile: {}</h1>\n", html_escape(report.config.run.model));
  out += fmt::format(
      "<p>{} parameters, compute dtype {}, device {}, peak {:.3g} TFLOP/s ({}), {} timed steps after {} warm-up, "
      "{} data{}.</p>\n",
      report.num_parameters, html_escape(c.dtype), html_escape(report.device), report.peak_tflops,
      html_escape(report.peak_source.empty() ? "unknown" : report.peak_source), c.steps, c.warmup,
      c.run.dataset_dir.empty() ? "synthetic" : "shard",
      c.run.gradient_checkpointing ? ", recomputation " + c.run_recomputation() : "");
  out += html_table("<table id=\"results\">", sweep_columns(report), report.rows) + "\n";
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
  out += point_sections(report, true);
  return html_page("kiln-profile report", out);
}

std::vector<std::string> write_reports(const SweepReport& report, const std::string& dir,
                                       const std::vector<std::string>& formats) {
  std::vector<std::string> written = write_files(dir, "profile", formats, [&](const std::string& f) {
    return f == "md"     ? to_markdown(report)
           : f == "csv"  ? to_csv(report)
           : f == "json" ? to_json(report)
                         : to_html(report);
  });
  if (std::find(formats.begin(), formats.end(), "csv") != formats.end())
    written.push_back(
        write_files(dir, "profile_components", {"csv"}, [&](auto&) { return to_components_csv(report); })[0]);
  return written;
}

}  // namespace kiln::profile
