// The CPU rules forced to another CPU's branch (ops/cpu_branches.h). Reference: what each rule is
// documented to pick on that kind of CPU (ops/linear.h, ops/linear_cross_entropy.h,
// kernels/cpu_loops.h), checked on whatever CPU runs the test.
#include <cstdlib>

#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/cpu_branches.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"

namespace ops = kiln::ops;

TEST_CASE("each CPU's branch can be forced on any CPU, and the rules follow it", "[linear][linear_ce]") {
  const std::vector<ops::testing::CpuBranches> all = ops::testing::cpu_branches();
  REQUIRE(all.size() >= 4);
  CHECK(all[0].native_low_precision_gemm == -1);
  CHECK(all[0].cross_entropy_loop == -1);
  CHECK(all[0].isa_level == 0);
  const int own_level = kiln::kernels::cpu::isa_level();
  for (const auto& b : all) {
    CAPTURE(b.name);
    const ops::testing::ForcedCpuBranches forced(b);
    INFO(ops::testing::describe_cpu_rules());
    for (const at::ScalarType low : {at::kBFloat16, at::kHalf}) {
      CAPTURE(low);
      if (b.native_low_precision_gemm == 1) {  // an AMX / Zen 4-5 machine
        CHECK(ops::cpu_native_low_precision_gemm(low));
        CHECK_FALSE(ops::cpu_linear_uses_fp32_gemm(low));
        CHECK(ops::linear_cross_entropy_matmul_dtype(low, /*cpu=*/true) == low);
      } else if (b.native_low_precision_gemm == 0) {  // an AVX2 machine
        CHECK_FALSE(ops::cpu_native_low_precision_gemm(low));
        CHECK(ops::cpu_linear_uses_fp32_gemm(low));
        CHECK(ops::linear_cross_entropy_matmul_dtype(low, /*cpu=*/true) == at::kFloat);
      }
      CHECK(ops::linear_cross_entropy_matmul_dtype(low, /*cpu=*/false) == low);  // a GPU is never forced
    }
    CHECK(ops::cpu_cross_entropy_uses_loop(at::kBFloat16) == (b.cross_entropy_loop != 0));
    CHECK(kiln::kernels::cpu::isa_level() == (b.isa_level > 0 ? b.isa_level : own_level));
  }
  // Back to this CPU's own rules.
  CHECK(kiln::kernels::cpu::isa_level() == own_level);
  if (std::getenv("KILN_CPU_CE_LOOP") == nullptr) CHECK(ops::cpu_cross_entropy_uses_loop(at::kBFloat16));
}
