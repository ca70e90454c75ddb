#include "kiln/profile/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/config/yaml.h"
#include "kiln/profile/flops.h"
#include "kiln/profile/report.h"

namespace kiln::profile {

using json = nlohmann::json;

const std::vector<DeviceSpec>& device_specs() {
  // Memory as sold (GB = 1e9); dense TFLOP/s as in device.cpp's table (V100: no bf16 tensor cores).
  static const std::vector<DeviceSpec> specs = {
      {"V100-16GB", 16e9, 15.7, 125.0, 15.7},  {"V100-32GB", 32e9, 15.7, 125.0, 15.7},
      {"A100-40GB", 40e9, 312.0, 312.0, 19.5}, {"A100-80GB", 80e9, 312.0, 312.0, 19.5},
      {"H100-80GB", 80e9, 989.0, 989.0, 67.0}, {"H200-141GB", 141e9, 989.0, 989.0, 67.0},
  };
  return specs;
}

std::optional<DeviceSpec> device_spec(const std::string& name) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  for (const DeviceSpec& d : device_specs()) {
    if (lower(d.name) == lower(name)) return d;
  }
  return std::nullopt;
}

double parse_bytes(const std::string& text, const std::string& what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {{"", 1},         {"B", 1},           {"KB", 1e3},
                                                  {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12},
                                                  {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [name, scale] : units) {
    if (used > 0 && unit == name && value > 0) return value * scale;
  }
  throw std::invalid_argument(
      fmt::format("{}: '{}' is not a size (e.g. 80GB, 16GiB, 512MB, or a number of bytes)", what, text));
}

void PlanConfig::validate() const {
  auto fail = [&](const std::string& key, const std::string& problem) {
    throw config::ConfigError(config::config_message(source, key, problem));
  };
  if (cutoff_lens.empty()) fail("cutoff_len", "empty list");
  for (int64_t t : cutoff_lens) {
    if (t < 1) fail("cutoff_len", fmt::format("{} is not positive", t));
  }
  if (dtype != "bf16" && dtype != "fp16" && dtype != "fp32")
    fail("dtype", fmt::format("'{}' is not bf16, fp16 or fp32", dtype));
  if (!(device_memory_bytes > 0)) fail("device_memory", "give the device's memory (e.g. 80GB) or a device name");
  if (!(mfu > 0 && mfu <= 1)) fail("mfu", fmt::format("must be in (0, 1], got {}", mfu));
  if ((target_tokens > 0) == (target_sequences > 0)) {
    fail("target", "give exactly one of a target global batch in tokens or in sequences (> 0)");
  }
  if (world_size < 1) fail("world_size", fmt::format("must be >= 1, got {}", world_size));
  if (zero_stage < 0 || zero_stage > 2) fail("zero_stage", fmt::format("must be 0, 1 or 2, got {}", zero_stage));
  if (world_size == 1 && zero_stage > 0) fail("zero_stage", "ZeRO needs a world size above 1");
}

const PlanRow* PlanReport::recommended(int64_t cutoff_len) const {
  for (const PlanRow& r : rows) {
    if (r.cutoff_len == cutoff_len && r.recommended) return &r;
  }
  return nullptr;
}

PlanReport make_plan(const PlanConfig& c) {
  c.validate();
  PlanReport report;
  report.config = c;
  report.model = c.model_config ? *c.model_config : model::load_llama_config(c.model);
  report.num_parameters = report.model.num_parameters();
  if (c.peak_tflops > 0) {
    report.peak_tflops = c.peak_tflops;
    report.peak_source = "--peak-tflops";
  } else if (const auto d = device_spec(c.device_name)) {
    report.peak_tflops = c.dtype == "bf16" ? d->bf16 : c.dtype == "fp16" ? d->fp16 : d->fp32;
    report.peak_source = d->name + " datasheet";
  }
  const int layers = static_cast<int>(report.model.num_hidden_layers);
  // every 0: no whole layer recomputed (none; selective recomputes only element-wise parts).
  std::vector<std::pair<std::string, int>> policies = {{"none", 0}, {"selective", 0}};
  for (int n : {4, 2}) {
    if (n < layers) policies.emplace_back(fmt::format("every_{}", n), n);
  }
  policies.emplace_back("full", 1);

  for (int64_t t : c.cutoff_lens) {
    if (t > report.model.max_position_embeddings) {
      throw config::ConfigError(
          config::config_message(c.source, "cutoff_len",
                                 fmt::format("{} exceeds the model's max_position_embeddings {} ({})", t,
                                             report.model.max_position_embeddings, report.model.source)));
    }
    const int64_t target = c.target_sequences > 0 ? c.target_sequences : (c.target_tokens + t - 1) / t;
    const FlopsPerToken flops = flops_per_token(report.model, t);
    std::vector<PlanRow> rows;
    for (int64_t b = 1; b * c.world_size <= std::max<int64_t>(target, c.world_size); b *= 2) {
      for (const auto& [name, every] : policies) {
        PlanRow r;
        r.cutoff_len = t;
        r.micro_batch = b;
        r.grad_accum = std::max<int64_t>((target + b * c.world_size - 1) / (b * c.world_size), 1);
        r.global_sequences = b * r.grad_accum * c.world_size;
        const bool selective = name == "selective";
        r.policy = name;
        r.every = every;
        r.predicted = estimate_training_memory(report.model, b, t,
                                               MemoryOptions{.compute_bytes = c.dtype == "fp32" ? 4 : 2,
                                                             .activation_checkpointing = every > 0 || selective,
                                                             .checkpoint_every = std::max(every, 1),
                                                             .selective = selective,
                                                             .cuda = c.cuda,
                                                             .kernels = c.kernels,
                                                             .data_parallel = c.world_size > 1,
                                                             .world_size = c.world_size,
                                                             .zero_stage = c.zero_stage,
                                                             .bucket_cap_bytes = c.ddp_bucket_cap_mb << 20});
        r.needed_bytes = r.predicted.total() + r.predicted.allocator_overhead;
        r.fits = r.needed_bytes <= c.device_memory_bytes;
        const double fraction = every > 0 ? std::ceil(layers / static_cast<double>(every)) / layers : 0.0;
        const double hardware = selective ? flops.train_selective() : flops.train_recomputing(fraction);
        if (report.peak_tflops > 0) {
          r.tokens_per_second = c.world_size * report.peak_tflops * 1e12 * c.mfu / hardware;
        } else {
          r.tokens_per_second = 1.0 / hardware;  // relative only (no peak known)
        }
        rows.push_back(r);
      }
    }
    std::stable_sort(rows.begin(), rows.end(), [](const PlanRow& a, const PlanRow& b) {
      if (a.fits != b.fits) return a.fits;
      if (a.tokens_per_second != b.tokens_per_second) return a.tokens_per_second > b.tokens_per_second;
      return a.micro_batch > b.micro_batch;
    });
    if (!rows.empty() && rows.front().fits) rows.front().recommended = true;
    report.rows.insert(report.rows.end(), rows.begin(), rows.end());
  }
  return report;
}

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
      c.model, r.num_parameters, c.dtype, gb(c.device_memory_bytes),
      c.device_name.empty() ? "" : " (" + c.device_name + ")", c.world_size, c.world_size == 1 ? "" : "s",
      c.zero_stage > 0 ? fmt::format(", ZeRO stage {}", c.zero_stage) : "",
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
                    {"dtype", c.dtype},
                    {"kernels", c.kernels},
                    {"device_memory_bytes", c.device_memory_bytes},
                    {"device_name", c.device_name},
                    {"cuda", c.cuda},
                    {"peak_tflops", r.peak_tflops > 0 ? json(r.peak_tflops) : json(nullptr)},
                    {"mfu_assumed", c.mfu},
                    {"target_tokens", c.target_tokens},
                    {"target_sequences", c.target_sequences},
                    {"world_size", c.world_size},
                    {"zero_stage", c.zero_stage},
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
