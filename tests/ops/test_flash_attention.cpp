// The blocked FlashAttention-2 reference against the textbook composition softmax(QK^T * scale
// + mask) V in fp64 (forward, log-sum-exp) and against autograd through that composition
// (dq, dk, dv), with GQA, odd lengths, block sizes that do not divide them, causal and
// non-causal, more keys than queries, and document-boundary (segment) masks; plus central
// finite differences on a few entries.
#include <cmath>

#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/ops/attention.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/flash_attention.h"
#include "support.h"

using kiln::ops::FlashAttentionParams;
using kiln::test::max_abs_diff;

namespace {

// Masked, scaled scores in fp64 with K/V repeated per group: [B, Hq, T, S].
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, bool causal, const at::Tensor& seg) {
  const int64_t group = q.size(1) / k.size(1), t = q.size(2), s = k.size(2);
  at::Tensor sc = at::matmul(q.to(at::kDouble), k.to(at::kDouble).repeat_interleave(group, 1).transpose(-1, -2)) /
                  std::sqrt(static_cast<double>(q.size(-1)));
  if (causal) sc = sc.masked_fill(at::ones({t, s}, at::kBool).triu(s - t + 1), -INFINITY);
  if (seg.defined()) sc = sc.masked_fill((seg.unsqueeze(2) != seg.unsqueeze(1)).unsqueeze(1), -INFINITY);
  return sc;
}

at::Tensor composition(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                       const at::Tensor& seg = {}) {
  const int64_t group = q.size(1) / k.size(1);
  return at::matmul(at::softmax(scores(q, k, causal, seg), -1), v.to(at::kDouble).repeat_interleave(group, 1));
}

at::Tensor random_segments(int64_t b, int64_t t) {
  // Document boundaries at random positions: segment id = number of boundaries so far.
  return (at::rand({b, t}) < 0.15).to(at::kInt).cumsum(1).to(at::kInt);
}

}  // namespace

TEST_CASE("blocked forward equals the composition, and lse is the log-sum-exp", "[ops][flash]") {
  for (int64_t kv : {4, 2, 1}) {
    for (int64_t t : {1, 17, 64, 100}) {
      for (bool causal : {true, false}) {
        const at::Tensor q = at::randn({2, 4, t, 16}), k = at::randn({2, kv, t, 16}), v = at::randn({2, kv, t, 16});
        const auto f = kiln::ops::flash_attention_forward(q, k, v, {.causal = causal, .block_q = 16, .block_k = 24});
        CAPTURE(kv, t, causal);
        CHECK(max_abs_diff(f.out, composition(q, k, v, causal)) < 2e-6);
        CHECK(max_abs_diff(f.lse, at::logsumexp(scores(q, k, causal, {}), -1)) < 2e-5);
      }
    }
  }
  // More keys than queries (decoding against a cache): bottom-right causal alignment.
  const at::Tensor q = at::randn({1, 4, 5, 8}), k = at::randn({1, 2, 23, 8}), v = at::randn({1, 2, 23, 8});
  CHECK(max_abs_diff(kiln::ops::flash_attention_forward(q, k, v, {.block_q = 4, .block_k = 8}).out,
                     composition(q, k, v, true)) < 2e-6);
}

TEST_CASE("segment masks keep packed documents apart", "[ops][flash]") {
  const at::Tensor q = at::randn({2, 4, 50, 16}), k = at::randn({2, 2, 50, 16}), v = at::randn({2, 2, 50, 16});
  const at::Tensor seg = random_segments(2, 50);
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    const at::Tensor want = composition(q, k, v, causal, seg);
    const auto f = kiln::ops::flash_attention_forward(
        q, k, v, {.causal = causal, .segment_ids = seg, .block_q = 16, .block_k = 16});
    CHECK(max_abs_diff(f.out, want) < 2e-6);
    // The ATen path of ops::attention applies the same mask.
    CHECK(max_abs_diff(kiln::ops::attention(q, k, v, {.causal = causal, .segment_ids = seg}), want) < 2e-6);
  }
}

TEST_CASE("blocked backward equals autograd through the composition", "[ops][flash]") {
  for (int64_t kv : {4, 1}) {
    for (bool with_segments : {false, true}) {
      const at::Tensor q = at::randn({2, 4, 37, 8}, at::kDouble).requires_grad_();
      const at::Tensor k = at::randn({2, kv, 37, 8}, at::kDouble).requires_grad_();
      const at::Tensor v = at::randn({2, kv, 37, 8}, at::kDouble).requires_grad_();
      const at::Tensor seg = with_segments ? random_segments(2, 37) : at::Tensor();
      const at::Tensor w = at::randn({2, 4, 37, 8}, at::kDouble);
      const FlashAttentionParams p{.causal = true, .segment_ids = seg, .block_q = 8, .block_k = 12};
      const auto got = torch::autograd::grad({(kiln::ops::flash_attention(q, k, v, p) * w).sum()}, {q, k, v});
      const auto want = torch::autograd::grad({(composition(q, k, v, true, seg) * w).sum()}, {q, k, v});
      CAPTURE(kv, with_segments);
      for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(got[i], want[i]) < 1e-10);
    }
  }
}

TEST_CASE("blocked gradients match central finite differences", "[ops][flash]") {
  const at::Tensor q = at::randn({1, 2, 9, 4}, at::kDouble), k = at::randn({1, 1, 9, 4}, at::kDouble),
                   v = at::randn({1, 1, 9, 4}, at::kDouble), w = at::randn({1, 2, 9, 4}, at::kDouble);
  const FlashAttentionParams p{.block_q = 4, .block_k = 4};
  const auto fwd = kiln::ops::flash_attention_forward(q, k, v, p);
  const auto g = kiln::ops::flash_attention_backward(q, k, v, fwd, w, p);
  auto objective = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
    return (kiln::ops::flash_attention_forward(qq, kk, vv, p).out * w).sum().item<double>();
  };
  const double eps = 1e-6;
  for (int i = 0; i < 3; ++i) {
    const at::Tensor& x = i == 0 ? q : i == 1 ? k : v;
    const at::Tensor& gx = i == 0 ? g.dq : i == 1 ? g.dk : g.dv;
    for (int64_t j : {0L, 5L, 17L, x.numel() - 1}) {
      at::Tensor plus = x.clone(), minus = x.clone();
      plus.view({-1})[j] += eps;
      minus.view({-1})[j] -= eps;
      const double fd = (i == 0   ? objective(plus, k, v) - objective(minus, k, v)
                         : i == 1 ? objective(q, plus, v) - objective(q, minus, v)
                                  : objective(q, k, plus) - objective(q, k, minus)) /
                        (2 * eps);
      CAPTURE(i, j);
      CHECK(gx.view({-1})[j].item<double>() == Approx(fd).margin(1e-7));
    }
  }
}

TEST_CASE("flash-attention CUDA forward matches the fp32 reference", "[ops][flash][cuda]") {
  REQUIRE(torch::cuda::is_available());
  at::NoGradGuard no_grad;
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (int64_t d : {64, 128}) {
      for (int64_t group : {1, 4, 8}) {
        for (int64_t t : {1, 17, 128, 1000, 4096}) {
          const int64_t hkv = 2, hq = hkv * group, b = t > 1000 ? 1 : 2;
          const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
          const at::Tensor q32 = at::randn({b, hq, t, d}, opts), k32 = at::randn({b, hkv, t, d}, opts),
                           v32 = at::randn({b, hkv, t, d}, opts);
          const at::Tensor q = q32.to(dtype), k = k32.to(dtype), v = v32.to(dtype);
          kiln::ops::set_backend(kiln::ops::Backend::kAten);
          const auto ref = kiln::ops::flash_attention_forward(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), {});
          const at::Tensor same_dtype = kiln::ops::attention(q, k, v);  // SDPA in `dtype`
          kiln::ops::set_backend(kiln::ops::Backend::kKiln);
          const auto got = kiln::ops::flash_attention_forward(q, k, v, {});
          CAPTURE(dtype, d, group, t);
          CHECK(got.out.scalar_type() == dtype);
          CHECK(max_abs_diff(got.out, ref.out) <= 2 * max_abs_diff(same_dtype, ref.out) + 1e-3);
          CHECK(max_abs_diff(got.lse, ref.lse) < 1e-2);
        }
      }
    }
  }
}

TEST_CASE("flash-attention gradients on CUDA match the fp32 reference", "[ops][flash][cuda]") {
  REQUIRE(torch::cuda::is_available());
  for (int64_t t : {17, 1000}) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    const at::Tensor q = at::randn({1, 8, t, 64}, opts).requires_grad_(),
                     k = at::randn({1, 2, t, 64}, opts).requires_grad_(),
                     v = at::randn({1, 2, t, 64}, opts).requires_grad_();
    const at::Tensor w = at::randn({1, 8, t, 64}, opts);
    const auto got = torch::autograd::grad({(kiln::ops::flash_attention(q, k, v, {}) * w).sum()}, {q, k, v});
    const at::Tensor q32 = q.detach().to(at::kFloat).requires_grad_(), k32 = k.detach().to(at::kFloat).requires_grad_(),
                     v32 = v.detach().to(at::kFloat).requires_grad_();
    const auto ref =
        torch::autograd::grad({(kiln::ops::attention(q32, k32, v32) * w.to(at::kFloat)).sum()}, {q32, k32, v32});
    const auto same = torch::autograd::grad({(kiln::ops::attention(q, k, v) * w).sum()}, {q, k, v});
    CAPTURE(t);
    for (size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(got[i], ref[i]) <= 2 * max_abs_diff(same[i], ref[i]) + 1e-2);
  }
}
