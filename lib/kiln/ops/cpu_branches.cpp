#include "kiln/ops/cpu_branches.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"

namespace kiln::ops::testing {

namespace {

const char* level_name(int level) {
  return level >= 4 ? "x86-64-v4" : level == 3 ? "x86-64-v3" : "the x86-64 baseline";
}

void apply(const CpuBranches& b) {
  // ops::linear and the loss head follow the GEMM rule; forced with it, so that an environment
  // override (KILN_CPU_HEAD_FP32 ...) cannot keep one of them on this CPU's branch.
  const int gemm = b.native_low_precision_gemm;
  force_cpu_native_low_precision_gemm(gemm);
  force_cpu_linear_fp32(gemm < 0 ? -1 : 1 - gemm);
  force_cpu_head_fp32(gemm < 0 ? -1 : 1 - gemm);
  force_cpu_cross_entropy_aten(b.cross_entropy_loop == 0);
  kernels::cpu::testing::force_isa_level(b.isa_level);
}

}  // namespace

std::vector<CpuBranches> cpu_branches() {
  std::vector<CpuBranches> out;
  out.push_back({.name = "this CPU's own rules"});
  out.push_back({.name = "native bf16/fp16 GEMMs (AMX, Zen 4/5)", .native_low_precision_gemm = 1});
  out.push_back({.name = "fp32 GEMMs (AVX2, AVX-512 without AMX)", .native_low_precision_gemm = 0});
  out.push_back({.name = "ATen's loss-head ops per chunk", .cross_entropy_loop = 0});
  // The loops' levels below this CPU's own (a level above it cannot run here).
  kernels::cpu::testing::force_isa_level(0);
  const int own = kernels::cpu::isa_level();
  for (const int level : {3, 1}) {
    if (level < own) out.push_back({.name = fmt::format("fused loops at {}", level_name(level)), .isa_level = level});
  }
  return out;
}

ForcedCpuBranches::ForcedCpuBranches(const CpuBranches& b) {
  apply(b);
}

ForcedCpuBranches::~ForcedCpuBranches() {
  apply(CpuBranches{});
}

std::string describe_cpu_rules() {
  const at::ScalarType head = linear_cross_entropy_matmul_dtype(at::kBFloat16, /*cpu=*/true);
  return fmt::format("bf16 linears in {}, loss head in {}, {}, loops at {}",
                     cpu_linear_uses_fp32_gemm(at::kBFloat16) ? "fp32 GEMMs" : "native bf16 GEMMs",
                     head == at::kFloat ? "fp32" : "bf16",
                     cpu_cross_entropy_uses_loop(at::kBFloat16) ? "fused row loops" : "ATen's ops",
                     level_name(kernels::cpu::isa_level()));
}

}  // namespace kiln::ops::testing
