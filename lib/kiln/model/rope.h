// RoPE frequencies and the cos/sin tables of a LlamaConfig, computed in fp32 with the same
// operations as transformers' LlamaRotaryEmbedding (default and "llama3" scaling), so that
// logits match it to rounding.
#pragma once

#include <ATen/core/Tensor.h>

#include "kiln/model/llama_config.h"

namespace kiln::model {

// Inverse frequencies, [head_dim / 2] fp32 on CPU: theta^(-2i/D), then llama3 scaling if set.
at::Tensor rope_inv_freq(const LlamaConfig& config);

struct RopeTables {
  at::Tensor cos;  // [B, T, D] in `dtype`
  at::Tensor sin;  // [B, T, D]
};

// position_ids: [B, T] integer positions; inv_freq on the positions' device.
RopeTables rope_cos_sin(const at::Tensor& inv_freq, const at::Tensor& position_ids, at::ScalarType dtype);

}  // namespace kiln::model
