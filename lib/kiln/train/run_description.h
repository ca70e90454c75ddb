// The cost models' description of a run (cost/run.h) from kiln-pretrain's config keys: the one
// place that turns settings into what the memory model, the traffic model and the planner price.
// The trainer (its banner, auto_fit and kiln-pretrain --dry-run), every kiln-profile sweep point
// (its PretrainConfig, profile/sweep.cpp) and kiln-profile explain and plan describe their runs
// through it, so one setting means the same run in each.
#pragma once

#include <optional>
#include <string>

#include "kiln/cost/hardware.h"
#include "kiln/cost/run.h"
#include "kiln/model/llama_config.h"

namespace kiln::train {

struct PretrainConfig;

// Where the run runs.
struct RunTarget {
  bool cuda = false;
  // The GPU's row of the hardware table (kiln's flash-attention rule, cost::kiln_attention_path);
  // nullopt on the CPU or for a GPU the table lacks (then attention is priced as SDPA's).
  std::optional<cost::HardwareSpec> hardware;
  int world_size = 1;
  bool data_parallel = false;  // under a launcher's process group (dist::DataParallel), also of one rank
};

// `config`'s run of `model` on `target`: per_device_train_batch_size, cutoff_len,
// gradient_accumulation_steps; bf16/fp16; the recomputation keys (train/recomputation.h); the
// kernels spec as ops' rules run it there (train/kernel_choices.h); the ZeRO stage
// (resolved_zero_stage) and ddp_bucket_cap_mb; max_grad_norm.
cost::RunDescription describe_run(const PretrainConfig& config, const model::LlamaConfig& model,
                                  const RunTarget& target);

// Sets bf16/fp16 for a compute dtype name ("bf16", "fp16", "fp32"): the inverse of compute_dtype
// (training_stack.h), for programs whose key is `dtype`.
void set_compute_dtype(PretrainConfig& config, const std::string& dtype);

}  // namespace kiln::train
