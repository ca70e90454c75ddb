// The kernel choices the cost models take as data (cost::KernelChoices), filled from ops' own
// rules: which ops a kernels spec runs fused, and what their dtype and CPU rules pick for a
// compute dtype on a device. The cost layer sits below ops' callers and never calls ops itself
// (docs/architecture.md, "Layers"); this is the one place that asks ops for it.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/cost/hardware.h"
#include "kiln/cost/run.h"

namespace kiln::train {

// `kernels`: an ops spec ("kiln", "aten", "rmsnorm=kiln,..."; ops/dispatch.h); `dtype`: the
// compute dtype ("bf16", "fp16" autocast, or "fp32"); `cuda`: the step runs on a GPU. Attention
// is kiln's flash kernels where the spec chooses them and `hardware` (the GPU's row) and
// `head_dim` let them run (cost::kiln_attention_path); otherwise, and on the CPU, SDPA.
cost::KernelChoices kernel_choices(const std::string& kernels, const std::string& dtype, bool cuda,
                                   const cost::HardwareSpec* hardware = nullptr, int64_t head_dim = 0);

// The spec a trainer runs: `kernels`, except that under full_determinism the default spec
// (ops::kDefaultKernels, SDPA's attention) becomes "kiln": SDPA's flash and memory-efficient
// backwards are not deterministic under PyTorch's warn-only deterministic mode, kiln's flash
// kernels have a deterministic backward. A spec the user wrote otherwise is kept as written.
std::string trainer_kernels(const std::string& kernels, bool full_determinism);

}  // namespace kiln::train
