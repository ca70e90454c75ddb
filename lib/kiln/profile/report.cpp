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

std::vector<Column<ComponentRow>> component_columns(bool measured) {
  using C = const ComponentRow&;
  auto text = [](const char* name, std::string ComponentRow::*m) -> Column<ComponentRow> {
    return {name, [m](C c) { return c.*m; }, name, [m](C c) { return json(c.*m); }};
  };
  auto optional_ms = [](C c) { return c.measured_seconds ? fmt::format("{:.3f}", *c.measured_seconds * 1e3) : "n/a"; };
  auto optional_mb = [](C c) { return c.counted_bytes ? fmt::format("{:.3f}", *c.counted_bytes / 1e6) : "n/a"; };
  std::vector<Column<ComponentRow>> out = {
      text("component", &ComponentRow::component),
      text("pass", &ComponentRow::pass),
      number<ComponentRow>("x", "repeats", 0, "{:g}", &ComponentRow::repeats),
      number<ComponentRow>("GEMM GFLOP", "gemm_flops", 'G', "{:.4f}", &ComponentRow::gemm_flops),
      number<ComponentRow>("other GFLOP", "other_flops", 'G', "{:.4f}", &ComponentRow::other_flops),
      number<ComponentRow>("MB", "bytes", 'M', "{:.3f}", &ComponentRow::bytes),
      number<ComponentRow>("MB eager", "eager_bytes", 'M', "{:.3f}", &ComponentRow::eager_bytes),
      {"MB counted", optional_mb, "", {}, true},
      number<ComponentRow>("FLOP/B", "intensity", 0, "{:.2f}", &ComponentRow::intensity),
      text("bound", &ComponentRow::bound),
      number<ComponentRow>("modelled ms", "modelled_seconds", 'm', "{:.3f}", &ComponentRow::modelled_seconds),
      number<ComponentRow>("modelled ms eager", "eager_modelled_seconds", 'm', "{:.3f}",
                           &ComponentRow::eager_modelled_seconds),
      {"measured ms", optional_ms, "measured_seconds", [](C c) { return opt(c.measured_seconds); }, true},
      field<ComponentRow>("counted_bytes", &ComponentRow::counted_bytes)};
  if (!measured) {
    std::erase_if(out, [](const auto& c) {
      return c.name == "MB counted" || c.name == "measured ms" || c.key == "counted_bytes";
    });
  }
  return out;
}

}  // namespace report_detail

using namespace report_detail;

namespace {

// Cells: "1.234" (GB = 1e9 bytes); "41.0%" or "n/a".
std::string gb(double bytes) {
  return fmt::format("{:.3f}", bytes / 1e9);
}
std::string pct(const std::optional<double>& f) {
  return f ? fmt::format("{:.1f}%", *f * 100) : "n/a";
}

bool cuda(const SweepReport& r) {
  return r.device.rfind("cuda", 0) == 0;
}
std::string ms(const std::optional<double>& seconds) {
  return seconds ? fmt::format("{:.3f}", *seconds * 1e3) : "n/a";
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
  if (report.cpu_peak) {
    const cost::CpuPeak& p = *report.cpu_peak;
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

// One phase of a point's counted steps (--counter-phases): the interval's counts and, per step,
// the row beside the traffic model's.
struct PhaseEntry {
  const PhaseCounters* counted;
  PhaseRow per_step;
};
std::vector<PhaseEntry> phase_entries(const ProfileRow& r, int64_t counted_steps) {
  std::vector<PhaseEntry> out;
  const std::vector<PhaseRow> rows = phase_rows(r, counted_steps);
  for (size_t i = 0; i < rows.size(); ++i) out.push_back({&r.counters->phases[i], rows[i]});
  return out;
}
std::vector<Column<PhaseEntry>> phase_columns(const ProfileRow& r) {
  using P = const PhaseEntry&;
  const bool gpu = r.counters && r.counters->source == "cupti";
  auto counted = [](std::optional<double> PhaseCounters::*m) { return [m](P p) { return opt(p.counted->*m); }; };
  auto gb_or_na = [](const std::optional<double>& b) { return b ? gb(*b) : "n/a"; };
  return {{"phase", [](P p) { return p.per_step.phase; }, "name", [](P p) { return json(p.counted->name); }},
          {"entered per step", [](P p) { return fmt::format("{:g}", p.per_step.segments_per_step); }, "segments",
           [](P p) { return json(p.counted->segments); }},
          {"wall ms", [](P p) { return fmt::format("{:.3f}", p.per_step.wall_seconds * 1e3); }, "seconds",
           [](P p) { return json(p.counted->seconds); }},
          {gpu ? "GPU ms (counted)" : "CPU ms (counted, all threads)",
           [](P p) { return ms(p.per_step.counted_seconds); }, "gpu_seconds", counted(&PhaseCounters::gpu_seconds)},
          {"", {}, "cpu_seconds", counted(&PhaseCounters::cpu_seconds)},
          {"", {}, "cycles", counted(&PhaseCounters::cycles)},
          {"", {}, "instructions", counted(&PhaseCounters::instructions)},
          {"modelled ms", [](P p) { return ms(p.per_step.modelled_seconds); }, "modelled_seconds_per_step",
           [](P p) { return opt(p.per_step.modelled_seconds); }},
          {"DRAM GB counted", [=](P p) { return gb_or_na(p.per_step.counted_bytes); }, "dram_bytes",
           counted(&PhaseCounters::dram_bytes)},
          {"GB modelled", [=](P p) { return gb_or_na(p.per_step.modelled_bytes); }, "modelled_bytes_per_step",
           [](P p) { return opt(p.per_step.modelled_bytes); }},
          {"counted/modelled",
           [](P p) {
             const PhaseRow& m = p.per_step;
             return m.counted_bytes && m.modelled_bytes && *m.modelled_bytes > 0
                        ? fmt::format("{:.2f}", *m.counted_bytes / *m.modelled_bytes)
                        : "n/a";
           }},
          {"memory bandwidth", [](P p) { return pct(p.per_step.memory_bandwidth); }, "memory_bandwidth",
           counted(&PhaseCounters::memory_bandwidth)},
          {"", {}, "memory_throughput", counted(&PhaseCounters::memory_throughput)},
          {"tensor core", [](P p) { return pct(p.per_step.tensor_core); }, "tensor_core",
           counted(&PhaseCounters::tensor_core)},
          {"fp engine", [](P p) { return pct(p.per_step.fp_engine); }, "fp_engine", counted(&PhaseCounters::fp_engine)},
          {"", {}, "kernels", [](P p) { return json(p.counted->kernels); }}};
}
std::string phase_note(const ProfileRow& r, int64_t counted_steps) {
  return fmt::format(
      "counted per phase over {} step{}, per step; modelled: the traffic model's fwd rows (forward), bwd and "
      "recompute rows (backward), step rows (optimizer); the model counts compulsory bytes, a lower bound of what "
      "DRAM moves; {}",
      counted_steps, counted_steps == 1 ? "" : "s", r.counters->detail);
}

json counters_json(const ProfileRow& r, int64_t counted_steps) {
  if (!r.counters) return nullptr;
  const CounterReading& c = *r.counters;
  json per_range = json::array(), kernels = json::array(), components = json::array();
  for (const auto& [name, seconds] : c.per_range) per_range.push_back({name, seconds});
  auto kernel_json = [](const KernelCounters& k) {
    json j = object("name", k.name, "launches", k.launches, "seconds", k.seconds, "dram_bytes", k.dram_bytes,
                    "memory_bandwidth", k.memory_bandwidth, "memory_throughput", k.memory_throughput, "tensor_core",
                    k.tensor_core, "fp_engine", k.fp_engine);
    if (!k.pass.empty()) j["pass"] = k.pass;
    return j;
  };
  for (const KernelCounters& k : c.kernels) kernels.push_back(kernel_json(k));
  for (const KernelCounters& k : c.components) components.push_back(kernel_json(k));
  return object("source", c.source, "memory_bandwidth", c.memory_bandwidth, "tensor_core", c.tensor_core, "fp_engine",
                c.fp_engine, "dram_bytes", c.dram_bytes, "cycles", c.cycles, "instructions", c.instructions,
                "cpu_seconds", c.cpu_seconds, "memory_throughput", c.memory_throughput, "gpu_seconds", c.gpu_seconds,
                "ranges", c.ranges, "collect_seconds", c.collect_seconds, "seconds", c.seconds, "reason", c.reason,
                "detail", c.detail, "per_range", per_range, "kernels", kernels, "components", components,
                "unattributed", c.unattributed ? kernel_json(*c.unattributed) : json(nullptr), "phases",
                json_rows(phase_columns(r), phase_entries(r, counted_steps)));
}

json component_times_json(const ProfileRow& r) {
  if (!r.component_times) return nullptr;
  const ComponentTimes& t = *r.component_times;
  json merged = json::array();
  for (const auto& [component, pass, seconds] : unmatched_component_times(r))
    merged.push_back(object("component", component, "pass", pass, "measured_seconds", seconds));
  return object("source", t.source, "linked_activities", t.linked_activities, "timed_activities", t.timed_activities,
                "unplaced_activities", t.unplaced_activities, "profiled_seconds", t.profiled_seconds,
                "unattributed_seconds", t.unattributed_seconds, "merged_rows", merged);
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
      field<ProfileRow>("predicted_components",
                        [](R r) {
                          json comps = json::object();
                          for (const auto& [n, b] : r.predicted.components) comps[n] = b;
                          return comps;
                        }),
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
      field<ProfileRow>("component_times", component_times_json),
      field<ProfileRow>("counters", [=](R r) { return counters_json(r, steps); })};
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
                    r.seconds_per_step * 1e3, r.modelled_step_seconds * 1e3, component_times_note(r));
    if (html) {
      out += "<details class=\"components\"><summary>" + html_escape(title) + "</summary>\n" +
             html_table("<table class=\"components\">", component_columns(), r.components) + "\n";
    } else {
      heading(3, title);
      out += "\n" + markdown_table(component_columns(), r.components, true);
    }
    std::string merged;
    for (const auto& [component, pass, seconds] : unmatched_component_times(r))
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
    heading(3, fmt::format("Phases: {} ({})", point_label(r.point), phase_note(r, steps)));
    out += html ? html_table("<table class=\"phases\">", phase_columns(r), phase_entries(r, steps)) + "\n"
                : "\n" + markdown_table(phase_columns(r), phase_entries(r, steps));
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
             c.counters_per_kernel, "cpu_peak", report.cpu_peak ? cpu_peak_json(*report.cpu_peak) : json(nullptr),
             "cpu_peak_missing", report.cpu_peak_missing, "measured_gemm_tflops", report.measured_gemm_tflops,
             "measured_gemm_exceeds_peak", report.measured_gemm_exceeds_peak, "hardware",
             report.hardware ? hardware_json(*report.hardware) : json(nullptr), "roofline",
             report.roofline ? roofline_json(*report.roofline, report.bandwidth_source) : json(nullptr), "warnings",
             report.warnings, "world_size", report.world_size, "launcher", report.launcher, "backend", report.backend,
             "zero_stage", c.run.zero_stage, "ddp_overlap", c.ddp_overlap, "optimisation",
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
