#include "kiln/train/activation_checkpoint.h"

#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/common/component_scope.h"
#include "kiln/common/torch_internals.h"

#include "kiln/ops/attention.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/ops/rope.h"
#include "kiln/ops/swiglu.h"
#include "kiln/train/step.h"

namespace kiln::train {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  // `layer` travels as an integer because saved_data holds IValues; the model outlives the graph.
  // segment_ids travels as an optional: autograd rejects undefined tensors among a Function's inputs.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            std::optional<at::Tensor> segment_ids, int64_t layer) {
    const at::DeviceType device = x.device().type();
    ctx->save_for_backward({x, cos, sin});
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["segment_ids"] = segment_ids;
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(at::autocast::get_autocast_dtype(device));
    // The recomputation may run on another thread (CUDA's autograd engine): it re-enters the
    // kernel choice the forward ran under.
    ctx->saved_data["kernels"] = ops::effective_backends_spec();
    return reinterpret_cast<model::LlamaDecoderLayerImpl*>(layer)->forward(x, cos, sin, nullptr, nullptr,
                                                                           segment_ids.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    auto* layer = reinterpret_cast<model::LlamaDecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const at::Tensor x = saved[0].detach().requires_grad_(true);
    std::optional<at::ScalarType> autocast;
    if (ctx->saved_data["autocast"].toBool()) {
      autocast = static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt());
    }
    at::Tensor out;
    {
      const at::AutoGradMode grad(true);
      const AutocastGuard guard(x.device().type(), autocast);
      const ops::BackendScope kernels(ctx->saved_data["kernels"].toStringRef());
      const c10::IValue& seg = ctx->saved_data["segment_ids"];
      out = layer->forward(x, saved[1], saved[2], nullptr, nullptr, seg.isTensor() ? seg.toTensor() : at::Tensor());
    }
    torch::autograd::backward({out}, {grad_outputs[0]});
    return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// ---- selective recomputation (set_selective_recomputation) ----

// Sets the autocast state of `device` while it lives, then restores the previous one (without
// clearing autocast's weight cache, which the step's forward may still be using).
class AutocastSet {
 public:
  AutocastSet(at::DeviceType device, bool enabled, at::ScalarType dtype)
      : device_(device),
        prev_enabled_(at::autocast::is_autocast_enabled(device)),
        prev_dtype_(at::autocast::get_autocast_dtype(device)) {
    at::autocast::set_autocast_enabled(device_, enabled);
    at::autocast::set_autocast_dtype(device_, dtype);
  }
  ~AutocastSet() {
    at::autocast::set_autocast_enabled(device_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_, prev_dtype_);
  }
  AutocastSet(const AutocastSet&) = delete;
  AutocastSet& operator=(const AutocastSet&) = delete;

 private:
  at::DeviceType device_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

// What the recomputation must see again: the forward's autocast state and kernel choice.
void save_forward_state(AutogradContext* ctx, at::DeviceType device) {
  ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
  ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(at::autocast::get_autocast_dtype(device));
  ctx->saved_data["kernels"] = ops::effective_backends_spec();
}

// Backward's recomputation of an element-wise prologue: with grad, under the forward's autocast
// state and kernels (the engine may run backward on another thread, CUDA's).
struct Recompute {
  Recompute(AutogradContext* ctx, at::DeviceType device)
      : grad(true),
        autocast(device, ctx->saved_data["autocast"].toBool(),
                 static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt())),
        kernels(ctx->saved_data["kernels"].toStringRef()) {}
  at::AutoGradMode grad;
  AutocastSet autocast;
  ops::BackendScope kernels;
};

// A matmul operand as at::linear sees it: under autocast its cast to the autocast dtype (through
// autocast's cache for parameters, so the copy is shared with the rest of the step), else itself.
at::Tensor compute_cast(const at::Tensor& t, at::DeviceType device) {
  if (!t.defined() || !at::autocast::is_autocast_enabled(device)) return t;
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(device), t, device);
}

at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) {
  return t ? *t : at::Tensor();
}

struct LinearGrads {
  at::Tensor dp, dw, db;  // dp in the compute dtype, [rows, in]
};

// The backward of y = p W^T (+ b) from p and the weight as the matmul saw them (compute dtype),
// with autocast off: dW = dY^T p, db = sum dY, dp = dY W (ops::mm: the fp32 GEMM where ops::linear
// uses it, so the values equal the plain layer's). Parameter gradients in the parameters' dtypes
// (as autocast's cast-backward gives them).
LinearGrads linear_backward(const at::Tensor& dy, const at::Tensor& p, const at::Tensor& wc, at::ScalarType w_dtype,
                            std::optional<at::ScalarType> b_dtype) {
  const at::Tensor dy2 = dy.reshape({-1, dy.size(-1)}).to(wc.scalar_type());
  const at::Tensor p2 = p.reshape({-1, p.size(-1)});
  LinearGrads g;
  g.dw = ops::mm(dy2.t(), p2).to(w_dtype);
  if (b_dtype) g.db = dy2.sum(0).to(*b_dtype);
  g.dp = ops::mm(dy2, wc);
  return g;
}

std::optional<at::ScalarType> bias_dtype(const c10::IValue& v) {
  const int64_t d = v.toInt();
  return d < 0 ? std::nullopt : std::optional(static_cast<at::ScalarType>(d));
}

int64_t dtype_or_none(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? static_cast<int64_t>(t->scalar_type()) : -1;
}

// p = rmsnorm(x, norm_weight) feeding two or three projections (q, k, v or gate, up): returns
// p W_i^T + b_i. Saves x and the weights as the matmuls saw them, not p or its casts.
struct NormLinears : public torch::autograd::Function<NormLinears> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& norm_weight, double eps,
                               const at::Tensor& w0, std::optional<at::Tensor> b0, const at::Tensor& w1,
                               std::optional<at::Tensor> b1, std::optional<at::Tensor> w2,
                               std::optional<at::Tensor> b2) {
    const at::DeviceType device = x.device().type();
    save_forward_state(ctx, device);
    const std::vector<at::Tensor> weights = w2 ? std::vector<at::Tensor>{w0, w1, *w2} : std::vector<at::Tensor>{w0, w1};
    const std::vector<std::optional<at::Tensor>> biases = {b0, b1, b2};
    at::Tensor p = ops::rmsnorm(x, norm_weight, eps);
    variable_list out, saved = {x, norm_weight};
    for (size_t i = 0; i < weights.size(); ++i) {
      const at::Tensor wc = compute_cast(weights[i], device);
      if (p.scalar_type() != wc.scalar_type()) p = compute_cast(p, device);
      out.push_back(ops::linear(p, wc, compute_cast(value_or_undefined(biases[i]), device)));
      saved.push_back(wc);
      ctx->saved_data["w" + std::to_string(i)] = static_cast<int64_t>(weights[i].scalar_type());
      ctx->saved_data["b" + std::to_string(i)] = dtype_or_none(biases[i]);
    }
    ctx->saved_data["eps"] = eps;
    ctx->save_for_backward(saved);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::DeviceType device = s[0].device().type();
    const at::Tensor x = s[0].detach().requires_grad_(true), norm_weight = s[1].detach().requires_grad_(true);
    at::Tensor p;
    {
      const Recompute recompute(ctx, device);
      p = ops::rmsnorm(x, norm_weight, ctx->saved_data["eps"].toDouble());
    }
    variable_list result(9);
    at::Tensor dp;  // in p's dtype (fp32), summed over the projections
    {
      const AutocastSet off(device, false, at::kFloat);
      at::Tensor pc;
      for (size_t i = 0; i + 2 < s.size(); ++i) {
        if (!grads[i].defined()) continue;
        const at::Tensor& wc = s[2 + i];
        if (!pc.defined() || pc.scalar_type() != wc.scalar_type()) pc = p.detach().to(wc.scalar_type());
        const std::string n = std::to_string(i);
        LinearGrads g = linear_backward(grads[i], pc, wc, static_cast<at::ScalarType>(ctx->saved_data["w" + n].toInt()),
                                        bias_dtype(ctx->saved_data["b" + n]));
        result[3 + 2 * i] = g.dw;
        result[4 + 2 * i] = g.db;
        at::Tensor dpi = g.dp.to(p.scalar_type());
        dp = dp.defined() ? dp.add_(dpi) : dpi;
      }
    }
    if (dp.defined()) {
      dp = dp.view(p.sizes());
      const torch_internals::GradientRoot root(p);
      p = at::Tensor();  // RMSNorm's backward needs x, the weight and 1/rms, not its output
      // From the recomputed prologue's graph, its output already dropped (RMSNorm's backward needs
      // only its inputs): one tensor of its size fewer at backward's peak than
      // torch::autograd::grad({p}, ...) would hold (common/torch_internals.h).
      const variable_list d = torch_internals::backprop_from(root, dp, {x, norm_weight});
      result[0] = d[0];
      result[1] = d[1];
    }
    return result;
  }
};

// silu(gate) * up feeding down_proj: returns (silu(gate) * up) W^T + b. Saves gate and up (the
// outputs of the gate/up matmuls) and the weight as the matmul saw it, not the product.
struct SwiGluLinear : public torch::autograd::Function<SwiGluLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight, std::optional<at::Tensor> bias) {
    const at::DeviceType device = gate.device().type();
    save_forward_state(ctx, device);
    const at::Tensor wc = compute_cast(weight, device);
    at::Tensor a = ops::swiglu(gate, up);
    if (a.scalar_type() != wc.scalar_type()) a = compute_cast(a, device);
    const at::Tensor y = ops::linear(a, wc, compute_cast(value_or_undefined(bias), device));
    ctx->save_for_backward({gate, up, wc});
    ctx->saved_data["w"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b"] = dtype_or_none(bias);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::DeviceType device = s[0].device().type();
    const at::Tensor gate = s[0].detach().requires_grad_(true), up = s[1].detach().requires_grad_(true);
    const at::Tensor& wc = s[2];
    at::Tensor a;
    {
      const Recompute recompute(ctx, device);
      a = ops::swiglu(gate, up);
    }
    LinearGrads g;
    {
      const AutocastSet off(device, false, at::kFloat);
      g = linear_backward(grads[0], a.detach().to(wc.scalar_type()), wc,
                          static_cast<at::ScalarType>(ctx->saved_data["w"].toInt()), bias_dtype(ctx->saved_data["b"]));
    }
    const at::Tensor da = g.dp.view(a.sizes()).to(a.scalar_type());
    g.dp = at::Tensor();
    const torch_internals::GradientRoot root(a);
    a = at::Tensor();  // dW is formed; SwiGLU's backward needs gate and up, not the product
    const variable_list d = torch_internals::backprop_from(root, da, {gate, up});
    return {d[0], d[1], g.dw, g.db};
  }
};

// [B, heads, T, D] -> [B, T, heads * D] (a copy unless the attention output is laid out that way).
at::Tensor merge_heads(const at::Tensor& t) {
  return t.transpose(1, 2).reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// The attention output [B, heads, T, D] through o_proj: merge_heads(attn) W^T + b. Saves the
// attention output itself (the attention's backward keeps it anyway), not the merged copy.
struct HeadsLinear : public torch::autograd::Function<HeadsLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& attn, const at::Tensor& weight,
                            std::optional<at::Tensor> bias) {
    const at::DeviceType device = attn.device().type();
    const at::Tensor wc = compute_cast(weight, device);
    at::Tensor a = merge_heads(attn);
    if (a.scalar_type() != wc.scalar_type()) a = compute_cast(a, device);
    const at::Tensor y = ops::linear(a, wc, compute_cast(value_or_undefined(bias), device));
    ctx->save_for_backward({attn, wc});
    ctx->saved_data["w"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b"] = dtype_or_none(bias);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor& attn = s[0];
    const at::Tensor& wc = s[1];
    const AutocastSet off(attn.device().type(), false, at::kFloat);
    LinearGrads g =
        linear_backward(grads[0], merge_heads(attn).to(wc.scalar_type()), wc,
                        static_cast<at::ScalarType>(ctx->saved_data["w"].toInt()), bias_dtype(ctx->saved_data["b"]));
    const at::Tensor dattn =
        g.dp.view({attn.size(0), attn.size(2), attn.size(1), attn.size(3)}).transpose(1, 2).to(attn.scalar_type());
    return {dattn, g.dw, g.db};
  }
};

std::optional<at::Tensor> optional_tensor(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// LlamaDecoderLayerImpl::forward (no KV cache) with the fused Functions above; the same ops in the
// same order otherwise (RoPE, attention and the residual adds are the model's own).
at::Tensor selective_layer_forward(model::LlamaDecoderLayerImpl& layer, const at::Tensor& x, const at::Tensor& cos,
                                   const at::Tensor& sin, const at::Tensor& segment_ids) {
  auto& attn = *layer.self_attn;
  auto& mlp = *layer.mlp;
  const int64_t batch = x.size(0), seq = x.size(1);
  auto heads = [&](const at::Tensor& t, int64_t n) { return t.view({batch, seq, n, attn.head_dim}).transpose(1, 2); };
  // Profiler scopes (common/component_scope.h): the fused Functions' parts share one scope each,
  // named after the traffic-model rows they merge (kiln-profile lists them beside the table).
  variable_list qkv;
  {
    ComponentScope scope("kiln::input RMSNorm + q_proj + k_proj + v_proj");
    qkv =
        NormLinears::apply(x, layer.input_layernorm->weight, layer.input_layernorm->eps, attn.q_proj->weight,
                           optional_tensor(attn.q_proj->bias), attn.k_proj->weight, optional_tensor(attn.k_proj->bias),
                           std::optional<at::Tensor>(attn.v_proj->weight), optional_tensor(attn.v_proj->bias));
  }
  // The projections' outputs are fresh (and not saved), so RoPE rotates them in place.
  at::Tensor q, k;
  {
    ComponentScope scope("kiln::RoPE (q, k)");
    q = ops::apply_rope_(heads(qkv[0], attn.num_heads), cos, sin);
    k = ops::apply_rope_(heads(qkv[1], attn.num_kv_heads), cos, sin);
  }
  const at::Tensor v = heads(qkv[2], attn.num_kv_heads);
  ops::AttentionOptions options;
  options.segment_ids = segment_ids;
  at::Tensor o, h;
  {
    ComponentScope scope("kiln::attention core");
    o = ops::attention(q, k, v, options);
  }
  {
    ComponentScope scope("kiln::attention output merge + o_proj");
    o = HeadsLinear::apply(o, attn.o_proj->weight, optional_tensor(attn.o_proj->bias));
  }
  {
    ComponentScope scope("kiln::residual adds (2)");
    h = x + o;
  }
  variable_list gu;
  {
    ComponentScope scope("kiln::post-attention RMSNorm + gate_proj + up_proj");
    gu = NormLinears::apply(h, layer.post_attention_layernorm->weight, layer.post_attention_layernorm->eps,
                            mlp.gate_proj->weight, optional_tensor(mlp.gate_proj->bias), mlp.up_proj->weight,
                            optional_tensor(mlp.up_proj->bias), std::nullopt, std::nullopt);
  }
  at::Tensor down;
  {
    ComponentScope scope("kiln::SwiGLU + down_proj");
    down = SwiGluLinear::apply(gu[0], gu[1], mlp.down_proj->weight, optional_tensor(mlp.down_proj->bias));
  }
  ComponentScope scope("kiln::residual adds (2)");
  return h + down;
}

}  // namespace

void set_activation_checkpointing(model::LlamaForCausalLM& model, bool enable, int every) {
  if (!enable) {
    model->model->layer_runner = nullptr;
    return;
  }
  if (every < 1) throw std::invalid_argument("activation checkpointing: every must be >= 1");
  std::set<const model::LlamaDecoderLayerImpl*> recomputed;
  const auto& layers = *model->model->layers;
  for (size_t i = 0; i < layers.size(); i += static_cast<size_t>(every)) {
    recomputed.insert(layers.ptr<model::LlamaDecoderLayerImpl>(i).get());
  }
  model->model->layer_runner = [recomputed](model::LlamaDecoderLayerImpl& layer, const at::Tensor& x,
                                            const at::Tensor& cos, const at::Tensor& sin,
                                            const at::Tensor& segment_ids) -> at::Tensor {
    if (!at::GradMode::is_enabled() || !recomputed.count(&layer)) {
      return layer.forward(x, cos, sin, nullptr, nullptr, segment_ids);  // evaluation: nothing to save
    }
    const std::optional<at::Tensor> seg = segment_ids.defined() ? std::optional<at::Tensor>(segment_ids) : std::nullopt;
    return CheckpointedLayer::apply(x, cos, sin, seg, reinterpret_cast<int64_t>(&layer));
  };
}

void set_selective_recomputation(model::LlamaForCausalLM& model, bool enable) {
  if (!enable) {
    model->model->layer_runner = nullptr;
    return;
  }
  model->model->layer_runner = [](model::LlamaDecoderLayerImpl& layer, const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin, const at::Tensor& segment_ids) -> at::Tensor {
    if (!at::GradMode::is_enabled()) return layer.forward(x, cos, sin, nullptr, nullptr, segment_ids);
    return selective_layer_forward(layer, x, cos, sin, segment_ids);
  };
}

}  // namespace kiln::train
