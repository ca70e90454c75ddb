#include "kiln/train/gradient_accumulation.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include "kiln/common/component_scope.h"
#include "kiln/common/nvtx.h"
#include "kiln/ops/dispatch.h"

namespace kiln::train {

int64_t count_targets(const at::Tensor& labels) {
  TORCH_CHECK(labels.dim() == 2, "labels must be [B, T], got ", labels.sizes());
  return labels.narrow(1, 1, labels.size(1) - 1).ne(-100).sum().item<int64_t>();
}

AutocastGuard::AutocastGuard(at::DeviceType device_type, std::optional<at::ScalarType> dtype)
    : device_type_(device_type) {
  if (!dtype || *dtype == at::kFloat) return;
  active_ = true;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_type);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, true);
  at::autocast::set_autocast_dtype(device_type, *dtype);
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
  at::autocast::clear_cache();  // casted weight copies live only for one step's forward
}

ForwardState ForwardState::current(at::DeviceType device_type) {
  ForwardState s;
  if (at::autocast::is_autocast_enabled(device_type)) s.autocast = at::autocast::get_autocast_dtype(device_type);
  s.kernels = ops::effective_backends_spec();
  return s;
}

ForwardStateScope::ForwardStateScope(at::DeviceType device_type, const ForwardState& state)
    : autocast_(device_type, state.autocast), kernels_(std::make_unique<ops::BackendScope>(state.kernels)) {}

ForwardStateScope::~ForwardStateScope() = default;

AccumulateResult accumulate_gradients(model::LlamaForCausalLM& model, const std::vector<MicroBatch>& micro_batches,
                                      const AccumulateOptions& options) {
  TORCH_CHECK(options.total_targets > 0, "accumulate_gradients: the step has no target tokens");
  TORCH_CHECK(options.micro_targets.empty() || options.micro_targets.size() == micro_batches.size(),
              "accumulate_gradients: ", options.micro_targets.size(), " micro_targets for ", micro_batches.size(),
              " micro-batches");
  for (const int64_t n : options.micro_targets) {
    TORCH_CHECK(n > 0, "accumulate_gradients: a window of the step has no target tokens");
  }
  AccumulateResult result;
  result.loss_sum = at::zeros({}, at::TensorOptions().device(options.device).dtype(at::kFloat));
  if (!options.micro_targets.empty()) {
    result.objective = at::zeros({}, at::TensorOptions().device(options.device).dtype(at::kFloat));
  }
  const at::TensorOptions fp32_on_device = at::TensorOptions().device(options.device).dtype(at::kFloat);
  double inv_targets = 0;
  at::Tensor loss_sum_grad;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const MicroBatch& mb = micro_batches[i];
    const double inv =
        1.0 / static_cast<double>(options.micro_targets.empty() ? options.total_targets : options.micro_targets[i]);
    if (!loss_sum_grad.defined() || inv != inv_targets) {
      inv_targets = inv;
      // The gradient each backward below sends to loss_sum, computed as autograd will compute it
      // (the loss scale times 1 / targets in fp32): the fused loss head rounds its bf16/fp16
      // gradient after this scale instead of before it (ops::LinearCrossEntropyOptions::expected_grad).
      loss_sum_grad = options.loss_scale ? options.loss_scale->squeeze().to(fp32_on_device) * inv_targets
                                         : at::full({}, inv_targets, fp32_on_device);
    }
    if (options.should_stop && options.should_stop()) {
      result.interrupted = true;
      return result;
    }
    at::Tensor loss_sum;
    {
      const nvtx::Range range("kiln::forward");  // not a component scope: the profiler's view is unchanged
      AutocastGuard autocast(options.device.type(), options.autocast_dtype);
      const at::Tensor segments =
          mb.segment_ids.defined() ? mb.segment_ids.to(options.device, /*non_blocking=*/true) : at::Tensor();
      const auto out = model->forward(mb.input_ids.to(options.device, /*non_blocking=*/true),
                                      mb.labels.to(options.device, /*non_blocking=*/true), {}, segments, loss_sum_grad);
      loss_sum = out.loss_sum.to(at::kFloat);
    }
    at::Tensor objective = loss_sum * inv_targets;
    if (options.loss_scale) objective = objective * options.loss_scale->squeeze();
    if (options.before_backward) options.before_backward(i + 1 == micro_batches.size());
    {
      // The profiler's backward window: component scopes inside it are recomputation.
      ComponentScope scope(kBackwardScope);
      objective.backward();
    }
    if (options.after_backward) options.after_backward();
    result.loss_sum.add_(loss_sum.detach());
    if (result.objective.defined()) result.objective.add_(loss_sum.detach() * inv_targets);
  }
  return result;
}

}  // namespace kiln::train
