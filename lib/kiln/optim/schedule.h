// Learning-rate schedules with Hugging Face's definitions (transformers.optimization), so a run
// moved from HF Trainer keeps its curve. All are multipliers of the peak learning rate as a
// function of the optimizer step about to be taken (0-based; with warmup, step 0 uses 0).
#pragma once

#include <cstdint>
#include <string>

namespace kiln::optim {

struct ScheduleConfig {
  std::string type = "linear";  // cosine, linear, constant, constant_with_warmup, warmup_stable_decay
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;  // cosine and warmup_stable_decay end here instead of at 0
  double decay_ratio = 0.1;   // warmup_stable_decay: the last decay_ratio of all steps decay
};

// The multiplier for `step` in [0, total_steps]; throws std::invalid_argument for an unknown type.
double lr_multiplier(const ScheduleConfig& config, int64_t step);

// HF's rule: warmup_steps if > 0, else ceil(warmup_ratio * total_steps).
int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace kiln::optim
