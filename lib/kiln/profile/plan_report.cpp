// The planner's report in Markdown, CSV, JSON and HTML (kiln-profile plan): the formatting of
// cost::PlanReport, which the cost layer computes.
#include "kiln/profile/plan_report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/profile/report.h"

namespace kiln::profile {

using json = nlohmann::json;
using cost::MemoryEstimate;
using cost::PlanReport;
using cost::PlanRow;

namespace {

std::string gb(double bytes) {
  return fmt::format("{:.2f}", bytes / 1e9);
}

std::string components(const MemoryEstimate& e) {
  std::string out;
  for (const auto& [name, bytes] : e.components) {
    if (bytes > 0) out += fmt::format("{}{} {}", out.empty() ? "" : "; ", name, gb(bytes));
  }
  return out;
}

std::string speed(const PlanReport& r, const PlanRow& row) {
  return r.peak_tflops > 0 ? fmt::format("{:.0f}", row.tokens_per_second) : "n/a";
}

const std::vector<std::string> kHeader = {
    "cutoff_len",  "micro-batch", "grad accum",           "global batch (seqs)", "recomputation",  "predicted (GB)",
    "needed (GB)", "fits",        "tokens/s (predicted)", "recommended",         "components (GB)"};

std::vector<std::string> cells(const PlanReport& r, const PlanRow& row) {
  return {std::to_string(row.cutoff_len),
          std::to_string(row.micro_batch),
          std::to_string(row.grad_accum),
          std::to_string(row.global_sequences),
          row.policy,
          gb(row.predicted.total()),
          gb(row.needed_bytes),
          row.fits ? "yes" : "no",
          speed(r, row),
          row.recommended ? "**yes**" : "",
          components(row.predicted)};
}

std::string title(const PlanReport& r) {
  const auto& c = r.config;
  return fmt::format(
      "kiln plan: {} ({} parameters), {}, {} GB per device{}, {} rank{}{}, target {} {} per step, MFU assumed {:.0f}% "
      "of {}",
      c.model, r.num_parameters, c.run.dtype, gb(c.device_memory_bytes),
      c.device_name.empty() ? "" : " (" + c.device_name + ")", c.run.parallel.world_size,
      c.run.parallel.world_size == 1 ? "" : "s",
      c.run.parallel.zero_stage > 0 ? fmt::format(", ZeRO stage {}", c.run.parallel.zero_stage) : "",
      c.target_sequences > 0 ? c.target_sequences : c.target_tokens, c.target_sequences > 0 ? "sequences" : "tokens",
      c.mfu * 100,
      r.peak_tflops > 0 ? fmt::format("{:.4g} TFLOP/s ({})", r.peak_tflops, r.peak_source)
                        : "an unknown peak (ranked by FLOPs only)");
}

}  // namespace

std::string plan_markdown(const PlanReport& r) {
  std::string out = "# " + title(r) + "\n";
  for (int64_t t : r.config.cutoff_lens) {
    out += fmt::format("\n## cutoff_len {}\n\n", t);
    const PlanRow* best = r.recommended(t);
    if (best) {
      out += fmt::format(
          "Recommended: micro-batch {}, gradient_accumulation_steps {}, recomputation {} (predicted {} GB, {} GB "
          "with the allocator's allowance).\n\n",
          best->micro_batch, best->grad_accum, best->policy, gb(best->predicted.total()), gb(best->needed_bytes));
    } else {
      out += "Nothing fits: not even micro-batch 1 with full recomputation.\n\n";
    }
    out += "|";
    for (const auto& h : kHeader) out += " " + h + " |";
    out += "\n|";
    for (size_t i = 0; i < kHeader.size(); ++i) out += " --- |";
    out += "\n";
    // Per policy, the largest micro-batch that fits (the full list is in the CSV and JSON).
    int shown = 0;
    std::vector<std::string> seen;
    for (const PlanRow& row : r.rows) {
      if (row.cutoff_len != t || !row.fits) continue;
      if (std::find(seen.begin(), seen.end(), row.policy) != seen.end()) continue;
      seen.push_back(row.policy);
      out += "|";
      for (const auto& cell : cells(r, row)) out += " " + cell + " |";
      out += "\n";
      ++shown;
    }
    if (shown == 0) out += "| (none) |\n";
  }
  return out;
}

std::string plan_csv(const PlanReport& r) {
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char ch : s) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  std::string out;
  for (size_t i = 0; i < kHeader.size(); ++i) out += (i ? "," : "") + quote(kHeader[i]);
  out += "\n";
  for (const PlanRow& row : r.rows) {
    auto c = cells(r, row);
    c[9] = row.recommended ? "yes" : "";
    for (size_t i = 0; i < c.size(); ++i) out += (i ? "," : "") + quote(c[i]);
    out += "\n";
  }
  return out;
}

std::string plan_json(const PlanReport& r) {
  const auto& c = r.config;
  json rows = json::array();
  for (const PlanRow& row : r.rows) {
    json comps = json::object();
    for (const auto& [name, bytes] : row.predicted.components) comps[name] = bytes;
    rows.push_back({{"cutoff_len", row.cutoff_len},
                    {"micro_batch", row.micro_batch},
                    {"gradient_accumulation_steps", row.grad_accum},
                    {"global_sequences", row.global_sequences},
                    {"policy", row.policy},
                    {"gradient_checkpointing_every", row.every},
                    {"predicted_bytes", row.predicted.total()},
                    {"allocator_overhead_bytes", row.predicted.allocator_overhead},
                    {"needed_bytes", row.needed_bytes},
                    {"predicted_components", comps},
                    {"peak_phase", row.predicted.peak_phase},
                    {"fits", row.fits},
                    {"tokens_per_second", r.peak_tflops > 0 ? json(row.tokens_per_second) : json(nullptr)},
                    {"recommended", row.recommended}});
  }
  const json doc = {{"model", c.model},
                    {"num_parameters", r.num_parameters},
                    {"dtype", c.run.dtype},
                    {"kernels", c.kernels},
                    {"device_memory_bytes", c.device_memory_bytes},
                    {"device_name", c.device_name},
                    {"cuda", c.run.cuda},
                    {"peak_tflops", r.peak_tflops > 0 ? json(r.peak_tflops) : json(nullptr)},
                    {"mfu_assumed", c.mfu},
                    {"target_tokens", c.target_tokens},
                    {"target_sequences", c.target_sequences},
                    {"world_size", c.run.parallel.world_size},
                    {"zero_stage", c.run.parallel.zero_stage},
                    {"rows", rows}};
  return doc.dump(2) + "\n";
}

std::string plan_html(const PlanReport& r) {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char ch : s) o += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
    return o;
  };
  std::string out =
      "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>kiln plan</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid "
      "#ccc;padding:3px 8px;text-align:right}tr.best{background:#dfd}tr.no{color:#999}"
      ".bar{background:#69c;height:10px;display:inline-block}</style></head><body>\n";
  out += "<h1>" + esc(title(r)) + "</h1>\n";
  for (int64_t t : r.config.cutoff_lens) {
    out += fmt::format("<h2>cutoff_len {}</h2>\n<table><tr>", t);
    for (const auto& h : kHeader) out += "<th>" + esc(h) + "</th>";
    out += "<th>of the device</th></tr>\n";
    for (const PlanRow& row : r.rows) {
      if (row.cutoff_len != t) continue;
      out += fmt::format("<tr class=\"{}\">", row.recommended ? "best" : row.fits ? "" : "no");
      auto c = cells(r, row);
      c[9] = row.recommended ? "yes" : "";
      for (const auto& cell : c) out += "<td>" + esc(cell) + "</td>";
      const double share = std::min(row.needed_bytes / r.config.device_memory_bytes, 2.0);
      out += fmt::format("<td><span class=\"bar\" style=\"width:{:.0f}px\"></span> {:.0f}%</td></tr>\n", share * 100,
                         share * 100);
    }
    out += "</table>\n";
  }
  out += "</body></html>\n";
  return out;
}

std::vector<std::string> write_plan_reports(const PlanReport& report, const std::string& dir,
                                            const std::vector<std::string>& formats) {
  return write_report_files(dir, "plan", formats, [&](const std::string& f) {
    return f == "md"     ? plan_markdown(report)
           : f == "csv"  ? plan_csv(report)
           : f == "json" ? plan_json(report)
                         : plan_html(report);
  });
}

}  // namespace kiln::profile
