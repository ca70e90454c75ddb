// The FlashAttention-2 algorithm written with ATen block operations: the CPU reference and the
// documentation of what kiln's CUDA flash-attention kernel computes (docs/kernels.md).
//
// Forward, per block of queries: stream over blocks of keys keeping a running row maximum m,
// running denominator l and unnormalised output; rescale by exp(m_old - m_new) when the maximum
// grows; at the end out = acc / l and the log-sum-exp lse = m + log(l) is saved. No T x S score
// matrix is ever held, only one [block_q x block_k] tile.
// Backward recomputes each tile's probabilities from q, k and the saved lse (p = exp(s - lse)),
// with D = rowsum(dout * out): dv += p^T dout, dp = dout v^T, ds = p * (dp - D), dq += ds k * scale,
// dk += ds^T q * scale. Grouped-query attention treats the G query heads sharing a KV head as G
// times more query rows of that head, so dk and dv come out summed over the group with no K/V
// repetition in memory.
//
// Masks: causal (bottom-right aligned: query i of T sees keys <= S - T + i) and, optionally,
// segment ids (documents packed into one row attend only within themselves).
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln::ops {

struct FlashAttentionParams {
  double scale = 0;  // 0 = 1/sqrt(head_dim)
  bool causal = true;
  at::Tensor segment_ids;  // [B, T] integer, optional (requires S == T)
  int64_t block_q = 64;    // tiles of the ATen reference (the CUDA kernels use 64 x 64)
  int64_t block_k = 64;
  // Bit-reproducible backward on the CUDA kernels (dq without atomics, about 1.4x the backward's
  // matmuls); also on whenever at::globalContext().deterministicAlgorithms() is. The ATen
  // reference is deterministic anyway.
  bool deterministic = false;
};

struct FlashForward {
  at::Tensor out;  // [B, Hq, T, D], the inputs' dtype
  at::Tensor lse;  // [B, Hq, T] fp32 (fp64 for fp64 inputs): log-sum-exp of the scaled scores
};

// q: [B, Hq, T, D]; k, v: [B, Hkv, S, D], Hkv dividing Hq. Accumulates in fp32 (fp64 for fp64).
// kiln's CUDA kernels (kernels/flash_attention.cu) compute forward and backward when
// flash_attention_kernel_applies() and backend(Op::kAttention) is kKiln; otherwise the blocked
// ATen reference below runs (any device, any dtype, any head_dim).
FlashForward flash_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const FlashAttentionParams& params);

// True when kiln's CUDA kernels handle these inputs: CUDA tensors of one dtype, bf16 or fp16,
// head_dim 64 or 128, compute capability >= 8.0, Hkv dividing Hq, S >= T when causal, S == T with
// segment ids. Ignores the backend setting.
bool flash_attention_kernel_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const FlashAttentionParams& params);

struct FlashGrads {
  at::Tensor dq, dk, dv;  // shapes of q, k, v
};

FlashGrads flash_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const FlashForward& forward, const at::Tensor& dout,
                                    const FlashAttentionParams& params);

// Differentiable: forward saves (q, k, v, out, lse); backward is flash_attention_backward.
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const FlashAttentionParams& params);

}  // namespace kiln::ops
