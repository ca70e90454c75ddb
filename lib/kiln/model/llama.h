// The LLaMA decoder on the LibTorch C++ frontend, single-device code only: parallelism,
// recomputation (HF's gradient_checkpointing) and kernel choice are applied from outside
// (docs/architecture.md). The decoder layer is a sequence of named sub-blocks that a
// recomputation policy can wrap (train/recompute_layers.h), so the layer is written once.
//
// Parameter names equal Hugging Face's LlamaForCausalLM state-dict keys
// ("model.layers.0.self_attn.q_proj.weight", ...), so HF weights map one to one. Modules create
// their parameters with caller-given TensorOptions: build on the meta device to count or plan
// without allocating, or directly on a GPU in bf16.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
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

  // For a recomputation that keeps this projection's output but not its input (selective,
  // train/recompute_layers.h): the weight as forward's matmul reads it (under autocast its
  // cast, through autocast's cache, so the copy is shared with the rest of the step; else itself),
  // and the gradients of forward(x) for `dy` formed from x and that weight (`wc`) as the matmul
  // read them (compute dtype), without running the matmul again: dW = dY^T x and db = sum dY in
  // the parameters' dtypes, dx = dY W in the compute dtype, with ops::linear's CPU GEMM rule
  // (ops::mm), so they equal those of forward's own backward.
  struct Grads {
    at::Tensor input, weight, bias;
  };
  at::Tensor compute_weight() const;
  Grads gradients(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& wc) const;

  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out] or undefined
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
  // The part between the projections: q, k, v as q_proj/k_proj/v_proj return them ([B, T, heads *
  // head_dim], fresh: RoPE rotates q and k in place); cos, sin: [B, T, head_dim]. Returns the
  // causal attention's output [B, Hq, T, D] (o_proj's input once the heads are merged). With
  // `cache_k/cache_v`, the new keys and values are appended to them and attention covers the
  // cached positions too. segment_ids: [B, T] document index per position (packed rows), or
  // undefined: positions attend only within their document.
  at::Tensor core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                  const at::Tensor& sin, at::Tensor* cache_k = nullptr, at::Tensor* cache_v = nullptr,
                  const at::Tensor& segment_ids = {});
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t num_heads, num_kv_heads, head_dim;
};
TORCH_MODULE(LlamaAttention);

// SwiGLU's projections: down(silu(gate(x)) * up(x)), run by the decoder layer's sub-blocks.
class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& config, const at::TensorOptions& options);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// A sub-block of the decoder layer that ends in matmuls: a prologue that holds none (an RMSNorm,
// SwiGLU, the merge of the attention heads) whose output p feeds one or more projections; returns
// p W_i^T + b_i per projection. Not a module of its own: it runs modules of the layer, whose
// parameter names stay HF's. A recomputation policy wraps it from outside through `runner`
// (train/recompute_layers.h: selective keeps the projections' outputs and recomputes the
// prologue in backward); the prologue takes its parameters as arguments so that a wrapper can
// run it on copies of them.
struct ProjectionBlock {
  using Prologue =
      std::function<at::Tensor(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params)>;
  using Runner = std::function<std::vector<at::Tensor>(ProjectionBlock& block, const std::vector<at::Tensor>& inputs)>;
  using Params = std::function<std::vector<at::Tensor>()>;

  ProjectionBlock() = default;
  ProjectionBlock(const char* scope, const char* prologue_scope, Prologue prologue, Params params,
                  std::vector<std::pair<const char*, Linear>> projections);

  // runner(*this, inputs) when one is installed, else forward(inputs).
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs);
  // The block itself: the prologue in its profiler scope (or, without one, in the first
  // projection's), then each projection in its own.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs);

  // Profiler scopes (common/component_scope.h, named after the traffic model's rows): the whole
  // block run as one ("kiln::SwiGLU + down_proj"), the prologue's or nullptr, each projection's.
  const char* scope = nullptr;
  const char* prologue_scope = nullptr;
  Prologue prologue;
  Params params;  // the prologue's parameters (RMSNorm's weight); empty: none
  std::vector<std::pair<const char*, Linear>> projections;
  Runner runner;
};

// How a wrapped decoder layer runs instead of its forward (no KV cache): installed from outside
// (train/recompute_layers.h); empty = forward.
class LlamaDecoderLayerImpl;
using LayerRunner = std::function<at::Tensor(LlamaDecoderLayerImpl& layer, const at::Tensor& x, const at::Tensor& cos,
                                             const at::Tensor& sin, const at::Tensor& segment_ids)>;

// Pre-norm block, its forward the sub-blocks below in order and nothing else:
//   attention block  attention_in    input RMSNorm -> q_proj, k_proj, v_proj
//                    self_attn->core RoPE (q, k) -> (KV cache) -> causal attention
//                    attention_out   merge of the heads -> o_proj, then + x
//   MLP block        mlp_in          post-attention RMSNorm -> gate_proj, up_proj
//                    mlp_out         SwiGLU -> down_proj, then + h
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,  // [B, T, H]
                     at::Tensor* cache_k = nullptr, at::Tensor* cache_v = nullptr, const at::Tensor& segment_ids = {});
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  ProjectionBlock attention_in, attention_out, mlp_in, mlp_out;
  LayerRunner runner;  // used by LlamaModelImpl for training passes without a KV cache
};
TORCH_MODULE(LlamaDecoderLayer);

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
  at::Tensor inv_freq;  // [head_dim / 2] fp32, a buffer (not saved in HF checkpoints)
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

  // HF-style initialisation (transformers' PreTrainedModel._init_weights): Linear and Embedding
  // weights ~ N(0, initializer_range) (0.02 when it is 0, as `initializer_range or 0.02`), biases
  // 0, norm weights 1. The same distribution as transformers', not its numbers; unlike HF's
  // nn.Embedding(padding_idx=pad_token_id), no row is zeroed (kiln's config has no pad token).
  // Values are drawn on the CPU in fp32 from `seed` and copied, so the same seed gives the same
  // model on every device and dtype. No-op on the meta device.
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
