#include "kiln/cost/run.h"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace kiln::cost {

int compute_dtype_bytes(std::string_view dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  throw std::invalid_argument("compute dtype '" + std::string(dtype) + "' is not fp32, bf16 or fp16");
}

int RunDescription::recomputed_stride() const {
  if (recompute == "full") return 1;
  if (recompute == "every_n") return every;
  return 0;
}

void RunDescription::validate() const {
  auto fail = [](const std::string& what) { throw std::invalid_argument("run description: " + what); };
  if (batch < 1) fail(fmt::format("batch must be >= 1, got {}", batch));
  if (cutoff_len < 1) fail(fmt::format("cutoff_len must be >= 1, got {}", cutoff_len));
  if (gradient_accumulation_steps < 1)
    fail(fmt::format("gradient_accumulation_steps must be >= 1, got {}", gradient_accumulation_steps));
  if (dtype != "bf16" && dtype != "fp16" && dtype != "fp32") fail("dtype '" + dtype + "' is not bf16, fp16 or fp32");
  const std::string& attention = kernels.attention;
  if (attention != "flash" && attention != "sdpa" && attention != "math")
    fail("attention '" + attention + "' is not flash, sdpa or math");
  // kiln's kernels take the autocast dtype only (kiln_attention_path).
  if (attention == "flash" && dtype == "fp32") fail("attention 'flash' needs bf16 or fp16 (kiln's kernels)");
  if (recompute != "none" && recompute != "full" && recompute != "every_n" && recompute != "selective")
    fail("recompute '" + recompute + "' is not none, full, every_n or selective");
  if (every < 1) fail(fmt::format("every must be >= 1, got {}", every));
  if (parallel.world_size < 1) fail(fmt::format("world_size must be >= 1, got {}", parallel.world_size));
  if (parallel.zero_stage < 0 || parallel.zero_stage > 2)
    fail(fmt::format("zero_stage must be 0, 1 or 2, got {}", parallel.zero_stage));
  if (kernels.fused_loss_head && !kernels.loss_chunk_tokens)
    fail("a fused loss head needs KernelChoices::loss_chunk_tokens");
}

}  // namespace kiln::cost
