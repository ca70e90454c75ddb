#include "kiln/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kiln::optim {

int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps > 0) return warmup_steps;
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
}

double lr_multiplier(const ScheduleConfig& c, int64_t step) {
  const double s = static_cast<double>(step), warmup = static_cast<double>(c.warmup_steps),
               total = static_cast<double>(c.total_steps);
  const bool warming = step < c.warmup_steps;
  const double warm = s / std::max(1.0, warmup);
  if (c.type == "constant") return 1.0;
  if (c.type == "constant_with_warmup") return warming ? warm : 1.0;
  if (c.type == "linear") return warming ? warm : std::max(0.0, (total - s) / std::max(1.0, total - warmup));
  if (c.type == "cosine") {
    // get_cosine_with_min_lr_schedule_with_warmup (half a cosine wave), floor at min_lr_ratio.
    if (warming) return warm;
    const double progress = (s - warmup) / std::max(1.0, total - warmup);
    const double cosine = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    return cosine * (1.0 - c.min_lr_ratio) + c.min_lr_ratio;
  }
  if (c.type == "warmup_stable_decay") {
    // get_wsd_schedule: warmup, hold at 1, then cosine decay to min_lr_ratio over the last steps.
    if (warming) return warm;
    const double decay = std::round(c.decay_ratio * total);
    const double stable = std::max(0.0, total - warmup - decay);
    if (s < warmup + stable) return 1.0;
    if (s < warmup + stable + decay) {
      const double progress = (s - warmup - stable) / std::max(1.0, decay);
      const double value = 0.5 * (1.0 + std::cos(M_PI * progress));
      return (1.0 - c.min_lr_ratio) * value + c.min_lr_ratio;
    }
    return c.min_lr_ratio;
  }
  throw std::invalid_argument("unknown lr_scheduler_type '" + c.type + "'");
}

}  // namespace kiln::optim
