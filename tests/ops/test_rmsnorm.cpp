// ops::rmsnorm against the formula y = w * x / sqrt(mean(x^2) + eps) evaluated in fp64; its
// hand-written backward (and add_rmsnorm's) against autograd through the ATen composition (fp32)
// and against finite differences (fp64); the CUDA kernels against the fp64/fp32 references with
// the low-precision rule (docs/architecture.md, design rule 4): a kernel result in bf16/fp16 may be off by at most
// twice what the ATen computation in that dtype is.
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/ops/dispatch.h"
#include "kiln/ops/rmsnorm.h"
#include "ops/gradcheck.h"
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

namespace {
// y, dx, dweight (and d_residual for add_rmsnorm) of one path, for upstream gradient gy (+ gh).
struct Grads {
  at::Tensor y, dx, dw, dres;
};
Grads run_rmsnorm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& gy, bool reference) {
  const at::Tensor xr = x.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
  const at::Tensor y = reference ? kiln::ops::rmsnorm_reference(xr, wr, 1e-5) : kiln::ops::rmsnorm(xr, wr, 1e-5);
  y.backward(gy);
  return {y.detach(), xr.grad(), wr.grad(), {}};
}
Grads run_add_rmsnorm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& w, const at::Tensor& gy,
                      const at::Tensor& gh, bool reference) {
  const at::Tensor xr = x.detach().clone().requires_grad_(true), rr = r.detach().clone().requires_grad_(true);
  const at::Tensor wr = w.detach().clone().requires_grad_(true);
  at::Tensor y, h;
  if (reference) {
    h = xr + rr;
    y = kiln::ops::rmsnorm_reference(h, wr, 1e-5);
  } else {
    std::tie(y, h) = kiln::ops::add_rmsnorm(xr, rr, wr, 1e-5);
  }
  torch::autograd::backward({y, h}, {gy, gh});
  return {y.detach(), xr.grad(), wr.grad(), rr.grad()};
}
}  // namespace

TEST_CASE("rmsnorm's fused backward matches autograd on the ATen composition", "[ops][rmsnorm]") {
  at::manual_seed(11);
  for (int64_t h : {1, 7, 1000}) {
    const at::Tensor x = at::randn({7, h}), w = at::randn({h}), gy = at::randn({7, h});
    const Grads got = run_rmsnorm(x, w, gy, false), want = run_rmsnorm(x, w, gy, true);
    CAPTURE(h);
    CHECK(max_abs_diff(got.y, want.y) < 1e-6);
    CHECK(max_abs_diff(got.dx, want.dx) < 1e-5);
    CHECK(max_abs_diff(got.dw, want.dw) < 1e-4);
    const at::Tensor r = at::randn({7, h}), gh = at::randn({7, h});
    const Grads got2 = run_add_rmsnorm(x, r, w, gy, gh, false), want2 = run_add_rmsnorm(x, r, w, gy, gh, true);
    CHECK(max_abs_diff(got2.y, want2.y) < 1e-6);
    CHECK(max_abs_diff(got2.dx, want2.dx) < 1e-5);
    CHECK(max_abs_diff(got2.dres, want2.dres) < 1e-5);
    CHECK(max_abs_diff(got2.dw, want2.dw) < 1e-4);
  }
}

TEST_CASE("rmsnorm and add_rmsnorm pass an fp64 finite-difference check", "[ops][rmsnorm]") {
  at::manual_seed(12);
  const at::Tensor x = at::randn({3, 5}), r = at::randn({3, 5}), w = at::randn({5}), gy = at::randn({3, 5});
  CHECK(kiln::test::gradcheck_max_error(
            [&](const std::vector<at::Tensor>& in) { return (kiln::ops::rmsnorm(in[0], in[1], 1e-5) * gy).sum(); },
            {x, w}) < 1e-7);
  CHECK(kiln::test::gradcheck_max_error(
            [&](const std::vector<at::Tensor>& in) {
              auto [y, h] = kiln::ops::add_rmsnorm(in[0], in[1], in[2], 1e-5);
              return (y * gy).sum() + (h * h).sum() * 0.3;
            },
            {x, r, w}) < 1e-7);
}

TEST_CASE("rmsnorm CUDA kernels match the reference, forward and backward", "[ops][rmsnorm][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(13);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t h : {7, 1000, 2048, 4099}) {
      const at::Tensor x32 = at::randn({37, h}), w32 = at::rand({h}) + 0.5, gy32 = at::randn({37, h});
      const at::Tensor r32 = at::randn({37, h}), gh32 = at::randn({37, h});
      auto dev = [&](const at::Tensor& t) { return t.to(dtype).cuda(); };
      // fp32 reference on the device, then the same-dtype ATen path, then the kernels.
      const Grads ref = run_rmsnorm(x32.cuda(), w32.cuda(), gy32.cuda(), true);
      const Grads aten = run_rmsnorm(dev(x32), dev(w32), dev(gy32), true);
      const Grads kern = run_rmsnorm(dev(x32), dev(w32), dev(gy32), false);
      const Grads ref2 = run_add_rmsnorm(x32.cuda(), r32.cuda(), w32.cuda(), gy32.cuda(), gh32.cuda(), true);
      const Grads aten2 = run_add_rmsnorm(dev(x32), dev(r32), dev(w32), dev(gy32), dev(gh32), true);
      const Grads kern2 = run_add_rmsnorm(dev(x32), dev(r32), dev(w32), dev(gy32), dev(gh32), false);
      CAPTURE(dtype, h);
      auto within = [&](const at::Tensor& k, const at::Tensor& a, const at::Tensor& r, double fp32_tol) {
        return dtype == at::kFloat ? max_abs_diff(k, r) < fp32_tol
                                   : max_abs_diff(k, r) <= 2 * max_abs_diff(a, r) + 1e-6;
      };
      CHECK(within(kern.y, aten.y, ref.y, 1e-5));
      CHECK(within(kern.dx, aten.dx, ref.dx, 1e-4));
      CHECK(within(kern.dw, aten.dw, ref.dw, 1e-3));
      CHECK(within(kern2.y, aten2.y, ref2.y, 1e-5));
      CHECK(within(kern2.dx, aten2.dx, ref2.dx, 1e-4));
      CHECK(within(kern2.dres, aten2.dres, ref2.dres, 1e-4));
      CHECK(within(kern2.dw, aten2.dw, ref2.dw, 1e-3));
      // A strided (non-contiguous rows) input takes the kernel too.
      const at::Tensor wide = at::randn({37, 2 * h}).to(dtype).cuda().narrow(1, 0, h);
      const at::NoGradGuard no_grad;
      CHECK(within(kiln::ops::rmsnorm(wide, dev(w32), 1e-5), kiln::ops::rmsnorm_reference(wide, dev(w32), 1e-5),
                   formula(wide, dev(w32), 1e-5), 1e-5));
    }
  }
}
