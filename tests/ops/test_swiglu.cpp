// ops::swiglu (hand-written backward) against autograd through at::silu(gate) * up (fp32) and
// against finite differences (fp64); the CUDA kernels against the fp32 reference with
// the low-precision rule (docs/architecture.md, design rule 4).
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/ops/dispatch.h"
#include "kiln/ops/swiglu.h"
#include "ops/gradcheck.h"
#include "support.h"

using kiln::test::max_abs_diff;

namespace {
struct Grads {
  at::Tensor y, dg, du;
};
Grads run(const at::Tensor& g, const at::Tensor& u, const at::Tensor& dy, bool reference) {
  const at::Tensor gr = g.detach().clone().requires_grad_(true), ur = u.detach().clone().requires_grad_(true);
  const at::Tensor y = reference ? kiln::ops::swiglu_reference(gr, ur) : kiln::ops::swiglu(gr, ur);
  y.backward(dy);
  return {y.detach(), gr.grad(), ur.grad()};
}
}  // namespace

TEST_CASE("swiglu's fused backward matches autograd on silu(gate) * up", "[ops][swiglu]") {
  at::manual_seed(21);
  for (int64_t n : {1, 7, 1000}) {
    const at::Tensor g = at::randn({7, n}) * 3, u = at::randn({7, n}), dy = at::randn({7, n});
    const Grads got = run(g, u, dy, false), want = run(g, u, dy, true);
    CAPTURE(n);
    // fp32 CPU: the fused loop's own exp (kernels/cpu_loops.h) against ATen's: within fp32 rounding.
    CHECK(max_abs_diff(got.y, want.y) <= 4e-7 * want.y.abs().max().item<double>());
    CHECK(max_abs_diff(got.dg, want.dg) < 1e-5);
    CHECK(max_abs_diff(got.du, want.du) < 1e-5);
  }
  const at::Tensor dy = at::randn({3, 4});
  CHECK(kiln::test::gradcheck_max_error(
            [&](const std::vector<at::Tensor>& in) { return (kiln::ops::swiglu(in[0], in[1]) * dy).sum(); },
            {at::randn({3, 4}) * 2, at::randn({3, 4})}) < 1e-7);
  CHECK_THAT(kiln::test::error_of([] {
               kiln::ops::swiglu(at::randn({2, 3}), at::randn({2, 4}));
             }),
             Catch::Matchers::Contains("one shape"));
}

TEST_CASE("swiglu on bf16 CPU tensors is fp64's result rounded once to bf16", "[ops][swiglu]") {
  // The bf16 loop widens each element, computes in fp32 and rounds once: against fp64 on the same
  // bf16 inputs every output is within one bf16 ulp (2^-8 relative, plus the fp32 exp's few ulp).
  at::manual_seed(22);
  for (int64_t n : {1, 17, 5000}) {
    const at::Tensor g = (at::randn({3, n}) * 4).to(at::kBFloat16), u = at::randn({3, n}).to(at::kBFloat16);
    const at::Tensor dy = at::randn({3, n}).to(at::kBFloat16);
    const Grads got = run(g, u, dy, false);
    REQUIRE(got.y.scalar_type() == at::kBFloat16);
    REQUIRE(got.dg.scalar_type() == at::kBFloat16);
    const at::Tensor g64 = g.to(at::kDouble), u64 = u.to(at::kDouble), d64 = dy.to(at::kDouble);
    const at::Tensor s = at::sigmoid(g64);
    const at::Tensor want_y = g64 * s * u64, want_dg = d64 * u64 * s * (1 + g64 * (1 - s)), want_du = d64 * g64 * s;
    auto within_one_ulp = [](const at::Tensor& got_t, const at::Tensor& want) {
      return ((got_t.to(at::kDouble) - want).abs() <= want.abs() * (1.0 / 256) + 1e-30).all().item<bool>();
    };
    CAPTURE(n);
    CHECK(within_one_ulp(got.y, want_y));
    CHECK(within_one_ulp(got.dg, want_dg));
    CHECK(within_one_ulp(got.du, want_du));
    // ATen's bf16 composition rounds twice (silu, then the product); it is no nearer to fp64.
    const Grads ref = run(g, u, dy, true);
    CHECK((got.y.to(at::kDouble) - want_y).abs().sum().item<double>() <=
          (ref.y.to(at::kDouble) - want_y).abs().sum().item<double>() * 1.01);
  }
}

TEST_CASE("swiglu CUDA kernels match the reference, forward and backward", "[ops][swiglu][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(22);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t n : {7, 1000, 8192, 11008}) {
      const at::Tensor g32 = at::randn({13, n}) * 3, u32 = at::randn({13, n}), dy32 = at::randn({13, n});
      auto dev = [&](const at::Tensor& t) { return t.to(dtype).cuda(); };
      const Grads ref = run(g32.cuda(), u32.cuda(), dy32.cuda(), true);
      const Grads aten = run(dev(g32), dev(u32), dev(dy32), true);
      const Grads kern = run(dev(g32), dev(u32), dev(dy32), false);
      CAPTURE(dtype, n);
      auto within = [&](const at::Tensor& k, const at::Tensor& a, const at::Tensor& r) {
        return dtype == at::kFloat ? max_abs_diff(k, r) < 1e-5 : max_abs_diff(k, r) <= 2 * max_abs_diff(a, r) + 1e-6;
      };
      CHECK(within(kern.y, aten.y, ref.y));
      CHECK(within(kern.dg, aten.dg, ref.dg));
      CHECK(within(kern.du, aten.du, ref.du));
    }
  }
}
