// The kernel choices the cost models take as data (cost::KernelChoices), filled from ops' own
// rules: which ops a kernels spec runs fused, and what their dtype and CPU rules pick for a
// compute dtype on a device. The cost layer sits below ops' callers and never calls ops itself
// (docs/architecture.md, "Layers"); this is the one place that asks ops for it.
#pragma once

#include <string>

#include "kiln/cost/memory.h"

namespace kiln::train {

// `kernels`: an ops spec ("kiln", "aten", "rmsnorm=kiln,..."; ops/dispatch.h); `compute_bytes`
// 2 (bf16/fp16 autocast) or 4 (fp32); `cuda`: the step runs on a GPU.
cost::KernelChoices kernel_choices(const std::string& kernels, int compute_bytes, bool cuda);

// The spec a trainer runs: `kernels`, except that under full_determinism the default spec
// (ops::kDefaultKernels, SDPA's attention) becomes "kiln": SDPA's flash and memory-efficient
// backwards are not deterministic under PyTorch's warn-only deterministic mode, kiln's flash
// kernels have a deterministic backward. A spec the user wrote otherwise is kept as written.
std::string trainer_kernels(const std::string& kernels, bool full_determinism);

}  // namespace kiln::train
