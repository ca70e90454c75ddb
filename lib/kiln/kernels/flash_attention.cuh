// Flash-attention forward launcher (FlashAttention-2 algorithm, ops/flash_attention.h documents
// it): tensor-core tiles (WMMA bf16/fp16 -> fp32), online softmax, no T x S matrix in memory,
// writes the output and the log-sum-exp for the backward pass. Torch-free.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct FlashFwdParams {
  const void* q = nullptr;  // [B, Hq, T, D] contiguous
  const void* k = nullptr;  // [B, Hkv, S, D] contiguous
  const void* v = nullptr;  // [B, Hkv, S, D] contiguous
  void* out = nullptr;      // [B, Hq, T, D] contiguous
  float* lse = nullptr;     // [B, Hq, T]
  int batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 0;
  bool causal = true;              // bottom-right aligned: query i sees keys <= seq_k - seq_q + i
  DType dtype = DType::kBFloat16;  // bf16 or fp16 (fp32 is not supported by the tensor-core path)
};

// True when the kernel handles these parameters (dtype bf16/fp16, head_dim 64 or 128).
bool flash_fwd_supported(const FlashFwdParams& params);

void launch_flash_fwd(const FlashFwdParams& params, Stream stream);

}  // namespace kiln::kernels
