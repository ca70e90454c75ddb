// LLaMA modules. The arithmetic follows transformers' modeling_llama.py step for step (RMSNorm
// in fp32, RoPE tables in fp32 cast to the compute dtype, loss in fp32) because HF logits are the
// golden reference for this code (tests/python/test_hf_parity.py).
#include "kiln/model/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <unistd.h>
#include <optional>
#include <tuple>

#include "kiln/common/component_scope.h"
#include "kiln/common/format.h"

#include "kiln/model/rope.h"
#include "kiln/ops/attention.h"
#include "kiln/ops/autocast_off.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/ops/rope.h"
#include "kiln/ops/swiglu.h"

namespace kiln::model {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool bias, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (bias) this->bias = register_parameter("bias", at::empty({out_features}, options));
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  return ops::linear(x, weight, bias);
}

at::Tensor LinearImpl::compute_weight() const {
  const at::DeviceType device = weight.device().type();
  if (!at::autocast::is_autocast_enabled(device)) return weight;
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(device), weight, device);
}

LinearImpl::Grads LinearImpl::gradients(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& wc) const {
  const ops::AutocastOff no_autocast;  // the operands are cast already; mm must not cast them again
  const at::Tensor dy2 = dy.reshape({-1, dy.size(-1)}).to(wc.scalar_type());
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  Grads g;
  g.weight = ops::mm(dy2.t(), x2).to(weight.scalar_type());
  if (bias.defined()) g.bias = dy2.sum(0).to(bias.scalar_type());
  g.input = ops::mm(dy2, wc);
  return g;
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({num_embeddings, dim}, options));
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  return at::embedding(weight, ids);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, const at::TensorOptions& options) : eps(eps) {
  weight = register_parameter("weight", at::ones({dim}, options));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return ops::rmsnorm(x, weight, eps);
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, const at::TensorOptions& options)
    : num_heads(c.num_attention_heads), num_kv_heads(c.kv_heads()), head_dim(c.resolved_head_dim()) {
  const int64_t h = c.hidden_size, b = c.attention_bias;
  q_proj = register_module("q_proj", Linear(h, num_heads * head_dim, b, options));
  k_proj = register_module("k_proj", Linear(h, num_kv_heads * head_dim, b, options));
  v_proj = register_module("v_proj", Linear(h, num_kv_heads * head_dim, b, options));
  o_proj = register_module("o_proj", Linear(num_heads * head_dim, h, b, options));
}

at::Tensor LlamaAttentionImpl::core(const at::Tensor& qp, const at::Tensor& kp, const at::Tensor& vp,
                                    const at::Tensor& cos, const at::Tensor& sin, at::Tensor* cache_k,
                                    at::Tensor* cache_v, const at::Tensor& segment_ids) {
  const int64_t batch = qp.size(0), seq = qp.size(1);
  // [B, T, heads * D] -> [B, heads, T, D]
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({batch, seq, n, head_dim}).transpose(1, 2); };
  at::Tensor v = heads(vp, num_kv_heads);
  // The projections' outputs are fresh, so RoPE rotates them in place.
  at::Tensor q, k;
  {
    ComponentScope scope("kiln::RoPE (q, k)");
    std::tie(q, k) = ops::apply_rope_qk_(heads(qp, num_heads), heads(kp, num_kv_heads), cos, sin);
  }
  if (cache_k != nullptr) {
    if (cache_k->defined()) {
      k = at::cat({*cache_k, k}, 2);
      v = at::cat({*cache_v, v}, 2);
    }
    *cache_k = k;
    *cache_v = v;
  }
  ComponentScope scope("kiln::attention core");
  return ops::attention(q, k, v, {.causal = true, .scale = std::nullopt, .segment_ids = segment_ids});
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c, const at::TensorOptions& options) {
  gate_proj = register_module("gate_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, options));
  up_proj = register_module("up_proj", Linear(c.hidden_size, c.intermediate_size, c.mlp_bias, options));
  down_proj = register_module("down_proj", Linear(c.intermediate_size, c.hidden_size, c.mlp_bias, options));
}

ProjectionBlock::ProjectionBlock(const char* scope, const char* prologue_scope, Prologue prologue, Params params,
                                 std::vector<std::pair<const char*, Linear>> projections)
    : scope(scope),
      prologue_scope(prologue_scope),
      prologue(std::move(prologue)),
      params(std::move(params)),
      projections(std::move(projections)) {}

std::vector<at::Tensor> ProjectionBlock::operator()(const std::vector<at::Tensor>& inputs) {
  return runner ? runner(*this, inputs) : forward(inputs);
}

std::vector<at::Tensor> ProjectionBlock::forward(const std::vector<at::Tensor>& inputs) {
  std::optional<ComponentScope> scope(std::in_place, prologue_scope ? prologue_scope : projections.front().first);
  const at::Tensor p = prologue(inputs, params ? params() : std::vector<at::Tensor>{});
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < projections.size(); ++i) {
    if (i > 0 || prologue_scope) {
      scope.reset();
      scope.emplace(projections[i].first);
    }
    out.push_back(projections[i].second->forward(p));
  }
  return out;
}

namespace {

// p = RMSNorm(x) with the module's eps and the given weight.
ProjectionBlock::Prologue rmsnorm_prologue(const RMSNorm& norm) {
  return [norm](const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& params) {
    return ops::rmsnorm(in[0], params[0], norm->eps);
  };
}

// The attention output [B, heads, T, D] -> o_proj's input [B, T, heads * D] (a copy unless laid
// out that way).
at::Tensor merge_heads(const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& /*params*/) {
  const at::Tensor& t = in[0];
  return t.transpose(1, 2).reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

at::Tensor swiglu(const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& /*params*/) {
  return ops::swiglu(in[0], in[1]);
}

// x + y in the residual adds' profiler scope.
at::Tensor residual(const at::Tensor& x, const at::Tensor& y) {
  ComponentScope scope("kiln::residual adds (2)");
  return x + y;
}

}  // namespace

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, const at::TensorOptions& options) {
  self_attn = register_module("self_attn", LlamaAttention(c, options));
  mlp = register_module("mlp", LlamaMLP(c, options));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
  auto weight_of = [](const RMSNorm& norm) { return [norm] { return std::vector<at::Tensor>{norm->weight}; }; };
  attention_in = ProjectionBlock(
      "kiln::input RMSNorm + q_proj + k_proj + v_proj", "kiln::input RMSNorm", rmsnorm_prologue(input_layernorm),
      weight_of(input_layernorm),
      {{"kiln::q_proj", self_attn->q_proj}, {"kiln::k_proj", self_attn->k_proj}, {"kiln::v_proj", self_attn->v_proj}});
  // The merge runs in o_proj's scope: the traffic model has no row of its own for it.
  attention_out = ProjectionBlock("kiln::attention output merge + o_proj", nullptr, merge_heads, nullptr,
                                  {{"kiln::o_proj", self_attn->o_proj}});
  mlp_in = ProjectionBlock("kiln::post-attention RMSNorm + gate_proj + up_proj", "kiln::post-attention RMSNorm",
                           rmsnorm_prologue(post_attention_layernorm), weight_of(post_attention_layernorm),
                           {{"kiln::gate_proj", mlp->gate_proj}, {"kiln::up_proj", mlp->up_proj}});
  mlp_out = ProjectionBlock("kiln::SwiGLU + down_proj", "kiln::SwiGLU", swiglu, nullptr,
                            {{"kiln::down_proj", mlp->down_proj}});
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          at::Tensor* cache_k, at::Tensor* cache_v, const at::Tensor& segment_ids) {
  // Each block's intermediates (q, k, v, the attention output; gate, up) are released before its
  // residual add, as a module's locals would be.
  at::Tensor y;
  {
    const std::vector<at::Tensor> qkv = attention_in({x});
    const at::Tensor attn = self_attn->core(qkv[0], qkv[1], qkv[2], cos, sin, cache_k, cache_v, segment_ids);
    y = attention_out({attn})[0];
  }
  const at::Tensor h = residual(x, y);
  y = mlp_out(mlp_in({h}))[0];
  return residual(h, y);
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c, const at::TensorOptions& options) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, options));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, options));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
  // Frequencies stay fp32 whatever the parameter dtype (HF keeps inv_freq in fp32 too).
  inv_freq = register_buffer("inv_freq", rope_inv_freq(c).to(options.device()));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& input_ids, const at::Tensor& position_ids, KVCache* cache,
                                   const at::Tensor& segment_ids) {
  TORCH_CHECK(!segment_ids.defined() || cache == nullptr, "segment_ids cannot be combined with a KV cache");
  at::Tensor h;
  {
    ComponentScope scope("kiln::embedding lookup");
    h = embed_tokens->forward(input_ids);
  }
  std::optional<ComponentScope> tables_scope(std::in_place, "kiln::RoPE tables (cos, sin)");
  const RopeTables rope = rope_cos_sin(inv_freq, position_ids, h.scalar_type());
  tables_scope.reset();
  if (cache != nullptr) {
    cache->keys.resize(layers->size());
    cache->values.resize(layers->size());
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    auto* layer = layers[i]->as<LlamaDecoderLayerImpl>();
    if (layer->runner && cache == nullptr) {
      h = layer->runner(*layer, h, rope.cos, rope.sin, segment_ids);
    } else {
      h = layer->forward(h, rope.cos, rope.sin, cache ? &cache->keys[i] : nullptr, cache ? &cache->values[i] : nullptr,
                         segment_ids);
    }
  }
  if (cache != nullptr) cache->length += input_ids.size(1);
  ComponentScope scope("kiln::final RMSNorm");
  return norm->forward(h);
}

namespace {

// A config whose parameters cannot fit (a mistyped size in config.json) fails here with the size
// it needs, not with an allocator error deep inside the first at::empty.
void check_fits_in_memory(const LlamaConfig& c, const at::TensorOptions& options) {
  if (!options.device().is_cpu()) return;  // the GPU allocator's own out-of-memory error names the size
  const double bytes = static_cast<double>(c.num_parameters()) *
                       static_cast<double>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  if (bytes > memory) {
    throw std::runtime_error(fmt::format(
        "{}: the model needs {} for its {} parameters in {} (vocab_size {}, hidden_size {}, {} layers), more than "
        "this machine's {} of memory",
        c.source, human_bytes(bytes), c.num_parameters(), c10::toString(c10::typeMetaToScalarType(options.dtype())),
        c.vocab_size, c.hidden_size, c.num_hidden_layers, human_bytes(memory)));
  }
}

}  // namespace

LlamaForCausalLMImpl::LlamaForCausalLMImpl(LlamaConfig config, const at::TensorOptions& options)
    : config_(std::move(config)) {
  config_.validate();
  check_fits_in_memory(config_, options);
  model = register_module("model", LlamaModel(config_, options));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head", Linear(config_.hidden_size, config_.vocab_size, false, options));
  }
  init_weights(0);
}

void causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, CausalLMOutput& out) {
  TORCH_CHECK(labels.sizes() == logits.sizes().slice(0, 2), "labels ", labels.sizes(), " do not match logits ",
              logits.sizes());
  const int64_t seq = logits.size(1), vocab = logits.size(2);
  // At least fp32 (HF upcasts half-precision logits); an fp64 model keeps fp64 (gradient checks).
  const at::ScalarType loss_dtype = at::promote_types(logits.scalar_type(), at::kFloat);
  const at::Tensor shifted_logits = logits.narrow(1, 0, seq - 1).reshape({-1, vocab}).to(loss_dtype);
  const at::Tensor shifted_labels = labels.narrow(1, 1, seq - 1).reshape({-1}).to(logits.device());
  out.loss_sum = at::cross_entropy_loss(shifted_logits, shifted_labels, {}, at::Reduction::Sum, -100);
  out.num_tokens = shifted_labels.ne(-100).sum();
  out.loss = out.loss_sum / out.num_tokens;
}

at::Tensor LlamaForCausalLMImpl::document_positions(const at::Tensor& segment_ids) {
  TORCH_CHECK(segment_ids.dim() == 2, "segment_ids must be [B, T], got ", segment_ids.sizes());
  const int64_t t = segment_ids.size(1);
  const at::Tensor idx = at::arange(t, segment_ids.options().dtype(at::kLong)).unsqueeze(0).expand_as(segment_ids);
  at::Tensor starts = at::zeros_like(idx);
  if (t > 1) {
    const at::Tensor changed = segment_ids.narrow(1, 1, t - 1) != segment_ids.narrow(1, 0, t - 1);
    starts.narrow(1, 1, t - 1)
        .copy_(at::where(changed, idx.narrow(1, 1, t - 1), at::zeros_like(changed, idx.options())));
  }
  return idx - std::get<0>(starts.cummax(1));  // distance to the latest document start
}

CausalLMOutput LlamaForCausalLMImpl::forward(const at::Tensor& input_ids, const at::Tensor& labels,
                                             const at::Tensor& position_ids, const at::Tensor& segment_ids,
                                             const at::Tensor& loss_sum_grad) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  TORCH_CHECK(!segment_ids.defined() || segment_ids.sizes() == input_ids.sizes(), "segment_ids ", segment_ids.sizes(),
              " do not match input_ids ", input_ids.sizes());
  const at::Tensor segments = segment_ids.defined() ? segment_ids.to(input_ids.device()) : at::Tensor();
  at::Tensor positions = position_ids;
  if (!positions.defined() && segments.defined()) {
    positions = document_positions(segments);
  } else if (!positions.defined()) {
    positions = at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)).unsqueeze(0).expand_as(input_ids);
  }
  const at::Tensor hidden = model->forward(input_ids, positions, nullptr, segments);
  const at::Tensor& head = lm_head ? lm_head->weight : model->embed_tokens->weight;
  ComponentScope scope("kiln::LM head + loss");
  CausalLMOutput out;
  if (labels.defined() && fused_lm_loss) {
    TORCH_CHECK(labels.sizes() == input_ids.sizes(), "labels ", labels.sizes(), " do not match input_ids ",
                input_ids.sizes());
    // Row t of hidden predicts labels[t + 1]: shift the labels left and ignore the last position,
    // which keeps hidden's rows in place (no copy of the activations).
    const at::Tensor y = labels.to(hidden.device());
    const at::Tensor targets = at::cat({y.narrow(1, 1, y.size(1) - 1), at::full({y.size(0), 1}, -100, y.options())}, 1);
    ops::LinearCrossEntropyResult r = ops::linear_cross_entropy(
        hidden, head, targets, {.reduction = ops::LossReduction::kSum, .expected_grad = loss_sum_grad});
    out.loss_sum = r.loss_sum;
    out.num_tokens = r.num_tokens;
    out.loss = out.loss_sum / out.num_tokens;
    return out;
  }
  out.logits = at::linear(hidden, head);
  if (labels.defined()) causal_lm_loss(out.logits, labels, out);
  return out;
}

at::Tensor LlamaForCausalLMImpl::forward_cached(const at::Tensor& input_ids, KVCache& cache) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T], got ", input_ids.sizes());
  const at::Tensor positions = (at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)) + cache.length)
                                   .unsqueeze(0)
                                   .expand_as(input_ids);
  const at::Tensor hidden = model->forward(input_ids, positions, &cache);
  return at::linear(hidden, lm_head ? lm_head->weight : model->embed_tokens->weight);
}

void LlamaForCausalLMImpl::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  // transformers' _init_weights: `config.initializer_range or 0.02`.
  const double std = config_.initializer_range > 0 ? config_.initializer_range : 0.02;
  for (const auto& item : named_parameters(/*recurse=*/true)) {
    at::Tensor p = item.value();
    if (p.is_meta()) continue;
    const std::string& name = item.key();
    if (name.ends_with("norm.weight")) {
      p.fill_(1.0);
    } else if (name.ends_with(".bias")) {
      p.zero_();
    } else {
      p.copy_(at::empty(p.sizes(), at::kFloat).normal_(0.0, std, generator));
    }
  }
}

int64_t LlamaForCausalLMImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters(/*recurse=*/true)) n += p.numel();
  return n;
}

}  // namespace kiln::model
