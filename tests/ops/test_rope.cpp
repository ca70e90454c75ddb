// ops::apply_rope / apply_rope_ (in place, hand-written backward) against autograd through the
// ATen composition (fp32) and finite differences (fp64), with default and llama3-scaled tables;
// the CUDA kernel against the fp32 reference with the low-precision rule (docs/architecture.md, design rule 4).
#include <tuple>

#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/model/llama_config.h"
#include "kiln/model/rope.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/rope.h"
#include "ops/gradcheck.h"
#include "support.h"

using kiln::test::max_abs_diff;

namespace {
kiln::model::RopeTables tables(bool llama3, int64_t batch, int64_t seq, at::ScalarType dtype, at::Device device) {
  kiln::model::LlamaConfig c = kiln::model::load_llama_config("tiny");
  if (llama3) {
    c.rope_scaling.rope_type = "llama3";
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_position_embeddings = 16;
  }
  const at::Tensor pos = at::randint(4 * seq, {batch, seq}, at::kLong).to(device);
  return kiln::model::rope_cos_sin(kiln::model::rope_inv_freq(c).to(device), pos, dtype);
}
struct Grads {
  at::Tensor y, dx;
};
// x as the model makes it: a [B, T, H*D] projection output viewed as [B, H, T, D].
Grads run(const at::Tensor& x_bthd, const kiln::model::RopeTables& t, const at::Tensor& dy, int mode) {
  const at::Tensor leaf = x_bthd.detach().clone().requires_grad_(true);
  const at::Tensor x = (leaf * 1).transpose(1, 2);  // a non-leaf strided view, like the projection
  at::Tensor y;
  if (mode == 0) y = kiln::ops::apply_rope_reference(x, t.cos, t.sin);
  if (mode == 1) y = kiln::ops::apply_rope(x, t.cos, t.sin);
  if (mode == 2) y = kiln::ops::apply_rope_(x, t.cos, t.sin);
  y.backward(dy);
  return {y.detach(), leaf.grad()};
}
}  // namespace

TEST_CASE("rope's in-place Function matches autograd on the ATen composition", "[ops][rope]") {
  at::manual_seed(31);
  const int64_t head_dim = kiln::model::load_llama_config("tiny").resolved_head_dim();
  for (bool llama3 : {false, true}) {
    const auto t = tables(llama3, 2, 7, at::kFloat, at::kCPU);
    const at::Tensor x = at::randn({2, 7, 3, head_dim}), dy = at::randn({2, 3, 7, head_dim});
    const Grads want = run(x, t, dy, 0);
    for (int mode : {1, 2}) {
      const Grads got = run(x, t, dy, mode);
      CAPTURE(llama3, mode);
      CHECK(max_abs_diff(got.y, want.y) == 0);
      // The CPU loop rounds each product and sum as ATen's ops do: the backward's bits too.
      CHECK(max_abs_diff(got.dx, want.dx) == 0);
    }
  }
  const auto t = tables(true, 1, 3, at::kDouble, at::kCPU);
  const at::Tensor dy = at::randn({1, 2, 3, head_dim});
  CHECK(kiln::test::gradcheck_max_error(
            [&](const std::vector<at::Tensor>& in) {
              return (kiln::ops::apply_rope_((in[0] * 1).transpose(1, 2), t.cos, t.sin) * dy).sum();
            },
            {at::randn({1, 3, 2, head_dim})}) < 1e-7);
}

TEST_CASE("rope's CPU loop gives the ATen composition's bits in bf16, and strided heads take ATen", "[ops][rope]") {
  at::manual_seed(32);
  const int64_t head_dim = kiln::model::load_llama_config("tiny").resolved_head_dim();
  // bf16 activations and tables (the trainer's bf16 CPU path), per-sequence and shared tables:
  // each product and sum rounded to bf16 as ATen's bf16 ops round them.
  for (int64_t table_batch : {int64_t{2}, int64_t{1}}) {
    const auto t = tables(false, table_batch, 7, at::kBFloat16, at::kCPU);
    const at::Tensor x = at::randn({2, 7, 3, head_dim}).to(at::kBFloat16),
                     dy = at::randn({2, 3, 7, head_dim}).to(at::kBFloat16);
    const Grads want = run(x, t, dy, 0);
    for (int mode : {1, 2}) {
      const Grads got = run(x, t, dy, mode);
      CAPTURE(table_batch, mode);
      CHECK(at::equal(got.y, want.y));
      CHECK(at::equal(got.dx, want.dx));
    }
  }
  // Autocast's mixed case: bf16 projections with fp32 tables. The reference promotes y to fp32 and
  // autograd rounds each term of dx to bf16; the mixed loop gives the same bits.
  for (int64_t table_batch : {int64_t{2}, int64_t{1}}) {
    const auto t32 = tables(true, table_batch, 7, at::kFloat, at::kCPU);
    const at::Tensor x = at::randn({2, 7, 3, head_dim}).to(at::kBFloat16), dy = at::randn({2, 3, 7, head_dim});
    const Grads want = run(x, t32, dy, 0);
    REQUIRE(want.y.scalar_type() == at::kFloat);
    REQUIRE(want.dx.scalar_type() == at::kBFloat16);
    for (int mode : {1, 2}) {
      const Grads got = run(x, t32, dy, mode);
      CAPTURE(table_batch, mode);
      REQUIRE(got.y.scalar_type() == at::kFloat);
      CHECK(at::equal(got.y, want.y));
      CHECK(at::equal(got.dx, want.dx));
    }
  }
  // Heads whose D is not unit-stride (every other element of a wider buffer) take the ATen
  // rotation inside the same Function: same values.
  const auto t = tables(true, 2, 7, at::kFloat, at::kCPU);
  const at::Tensor wide = at::randn({2, 3, 7, 2 * head_dim}), dy = at::randn({2, 3, 7, head_dim});
  const at::Tensor leaf = wide.clone().requires_grad_(true), ref_leaf = wide.clone().requires_grad_(true);
  const at::Tensor strided = (leaf * 1).slice(3, 0, 2 * head_dim, 2);
  REQUIRE(strided.stride(3) == 2);
  const at::Tensor y = kiln::ops::apply_rope_(strided, t.cos, t.sin);
  const at::Tensor y_ref = kiln::ops::apply_rope_reference((ref_leaf * 1).slice(3, 0, 2 * head_dim, 2), t.cos, t.sin);
  CHECK(max_abs_diff(y, y_ref) == 0);
  y.backward(dy);
  y_ref.backward(dy);
  CHECK(max_abs_diff(leaf.grad(), ref_leaf.grad()) == 0);
}

namespace {
// q [B, T, 4, D] and k [B, T, 2, D] (GQA) as the model makes them, through apply_rope_qk_ (mode
// 1) or the reference on each (mode 0); y and the leaves' gradients of both.
struct QkGrads {
  at::Tensor yq, yk, dq, dk;
};
QkGrads run_qk(const at::Tensor& q_bthd, const at::Tensor& k_bthd, const kiln::model::RopeTables& t,
               const at::Tensor& dyq, const at::Tensor& dyk, int mode) {
  const at::Tensor lq = q_bthd.detach().clone().requires_grad_(true), lk = k_bthd.detach().clone().requires_grad_(true);
  const at::Tensor q = (lq * 1).transpose(1, 2), k = (lk * 1).transpose(1, 2);
  at::Tensor yq, yk;
  if (mode == 0) {
    yq = kiln::ops::apply_rope_reference(q, t.cos, t.sin);
    yk = kiln::ops::apply_rope_reference(k, t.cos, t.sin);
  } else {
    std::tie(yq, yk) = kiln::ops::apply_rope_qk_(q, k, t.cos, t.sin);
  }
  torch::autograd::backward({yq, yk}, {dyq, dyk});
  return {yq.detach(), yk.detach(), lq.grad(), lk.grad()};
}
void check_qk(const QkGrads& got, const QkGrads& want, double tol) {
  CHECK(max_abs_diff(got.yq, want.yq) <= tol);
  CHECK(max_abs_diff(got.yk, want.yk) <= tol);
  CHECK(max_abs_diff(got.dq, want.dq) <= tol);
  CHECK(max_abs_diff(got.dk, want.dk) <= tol);
}
}  // namespace

// apply_rope_qk_ on the CPU is two apply_rope_ calls: the reference's values and gradients, bit
// for bit, in fp32 and bf16 (the CPU loop), with the kiln and the aten backend, per-sequence and
// shared tables; and under autocast's mixed dtypes (fp32 tables), where it returns fp32 results.
TEST_CASE("apply_rope_qk_ gives the reference's q and k and their gradients", "[ops][rope]") {
  at::manual_seed(35);
  const int64_t head_dim = kiln::model::load_llama_config("tiny").resolved_head_dim();
  for (const char* spec : {"kiln", "aten"}) {
    const kiln::ops::BackendScope scope(spec);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t table_batch : {int64_t{2}, int64_t{1}}) {
        for (auto table_dtype : {dtype, at::kFloat}) {
          CAPTURE(spec, dtype, table_batch, table_dtype);
          const auto t = tables(true, table_batch, 7, table_dtype, at::kCPU);
          const at::Tensor q = at::randn({2, 7, 4, head_dim}).to(dtype), k = at::randn({2, 7, 2, head_dim}).to(dtype);
          const auto out = at::promote_types(dtype, table_dtype);
          const at::Tensor dyq = at::randn({2, 4, 7, head_dim}).to(out), dyk = at::randn({2, 2, 7, head_dim}).to(out);
          const QkGrads want = run_qk(q, k, t, dyq, dyk, 0), got = run_qk(q, k, t, dyq, dyk, 1);
          REQUIRE(got.yq.scalar_type() == want.yq.scalar_type());
          check_qk(got, want, 0);
        }
      }
    }
  }
}

TEST_CASE("rope CUDA mixed-dtype kernel gives the reference's bits under autocast's dtypes", "[ops][rope][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(33);
  const int64_t head_dim = kiln::model::load_llama_config("tiny").resolved_head_dim();
  // bf16/fp16 projections with fp32 tables: the reference promotes y to fp32 and rounds each term
  // of dx to x's dtype; the kernel's __fmul_rn / __fadd_rn give the same bits as ATen's ops.
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t table_batch : {int64_t{2}, int64_t{1}}) {
      const auto t32 = tables(true, table_batch, 37, at::kFloat, at::kCUDA);
      const at::Tensor x = at::randn({2, 37, 3, head_dim}).to(dtype).cuda(),
                       dy = at::randn({2, 3, 37, head_dim}).cuda();
      const Grads want = run(x, t32, dy, 0);
      REQUIRE(want.y.scalar_type() == at::kFloat);
      REQUIRE(want.dx.scalar_type() == dtype);
      for (int mode : {1, 2}) {
        const Grads got = run(x, t32, dy, mode);
        CAPTURE(dtype, table_batch, mode);
        REQUIRE(got.y.scalar_type() == at::kFloat);
        CHECK(at::equal(got.y, want.y));
        CHECK(at::equal(got.dx, want.dx));
      }
    }
  }
}

TEST_CASE("rope CUDA kernel matches the reference, forward and backward", "[ops][rope][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(32);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (bool llama3 : {false, true}) {
      for (int64_t d : {64, 128}) {
        const at::Tensor x32 = at::randn({2, 33, 5, d}).cuda(), dy32 = at::randn({2, 5, 33, d}).cuda();
        const at::Tensor pos = at::randint(1000, {2, 33}, at::kLong).cuda();
        kiln::model::LlamaConfig c = kiln::model::load_llama_config("tiny");
        c.head_dim = d;
        if (llama3) c.rope_scaling.rope_type = "llama3";
        const at::Tensor inv = kiln::model::rope_inv_freq(c).cuda();
        const auto t32 = kiln::model::rope_cos_sin(inv, pos, at::kFloat);
        const auto t = kiln::model::rope_cos_sin(inv, pos, dtype);
        const Grads ref = run(x32, t32, dy32, 0);
        const Grads aten = run(x32.to(dtype), t, dy32.to(dtype), 0);
        const Grads kern = run(x32.to(dtype), t, dy32.to(dtype), 2);
        CAPTURE(dtype, llama3, d);
        if (dtype == at::kFloat) {
          CHECK(max_abs_diff(kern.y, ref.y) < 1e-5);
          CHECK(max_abs_diff(kern.dx, ref.dx) < 1e-5);
        } else {
          CHECK(max_abs_diff(kern.y, ref.y) <= 2 * max_abs_diff(aten.y, ref.y) + 1e-6);
          CHECK(max_abs_diff(kern.dx, ref.dx) <= 2 * max_abs_diff(aten.dx, ref.dx) + 1e-6);
        }
      }
    }
  }
}

// apply_rope_qk_'s one launch (q: 32 heads, k: 8, and 5 with 3) against the fp32 reference,
// forward and both gradients, with the low-precision rule.
TEST_CASE("rope CUDA q+k kernel matches the reference, forward and backward", "[ops][rope][cuda]") {
  REQUIRE(torch::cuda::is_available());
  REQUIRE(kiln::ops::kernels_compiled());
  at::manual_seed(36);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (int64_t d : {64, 128}) {
      for (const auto [nq, nk] : {std::pair<int64_t, int64_t>{32, 8}, std::pair<int64_t, int64_t>{5, 3}}) {
        kiln::model::LlamaConfig c = kiln::model::load_llama_config("tiny");
        c.head_dim = d;
        const at::Tensor inv = kiln::model::rope_inv_freq(c).cuda();
        const at::Tensor pos = at::randint(1000, {2, 33}, at::kLong).cuda();
        const auto t32 = kiln::model::rope_cos_sin(inv, pos, at::kFloat),
                   t = kiln::model::rope_cos_sin(inv, pos, dtype);
        const at::Tensor q = at::randn({2, 33, nq, d}).cuda(), k = at::randn({2, 33, nk, d}).cuda();
        const at::Tensor dyq = at::randn({2, nq, 33, d}).cuda(), dyk = at::randn({2, nk, 33, d}).cuda();
        const QkGrads ref = run_qk(q, k, t32, dyq, dyk, 0);
        const QkGrads aten = run_qk(q.to(dtype), k.to(dtype), t, dyq.to(dtype), dyk.to(dtype), 0);
        const QkGrads kern = run_qk(q.to(dtype), k.to(dtype), t, dyq.to(dtype), dyk.to(dtype), 1);
        CAPTURE(dtype, d, nq, nk);
        if (dtype == at::kFloat) {
          check_qk(kern, ref, 1e-5);
        } else {
          CHECK(max_abs_diff(kern.yq, ref.yq) <= 2 * max_abs_diff(aten.yq, ref.yq) + 1e-6);
          CHECK(max_abs_diff(kern.yk, ref.yk) <= 2 * max_abs_diff(aten.yk, ref.yk) + 1e-6);
          CHECK(max_abs_diff(kern.dq, ref.dq) <= 2 * max_abs_diff(aten.dq, ref.dq) + 1e-6);
          CHECK(max_abs_diff(kern.dk, ref.dk) <= 2 * max_abs_diff(aten.dk, ref.dk) + 1e-6);
        }
      }
    }
  }
}
