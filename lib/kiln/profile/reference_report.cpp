// The reference runs' report in Markdown, JSON and HTML (kiln-profile reference): the formatting
// of cost::ReferenceReport, which cost/reference_runs.h computes.
#include "kiln/profile/reference_report.h"

#include <map>

#include "kiln/profile/report_internal.h"
#include "kiln/profile/settings.h"
#include "kiln/train/run_description.h"

namespace kiln::profile {

using namespace report_detail;

ReferenceReport reference_report(const std::string& data_path, const std::string& host_costs_path) {
  return cost::predict_reference_runs(
      data_path, host_costs_path,
      [](const ReferenceRow& r, const model::LlamaConfig& model, const cost::HardwareSpec& gpu) {
        ProfileSettings s;
        s.command = Command::kExplain;
        s.source = s.run.source = "the reference runs";
        s.run.model = r.model;
        s.cutoff_len = {r.cutoff_len};
        s.per_device_train_batch_size = {r.batch};
        s.gradient_accumulation_steps = {r.accumulation};
        train::set_compute_dtype(s.run, r.dtype);
        return explain_run(s, model, ExplainDevice{true, gpu, gpu.source});
      });
}

namespace {

using R = const ReferenceRow&;

std::string ratio(const std::optional<double>& r, bool within) {
  return r ? fmt::format("{:.2f}{}", *r, within ? "" : " *") : "";
}
// A number column: `format` of get(row).
Column<ReferenceRow> col(const char* name, const char* format, double (*get)(R)) {
  return {name, [=](R r) { return fmt::format(fmt::runtime(format), get(r)); }, "", {}, true};
}
// Every table's first two columns: the row's table and its shape.
std::vector<Column<ReferenceRow>> row_columns(std::vector<Column<ReferenceRow>> rest) {
  rest.insert(rest.begin(), {{"table", [](R r) { return r.table; }, "", {}, false, "l"},
                             {"cutoff_len x batch x gradient_accumulation_steps",
                              [](R r) { return fmt::format("{} x {} x {}", r.cutoff_len, r.batch, r.accumulation); }}});
  return rest;
}

// Measured against predicted, and kiln's own prediction (with the HTML's column of the misses).
std::vector<Column<ReferenceRow>> prediction_columns() {
  return row_columns(
      {{"measured s/step",
        [](R r) { return fmt::format("{:.4g} ({})", *r.measured_seconds, r.speed_text); },
        "",
        {},
        true},
       col("predicted s/step", "{:.4g}", [](R r) { return r.predicted.seconds; }),
       {"ratio", [](R r) { return ratio(r.speed_ratio(), r.speed_within()); }, "", {}, true, "r"},
       {"bound", [](R r) { return std::string(r.predicted.host_bound ? "host" : "device"); }},
       {"measured GB", [](R r) { return r.measured_memory ? gb2(*r.measured_memory) : ""; }, "", {}, true},
       {"predicted GB", [](R r) { return gb2(r.predicted_memory.total()); }, "", {}, true},
       {"ratio", [](R r) { return ratio(r.memory_ratio(), r.memory_within()); }, "", {}, true, "r"},
       {"peak", [](R r) { return r.predicted_memory.peak_phase; }},
       col("kiln s/step", "{:.4g}", [](R r) { return r.kiln.seconds; }),
       {"kiln GB", [](R r) { return gb2(r.kiln_memory.total()); }, "", {}, true},
       col("kiln speed-up", "{:.2f}x", [](R r) { return r.predicted.seconds / r.kiln.seconds; }),
       {"why outside",
        [](R r) {
          std::string why;
          for (const std::string& m : r.misses) why += (why.empty() ? "" : "; ") + m;
          return html_escape(why);
        },
        "",
        {},
        false,
        "l",
        false,
        true}});
}

std::vector<Column<ReferenceRow>> time_columns() {
  return row_columns(
      {col("ops per step", "{:.0f}", [](R r) { return r.predicted.ops_per_step; }),
       col("host ms per micro-batch", "{:.1f}", [](R r) { return 1e3 * r.predicted.host_micro_batch; }),
       col("device ms per micro-batch", "{:.1f}", [](R r) { return 1e3 * r.predicted.device_micro_batch; }),
       col("host ms per step (optimizer)", "{:.1f}", [](R r) { return 1e3 * r.predicted.host_step; }),
       col("device ms per step (optimizer)", "{:.1f}", [](R r) { return 1e3 * r.predicted.device_step; }),
       {"attention", [](R r) { return r.attention_backend; }},
       col("kiln: host ms", "{:.1f}",
           [](R r) {
             return 1e3 * (static_cast<double>(r.accumulation) * r.kiln.host_micro_batch + r.kiln.host_step);
           }),
       col("kiln: device ms", "{:.1f}", [](R r) {
         return 1e3 * (static_cast<double>(r.accumulation) * r.kiln.device_micro_batch + r.kiln.device_step);
       })});
}

std::vector<Column<ReferenceRow>> counter_columns() {
  // The user's profiler's figure beside the model's at the measured step time.
  auto pair = [](const char* name, std::optional<double> ReferenceRow::*measured,
                 double cost::ModelledUtilisation::*modelled) -> Column<ReferenceRow> {
    return {name, [=](R r) {
              const auto& m = r.*measured;
              return fmt::format("{} / {:.1f}%", m ? fmt::format("{:.0f}%", 100 * *m) : "-",
                                 100 * (r.counters_at_measured.*modelled));
            }};
  };
  return row_columns(
      {pair("memory bandwidth", &ReferenceRow::memory_bandwidth, &cost::ModelledUtilisation::memory_bandwidth),
       pair("tensor core", &ReferenceRow::tensor_core, &cost::ModelledUtilisation::tensor_core),
       pair("fp engine", &ReferenceRow::fp_engine, &cost::ModelledUtilisation::fp_engine),
       col("kiln at its predicted time: bandwidth", "{:.1f}%",
           [](R r) { return 100 * r.kiln_counters.memory_bandwidth; }),
       col("tensor core", "{:.1f}%", [](R r) { return 100 * r.kiln_counters.tensor_core; }),
       col("fp engine", "{:.1f}%", [](R r) { return 100 * r.kiln_counters.fp_engine; })});
}

std::vector<Column<ReferenceRow>> traffic_columns() {
  std::vector<Column<ReferenceRow>> out;
  for (size_t i = 0; i < 4; ++i) {
    out.push_back({i == 3   ? "optimizer step"
                   : i == 0 ? "forward"
                   : i == 1 ? "backward"
                            : "recompute",
                   [i](R r) { return fmt::format("{:.2f}", r.bytes_by_pass[i].second / 1e9); },
                   "",
                   {},
                   true});
  }
  auto total = [](R r) {
    double t = 0;
    for (const auto& [pass, bytes] : r.bytes_by_pass) t += bytes;
    return t;
  };
  out.push_back({"total", [=](R r) { return fmt::format("{:.2f}", total(r) / 1e9); }, "", {}, true});
  out.push_back({"MB per token",
                 [=](R r) {
                   return fmt::format("{:.2f}",
                                      total(r) / static_cast<double>(r.cutoff_len * r.batch * r.accumulation) / 1e6);
                 },
                 "",
                 {},
                 true});
  return row_columns(out);
}

}  // namespace

std::string reference_markdown(const ReferenceReport& rep) {
  std::string out = fmt::format(
      "# kiln reference: the reference runs, predicted\n\n"
      "Measured: {}. Host costs: {}. The reference stack: LLaMA-Factory 0.9.0 on transformers 4.45 (SDPA attention, "
      "gradient checkpointing, fp32 logits, foreach AdamW), its step the larger of host and device time between "
      "synchronisations; memory as nvidia-smi shows it (the caching allocator's segments, replayed tensor by tensor, "
      "and the CUDA context). "
      "kiln: its own step for the same work on the same GPU (default kernels, no recomputation). Speed within {:.0f}% "
      "and memory within {:.0f}% are the targets; a row outside says what the model lacks.\n\n",
      rep.data_source, rep.host_source, 100 * kSpeedTolerance, 100 * kMemoryTolerance);
  out += markdown_table(prediction_columns(), rep.rows, true);
  int speed_in = 0, speed_n = 0, mem_in = 0, mem_n = 0;
  for (const ReferenceRow& r : rep.rows) {
    speed_n += r.measured_seconds ? 1 : 0, speed_in += r.measured_seconds && r.speed_within() ? 1 : 0;
    mem_n += r.measured_memory ? 1 : 0, mem_in += r.measured_memory && r.memory_within() ? 1 : 0;
  }
  out += fmt::format("\nWithin tolerance: speed {} of {} rows, memory {} of {} rows (* outside).\n", speed_in, speed_n,
                     mem_in, mem_n);
  out += "\n## Step time, host and device\n\n" + markdown_table(time_columns(), rep.rows, true);
  out += "\n## Counters: the user's profiler against the model at the measured step time\n\n" +
         markdown_table(counter_columns(), rep.rows, true);
  out += "\n(measured / modelled; a blank measured cell: the user recorded none.)\n";
  out += "\n## The reference step's modelled traffic, GB per optimizer step\n\n" +
         markdown_table(traffic_columns(), rep.rows, true);
  bool any = false;
  for (const ReferenceRow& r : rep.rows) {
    for (const std::string& m : r.misses) {
      if (!std::exchange(any, true)) out += "\n## Outside the tolerance, and why\n\n";
      out += fmt::format("- {} {} x {} x {}: {}\n", r.table, r.cutoff_len, r.batch, r.accumulation, m);
    }
  }
  if (!rep.unmeasured.empty()) {
    out += "\n## Not predicted\n\n";
    for (const std::string& u : rep.unmeasured) out += "- " + u + "\n";
  }
  return out;
}

std::string reference_json(const ReferenceReport& rep) {
  auto step = [](const cost::StepTime& s) {
    return object("seconds", s.seconds, "host_bound", s.host_bound, "ops_per_step", s.ops_per_step,
                  "host_micro_batch_seconds", s.host_micro_batch, "device_micro_batch_seconds", s.device_micro_batch,
                  "host_step_seconds", s.host_step, "device_step_seconds", s.device_step);
  };
  auto memory = [](const cost::SmiMemory& m) {
    json parts = json::array();
    for (const auto& [name, bytes] : m.components) parts.push_back(object("name", name, "bytes", bytes));
    return object("bytes", m.total(), "allocated_bytes", m.allocated, "reserved_bytes", m.reserved, "context_bytes",
                  m.context, "peak_phase", m.peak_phase, "components", parts);
  };
  auto counters = [](const cost::ModelledUtilisation& u) {
    return object("memory_bandwidth", u.memory_bandwidth, "tensor_core", u.tensor_core, "fp_engine", u.fp_engine);
  };
  json rows = json::array();
  for (const ReferenceRow& r : rep.rows) {
    json bytes_by_pass = json::object();
    for (const auto& [pass, bytes] : r.bytes_by_pass) bytes_by_pass[pass] = bytes;
    rows.push_back(
        object("table", r.table, "device", r.device, "model", r.model, "dtype", r.dtype, "batch", r.batch,
               "accumulation", r.accumulation, "cutoff_len", r.cutoff_len, "measured",
               object("speed", r.speed_text, "seconds", r.measured_seconds, "memory_bytes", r.measured_memory,
                      "memory_bandwidth", r.memory_bandwidth, "tensor_core", r.tensor_core, "fp_engine", r.fp_engine),
               "reference",
               object("step", step(r.predicted), "memory", memory(r.predicted_memory), "counters_at_measured_seconds",
                      counters(r.counters_at_measured), "attention_backend", r.attention_backend, "bytes_by_pass",
                      bytes_by_pass, "gemm_flops", r.gemm_flops, "speed_ratio", r.speed_ratio(), "memory_ratio",
                      r.memory_ratio(), "speed_within", r.speed_within(), "memory_within", r.memory_within(), "misses",
                      r.misses),
               "kiln",
               object("step", step(r.kiln), "memory", memory(r.kiln_memory), "counters", counters(r.kiln_counters),
                      "attention", r.kiln_attention)));
  }
  return object("data_source", rep.data_source, "host_costs_source", rep.host_source, "speed_tolerance",
                kSpeedTolerance, "memory_tolerance", kMemoryTolerance, "rows", rows, "not_predicted", rep.unmeasured)
             .dump(2) +
         "\n";
}

std::string reference_html(const ReferenceReport& rep) {
  std::string out = "<h1>The reference runs, predicted</h1>\n<p>" +
                    html_escape(fmt::format("Measured: {}. Host costs: {}.", rep.data_source, rep.host_source)) +
                    "</p>\n";
  // Per table whose rows vary cutoff_len at batch 1, accumulation 1: step time and memory against it.
  std::map<std::string, std::vector<const ReferenceRow*>> sweeps;
  for (const ReferenceRow& r : rep.rows) {
    if (r.batch == 1 && r.accumulation == 1) sweeps[r.table].push_back(&r);
  }
  int id = 0;
  for (const auto& [table, rows] : sweeps) {
    if (rows.size() < 3) continue;
    Series ms{"measured", {}, kColors[0]}, pred{"reference, predicted", {}, kColors[1], true},
        kiln{"kiln, predicted", {}, kColors[2], true};
    Series gbm = ms, gbp = pred, gbk = kiln;
    for (const ReferenceRow* r : rows) {
      const double x = static_cast<double>(r->cutoff_len);
      ms.points.emplace_back(x, 1e3 * *r->measured_seconds);
      pred.points.emplace_back(x, 1e3 * r->predicted.seconds);
      kiln.points.emplace_back(x, 1e3 * r->kiln.seconds);
      if (r->measured_memory) gbm.points.emplace_back(x, *r->measured_memory / 1e9);
      gbp.points.emplace_back(x, r->predicted_memory.total() / 1e9);
      gbk.points.emplace_back(x, r->kiln_memory.total() / 1e9);
    }
    out += "<h2>" + html_escape(table) + "</h2>\n";
    out += line_chart(fmt::format("chart-ref-{}", id++), "step time, batch 1", "cutoff_len", "ms per step",
                      {ms, pred, kiln});
    out += line_chart(fmt::format("chart-ref-{}", id++), "memory (nvidia-smi)", "cutoff_len", "GB", {gbm, gbp, gbk});
  }
  out += "<h2>Every row</h2>\n" +
         html_table<ReferenceRow>(
             "<table>", prediction_columns(), rep.rows,
             [](const ReferenceRow& r) { return r.misses.empty() ? "" : "miss"; }, true) +
         "\n";
  return html_page("kiln reference", out);
}

std::vector<std::string> write_reference_reports(const ReferenceReport& report, const std::string& dir,
                                                 const std::vector<std::string>& formats) {
  return write_files(
      dir, "reference", formats,
      [&](const std::string& f) {
        return f == "md" ? reference_markdown(report) : f == "json" ? reference_json(report) : reference_html(report);
      },
      {"md", "json", "html"});
}

}  // namespace kiln::profile
