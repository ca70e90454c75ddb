// Analytic FLOPs of a LLaMA training step (docs/performance.md derives each term).
//
// Per token, forward:
//   matmuls   2 * (L * (H*q + 2*H*kv + q*H + 3*H*F) + V*H)      (q = heads*d, kv = kv_heads*d;
//                                                               the LM head counts, the embedding
//                                                               lookup does not)
//   attention 2 * 2 * L * heads * d * (T + 1) / 2               (QK^T and PV, causal: a query at
//                                                               position t sees t + 1 keys)
// Training = forward x 3 (backward is twice the forward), x 4 with full activation recomputation.
// The "6 N" rule of thumb (N = parameters) is kept beside it for comparison with users' own
// estimates (configs/reference/llamafactory_runs.yaml).
#pragma once

#include <cstdint>

#include "kiln/model/llama_config.h"

namespace kiln::cost {

struct FlopsPerToken {
  double matmul_forward = 0;
  double attention_forward = 0;
  double forward() const { return matmul_forward + attention_forward; }
  // Model FLOPs of one trained token (forward + backward); recomputation is not model work, so
  // MFU uses recompute = false and hardware FLOPs use true.
  double train(bool recompute = false) const { return forward() * (recompute ? 4.0 : 3.0); }
  // Hardware FLOPs when a fraction of the decoder layers runs its forward twice (every_n
  // recomputation: ceil(L / n) / L); counted on the whole forward, a slight overestimate.
  double train_recomputing(double fraction) const { return forward() * (3.0 + fraction); }
  // Selective recomputation reruns no matmul, only the element-wise prologues: per layer two
  // RMSNorms (square, mean, scale by 1/rms, by the weight: 4 H each) and SwiGLU (silu 4 F, the
  // product F). Tiny next to the matmuls (0.03% for llama-100m), counted so that the planner ranks
  // it just behind no recomputation.
  double elementwise_recompute = 0;
  double train_selective() const { return forward() * 3.0 + elementwise_recompute; }
};

FlopsPerToken flops_per_token(const model::LlamaConfig& config, int64_t cutoff_len);

// 6 * N per token, N = all trainable parameters (the usual hand estimate).
double six_n_per_token(const model::LlamaConfig& config);

}  // namespace kiln::cost
