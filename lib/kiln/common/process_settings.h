// Process-wide settings for a training program. A library linked into someone's service must not
// change their process on its own, so lib/ never calls these; kiln's programs (kiln-pretrain,
// kiln-profile, kiln-bench) call them first thing, and a host may (kiln/kiln.h exports them).
// Each is documented in docs/training.md ("Process settings") and is a no-op where the user
// already chose (their environment variables win).
#pragma once

#include <string>

#include "kiln/common/malloc_tuning.h"
#include "kiln/export.h"

namespace kiln {

// Exact resume on the CPU needs the math libraries to split work the same way in every process:
// pins ATen's intra-op thread count at its current value through the public at::set_num_threads
// (which also turns MKL's dynamic thread adjustment off), or at `threads` when > 0 (a rank of a
// job: its share of the host's CPUs, dist::rank_cpu_threads). Skipped when the user set
// MKL_DYNAMIC. Returns what it did, for a host's log (empty when nothing).
KILN_API std::string pin_cpu_math_threads(int threads = 0);

// full_determinism on CUDA: cuBLAS is deterministic only with a fixed workspace, which must be
// in the environment before cuBLAS's first handle (CUBLAS_WORKSPACE_CONFIG=:4096:8, as HF's
// enable_full_determinism sets). Skipped when the user set it. Returns what it did.
KILN_API std::string set_cublas_deterministic_workspace();

}  // namespace kiln
