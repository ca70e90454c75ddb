// The fused fp32 CPU loops (kernels/cpu_loops.h): their exp against the fp64 one, and every ISA
// level this CPU can run (AVX-512, AVX2, baseline; forced in turn) bitwise against the baseline,
// so that every machine of the project's kind computes the same bits. The ops' results against
// their ATen references are in test_rmsnorm.cpp and test_swiglu.cpp; the cross-entropy rows are
// checked against fp64 here and through ops::linear_cross_entropy in test_linear_cross_entropy.cpp.
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
  // Cross-entropy rows (max, sum of exponentials, gradient in place), with an ignored row and a
  // z-loss, over widths that reach the lane tails.
  for (int64_t cols : {1, 17, 1000}) {
    const int64_t rows = 5;
    at::Tensor x = at::randn({rows, cols}) * 4, loss = at::empty({rows}), lse = at::empty({rows});
    at::Tensor labels = at::randint(cols, {rows}, at::kLong);
    labels[2] = -100;
    cpu::cross_entropy_rows(m(x), labels.const_data_ptr<int64_t>(), -100, 1e-2f, m(loss), m(lse), rows, cols, true);
    out.insert(out.end(), {x, loss, lse});
  }
  // The bf16 forms on the same values rounded to bf16 (Tensor storage of the bit patterns).
  const at::Tensor gb = g.to(at::kBFloat16), ub = u.to(at::kBFloat16), dyb = dy.to(at::kBFloat16);
  at::Tensor yb = at::empty_like(gb), dgb = at::empty_like(gb), dub = at::empty_like(gb);
  auto bits = [](const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>()); };
  auto bits_out = [](at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()); };
  cpu::swiglu_forward_bf16(bits(gb), bits(ub), bits_out(yb), n);
  cpu::swiglu_backward_bf16(bits(gb), bits(ub), bits(dyb), bits_out(dgb), bits_out(dub), n);
  out.insert(out.end(), {yb, dgb, dub});
  // bf16 cross-entropy rows and the bf16-into-fp32 accumulation.
  for (int64_t cols : {1, 17, 1000}) {
    const int64_t rows = 5;
    at::Tensor x = (at::randn({rows, cols}) * 4).to(at::kBFloat16), loss = at::empty({rows}), lse = at::empty({rows});
    at::Tensor labels = at::randint(cols, {rows}, at::kLong);
    labels[2] = -100;
    cpu::cross_entropy_rows_bf16(bits_out(x), labels.const_data_ptr<int64_t>(), -100, 1e-2f, m(loss), m(lse), rows,
                                 cols, true);
    out.insert(out.end(), {x, loss, lse});
  }
  at::Tensor acc = at::randn({n});
  cpu::accumulate_bf16(m(acc), bits(dyb), n);
  out.push_back(acc);
  // RoPE rows, forward in place on a [B, T, H, D] buffer viewed as [B, H, T, D] and backward into a
  // contiguous tensor, with per-sequence and shared tables, fp32 and bf16, over widths whose halves
  // reach the lane tails.
  for (int64_t dim : {2, 34, 64}) {
    for (int64_t cs_batch : {int64_t{1}, int64_t{2}}) {
      const at::Tensor base = at::randn({2, 5, 3, dim}), cs = at::randn({cs_batch, 5, dim}),
                       sn = at::randn({cs_batch, 5, dim});
      for (bool bf16 : {false, true}) {
        const at::ScalarType dt = bf16 ? at::kBFloat16 : at::kFloat;
        at::Tensor x = base.to(dt).transpose(1, 2);  // in place, strided
        const at::Tensor c = cs.to(dt), s = sn.to(dt);
        at::Tensor dx = at::empty({2, 3, 5, dim}, dt);
        cpu::RopeShape shape{2,
                             3,
                             5,
                             dim,
                             {x.stride(0), x.stride(1), x.stride(2)},
                             {x.stride(0), x.stride(1), x.stride(2)},
                             cs_batch == 1 ? 0 : 5 * dim};
        cpu::RopeShape back = shape;
        back.dst_stride[0] = dx.stride(0), back.dst_stride[1] = dx.stride(1), back.dst_stride[2] = dx.stride(2);
        if (bf16) {
          uint16_t* xb = reinterpret_cast<uint16_t*>(x.mutable_data_ptr<at::BFloat16>());
          cpu::rope_bf16(xb, xb, bits(c), bits(s), shape, false);
          cpu::rope_bf16(xb, bits_out(dx), bits(c), bits(s), back, true);
        } else {
          cpu::rope(p(x), m(x), p(c), p(s), shape, false);
          cpu::rope(p(x), m(dx), p(c), p(s), back, true);
        }
        out.insert(out.end(), {x, dx});
      }
      // Autocast's mixed forms: bf16 in, fp32 out; fp32 gradient in, bf16 out.
      const at::Tensor xb = base.to(at::kBFloat16).transpose(1, 2);
      at::Tensor y32 = at::empty({2, 3, 5, dim}), dxb = at::empty({2, 3, 5, dim}, at::kBFloat16);
      cpu::RopeShape mixed{2,
                           3,
                           5,
                           dim,
                           {xb.stride(0), xb.stride(1), xb.stride(2)},
                           {y32.stride(0), y32.stride(1), y32.stride(2)},
                           cs_batch == 1 ? 0 : 5 * dim};
      cpu::rope_bf16_to_fp32(bits(xb), m(y32), p(cs), p(sn), mixed);
      cpu::RopeShape mixed_back = mixed;
      for (int i = 0; i < 3; ++i) mixed_back.src_stride[i] = y32.stride(i);
      cpu::rope_backward_fp32_to_bf16(p(y32), bits_out(dxb), p(cs), p(sn), mixed_back);
      out.insert(out.end(), {y32, dxb});
    }
  }
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

namespace {
// The fp64 reference of the cross-entropy rows (labels -100 ignored): lse, nll + z lse^2 and
// (softmax (1 + 2 z lse) - onehot) for valid rows, zero for ignored ones.
struct CeRef {
  at::Tensor lse, loss, grad;
};
CeRef ce_reference(const at::Tensor& x64, const at::Tensor& labels, double z) {
  const at::Tensor lse = at::logsumexp(x64, 1);
  const at::Tensor valid = labels.ne(-100);
  const at::Tensor safe = at::where(valid, labels, at::zeros_like(labels)).unsqueeze(1);
  const at::Tensor nll = lse - x64.gather(1, safe).squeeze(1);
  const at::Tensor loss = (nll + lse.square() * z) * valid.to(at::kDouble);
  at::Tensor grad = at::softmax(x64, 1) * (1 + 2 * z * lse).unsqueeze(1);
  grad.scatter_add_(1, safe, at::full({x64.size(0), 1}, -1.0, at::kDouble));
  grad.mul_(valid.to(at::kDouble).unsqueeze(1));
  return {lse, loss, grad};
}

}  // namespace

TEST_CASE("the CPU cross-entropy rows give fp64's loss, lse and gradient", "[ops][cpu_loops]") {
  at::manual_seed(32);
  for (int64_t cols : {1, 7, 16, 33, 4000}) {
    for (double z : {0.0, 1e-3}) {
      const int64_t rows = 6;
      // Wide logits (a softmax far from uniform) and one large offset row (the max subtraction).
      at::Tensor x = at::randn({rows, cols}) * 6;
      x[3].add_(300.0);
      at::Tensor labels = at::randint(cols, {rows}, at::kLong);
      labels[1] = -100;
      const at::Tensor x64 = x.to(at::kDouble);
      at::Tensor got = x.clone(), loss = at::empty({rows}), lse = at::empty({rows});
      cpu::cross_entropy_rows(m(got), labels.const_data_ptr<int64_t>(), -100, static_cast<float>(z), m(loss), m(lse),
                              rows, cols, true);
      const CeRef want = ce_reference(x64, labels, z);
      CAPTURE(cols, z);
      CHECK(at::allclose(lse.to(at::kDouble), want.lse, 1e-6, 1e-5));
      CHECK(at::allclose(loss.to(at::kDouble), want.loss, 1e-6, 2e-5));
      CHECK(at::allclose(got.to(at::kDouble), want.grad, 1e-5, 1e-7));
      CHECK(got[1].abs().max().item<float>() == 0.0f);  // the ignored row: zero gradient, zero loss
      CHECK(loss[1].item<float>() == 0.0f);
      // Without the gradient the logits stay as they were and the loss is the same bits.
      at::Tensor kept = x.clone(), loss2 = at::empty({rows}), lse2 = at::empty({rows});
      cpu::cross_entropy_rows(m(kept), labels.const_data_ptr<int64_t>(), -100, static_cast<float>(z), m(loss2), m(lse2),
                              rows, cols, false);
      CHECK(at::equal(kept, x));
      CHECK(at::equal(loss2, loss));
      CHECK(at::equal(lse2, lse));
    }
  }
}

TEST_CASE("the bf16 CPU cross-entropy rows: fp32 arithmetic on the bf16 logits, the gradient rounded once",
          "[ops][cpu_loops]") {
  at::manual_seed(33);
  for (int64_t cols : {1, 7, 16, 33, 4000}) {
    for (double z : {0.0, 1e-3}) {
      const int64_t rows = 6;
      at::Tensor x = at::randn({rows, cols}) * 6;
      x[3].add_(300.0);
      const at::Tensor xb = x.to(at::kBFloat16);
      at::Tensor labels = at::randint(cols, {rows}, at::kLong);
      labels[1] = -100;
      // fp64 reference on the bf16 values: what ATen's fp32 log-softmax of bf16 logits approximates.
      const at::Tensor x64 = xb.to(at::kDouble);
      at::Tensor got = xb.clone(), loss = at::empty({rows}), lse = at::empty({rows});
      cpu::cross_entropy_rows_bf16(reinterpret_cast<uint16_t*>(got.mutable_data_ptr<at::BFloat16>()),
                                   labels.const_data_ptr<int64_t>(), -100, static_cast<float>(z), m(loss), m(lse), rows,
                                   cols, true);
      const CeRef want = ce_reference(x64, labels, z);
      CAPTURE(cols, z);
      REQUIRE(got.scalar_type() == at::kBFloat16);
      CHECK(at::allclose(lse.to(at::kDouble), want.lse, 1e-6, 1e-5));
      CHECK(at::allclose(loss.to(at::kDouble), want.loss, 1e-6, 2e-5));
      // Each gradient element within one bf16 rounding (2^-8 relative) of fp64's, plus fp32's error.
      const at::Tensor err = (got.to(at::kDouble) - want.grad).abs();
      CHECK((err <= want.grad.abs() * (1.0 / 256) + 1e-7).all().item<bool>());
      // And equal to the fp32 loop's gradient (on the same widened values) rounded once to bf16.
      at::Tensor g32 = x64.to(at::kFloat), l32 = at::empty({rows}), s32 = at::empty({rows});
      cpu::cross_entropy_rows(m(g32), labels.const_data_ptr<int64_t>(), -100, static_cast<float>(z), m(l32), m(s32),
                              rows, cols, true);
      CHECK(at::equal(got, g32.to(at::kBFloat16)));
      CHECK(at::equal(loss, l32));
      CHECK(at::equal(lse, s32));
      CHECK(got[1].to(at::kFloat).abs().max().item<float>() == 0.0f);
      // With a grad_scale (the trainer's 1 / targets): the fp32 gradient times it, rounded once.
      const float scale = 1.0f / 3000.0f;
      at::Tensor scaled = xb.clone(), l_s = at::empty({rows}), s_s = at::empty({rows});
      cpu::cross_entropy_rows_bf16(reinterpret_cast<uint16_t*>(scaled.mutable_data_ptr<at::BFloat16>()),
                                   labels.const_data_ptr<int64_t>(), -100, static_cast<float>(z), m(l_s), m(s_s), rows,
                                   cols, true, scale);
      CHECK(at::equal(scaled, (g32 * scale).to(at::kBFloat16)));
      CHECK(at::equal(l_s, l32));
    }
  }
}

TEST_CASE("accumulate_bf16 adds the widened bf16 values into fp32", "[ops][cpu_loops]") {
  at::manual_seed(34);
  for (int64_t n : {1, 15, 16, 70001}) {
    const at::Tensor src = at::randn({n}).to(at::kBFloat16), base = at::randn({n});
    at::Tensor acc = base.clone();
    cpu::accumulate_bf16(m(acc), reinterpret_cast<const uint16_t*>(src.const_data_ptr<at::BFloat16>()), n);
    CAPTURE(n);
    CHECK(at::equal(acc, base + src.to(at::kFloat)));  // one fp32 addition per element, as ATen's
  }
}

TEST_CASE("a NaN logit reaches the CPU cross-entropy loss", "[ops][cpu_loops]") {
  for (int64_t at_col : {0, 5, 20}) {  // in the lanes and in the tail
    at::Tensor x = at::zeros({1, 21}), loss = at::empty({1}), lse = at::empty({1});
    x[0][at_col] = std::nanf("");
    const int64_t label = 3;
    cpu::cross_entropy_rows(m(x), &label, -100, 0.0f, m(loss), m(lse), 1, 21, true);
    CAPTURE(at_col);
    CHECK(std::isnan(loss.item<float>()));
  }
}
