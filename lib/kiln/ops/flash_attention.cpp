// See flash_attention.h. Shapes below: G = Hq / Hkv query heads per KV head; a block of bq query
// positions of all G heads forms R = G * bq rows against one KV head.
#include "kiln/ops/flash_attention.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/ops/dispatch.h"

namespace kiln::ops {

namespace {

struct Shape {
  int64_t b, hq, hkv, g, t, s, d;
};

Shape check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashAttentionParams& p) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes(),
              "flash_attention: q [B, Hq, T, D] and k, v [B, Hkv, S, D] expected, got ", q.sizes(), ", ", k.sizes(),
              ", ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "flash_attention: batch or head_dim differ");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "flash_attention: KV heads (", k.size(1),
              ") must divide query heads (", q.size(1), ")");
  TORCH_CHECK(!p.causal || q.size(2) <= k.size(2), "flash_attention: causal with more queries than keys");
  TORCH_CHECK(p.block_q > 0 && p.block_k > 0, "flash_attention: block sizes must be positive");
  if (p.segment_ids.defined()) {
    TORCH_CHECK(p.segment_ids.dim() == 2 && p.segment_ids.size(0) == q.size(0) && p.segment_ids.size(1) == q.size(2) &&
                    q.size(2) == k.size(2),
                "flash_attention: segment_ids must be [B, T] with S == T, got ", p.segment_ids.sizes());
  }
  return {q.size(0), q.size(1), k.size(1), q.size(1) / k.size(1), q.size(2), k.size(2), q.size(3)};
}

double scale_of(const FlashAttentionParams& p, int64_t d) {
  return p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(d));
}

// Scores of query rows [t0, t0 + bq) (all G heads) against keys [s0, s0 + bk), masked with -inf.
at::Tensor tile_scores(const at::Tensor& q5, const at::Tensor& k, const Shape& sh, const FlashAttentionParams& p,
                       double scale, int64_t t0, int64_t bq, int64_t s0, int64_t bk, at::ScalarType acc) {
  const at::Tensor qb = q5.narrow(3, t0, bq).reshape({sh.b, sh.hkv, sh.g * bq, sh.d}).to(acc);
  const at::Tensor kb = k.narrow(2, s0, bk).to(acc);
  at::Tensor s = at::matmul(qb, kb.transpose(-1, -2)) * scale;  // [B, Hkv, R, bk]
  const auto idx = at::TensorOptions().device(q5.device()).dtype(at::kLong);
  const at::Tensor q_pos = (at::arange(t0, t0 + bq, idx) + (sh.s - sh.t)).repeat({sh.g});  // [R]
  const at::Tensor k_pos = at::arange(s0, s0 + bk, idx);
  at::Tensor masked;
  if (p.causal) masked = k_pos.unsqueeze(0) > q_pos.unsqueeze(1);  // [R, bk]
  if (p.segment_ids.defined()) {
    const at::Tensor sq = p.segment_ids.narrow(1, t0, bq).repeat({1, sh.g});     // [B, R]
    const at::Tensor sk = p.segment_ids.narrow(1, s0, bk);                       // [B, bk]
    const at::Tensor other = (sq.unsqueeze(2) != sk.unsqueeze(1)).unsqueeze(1);  // [B, 1, R, bk]
    masked = masked.defined() ? masked.logical_or(other) : other;
  }
  if (masked.defined()) s = s.masked_fill(masked, -std::numeric_limits<double>::infinity());
  return s;
}

// Causal: the first key block that no query of [t0, t0 + bq) can see is skipped entirely.
int64_t key_limit(const Shape& sh, const FlashAttentionParams& p, int64_t t0, int64_t bq) {
  return p.causal ? std::min(sh.s, t0 + bq + (sh.s - sh.t)) : sh.s;
}

}  // namespace

#ifdef KILN_WITH_CUDA
// ops/flash_attention_cuda.cpp
bool flash_cuda_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const FlashAttentionParams& params);
FlashForward flash_forward_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const FlashAttentionParams& params, double scale);
FlashGrads flash_backward_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashForward& fwd,
                               const at::Tensor& dout, const FlashAttentionParams& params, double scale,
                               bool deterministic);
#endif

bool flash_attention_kernel_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const FlashAttentionParams& params) {
#ifdef KILN_WITH_CUDA
  return flash_cuda_applies(q, k, v, params);
#else
  (void)q, (void)k, (void)v, (void)params;
  return false;
#endif
}

namespace {
bool use_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashAttentionParams& p) {
  return backend(Op::kAttention) == Backend::kKiln && flash_attention_kernel_applies(q, k, v, p);
}
}  // namespace

namespace {
// `kernel`: the CUDA kernels (use_kernel's answer), else the blocked ATen reference.
FlashForward forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashAttentionParams& p,
                          bool kernel) {
  const Shape sh = check(q, k, v, p);
  const double scale = scale_of(p, sh.d);
#ifdef KILN_WITH_CUDA
  if (kernel) return flash_forward_cuda(q, k, v, p, scale);
#else
  (void)kernel;
#endif
  const at::ScalarType acc = at::promote_types(q.scalar_type(), at::kFloat);
  const at::Tensor q5 = q.view({sh.b, sh.hkv, sh.g, sh.t, sh.d});
  at::Tensor out = at::empty({sh.b, sh.hkv, sh.g, sh.t, sh.d}, q.options());
  at::Tensor lse = at::empty({sh.b, sh.hkv, sh.g, sh.t}, q.options().dtype(acc));
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t t0 = 0; t0 < sh.t; t0 += p.block_q) {
    const int64_t bq = std::min(p.block_q, sh.t - t0), rows = sh.g * bq;
    at::Tensor m = at::full({sh.b, sh.hkv, rows, 1}, -inf, q.options().dtype(acc));
    at::Tensor l = at::zeros({sh.b, sh.hkv, rows, 1}, q.options().dtype(acc));
    at::Tensor o = at::zeros({sh.b, sh.hkv, rows, sh.d}, q.options().dtype(acc));
    for (int64_t s0 = 0; s0 < key_limit(sh, p, t0, bq); s0 += p.block_k) {
      const int64_t bk = std::min(p.block_k, sh.s - s0);
      const at::Tensor s = tile_scores(q5, k, sh, p, scale, t0, bq, s0, bk, acc);
      const at::Tensor m_new = at::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));
      const at::Tensor m_safe = at::where(m_new == -inf, at::zeros_like(m_new), m_new);  // rows with no key yet
      const at::Tensor probs = at::exp(s - m_safe);
      const at::Tensor alpha = at::exp(m - m_safe);
      l = l * alpha + probs.sum(-1, /*keepdim=*/true);
      o = o * alpha + at::matmul(probs, v.narrow(2, s0, bk).to(acc));
      m = m_new;
    }
    out.narrow(3, t0, bq).copy_((o / l).view({sh.b, sh.hkv, sh.g, bq, sh.d}));
    lse.narrow(3, t0, bq).copy_((m + at::log(l)).view({sh.b, sh.hkv, sh.g, bq}));
  }
  return {out.view({sh.b, sh.hq, sh.t, sh.d}), lse.view({sh.b, sh.hq, sh.t})};
}

FlashGrads backward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashForward& fwd,
                         const at::Tensor& dout, const FlashAttentionParams& p, bool kernel) {
  const Shape sh = check(q, k, v, p);
  const double scale = scale_of(p, sh.d);
#ifdef KILN_WITH_CUDA
  if (kernel) {
    return flash_backward_cuda(q, k, v, fwd, dout, p, scale,
                               p.deterministic || at::globalContext().deterministicAlgorithms());
  }
#else
  (void)kernel;
#endif
  const at::ScalarType acc = at::promote_types(q.scalar_type(), at::kFloat);
  const at::Tensor q5 = q.view({sh.b, sh.hkv, sh.g, sh.t, sh.d});
  const at::Tensor do5 = dout.reshape({sh.b, sh.hkv, sh.g, sh.t, sh.d});
  const at::Tensor lse5 = fwd.lse.view({sh.b, sh.hkv, sh.g, sh.t});
  const at::Tensor delta5 = (dout.to(acc) * fwd.out.to(acc)).sum(-1).view({sh.b, sh.hkv, sh.g, sh.t});  // D
  at::Tensor dq = at::zeros({sh.b, sh.hkv, sh.g, sh.t, sh.d}, q.options().dtype(acc));
  at::Tensor dk = at::zeros({sh.b, sh.hkv, sh.s, sh.d}, q.options().dtype(acc));
  at::Tensor dv = at::zeros({sh.b, sh.hkv, sh.s, sh.d}, q.options().dtype(acc));
  for (int64_t t0 = 0; t0 < sh.t; t0 += p.block_q) {
    const int64_t bq = std::min(p.block_q, sh.t - t0), rows = sh.g * bq;
    const at::Tensor qb = q5.narrow(3, t0, bq).reshape({sh.b, sh.hkv, rows, sh.d}).to(acc);
    const at::Tensor dob = do5.narrow(3, t0, bq).reshape({sh.b, sh.hkv, rows, sh.d}).to(acc);
    const at::Tensor lse_b = lse5.narrow(3, t0, bq).reshape({sh.b, sh.hkv, rows, 1});
    const at::Tensor delta_b = delta5.narrow(3, t0, bq).reshape({sh.b, sh.hkv, rows, 1});
    at::Tensor dq_b = at::zeros({sh.b, sh.hkv, rows, sh.d}, q.options().dtype(acc));
    for (int64_t s0 = 0; s0 < key_limit(sh, p, t0, bq); s0 += p.block_k) {
      const int64_t bk = std::min(p.block_k, sh.s - s0);
      const at::Tensor probs =
          at::exp(tile_scores(q5, k, sh, p, scale, t0, bq, s0, bk, acc) - lse_b);  // [B, Hkv, R, bk]
      const at::Tensor kb = k.narrow(2, s0, bk).to(acc), vb = v.narrow(2, s0, bk).to(acc);
      dv.narrow(2, s0, bk).add_(at::matmul(probs.transpose(-1, -2), dob));
      const at::Tensor ds = probs * (at::matmul(dob, vb.transpose(-1, -2)) - delta_b);
      dq_b.add_(at::matmul(ds, kb), scale);
      dk.narrow(2, s0, bk).add_(at::matmul(ds.transpose(-1, -2), qb), scale);
    }
    dq.narrow(3, t0, bq).copy_(dq_b.view({sh.b, sh.hkv, sh.g, bq, sh.d}));
  }
  return {dq.view({sh.b, sh.hq, sh.t, sh.d}).to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}
}  // namespace

FlashForward flash_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const FlashAttentionParams& p) {
  return forward_impl(q, k, v, p, use_kernel(q, k, v, p));
}

FlashGrads flash_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const FlashForward& fwd, const at::Tensor& dout, const FlashAttentionParams& p) {
  return backward_impl(q, k, v, fwd, dout, p, use_kernel(q, k, v, p));
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FlashAttentionFunction : public torch::autograd::Function<FlashAttentionFunction> {
  // segment_ids travels as an optional non-differentiable argument: autograd rejects undefined
  // tensors among a Function's inputs.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            std::optional<at::Tensor> segment_ids, double scale, bool causal, int64_t block_q,
                            int64_t block_k, bool deterministic) {
    const FlashAttentionParams p{scale, causal, segment_ids.value_or(at::Tensor()), block_q, block_k, deterministic};
    // Decided here, where the caller's BackendScope holds: backward follows it (autograd may run
    // backward on its device thread, which sees only the process-wide setting).
    const bool kernel = use_kernel(q, k, v, p);
    FlashForward f = forward_impl(q, k, v, p, kernel);
    ctx->saved_data["kernel"] = kernel;
    ctx->save_for_backward({q, k, v, f.out, f.lse});
    ctx->saved_data["segment_ids"] = segment_ids;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    ctx->saved_data["deterministic"] = deterministic;
    return f.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const c10::IValue& seg = ctx->saved_data["segment_ids"];
    const FlashAttentionParams p{ctx->saved_data["scale"].toDouble(),
                                 ctx->saved_data["causal"].toBool(),
                                 seg.isTensor() ? seg.toTensor() : at::Tensor(),
                                 ctx->saved_data["block_q"].toInt(),
                                 ctx->saved_data["block_k"].toInt(),
                                 ctx->saved_data["deterministic"].toBool()};
    const FlashGrads g = backward_impl(s[0], s[1], s[2], {s[3], s[4]}, grads[0], p, ctx->saved_data["kernel"].toBool());
    return {g.dq, g.dk, g.dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const FlashAttentionParams& params) {
  const std::optional<at::Tensor> segments =
      params.segment_ids.defined() ? std::optional<at::Tensor>(params.segment_ids) : std::nullopt;
  return FlashAttentionFunction::apply(q, k, v, segments, params.scale, params.causal, params.block_q, params.block_k,
                                       params.deterministic);
}

}  // namespace kiln::ops
