// ops::rmsnorm against the formula y = w * x / sqrt(mean(x^2) + eps) evaluated in fp64, and the
// CUDA kernel against the same fp64 reference with the low-precision rule of design.md: a kernel
// result in bf16/fp16 may be off by at most twice what the ATen computation in that dtype is.
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/ops/dispatch.h"
#include "kiln/ops/rmsnorm.h"
#include "support.h"

using kiln::test::max_abs_diff;

namespace {
at::Tensor formula(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xd = x.to(at::kDouble).cpu();
  return w.to(at::kDouble).cpu() * xd / at::sqrt(xd.pow(2).mean(-1, true) + eps);
}
}  // namespace

TEST_CASE("rmsnorm matches the fp64 formula", "[ops][rmsnorm]") {
  for (int64_t h : {1, 7, 1000}) {
    const at::Tensor x = at::randn({3, 5, h}), w = at::randn({h});
    CAPTURE(h);
    CHECK(max_abs_diff(kiln::ops::rmsnorm(x, w, 1e-5), formula(x, w, 1e-5)) < 1e-5);
  }
  // bf16: normalised in fp32, rounded once to bf16, then scaled in bf16 (two roundings).
  const at::Tensor x = at::randn({4, 256}).to(at::kBFloat16), w = at::rand({256}).to(at::kBFloat16) + 0.5;
  const at::Tensor y = kiln::ops::rmsnorm(x, w, 1e-6);
  CHECK(y.scalar_type() == at::kBFloat16);
  const at::Tensor ref = formula(x, w, 1e-6);
  CHECK(((y.to(at::kDouble) - ref).abs() <= ref.abs() * (2.02 / 256) + 1e-6).all().item<bool>());
}

TEST_CASE("rmsnorm rejects a weight of the wrong size", "[ops][rmsnorm]") {
  CHECK_THAT(kiln::test::error_of([] {
               kiln::ops::rmsnorm(at::randn({2, 8}), at::ones({7}), 1e-6);
             }),
             Catch::Matchers::Contains("last dimension"));
}

TEST_CASE("rmsnorm CUDA kernel matches the reference", "[ops][rmsnorm][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::NoGradGuard no_grad;  // the kernel serves the forward-only path
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t h : {7, 1000, 2048, 4099}) {
      const at::Tensor x32 = at::randn({37, h}), w32 = at::rand({h}) + 0.5;
      const at::Tensor x = x32.to(dtype).cuda(), w = w32.to(dtype).cuda();
      const at::Tensor ref = formula(x, w, 1e-5);
      kiln::ops::set_backend(kiln::ops::Backend::kAten);
      const at::Tensor aten = kiln::ops::rmsnorm(x, w, 1e-5);
      kiln::ops::set_backend(kiln::ops::Backend::kKiln);
      const at::Tensor kernel = kiln::ops::rmsnorm(x, w, 1e-5);
      CAPTURE(dtype, h);
      if (dtype == at::kFloat) {
        CHECK(max_abs_diff(kernel, ref) < 1e-5);
      } else {
        CHECK(max_abs_diff(kernel, ref) <= 2 * max_abs_diff(aten, ref) + 1e-6);
      }
      // A strided (non-contiguous rows) input takes the same kernel.
      const at::Tensor wide = at::randn({37, 2 * h}).to(dtype).cuda().narrow(1, 0, h);
      CHECK(max_abs_diff(kiln::ops::rmsnorm(wide, w, 1e-5), formula(wide, w, 1e-5)) <=
            (dtype == at::kFloat
                 ? 1e-5
                 : 2 * max_abs_diff(kiln::ops::rmsnorm_reference(wide, w, 1e-5), formula(wide, w, 1e-5)) + 1e-6));
    }
  }
}
