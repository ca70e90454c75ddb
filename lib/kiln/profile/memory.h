// First-order memory model of a training step, per component, so a run (kiln-pretrain
// --dry-run) and the profile report can say where the bytes go before anything is allocated.
//
//   parameters        N * 4              fp32 master weights (bf16/fp16 runs compute via autocast)
//   gradients         N * 4
//   optimizer         N * 8              AdamW exp_avg + exp_avg_sq
//   activations       B * T * L * H * a  a = bytes kept per layer per token per hidden unit for
//                                        backward (Korthikanti et al. 2022, without the T x T
//                                        score matrix: SDPA/flash keeps only the log-sum-exp)
//                   + B * T * L * F * f  the MLP's gate/up/activation tensors
//   logits            B * T * V * (c + 8)  logits in the compute dtype, their fp32 upcast and its
//                                        gradient (the unfused loss)
// The coefficients are documented in docs/performance.md; kiln-profile compares this model
// with measured peaks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/model/llama_config.h"

namespace kiln::profile {

struct MemoryEstimate {
  std::vector<std::pair<std::string, double>> components;  // (name, bytes)
  double total() const;
};

// `compute_bytes`: 2 for bf16/fp16 autocast, 4 for fp32. With activation checkpointing only each
// layer's fp32 input is kept, plus one layer's activations while it is recomputed.
MemoryEstimate estimate_training_memory(const model::LlamaConfig& config, int64_t batch, int64_t seq_len,
                                        int compute_bytes, bool activation_checkpointing = false);

}  // namespace kiln::profile
