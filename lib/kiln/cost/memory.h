// Memory model of a training step, per component, so a run (kiln-pretrain --dry-run) and the
// profile report can say where the bytes go before anything is allocated. Calibrated against
// the counting CPU allocator (kiln-profile, tests/profile/test_memory.cpp); docs/performance.md
// derives every coefficient from what autograd saves per op.
//
// The step's peak is the larger of two moments, on top of the fp32 parameters (4 N) and AdamW
// moments (8 N) that live throughout:
//   forward/backward boundary  every saved activation, the LM head's logits and loss tensors,
//                              and autocast's low-precision weight copies (bf16/fp16)
//   end of backward            all fp32 gradients (4 N), plus the tied embedding's second
//                              gradient while its two contributions are summed
// Per token, per decoder layer (c = compute bytes: 2 under bf16/fp16 autocast, 4 in fp32):
//   16 H                  fp32 residual input, normalised values of both RMSNorms, the residual sum
//   c (2H + 3q + 2kv)     the norms' outputs cast for the projections, q/k/v as SDPA keeps them,
//                         its output and the o_proj input
//   4 c F                 gate, silu(gate), up and their product (SwiGLU)
// Selective recomputation (gradient_checkpointing_policy selective) keeps per layer only the
// fp32 residual input and the residual after attention (8 H), q/k/v and the attention output as
// the attention keeps them (c (2q + 2kv)) and gate and up (2 c F), whatever the kernels; plus
// c F once (the top layer's backward).
// Head per token: the final norm (4H + 4H + c H) and, per vocabulary entry, 10 bytes (fp32) or
// 16 bytes (bf16/fp16: logits, fp32 upcast, log-softmax, their gradients).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cost/run.h"
#include "kiln/model/llama_config.h"

namespace kiln::cost {

struct MemoryEstimate {
  std::vector<std::pair<std::string, double>> components;  // (name, bytes) at the peak
  std::string peak_phase;                                  // "forward/backward boundary" | "end of backward"
  // Extra the CUDA caching allocator reserves beyond allocated bytes (block rounding, cached
  // free blocks): a first-order allowance, not part of total(); 0 on the CPU.
  double allocator_overhead = 0;
  double total() const;
  double component(const std::string& name) const;  // 0 when absent
};

// The peak of one step of `run` (cost/run.h): its micro-batch and cutoff_len, dtype,
// recomputation, kernels, device and data parallelism.
MemoryEstimate estimate_training_memory(const model::LlamaConfig& config, const RunDescription& run);

}  // namespace kiln::cost
