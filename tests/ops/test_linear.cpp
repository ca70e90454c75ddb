// ops::linear: on a CPU, a bf16/fp16 linear may run as an fp32 GEMM over the rounded operands.
// Both CPU paths (forced, so every machine runs both whatever its AMX) are checked against an
// independent fp64 reference of what a low-precision GEMM with wide accumulation computes: the
// operands rounded to the compute dtype, the products summed exactly, the result rounded once.
#include <array>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/autocast_mode.h>
#include <catch2/catch.hpp>

#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "support.h"

using kiln::test::max_abs_diff;

namespace {

at::Tensor r64(const at::Tensor& t, at::ScalarType c) {
  return t.to(c).to(at::kDouble);
}

// Elements of `got` more than one unit in the last place of `c` away from `want` (fp64), and the
// share of elements not equal to `want` rounded to `c`.
struct UlpCheck {
  int64_t beyond_one_ulp;
  double inexact_share;
};
UlpCheck ulps(const at::Tensor& got, const at::Tensor& want, at::ScalarType c) {
  const double eps = c == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;  // 2^-(mantissa bits)
  const at::Tensor g = got.to(at::kDouble), w = want.to(c).to(at::kDouble);
  const at::Tensor beyond = (g - w).abs() > w.abs() * eps + 1e-30;
  return {beyond.sum().item<int64_t>(), g.ne(w).to(at::kDouble).mean().item<double>()};
}

struct Result {
  at::Tensor y, dx, dw, db;
};

// y = linear(x, w, b) under CPU autocast (or without it when autocast_dtype is Undefined), then
// backward of sum(y * g).
Result run(const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& b0, const at::Tensor& g,
           at::ScalarType autocast_dtype) {
  const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  const at::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : at::Tensor();
  at::Tensor y;
  if (autocast_dtype != at::ScalarType::Undefined) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, autocast_dtype);
  }
  y = kiln::ops::linear(x, w, b);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  (y.to(at::kFloat) * g).sum().backward();
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : at::Tensor()};
}

}  // namespace

TEST_CASE("a CPU bf16 linear computes what a bf16 GEMM does, through fp32 or natively", "[ops][linear]") {
  at::manual_seed(11);
  const int64_t in = 48, out = 40;
  const at::Tensor w = at::randn({out, in}) * 0.2, b = at::randn({out});
  const at::Tensor g = at::randn({2, 5, out});
  const at::ScalarType c = at::kBFloat16;
  for (int fp32 : {1, 0}) {
    kiln::ops::testing::force_cpu_linear_fp32(fp32);
    CHECK(kiln::ops::cpu_linear_uses_fp32_gemm(c) == (fp32 == 1));
    CHECK_FALSE(kiln::ops::cpu_linear_uses_fp32_gemm(at::kFloat));
    for (at::ScalarType x_dtype : {at::kFloat, at::kBFloat16}) {
      for (bool bias : {false, true}) {
        CAPTURE(fp32, x_dtype, bias);
        const at::Tensor x = at::randn({2, 5, in}).to(x_dtype);
        const Result r = run(x, w, bias ? b : at::Tensor(), g, c);
        // The reference: operands rounded to bf16, exact sums (fp64), one rounding.
        const at::Tensor xr = r64(x, c).reshape({-1, in}), wr = r64(w, c), dy = r64(g, c).reshape({-1, out});
        at::Tensor y_ref = xr.mm(wr.t());
        if (bias) y_ref = y_ref + r64(b, c);
        REQUIRE(r.y.scalar_type() == c);
        REQUIRE(r.dx.scalar_type() == x_dtype);
        REQUIRE(r.dw.scalar_type() == at::kFloat);
        const UlpCheck fy = ulps(r.y.reshape({-1, out}), y_ref, c);
        const UlpCheck fdx = ulps(r.dx.reshape({-1, in}), dy.mm(wr), c);
        const UlpCheck fdw = ulps(r.dw, dy.t().mm(xr), c);
        CHECK(fy.beyond_one_ulp == 0);
        CHECK(fdx.beyond_one_ulp == 0);
        CHECK(fdw.beyond_one_ulp == 0);
        if (fp32 == 1) {
          // fp32 sums of exact products round like the fp64 ones but for rare near-ties.
          CHECK(fy.inexact_share < 0.02);
          CHECK(fdx.inexact_share < 0.02);
          CHECK(fdw.inexact_share < 0.02);
        }
        if (bias) CHECK(ulps(r.db, dy.sum(0), c).beyond_one_ulp == 0);
      }
    }
  }
  kiln::ops::testing::force_cpu_linear_fp32(-1);
}

TEST_CASE("without autocast, bf16 and fp16 operands take the same route; fp32 is at::linear", "[ops][linear]") {
  at::manual_seed(12);
  kiln::ops::testing::force_cpu_linear_fp32(1);
  for (at::ScalarType c : {at::kBFloat16, at::kHalf}) {
    CAPTURE(c);
    const at::Tensor x = at::randn({7, 24}).to(c), w = (at::randn({16, 24}) * 0.3).to(c);
    const at::Tensor g = at::randn({7, 16});
    const Result r = run(x, w, at::Tensor(), g, at::ScalarType::Undefined);
    REQUIRE(r.y.scalar_type() == c);
    REQUIRE(r.dw.scalar_type() == c);
    CHECK(ulps(r.y, r64(x, c).mm(r64(w, c).t()), c).beyond_one_ulp == 0);
    CHECK(ulps(r.dx, r64(g, c).mm(r64(w, c)), c).beyond_one_ulp == 0);
    CHECK(ulps(r.dw, r64(g, c).t().mm(r64(x, c)), c).beyond_one_ulp == 0);
  }
  // fp32 calls are at::linear itself, bitwise.
  const at::Tensor x = at::randn({3, 8, 24}), w = at::randn({16, 24}), b = at::randn({16});
  CHECK(at::equal(kiln::ops::linear(x, w, b), at::linear(x, w, b)));
  kiln::ops::testing::force_cpu_linear_fp32(-1);
}

namespace {
// An fp64 reference of a @ b and the bound on an fp32 GEMM's error: K roundings of partial sums,
// each at most 2^-24 of the sum of |a_ik b_kj| (the classic bound; in practice far below it).
struct MmRef {
  at::Tensor value, bound;
};
MmRef mm_ref(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return {a64.mm(b64), a64.abs().mm(b64.abs()) * (static_cast<double>(a.size(1)) * std::ldexp(1.0, -24))};
}
bool within(const at::Tensor& got, const MmRef& r) {
  return ((got.to(at::kDouble) - r.value).abs() <= r.bound + 1e-30).all().item<bool>();
}
}  // namespace

TEST_CASE("ops::mm_into and ops::mm: CPU fp32 GEMMs are ATen's, every operand layout", "[ops][linear]") {
  at::manual_seed(14);
  // Shapes of the decoder (odd sizes too) and of the head; a and b plain or transposed views.
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{{37, 53, 29}, {128, 64, 192}, {64, 96, 1000}, {1, 7, 5}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CAPTURE(m, k, n, ta, tb);
        const at::Tensor a = ta ? at::randn({k, m}).t() : at::randn({m, k});
        const at::Tensor b = tb ? at::randn({n, k}).t() : at::randn({k, n});
        const MmRef r = mm_ref(a, b);
        at::Tensor out = at::empty({m, n});
        kiln::ops::mm_into(out, a, b);
        CHECK(within(out, r));
        CHECK(at::equal(out, at::mm(a, b)));  // ATen's path is at::mm itself
        // Accumulate: out += a b over what is there.
        const at::Tensor base = at::randn({m, n});
        at::Tensor acc = base.clone();
        kiln::ops::mm_into(acc, a, b, /*accumulate=*/true);
        CHECK(within(acc - base, {r.value, r.bound * 2 + base.abs().to(at::kDouble) * std::ldexp(1.0, -23)}));
        CHECK(at::equal(acc, at::addmm(base, a, b)));
        // ops::mm is the same product.
        CHECK(at::equal(kiln::ops::mm(a, b), out));
      }
    }
  }
  // An fp32 linear is at::linear, forward and backward, bitwise.
  const at::Tensor x = at::randn({3, 9, 56}).requires_grad_(true), w = (at::randn({40, 56}) * 0.2).requires_grad_(true);
  const at::Tensor y = kiln::ops::linear(x, w);
  const at::Tensor xr = x.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
  const at::Tensor yr = at::linear(xr, wr);
  CHECK(at::equal(y, yr));
  const at::Tensor g = at::randn({3, 9, 40});
  (y * g).sum().backward();
  (yr * g).sum().backward();
  CHECK(at::equal(x.grad(), xr.grad()));
  CHECK(at::equal(w.grad(), wr.grad()));
}

TEST_CASE("the aten backend of linear is autocast's at::linear, bitwise", "[ops][linear]") {
  at::manual_seed(13);
  kiln::ops::testing::force_cpu_linear_fp32(1);
  const at::Tensor x = at::randn({4, 6, 32}), w = at::randn({24, 32}) * 0.2, g = at::randn({4, 6, 24});
  Result aten, kiln_fp32;
  {
    const kiln::ops::BackendScope scope("kiln,linear=aten");
    aten = run(x, w, at::Tensor(), g, at::kBFloat16);
  }
  kiln_fp32 = run(x, w, at::Tensor(), g, at::kBFloat16);
  // The reference composition by hand: autocast casts both operands to bf16, at::linear in bf16.
  const at::Tensor xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
  const at::Tensor y = at::linear(xr.to(at::kBFloat16), wr.to(at::kBFloat16));
  (y.to(at::kFloat) * g).sum().backward();
  CHECK(at::equal(aten.y, y.detach()));
  CHECK(at::equal(aten.dw, wr.grad()));
  CHECK(at::equal(aten.dx, xr.grad()));
  // Both are bf16 GEMMs of the same operands: within one rounding of each other.
  CHECK(max_abs_diff(kiln_fp32.y.to(at::kFloat), aten.y.to(at::kFloat)) <=
        aten.y.to(at::kFloat).abs().max().item<double>() / 64);
  kiln::ops::testing::force_cpu_linear_fp32(-1);
}

TEST_CASE("the CPU feature tests behind the bf16 GEMM rule agree with /proc/cpuinfo", "[ops][linear]") {
  // The kernel's own reading of CPUID, an independent reference for kiln's: the vendor and the
  // avx512_bf16 / amx_bf16 flags of the first processor.
  std::ifstream info("/proc/cpuinfo");
  if (!info) {
    WARN("no /proc/cpuinfo: nothing to compare with");
    return;
  }
  std::string line, vendor, flags;
  while (std::getline(info, line) && (vendor.empty() || flags.empty())) {
    if (vendor.empty() && line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + line.substr(line.find(':') + 2) + " ";
  }
  if (flags.empty()) {
    WARN("no x86 flags in /proc/cpuinfo: nothing to compare with");
    return;
  }
  const bool avx512_bf16 = flags.find(" avx512_bf16 ") != std::string::npos;
  const bool amx_bf16 = flags.find(" amx_bf16 ") != std::string::npos;
  CAPTURE(vendor, avx512_bf16, amx_bf16);
  CHECK(kiln::ops::cpu_is_amd_with_avx512_bf16() == (vendor == "AuthenticAMD" && avx512_bf16));
  CHECK(kiln::ops::cpu_has_amx_bf16() == amx_bf16);
  // The rule (no override in the test environment): bf16 native with either, fp16 with AMX only.
  if (std::getenv("KILN_CPU_LOW_PRECISION_GEMM") == nullptr) {
    CHECK(kiln::ops::cpu_native_low_precision_gemm(at::kBFloat16) ==
          (amx_bf16 || (vendor == "AuthenticAMD" && avx512_bf16)));
    CHECK(kiln::ops::cpu_native_low_precision_gemm(at::kHalf) == amx_bf16);
  }
}
