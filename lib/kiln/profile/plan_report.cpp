// The planner's report in Markdown, CSV, JSON and HTML (kiln-profile plan): the formatting of
// cost::PlanReport, which the cost layer computes.
#include "kiln/profile/plan_report.h"

#include <algorithm>

#include "kiln/profile/report_internal.h"

namespace kiln::profile {

using namespace report_detail;
using cost::PlanRow;

namespace {

std::vector<Column<PlanRow>> plan_columns(const PlanReport& r) {
  using P = const PlanRow&;
  auto count = [](const char* name, const char* key, int64_t PlanRow::*m) -> Column<PlanRow> {
    return {name, [m](P p) { return std::to_string(p.*m); }, key, [m](P p) { return json(p.*m); }};
  };
  auto bytes = [](const char* name, const char* key, double (*get)(P)) -> Column<PlanRow> {
    return {name, [get](P p) { return gb2(get(p)); }, key, [get](P p) { return json(get(p)); }};
  };
  const bool speed = r.peak_tflops > 0;
  const double device = r.config.device_memory_bytes;
  return {count("cutoff_len", "cutoff_len", &PlanRow::cutoff_len),
          count("micro-batch", "micro_batch", &PlanRow::micro_batch),
          count("gradient_accumulation_steps", "gradient_accumulation_steps", &PlanRow::gradient_accumulation_steps),
          count("global batch (seqs)", "global_sequences", &PlanRow::global_sequences),
          {"recomputation", [](P p) { return p.policy; }, "policy", [](P p) { return json(p.policy); }},
          field<PlanRow>("gradient_checkpointing_every", [](P p) { return p.every; }),
          bytes("predicted (GB)", "predicted_bytes", [](P p) { return p.predicted.total(); }),
          field<PlanRow>("allocator_overhead_bytes", [](P p) { return p.predicted.allocator_overhead; }),
          bytes("needed (GB)", "needed_bytes", [](P p) { return p.needed_bytes; }),
          {"fits", [](P p) { return p.fits ? "yes" : "no"; }, "fits", [](P p) { return json(p.fits); }},
          {"tokens/s (predicted)", [=](P p) { return speed ? fmt::format("{:.0f}", p.tokens_per_second) : "n/a"; },
           "tokens_per_second", [=](P p) { return speed ? json(p.tokens_per_second) : json(nullptr); }},
          {"recommended", [](P p) { return p.recommended ? "yes" : ""; }, "recommended",
           [](P p) { return json(p.recommended); }, false, "", true},
          {"components (GB)",
           [](P p) {
             std::string out;
             for (const auto& [name, b] : p.predicted.components) {
               if (b > 0) out += fmt::format("{}{} {}", out.empty() ? "" : "; ", name, gb2(b));
             }
             return out;
           },
           "predicted_components", [](P p) { return components_json(p.predicted); }},
          field<PlanRow>("peak_phase", [](P p) { return p.predicted.peak_phase; }),
          {"of the device",
           [=](P p) {
             const double share = std::min(p.needed_bytes / device, 2.0) * 100;
             return fmt::format("<span class=\"bar\" style=\"width:{:.0f}px\"></span> {:.0f}%", share, share);
           },
           "",
           {},
           false,
           "",
           false,
           true}};
}

std::string title(const PlanReport& r) {
  const auto& c = r.config;
  return fmt::format(
      "kiln plan: {} ({} parameters), {}, {} GB per device{}, {} rank{}{}, target {} {} per step, MFU assumed {:.0f}% "
      "of {}",
      c.model, r.num_parameters, c.run.dtype, gb2(c.device_memory_bytes),
      c.device_name.empty() ? "" : " (" + c.device_name + ")", c.run.parallel.world_size,
      c.run.parallel.world_size == 1 ? "" : "s",
      c.run.parallel.zero_stage > 0 ? fmt::format(", ZeRO stage {}", c.run.parallel.zero_stage) : "",
      c.target_sequences > 0 ? c.target_sequences : c.target_tokens, c.target_sequences > 0 ? "sequences" : "tokens",
      c.mfu * 100,
      r.peak_tflops > 0 ? fmt::format("{:.4g} TFLOP/s ({})", r.peak_tflops, r.peak_source)
                        : "an unknown peak (ranked by FLOPs only)");
}

std::vector<PlanRow> rows_of(const PlanReport& r, int64_t cutoff_len) {
  std::vector<PlanRow> out;
  std::copy_if(r.rows.begin(), r.rows.end(), std::back_inserter(out),
               [&](const PlanRow& row) { return row.cutoff_len == cutoff_len; });
  return out;
}

}  // namespace

std::string plan_markdown(const PlanReport& r) {
  std::string out = "# " + title(r) + "\n";
  for (int64_t t : r.config.cutoff_lens) {
    out += fmt::format("\n## cutoff_len {}\n\n", t);
    if (const PlanRow* best = r.recommended(t)) {
      out += fmt::format(
          "Recommended: micro-batch {}, gradient_accumulation_steps {}, recomputation {} (predicted {} GB, {} GB "
          "with the allocator's allowance).\n\n",
          best->micro_batch, best->gradient_accumulation_steps, best->policy, gb2(best->predicted.total()),
          gb2(best->needed_bytes));
    } else {
      out += "Nothing fits: not even micro-batch 1 with full recomputation.\n\n";
    }
    // Per policy, the largest micro-batch that fits (the full list is in the CSV and JSON).
    std::vector<PlanRow> shown;
    for (const PlanRow& row : rows_of(r, t)) {
      const bool seen =
          std::any_of(shown.begin(), shown.end(), [&](const PlanRow& s) { return s.policy == row.policy; });
      if (row.fits && !seen) shown.push_back(row);
    }
    out += markdown_table(plan_columns(r), shown) + (shown.empty() ? "| (none) |\n" : "");
  }
  return out;
}

std::string plan_csv(const PlanReport& r) {
  return csv_table(plan_columns(r), r.rows);
}

std::string plan_json(const PlanReport& r) {
  const auto& c = r.config;
  const json doc = object("model", c.model, "num_parameters", r.num_parameters, "dtype", c.run.dtype, "kernels",
                          c.kernels, "device_memory_bytes", c.device_memory_bytes, "device_name", c.device_name, "cuda",
                          c.run.cuda, "peak_tflops", r.peak_tflops > 0 ? json(r.peak_tflops) : json(nullptr),
                          "mfu_assumed", c.mfu, "target_tokens", c.target_tokens, "target_sequences",
                          c.target_sequences, "world_size", c.run.parallel.world_size, "zero_stage",
                          c.run.parallel.zero_stage, "rows", json_rows(plan_columns(r), r.rows));
  return doc.dump(2) + "\n";
}

std::string plan_html(const PlanReport& r) {
  std::string out = "<h1>" + html_escape(title(r)) + "</h1>\n";
  for (int64_t t : r.config.cutoff_lens) {
    out += fmt::format("<h2>cutoff_len {}</h2>\n", t);
    out += html_table<PlanRow>(
               "<table>", plan_columns(r), rows_of(r, t),
               [](const PlanRow& row) { return row.recommended ? "best"
                                               : row.fits      ? ""
                                                               : "no"; }, true) +
           "\n";
  }
  return html_page("kiln plan", out);
}

std::vector<std::string> write_plan_reports(const PlanReport& report, const std::string& dir,
                                            const std::vector<std::string>& formats) {
  return write_files(dir, "plan", formats, [&](const std::string& f) {
    return f == "md"     ? plan_markdown(report)
           : f == "csv"  ? plan_csv(report)
           : f == "json" ? plan_json(report)
                         : plan_html(report);
  });
}

}  // namespace kiln::profile
