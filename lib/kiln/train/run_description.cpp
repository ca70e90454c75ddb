#include "kiln/train/run_description.h"

#include <stdexcept>

#include "kiln/train/kernel_choices.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/recomputation.h"
#include "kiln/train/training_stack.h"

namespace kiln::train {

cost::RunDescription describe_run(const PretrainConfig& c, const model::LlamaConfig& model, const RunTarget& target) {
  cost::RunDescription r;
  r.batch = c.per_device_train_batch_size;
  r.cutoff_len = c.cutoff_len;
  r.gradient_accumulation_steps = c.gradient_accumulation_steps;
  r.dtype = compute_dtype(c);
  const Recomputation recompute =
      resolve_recomputation(c.gradient_checkpointing, c.gradient_checkpointing_policy, c.gradient_checkpointing_every);
  r.recompute = recompute.policy;
  r.every = std::max(recompute.every, 1);
  r.kernels = kernel_choices(c.kernels, r.dtype, target.cuda, target.hardware ? &*target.hardware : nullptr,
                             model.resolved_head_dim());
  r.cuda = target.cuda;
  r.parallel.data_parallel = target.data_parallel;
  r.parallel.world_size = target.world_size;
  r.parallel.zero_stage = c.resolved_zero_stage();
  r.parallel.bucket_cap_bytes = c.ddp_bucket_cap_mb << 20;
  r.clip_grad_norm = c.max_grad_norm > 0;
  return r;
}

void set_compute_dtype(PretrainConfig& c, const std::string& dtype) {
  if (dtype != "bf16" && dtype != "fp16" && dtype != "fp32") {
    throw std::invalid_argument("compute dtype '" + dtype + "' is not bf16, fp16 or fp32");
  }
  c.bf16 = dtype == "bf16";
  c.fp16 = dtype == "fp16";
}

}  // namespace kiln::train
