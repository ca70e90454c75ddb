#include "kiln/cost/flops.h"

namespace kiln::cost {

FlopsPerToken flops_per_token(const model::LlamaConfig& c, int64_t cutoff_len) {
  const double h = static_cast<double>(c.hidden_size), d = static_cast<double>(c.resolved_head_dim());
  const double q = static_cast<double>(c.num_attention_heads) * d, kv = static_cast<double>(c.kv_heads()) * d;
  const double ffn = static_cast<double>(c.intermediate_size), layers = static_cast<double>(c.num_hidden_layers);
  FlopsPerToken f;
  f.matmul_forward =
      2.0 * (layers * (h * q + 2 * h * kv + q * h + 3 * h * ffn) + static_cast<double>(c.vocab_size) * h);
  f.attention_forward = 4.0 * layers * q * (static_cast<double>(cutoff_len) + 1.0) / 2.0;
  f.elementwise_recompute = layers * (2.0 * 4.0 * h + 5.0 * ffn);
  return f;
}

double six_n_per_token(const model::LlamaConfig& c) {
  return 6.0 * static_cast<double>(c.num_parameters());
}

}  // namespace kiln::cost
