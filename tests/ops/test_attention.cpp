// ops::attention against the textbook composition softmax(Q K^T * scale + causal mask) V,
// written here in fp64 with K/V heads repeated explicitly for grouped-query attention.
#include <cmath>

#include <torch/csrc/autograd/autograd.h>
#include <catch2/catch.hpp>

#include "kiln/ops/attention.h"
#include "support.h"

using kiln::test::max_abs_diff;

namespace {
at::Tensor composition(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  const int64_t group = q.size(1) / k.size(1);
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble).repeat_interleave(group, 1),
                   vd = v.to(at::kDouble).repeat_interleave(group, 1);
  at::Tensor scores = at::matmul(qd, kd.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (causal) {
    const int64_t t = q.size(2), s = k.size(2);
    const at::Tensor future = at::ones({t, s}, at::kBool).triu(s - t + 1);
    scores = scores.masked_fill(future, -INFINITY);
  }
  return at::matmul(at::softmax(scores, -1), vd);
}
}  // namespace

TEST_CASE("attention equals the softmax(QK^T)V composition, with GQA", "[ops][attention]") {
  for (int64_t kv_heads : {8, 2, 1}) {
    for (int64_t t : {1, 5, 33}) {
      const at::Tensor q = at::randn({2, 8, t, 16}), k = at::randn({2, kv_heads, t, 16}),
                       v = at::randn({2, kv_heads, t, 16});
      CAPTURE(kv_heads, t);
      CHECK(max_abs_diff(kiln::ops::attention(q, k, v), composition(q, k, v, true)) < 2e-6);
      CHECK(max_abs_diff(kiln::ops::attention(q, k, v, {.causal = false}), composition(q, k, v, false)) < 2e-6);
    }
  }
}

TEST_CASE("causal attention with more keys than queries aligns bottom-right (KV cache)", "[ops][attention]") {
  for (int64_t t : {1, 3}) {
    const at::Tensor q = at::randn({2, 4, t, 16}), k = at::randn({2, 2, 9, 16}), v = at::randn({2, 2, 9, 16});
    CAPTURE(t);
    CHECK(max_abs_diff(kiln::ops::attention(q, k, v), composition(q, k, v, true)) < 2e-6);
  }
}

TEST_CASE("GQA equals attention with K/V heads repeated", "[ops][attention]") {
  const at::Tensor q = at::randn({1, 12, 20, 32}), k = at::randn({1, 3, 20, 32}), v = at::randn({1, 3, 20, 32});
  const at::Tensor gqa = kiln::ops::attention(q, k, v);
  const at::Tensor repeated = kiln::ops::attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1));
  CHECK(max_abs_diff(gqa, repeated) < 1e-6);
}

TEST_CASE("attention gradients match the composition's", "[ops][attention]") {
  const at::Tensor q = at::randn({1, 4, 9, 8}, at::kDouble).requires_grad_();
  const at::Tensor k = at::randn({1, 2, 9, 8}, at::kDouble).requires_grad_();
  const at::Tensor v = at::randn({1, 2, 9, 8}, at::kDouble).requires_grad_();
  const at::Tensor w = at::randn({1, 4, 9, 8}, at::kDouble);
  const auto grads = torch::autograd::grad({(kiln::ops::attention(q, k, v) * w).sum()}, {q, k, v});
  const auto ref = torch::autograd::grad({(composition(q, k, v, true) * w).sum()}, {q, k, v});
  for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(grads[i], ref[i]) < 1e-10);
}

TEST_CASE("attention rejects mismatched shapes with a clear message", "[ops][attention]") {
  const at::Tensor q = at::randn({1, 6, 4, 8}), k = at::randn({1, 4, 4, 8});
  CHECK_THAT(kiln::test::error_of([&] { kiln::ops::attention(q, k, k); }), Catch::Matchers::Contains("must divide"));
  CHECK_THAT(kiln::test::error_of([&] {
               kiln::ops::attention(q.view({6, 4, 8}), k, k);
             }),
             Catch::Matchers::Contains("[B, H, T, D]"));
}
