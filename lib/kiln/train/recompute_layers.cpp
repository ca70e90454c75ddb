#include "kiln/train/recompute_layers.h"

#include <optional>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/common/component_scope.h"
#include "kiln/common/torch_internals.h"
#include "kiln/train/gradient_accumulation.h"

namespace kiln::train {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The ForwardState of a Function's forward in its saved_data (which holds IValues), and back.
void save_forward_state(AutogradContext* ctx, at::DeviceType device) {
  const ForwardState state = ForwardState::current(device);
  ctx->saved_data["autocast"] = state.autocast ? static_cast<int64_t>(*state.autocast) : int64_t{-1};
  ctx->saved_data["kernels"] = state.kernels;
}

ForwardState saved_forward_state(AutogradContext* ctx) {
  ForwardState state;
  const int64_t autocast = ctx->saved_data["autocast"].toInt();
  if (autocast >= 0) state.autocast = static_cast<at::ScalarType>(autocast);
  state.kernels = ctx->saved_data["kernels"].toStringRef();
  return state;
}

// ---- full and every_n: the whole layer (set_layer_recomputation) ----

struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  // `layer` travels as an integer because saved_data holds IValues; the model outlives the graph.
  // segment_ids travels as an optional: autograd rejects undefined tensors among a Function's inputs.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            std::optional<at::Tensor> segment_ids, int64_t layer) {
    ctx->save_for_backward({x, cos, sin});
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["segment_ids"] = segment_ids;
    save_forward_state(ctx, x.device().type());
    return reinterpret_cast<model::LlamaDecoderLayerImpl*>(layer)->forward(x, cos, sin, nullptr, nullptr,
                                                                           segment_ids.value_or(at::Tensor()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    auto* layer = reinterpret_cast<model::LlamaDecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const at::Tensor x = saved[0].detach().requires_grad_(true);
    at::Tensor out;
    {
      const ForwardStateScope state(x.device().type(), saved_forward_state(ctx));
      const c10::IValue& seg = ctx->saved_data["segment_ids"];
      out = layer->forward(x, saved[1], saved[2], nullptr, nullptr, seg.isTensor() ? seg.toTensor() : at::Tensor());
    }
    // Accumulates the layer's parameter gradients directly.
    torch::autograd::backward({out}, {grad_outputs[0]});
    return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor run_checkpointed(model::LlamaDecoderLayerImpl& layer, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& segment_ids) {
  if (!at::GradMode::is_enabled()) {
    return layer.forward(x, cos, sin, nullptr, nullptr, segment_ids);  // evaluation: nothing to save
  }
  const std::optional<at::Tensor> seg = segment_ids.defined() ? std::optional<at::Tensor>(segment_ids) : std::nullopt;
  return CheckpointedLayer::apply(x, cos, sin, seg, reinterpret_cast<int64_t>(&layer));
}

// ---- selective: the layer's ProjectionBlocks (set_selective_recomputation) ----

std::vector<at::Tensor> prologue_params(const model::ProjectionBlock& block) {
  return block.params ? block.params() : std::vector<at::Tensor>{};
}

// The Function's tensor inputs besides the block's activations, so that their gradients go back
// through the engine (which accumulates them and runs data parallelism's hooks): the prologue's
// parameters, then each projection's weight and, where it has one, bias.
std::vector<at::Tensor> block_params(const model::ProjectionBlock& block) {
  std::vector<at::Tensor> out = prologue_params(block);
  for (const auto& projection : block.projections) {
    out.push_back(projection.second->weight);
    if (projection.second->bias.defined()) out.push_back(projection.second->bias);
  }
  return out;
}

// An activation as a matmul under autocast reads it: its cast to the autocast dtype; else itself.
at::Tensor compute_cast(const at::Tensor& t, at::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device)) return t;
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(device), t, device);
}

// A ProjectionBlock run as one node: returns its projections' outputs; saves the prologue's inputs
// and parameters and each weight as its matmul read it, not the prologue's output p. Backward runs
// the prologue again, forms each projection's dW (and db) and its share of dp from the saved
// weight, and back-propagates dp through the rerun prologue, whose output is dropped first (its
// backward needs only its inputs). `Name` names the node after what the block fuses.
template <class Name>
struct RecomputedPrologue : public torch::autograd::Function<RecomputedPrologue<Name>> {
  // `block` travels as an integer (saved_data holds IValues); the model outlives the graph.
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params, int64_t block) {
    auto& b = *reinterpret_cast<model::ProjectionBlock*>(block);
    const at::DeviceType device = inputs[0].device().type();
    save_forward_state(ctx, device);
    variable_list saved = inputs.vec();
    const std::vector<at::Tensor> own(params.begin(), params.begin() + prologue_params(b).size());
    saved.insert(saved.end(), own.begin(), own.end());
    at::Tensor p = b.prologue(inputs.vec(), own);
    variable_list out;
    for (auto& projection : b.projections) {
      const at::Tensor wc = projection.second->compute_weight();
      if (p.scalar_type() != wc.scalar_type()) p = compute_cast(p, device);  // once for all projections
      out.push_back(projection.second->forward(p));
      saved.push_back(wc);
    }
    ctx->saved_data["block"] = block;
    ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
    ctx->save_for_backward(saved);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto& b = *reinterpret_cast<model::ProjectionBlock*>(ctx->saved_data["block"].toInt());
    const variable_list s = ctx->get_saved_variables();
    const auto num_inputs = static_cast<size_t>(ctx->saved_data["inputs"].toInt());
    const size_t num_leaves = s.size() - b.projections.size();
    std::vector<at::Tensor> leaves;  // the prologue's inputs, then its parameters
    for (size_t i = 0; i < num_leaves; ++i) leaves.push_back(s[i].detach().requires_grad_(true));
    const std::vector<at::Tensor> inputs(leaves.begin(), leaves.begin() + num_inputs),
        own(leaves.begin() + num_inputs, leaves.end());
    at::Tensor p;
    {
      const ForwardStateScope state(s[0].device().type(), saved_forward_state(ctx));
      p = b.prologue(inputs, own);
    }
    variable_list result(num_leaves);  // the leaves' gradients, filled last; then the projections'
    at::Tensor dp;                     // in p's dtype, summed over the projections
    {
      at::Tensor pc;  // p as the matmuls read it
      for (size_t i = 0; i < b.projections.size(); ++i) {
        const model::Linear& linear = b.projections[i].second;
        const at::Tensor& wc = s[num_leaves + i];
        model::LinearImpl::Grads g;
        if (grads[i].defined()) {
          if (!pc.defined() || pc.scalar_type() != wc.scalar_type()) pc = p.detach().to(wc.scalar_type());
          g = linear->gradients(grads[i], pc, wc);
          at::Tensor dpi = g.input.to(p.scalar_type());
          dp = dp.defined() ? dp.add_(dpi) : dpi;
        }
        result.push_back(g.weight);
        if (linear->bias.defined()) result.push_back(g.bias);
      }
    }
    result.emplace_back();  // `block`
    if (dp.defined()) {
      dp = dp.view(p.sizes());
      const torch_internals::GradientRoot root(p);
      p = at::Tensor();
      // From the rerun prologue's graph, its output already dropped: one tensor of its size fewer
      // at backward's peak than torch::autograd::grad({p}, ...) would hold (common/torch_internals.h).
      const variable_list d = torch_internals::backprop_from(root, dp, leaves);
      for (size_t i = 0; i < num_leaves; ++i) result[i] = d[i];
    }
    return result;
  }
};

// The names of the selective nodes in the autograd graph (and in docs/performance.md's table).
struct NormLinears {};   // RMSNorm + q/k/v projections, RMSNorm + gate/up
struct HeadsLinear {};   // merge of the heads + o_proj
struct SwiGluLinear {};  // SwiGLU + down_proj

template <class Name>
std::vector<at::Tensor> run_recomputing_prologue(model::ProjectionBlock& block, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return block.forward(inputs);  // evaluation: nothing to save
  // One profiler scope for the whole block (common/component_scope.h): its parts share one node.
  ComponentScope scope(block.scope);
  return RecomputedPrologue<Name>::apply(at::TensorList(inputs), at::TensorList(block_params(block)),
                                         reinterpret_cast<int64_t>(&block));
}

// Every layer back to its own forward.
void remove_recomputation(model::LlamaForCausalLM& model) {
  const auto& layers = *model->model->layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    auto& layer = *layers.ptr<model::LlamaDecoderLayerImpl>(i);
    layer.runner = nullptr;
    for (model::ProjectionBlock* block : {&layer.attention_in, &layer.attention_out, &layer.mlp_in, &layer.mlp_out}) {
      block->runner = nullptr;
    }
  }
}

}  // namespace

void set_layer_recomputation(model::LlamaForCausalLM& model, bool enable, int every) {
  if (enable && every < 1) throw std::invalid_argument("recomputation: every must be >= 1");
  remove_recomputation(model);
  if (!enable) return;
  const auto& layers = *model->model->layers;
  for (size_t i = 0; i < layers.size(); i += static_cast<size_t>(every)) {
    layers.ptr<model::LlamaDecoderLayerImpl>(i)->runner = run_checkpointed;
  }
}

void set_selective_recomputation(model::LlamaForCausalLM& model, bool enable) {
  remove_recomputation(model);
  if (!enable) return;
  const auto& layers = *model->model->layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    auto& layer = *layers.ptr<model::LlamaDecoderLayerImpl>(i);
    layer.attention_in.runner = run_recomputing_prologue<NormLinears>;
    layer.attention_out.runner = run_recomputing_prologue<HeadsLinear>;
    layer.mlp_in.runner = run_recomputing_prologue<NormLinears>;
    layer.mlp_out.runner = run_recomputing_prologue<SwiGluLinear>;
  }
}

}  // namespace kiln::train
