// Autoregressive sampling with a KV cache: greedy, temperature, top-k and top-p (nucleus) with
// Hugging Face's semantics (top-p keeps the smallest set of tokens whose probability reaches p,
// always at least one), for kiln-generate and for looking at what a checkpoint learned.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/model/llama.h"

namespace kiln::model {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  bool greedy = false;        // argmax; the sampling settings below are ignored
  double temperature = 1.0;   // > 0
  int64_t top_k = 0;          // 0 = off
  double top_p = 1.0;         // 1 = off
  int64_t eos_token_id = -1;  // stop after emitting it; -1 = never
  uint64_t seed = 0;
  // Only ids below this are ever produced (the tokenizer's vocabulary, when the model's embedding
  // has more rows, e.g. padded to a multiple of 64); 0 = the model's whole vocabulary.
  int64_t vocab_limit = 0;
};

// Returns the new tokens only (not the prompt). The prompt must be non-empty and its ids below the
// model's vocab_size; max_new_tokens must be >= 0 (std::invalid_argument otherwise).
std::vector<int64_t> generate(LlamaForCausalLM& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& options);

// The filtered next-token distribution that generate() samples from: logits [V] -> probs [V].
at::Tensor sampling_distribution(const at::Tensor& logits, const GenerateOptions& options);

}  // namespace kiln::model
