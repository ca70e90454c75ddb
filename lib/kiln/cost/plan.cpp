#include "kiln/cost/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/config/yaml.h"
#include "kiln/cost/flops.h"
#include "kiln/cost/hardware.h"

namespace kiln::cost {

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
  const std::string& dtype = run.dtype;
  if (dtype != "bf16" && dtype != "fp16" && dtype != "fp32")
    fail("dtype", fmt::format("'{}' is not bf16, fp16 or fp32", dtype));
  if (!(device_memory_bytes > 0)) fail("device_memory", "give the device's memory (e.g. 80GB) or a device name");
  if (!(mfu > 0 && mfu <= 1)) fail("mfu", fmt::format("must be in (0, 1], got {}", mfu));
  if ((target_tokens > 0) == (target_sequences > 0)) {
    fail("target", "give exactly one of a target global batch in tokens or in sequences (> 0)");
  }
  const int world_size = run.parallel.world_size, zero_stage = run.parallel.zero_stage;
  if (world_size < 1) fail("world_size", fmt::format("must be >= 1, got {}", world_size));
  if (zero_stage < 0 || zero_stage > 2) fail("zero_stage", fmt::format("must be 0, 1 or 2, got {}", zero_stage));
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
  } else if (const auto d = hardware_spec(c.device_name)) {
    report.peak_tflops = d->peak_tflops(c.run.dtype);
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
    const int64_t target = c.target_sequences > 0 ? c.target_sequences : (c.target_tokens + t - 1) / t;
    const FlopsPerToken flops = flops_per_token(report.model, t);
    std::vector<PlanRow> rows;
    const int64_t world = c.run.parallel.world_size;
    for (int64_t b = 1; b * world <= std::max<int64_t>(target, world); b *= 2) {
      for (const auto& [name, every] : policies) {
        PlanRow r;
        r.cutoff_len = t;
        r.micro_batch = b;
        r.gradient_accumulation_steps = std::max<int64_t>((target + b * world - 1) / (b * world), 1);
        r.global_sequences = b * r.gradient_accumulation_steps * world;
        const bool selective = name == "selective";
        r.policy = name;
        r.every = every;
        RunDescription run = c.run;
        run.batch = b;
        run.cutoff_len = t;
        run.gradient_accumulation_steps = r.gradient_accumulation_steps;
        run.recompute = selective ? "selective" : every == 0 ? "none" : every == 1 ? "full" : "every_n";
        run.every = std::max(every, 1);
        r.predicted = estimate_training_memory(report.model, run);
        r.needed_bytes = r.predicted.total() + r.predicted.allocator_overhead;
        r.fits = r.needed_bytes <= c.device_memory_bytes;
        const double fraction = every > 0 ? std::ceil(layers / static_cast<double>(every)) / layers : 0.0;
        const double hardware = selective ? flops.train_selective() : flops.train_recomputing(fraction);
        if (report.peak_tflops > 0) {
          r.tokens_per_second = world * report.peak_tflops * 1e12 * c.mfu / hardware;
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

}  // namespace kiln::cost
