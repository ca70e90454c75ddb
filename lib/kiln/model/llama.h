// The LLaMA decoder on the LibTorch C++ frontend, single-device code only: parallelism,
// activation checkpointing and kernel choice are applied from outside (docs/architecture.md).
//
// Parameter names equal Hugging Face's LlamaForCausalLM state-dict keys
// ("model.layers.0.self_attn.q_proj.weight", ...), so HF weights map one to one. Modules create
// their parameters with caller-given TensorOptions: build on the meta device to count or plan
// without allocating, or directly on a GPU in bf16.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include "kiln/model/llama_config.h"

namespace kiln::model {

// y = x W^T (+ b). Weight [out, in] as in HF.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // [..., in] -> [..., out]
  at::Tensor weight;                        // [out, in]
  at::Tensor bias;                          // [out] or undefined
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids);  // [B, T] int64 -> [B, T, dim]
  at::Tensor weight;                          // [num_embeddings, dim]
};
TORCH_MODULE(Embedding);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // [..., dim]
  at::Tensor weight;                        // [dim], initialised to ones
  double eps;
};
TORCH_MODULE(RMSNorm);

// Keys and values of the positions already processed, per layer, for incremental decoding.
struct KVCache {
  std::vector<at::Tensor> keys, values;  // per layer [B, Hkv, S, D]
  int64_t length = 0;                    // S: positions cached
};

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& config, const at::TensorOptions& options);
  // x: [B, T, H]; cos, sin: [B, T, head_dim]. Returns [B, T, H]. With `cache_k/cache_v`, the new
  // keys and values are appended to them and attention covers the cached positions too.
  // segment_ids: [B, T] document index per position (packed rows), or undefined: positions
  // attend only within their document.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor* cache_k = nullptr,
                     at::Tensor* cache_v = nullptr, const at::Tensor& segment_ids = {});
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t num_heads, num_kv_heads, head_dim;
};
TORCH_MODULE(LlamaAttention);

// SwiGLU: down(silu(gate(x)) * up(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x);  // [B, T, H] -> [B, T, H]
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)).
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,  // [B, T, H]
                     at::Tensor* cache_k = nullptr, at::Tensor* cache_v = nullptr, const at::Tensor& segment_ids = {});
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// How a decoder layer is run. Empty = a plain call; the trainer installs activation
// checkpointing here (train/activation_checkpoint.h), keeping the model single-device code.
using LayerRunner = std::function<at::Tensor(LlamaDecoderLayerImpl& layer, const at::Tensor& x, const at::Tensor& cos,
                                             const at::Tensor& sin, const at::Tensor& segment_ids)>;

// Embedding, decoder layers and final norm ("model." in HF names).
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& config, const at::TensorOptions& options);
  // input_ids, position_ids: [B, T] int64. Returns the final hidden states [B, T, H]. With a
  // cache, the tokens continue the cached positions and the cache is extended. segment_ids: see
  // LlamaAttentionImpl::forward (not with a cache).
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids, KVCache* cache = nullptr,
                     const at::Tensor& segment_ids = {});
  Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  at::Tensor inv_freq;       // [head_dim / 2] fp32, a buffer (not saved in HF checkpoints)
  LayerRunner layer_runner;  // used for training passes without a KV cache
};
TORCH_MODULE(LlamaModel);

struct CausalLMOutput {
  at::Tensor logits;      // [B, T, V] in the model's dtype; undefined when the loss was fused
  at::Tensor loss;        // mean next-token loss over targets != -100 (fp32 scalar), if labels given
  at::Tensor loss_sum;    // the sum behind `loss`, for accumulation across micro-batches
  at::Tensor num_tokens;  // count of targets behind `loss` (int64 scalar)
};

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(LlamaConfig config, const at::TensorOptions& options = {});

  // input_ids: [B, T] int64; labels: [B, T] int64 with -100 = ignore, aligned with input_ids
  // (the model shifts: logits at t predict labels at t + 1, as in HF); position_ids: [B, T],
  // default 0..T-1. segment_ids: [B, T] integer document index of each position in a packed row
  // ("neat packing"): attention stays within a document and the default positions restart at 0
  // at each document, so each document is computed as if it were alone. Labels are not changed:
  // the data loader marks a document's first token -100 (data/loader.h).
  // loss_sum_grad: with fused_lm_loss, the gradient backward will send to `loss_sum` (0-d, on the
  // device: the trainer's loss_scale / total_targets), so that a bf16/fp16 head rounds its scaled
  // gradient as autograd through the full logits would (ops::LinearCrossEntropyOptions::expected_grad).
  // Undefined: not known. Any other backward stays correct; only the rounding differs.
  CausalLMOutput forward(const at::Tensor& input_ids, const at::Tensor& labels = {},
                         const at::Tensor& position_ids = {}, const at::Tensor& segment_ids = {},
                         const at::Tensor& loss_sum_grad = {});

  // Positions restarting at 0 where the segment id changes: [B, T] int64.
  static at::Tensor document_positions(const at::Tensor& segment_ids);

  // Incremental decoding: logits [B, T, V] of input_ids [B, T] placed after the cache.length
  // positions already in `cache`, which is extended by T.
  at::Tensor forward_cached(const at::Tensor& input_ids, KVCache& cache);

  // HF-style initialisation: Linear and Embedding weights ~ N(0, initializer_range), biases 0,
  // norm weights 1. Values are drawn on the CPU in fp32 from `seed` and copied, so the same seed
  // gives the same model on every device and dtype. No-op on the meta device.
  void init_weights(uint64_t seed);

  int64_t num_parameters() const;  // trainable, counting a tied weight once
  const LlamaConfig& config() const { return config_; }

  LlamaModel model{nullptr};
  Linear lm_head{nullptr};  // null when tie_word_embeddings (logits use embed_tokens.weight)
  // When set, forward() with labels computes the loss with ops::linear_cross_entropy (chunked,
  // never holding all logits) and leaves `logits` undefined. Off by default so that callers that
  // want logits (kiln-hf, generation, tests) get them; the trainer turns it on.
  bool fused_lm_loss = false;

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaForCausalLM);

// Mean cross-entropy of next-token prediction: logits[:, t] scored against labels[:, t + 1],
// in fp32 (fp64 for an fp64 model), ignoring -100. Fills loss, loss_sum and num_tokens of `out`.
void causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, CausalLMOutput& out);

}  // namespace kiln::model
