#include "kiln/train/training_stack.h"

#include <algorithm>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "kiln/common/component_scope.h"
#include "kiln/common/nvtx.h"
#include "kiln/dist/comm.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/recompute_layers.h"

namespace kiln::train {

std::string compute_dtype(const PretrainConfig& c) {
  return c.bf16 ? "bf16" : c.fp16 ? "fp16" : "fp32";
}

StackOptions stack_options(const PretrainConfig& c, std::shared_ptr<dist::Comm> comm, int zero_stage) {
  StackOptions o;
  if (c.bf16) o.autocast_dtype = at::kBFloat16;
  if (c.fp16) o.autocast_dtype = at::kHalf;
  o.loss_scaling = c.fp16;
  o.adamw = optim::AdamWConfig{
      .beta1 = c.adam_beta1, .beta2 = c.adam_beta2, .eps = c.adam_epsilon, .weight_decay = c.weight_decay};
  o.max_grad_norm = c.max_grad_norm;
  o.comm = std::move(comm);
  o.parallel = dist::DataParallelOptions{.bucket_cap_bytes = c.ddp_bucket_cap_mb << 20, .zero_stage = zero_stage};
  o.recomputation =
      resolve_recomputation(c.gradient_checkpointing, c.gradient_checkpointing_policy, c.gradient_checkpointing_every);
  return o;
}

model::LlamaForCausalLM fresh_model(const model::LlamaConfig& config, at::Device device, uint64_t seed) {
  at::manual_seed(seed);
  model::LlamaForCausalLM model(config, at::TensorOptions().device(device).dtype(at::kFloat));
  model->init_weights(seed);
  return model;
}

optim::ScheduleConfig schedule_of(const PretrainConfig& c, int64_t total_steps) {
  return optim::ScheduleConfig{.type = c.lr_scheduler_type,
                               .total_steps = total_steps,
                               .warmup_steps = optim::resolve_warmup_steps(c.hf_warmup_steps(), total_steps),
                               .min_lr_ratio = c.min_lr_ratio,
                               .decay_ratio = c.decay_ratio,
                               .initial_lr = c.learning_rate,
                               .kwargs = c.lr_scheduler_kwargs};
}

double step_learning_rate(const PretrainConfig& c, const optim::ScheduleConfig& schedule, int64_t step) {
  return c.learning_rate * optim::lr_multiplier(schedule, step);
}

StepWindow draw_window(const std::function<std::optional<MicroBatch>()>& next, int64_t window, bool hf_items,
                       dist::Comm* comm) {
  StepWindow w;
  int64_t exhausted = 0;
  for (int64_t i = 0; i < window; ++i) {
    std::optional<MicroBatch> m = next();
    if (!m) {
      exhausted = 1;
      break;
    }
    w.micro.push_back(std::move(*m));
    const at::Tensor labels = w.micro.back().labels.cpu();
    w.targets += hf_items ? labels.ne(-100).sum().item<int64_t>() : count_targets(labels);
    w.tokens += w.micro.back().input_ids.numel();
  }
  if (comm) {
    // The step's loss is normalised by every rank's target tokens; a rank whose source ran out
    // ends the run for all of them.
    const auto sums =
        comm->host_sum({static_cast<double>(w.targets), static_cast<double>(w.tokens), static_cast<double>(exhausted)});
    w.targets = static_cast<int64_t>(sums[0]);
    w.tokens = static_cast<int64_t>(sums[1]);
    exhausted = static_cast<int64_t>(sums[2]);
  }
  w.exhausted = exhausted > 0;
  return w;
}

void apply_recomputation(model::LlamaForCausalLM& model, const Recomputation& r) {
  if (r.policy == "selective") {
    set_selective_recomputation(model, true);
  } else {
    set_layer_recomputation(model, r.every > 0, std::max(r.every, 1));
  }
}

TrainingStack::TrainingStack(model::LlamaForCausalLM model, at::Device device, StackOptions options)
    : model_(std::move(model)), device_(device), options_(std::move(options)) {
  model_->fused_lm_loss = true;  // a step needs only the loss: never hold all logits
  apply_recomputation(model_, options_.recomputation);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
  params_ = model_->parameters();
  if (options_.comm) {
    // Every rank starts from rank 0's weights (a model from a checkpoint is the same everywhere
    // anyway; a fresh init could differ with a platform's random numbers).
    dp_ = std::make_unique<dist::DataParallel>(options_.comm, named, options_.parallel);
    dp_->broadcast_parameters();
    optimizer_ = std::make_unique<optim::AdamW>(dp_->optimizer_params(), options_.adamw);
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(named, options_.adamw);
  }
  if (options_.loss_scaling) scaler_ = std::make_unique<optim::GradScaler>(device_);
}

TrainingStack::~TrainingStack() = default;

void TrainingStack::zero_grad() {
  if (dp_) {
    dp_->zero_grad();
  } else {
    optimizer_->zero_grad();
  }
}

StepResult TrainingStack::step(const std::vector<MicroBatch>& micro, int64_t total_targets, double lr,
                               const StepHooks& hooks, const std::vector<int64_t>& micro_targets) {
  const nvtx::Range step_range("kiln::step");
  StepResult out;
  AccumulateOptions acc;
  acc.autocast_dtype = options_.autocast_dtype;
  acc.total_targets = total_targets;
  acc.micro_targets = micro_targets;
  acc.device = device_;
  acc.should_stop = hooks.should_stop;
  if (scaler_) acc.loss_scale = scaler_->scale();
  bool last_backward = false;
  if (dp_ || hooks.mark) {
    acc.before_backward = [&](bool last) {
      if (hooks.mark) hooks.mark("backward");
      last_backward = last;
      if (dp_) dp_->begin_backward(last);
    };
    acc.after_backward = [&] {
      if (dp_) dp_->end_backward();  // draining the gradient reduction is backward's
      if (hooks.mark && !last_backward) hooks.mark("forward");
    };
  }
  AccumulateResult r = [&] {
    const ops::CheckedLabelsScope checked;  // host batches are checked where they enter (check_host_batch)
    return accumulate_gradients(model_, micro, acc);
  }();
  if (r.interrupted) {
    zero_grad();
    out.interrupted = true;
    return out;
  }
  if (hooks.mark) hooks.mark("optimizer");  // the loss over ranks, unscale, clipping, AdamW, zero_grad
  const nvtx::Range optimizer_range("kiln::optimizer");
  out.loss_sum = r.loss_sum;
  out.objective = r.objective;
  if (dp_) {
    at::Tensor sum = r.loss_sum.reshape({1}).clone();  // the step's loss over every rank
    dp_->all_reduce(sum);
    out.loss_sum = sum.squeeze();
  }
  if (scaler_) {
    const ComponentScope scope("kiln::loss-scale unscale");
    if (dp_ && options_.parallel.zero_stage == 2) {
      scaler_->unscale_grads(dp_->local_grads());
      dp_->all_reduce(scaler_->found_inf());  // an overflow in any shard skips the step everywhere
    } else {
      scaler_->unscale(params_);
    }
  }
  {
    const ComponentScope scope("kiln::gradient clipping");
    out.norm =
        dp_ ? dp_->clip_grad_norm(options_.max_grad_norm) : optim::clip_grad_norm(params_, options_.max_grad_norm);
  }
  out.bad = out.loss_sum.isfinite().logical_and(out.norm.to(device_).isfinite()).logical_not();
  at::Tensor skip = out.bad.to(at::kFloat).reshape({1});
  if (scaler_) skip = at::maximum(skip, scaler_->found_inf());
  {
    const ComponentScope scope("kiln::AdamW");
    optimizer_->step(lr, std::nullopt, skip);
  }
  if (dp_) dp_->after_step();
  if (scaler_) scaler_->update();
  if (dp_) out.comm_seconds = dp_->stats().exposed_seconds;
  zero_grad();
  return out;
}

}  // namespace kiln::train
