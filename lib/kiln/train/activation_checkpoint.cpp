#include "kiln/train/activation_checkpoint.h"

#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/ops/dispatch.h"
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

}  // namespace kiln::train
