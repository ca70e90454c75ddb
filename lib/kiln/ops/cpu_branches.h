// The CPU-dependent choices inside kiln's CPU ops, as one set that a test can force to what
// another CPU would pick (docs/kernels.md, "CPU rules and the machines that take them").
//
// Three rules pick a path by the CPU's features, never by a timing:
//   - ops::cpu_native_low_precision_gemm (ops/linear.h): the native bf16/fp16 GEMM on AMX and on
//     AMD CPUs with AVX512-BF16, fp32 GEMMs elsewhere; ops::linear and the loss head's matmul dtype
//     (ops/linear_cross_entropy.h) follow it;
//   - ops::cpu_cross_entropy_uses_loop: the loss head's fused row loops or ATen's ops per chunk;
//   - kernels::cpu::isa_level: the loops' instruction set (x86-64-v4, v3 or the baseline).
// A machine runs only its own branch unless told otherwise, so an AVX2 developer machine never
// ran the AMX branch and an AMX CI machine never the AVX2 one. The default test suite runs the
// training step under every entry of cpu_branches() on every machine (tests/train/
// test_training_step.cpp).
#pragma once

#include <string>
#include <vector>

namespace kiln::ops::testing {

struct CpuBranches {
  std::string name;                    // as the tests print it
  int native_low_precision_gemm = -1;  // -1 this CPU's rule; 0 fp32 GEMMs (AVX2); 1 native (AMX)
  int cross_entropy_loop = -1;         // -1 the rule; 0 ATen's ops per chunk; 1 the fused loops
  int isa_level = 0;                   // 0 this CPU's; 4, 3 or 1 (never above this CPU's own)
};

// This CPU's own choices first, then the branches of the other kinds of CPU: native GEMMs (an AMX
// or Zen 4/5 machine), fp32 GEMMs (AVX2, AVX-512 without AMX), ATen's loss-head ops, and the
// loops at x86-64-v3 and at the baseline (on this CPU, those at or below its own level).
std::vector<CpuBranches> cpu_branches();

// Forces `b` for the whole process while it lives (the rules are process-wide, as the CPU is);
// back to this CPU's own rules when destroyed. Not nested, not for two tests at once.
class ForcedCpuBranches {
 public:
  explicit ForcedCpuBranches(const CpuBranches& b);
  ~ForcedCpuBranches();
  ForcedCpuBranches(const ForcedCpuBranches&) = delete;
  ForcedCpuBranches& operator=(const ForcedCpuBranches&) = delete;
};

// What the rules pick now for bf16 (with any branch forced), e.g. "GEMM bf16, loss head bf16,
// fused loops at x86-64-v3": the test names the branch that actually ran.
std::string describe_cpu_rules();

}  // namespace kiln::ops::testing
