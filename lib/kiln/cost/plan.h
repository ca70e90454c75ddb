// The memory planner (kiln-profile plan, kiln-pretrain --auto-fit; docs/performance.md):
// before anything runs, which micro-batch, gradient accumulation and recomputation policy fit a
// device's memory at each cutoff_len, ranked by predicted speed. Everything comes from the
// analytic models (memory.h, flops.h) and the model's config: no weights are allocated.
//
// Candidates per cutoff_len: micro-batches 1, 2, 4, ... up to the target global batch, times the
// policies none, selective, every_n (n = 4, 2, where n < layers) and full. A candidate fits when its predicted
// peak (plus the CUDA caching allocator's allowance on a GPU) is at most the device's memory.
// Predicted tokens/s = world x peak TFLOP/s x the assumed MFU / hardware FLOPs per token
// (recomputation included), so a policy that recomputes less is faster; among equals the larger
// micro-batch ranks first (fewer, fuller steps). The first fitting candidate is recommended.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/cost/memory.h"
#include "kiln/cost/run.h"
#include "kiln/model/llama_config.h"

namespace kiln::cost {

// "80GB", "80 GB", "16GiB", "512MB", "1e9" (bytes) -> bytes; throws std::invalid_argument naming `what`.
double parse_bytes(const std::string& text, const std::string& what);

struct PlanConfig {
  std::string source = "command line";
  std::string model = "tiny";                      // preset or model YAML
  std::optional<model::LlamaConfig> model_config;  // instead of `model` (e.g. an HF directory's config.json)
  std::vector<int64_t> cutoff_lens{1024};
  std::string kernels = "kiln,attention=aten";  // the ops spec, as shown (ops::kDefaultKernels; cost/ includes no ops/)
  // The run being planned: its dtype, kernels (what `kernels` runs), device and parallelism, as
  // train::describe_run gives them; the planner varies its micro-batch, accumulation and
  // recomputation and takes the rest as it is.
  RunDescription run;
  double device_memory_bytes = 0;  // > 0
  std::string device_name;         // for the peak TFLOP/s (a cost/hardware.h name), or empty
  double peak_tflops = 0;          // > 0 overrides the device's
  double mfu = 0.4;                // assumed model FLOPs utilisation, (0, 1]
  int64_t target_tokens = 0;       // global batch in tokens per optimizer step, or
  int64_t target_sequences = 0;    // in sequences (one of the two, > 0)

  void validate() const;  // throws config::ConfigError naming the key
};

struct PlanRow {
  int64_t cutoff_len = 0, micro_batch = 0, gradient_accumulation_steps = 0;
  int64_t global_sequences = 0;  // micro_batch x gradient_accumulation_steps x world
  std::string policy;            // none | selective | every_4 | every_2 | full
  int every = 0;                 // 0 = no whole layer recomputed (none, selective)
  MemoryEstimate predicted;
  double needed_bytes = 0;  // predicted peak + allocator allowance
  bool fits = false;
  double tokens_per_second = 0;  // predicted, the whole job
  bool recommended = false;
};

struct PlanReport {
  PlanConfig config;
  model::LlamaConfig model;
  int64_t num_parameters = 0;
  double peak_tflops = 0;
  std::string peak_source;    // the device table, --peak-tflops
  std::vector<PlanRow> rows;  // per cutoff_len: fitting ones ranked first, then the others
  const PlanRow* recommended(int64_t cutoff_len) const;
};

PlanReport make_plan(const PlanConfig& config);

}  // namespace kiln::cost
