#include "kiln/profile/memory.h"

namespace kiln::profile {

double MemoryEstimate::total() const {
  double t = 0;
  for (const auto& [name, bytes] : components) t += bytes;
  return t;
}

MemoryEstimate estimate_training_memory(const model::LlamaConfig& c, int64_t batch, int64_t seq_len, int compute_bytes,
                                        bool activation_checkpointing) {
  const double n = static_cast<double>(c.num_parameters());
  const double tokens = static_cast<double>(batch * seq_len);
  const double layers = static_cast<double>(c.num_hidden_layers), h = static_cast<double>(c.hidden_size);
  const double ffn = static_cast<double>(c.intermediate_size), vocab = static_cast<double>(c.vocab_size);
  const double cb = compute_bytes;
  // Per layer per token: the fp32 residual inputs of both norms and their fp32 normalised values
  // (4 x 4H), the compute-dtype copies of the attention and MLP inputs and the q, k, v, attention
  // output (about 6 x cb x H), then gate, up and silu(gate) in the compute dtype (3 x cb x F).
  const double per_hidden = 16.0 + 6.0 * cb;
  const double per_ffn = 3.0 * cb;
  MemoryEstimate e;
  e.components = {
      {"parameters (fp32)", 4 * n},
      {"gradients (fp32)", 4 * n},
      {"optimizer (AdamW, fp32)", 8 * n},
      {"activations", activation_checkpointing ? tokens * (layers * 4.0 * h + h * per_hidden + ffn * per_ffn)
                                               : tokens * layers * (h * per_hidden + ffn * per_ffn)},
      {"logits and loss", tokens * vocab * (cb + 8.0)},
  };
  return e;
}

}  // namespace kiln::profile
