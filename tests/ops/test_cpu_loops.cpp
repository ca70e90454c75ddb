// The fused fp32 CPU loops (kernels/cpu_loops.h): their exp against the fp64 one, and every ISA
// level this CPU can run (AVX-512, AVX2, baseline; forced in turn) bitwise against the baseline,
// so that every machine of the project's kind computes the same bits. The ops' results against
// their ATen references are in test_rmsnorm.cpp and test_swiglu.cpp.
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "kiln/kernels/cpu_loops.h"

namespace cpu = kiln::kernels::cpu;

namespace {
const float* p(const at::Tensor& t) {
  return t.const_data_ptr<float>();
}
float* m(at::Tensor& t) {
  return t.mutable_data_ptr<float>();
}
}  // namespace

TEST_CASE("the CPU loops' exp is within 2 ulp of exp on [-87, 88]", "[ops][cpu_loops]") {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst = std::max(worst, std::abs(static_cast<double>(cpu::exp_approx(x)) - want) / ulp);
  }
  CAPTURE(worst);
  CHECK(worst <= 2.0);
  CHECK(cpu::exp_approx(0.0f) == 1.0f);
  CHECK(cpu::exp_approx(-100.0f) == 0.0f);
  CHECK(std::isfinite(cpu::exp_approx(100.0f)));
}

namespace {

// Every loop on fixed inputs at the current ISA level: all outputs, in order.
std::vector<at::Tensor> run_loops() {
  at::manual_seed(31);
  std::vector<at::Tensor> out;
  for (int64_t cols : {1, 15, 16, 17, 128, 1000}) {
    const int64_t rows = 9;
    const at::Tensor x = at::randn({rows, cols}), r = at::randn({rows, cols}), w = at::rand({cols}) + 0.5;
    const at::Tensor dy = at::randn({rows, cols}), dh = at::randn({rows, cols});
    for (bool residual : {false, true}) {
      at::Tensor y = at::empty_like(x), h = at::empty_like(x), s = at::empty({rows});
      cpu::rmsnorm_forward(p(x), residual ? p(r) : nullptr, p(w), m(y), m(h), m(s), rows, cols, 1e-5f);
      const at::Tensor hin = residual ? h : x;
      at::Tensor dx = at::empty_like(x), dw = at::zeros({cols});
      cpu::rmsnorm_backward(p(hin), p(w), p(s), p(dy), residual ? p(dh) : nullptr, m(dx), m(dw), rows, cols);
      out.insert(out.end(), {y, s, dx, dw});
      if (residual) out.push_back(h);
    }
  }
  // SwiGLU over a range that reaches both tails of the sigmoid.
  const int64_t n = 4099;
  const at::Tensor g = at::randn({n}) * 20, u = at::randn({n}), dy = at::randn({n});
  at::Tensor y = at::empty({n}), dg = at::empty({n}), du = at::empty({n});
  cpu::swiglu_forward(p(g), p(u), m(y), n);
  cpu::swiglu_backward(p(g), p(u), p(dy), m(dg), m(du), n);
  out.insert(out.end(), {g, u, y, dg, du});
  return out;
}

}  // namespace

TEST_CASE("every ISA level of the CPU loops gives the baseline's bits", "[ops][cpu_loops]") {
  const int top = cpu::isa_level();
  cpu::testing::force_isa_level(1);
  REQUIRE(cpu::isa_level() == 1);
  const std::vector<at::Tensor> base = run_loops();
  for (int level : {3, 4}) {
    cpu::testing::force_isa_level(level);
    CAPTURE(level, top);
    CHECK(cpu::isa_level() == std::min(level, top));
    const std::vector<at::Tensor> got = run_loops();
    REQUIRE(got.size() == base.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(at::equal(got[i], base[i]));
    }
  }
  cpu::testing::force_isa_level(0);
  CHECK(cpu::isa_level() == top);
  // And the values: silu(g) u against fp64 (the last five outputs are g, u, y, dg, du).
  const at::Tensor g64 = base[base.size() - 5].to(at::kDouble), u64 = base[base.size() - 4].to(at::kDouble);
  const at::Tensor want = g64 / (1 + (-g64).exp()) * u64;
  CHECK(((base[base.size() - 3].to(at::kDouble) - want).abs() <= want.abs() * 1e-6 + 1e-30).all().item<bool>());
}
