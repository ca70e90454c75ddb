// ops::attention: the single entry point for scaled dot-product attention in kiln.
//
// On CUDA with bf16/fp16 (or autocast to them), head_dim 64/128 and sm_80+, kiln's flash-attention
// kernels run (ops/flash_attention.h), unless the `attention` op's backend is aten. Otherwise, and
// on CPU: at::scaled_dot_product_attention with enable_gqa, so grouped-query attention never
// repeats K/V in memory. The choice is logged once per dtype/head_dim/device (spdlog, info).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace kiln::ops {

struct AttentionOptions {
  bool causal = true;
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  at::Tensor segment_ids;       // [B, T] document index per position (packed rows); optional, S == T
};

// q: [B, Hq, T, D]; k, v: [B, Hkv, S, D] with Hkv dividing Hq. Returns [B, Hq, T, D].
// Causal masking aligns the last query with the last key: with S > T (a KV cache) query i sees
// keys 0 .. S - T + i.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options = {});

}  // namespace kiln::ops
