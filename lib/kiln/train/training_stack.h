// One optimizer step, one way: the parts a step works on (model, data parallelism, AdamW, the fp16
// loss scaler, clipping) built from the run's settings, and the step itself: forward and backward
// over the micro-batches (gradient_accumulation.h), the loss summed over ranks, unscale, clipping, the non-finite
// check, AdamW with the learning rate given, zero_grad. kiln-pretrain's loop (Trainer) and every
// kiln-profile point run this code, so the profile measures the step that training runs.
//
// The step never reads a device value on the host: the loss, the norm and the skip decision stay
// on the device (the caller reads them when it logs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kiln/dist/data_parallel.h"
#include "kiln/model/llama.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/optim/schedule.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/recomputation.h"

namespace kiln::dist {
class Comm;
}

namespace kiln::train {

struct PretrainConfig;

struct StackOptions {
  std::optional<at::ScalarType> autocast_dtype;  // bf16/fp16 compute; parameters stay fp32
  bool loss_scaling = false;                     // fp16: GradScaler's dynamic loss scale
  optim::AdamWConfig adamw;
  double max_grad_norm = 1.0;          // optim::clip_grad_norm's limit
  std::shared_ptr<dist::Comm> comm;    // data parallel over its ranks, or null
  dist::DataParallelOptions parallel;  // with comm
  Recomputation recomputation{"none", 0};
};

// A run's stack settings from its config (the same keys kiln-pretrain reads).
StackOptions stack_options(const PretrainConfig& config, std::shared_ptr<dist::Comm> comm, int zero_stage);

// The config's compute dtype: "bf16", "fp16" or "fp32" (cost::compute_dtype_bytes gives its size).
std::string compute_dtype(const PretrainConfig& config);

// Marks between a step's phases, for counters that count them apart (kiln-profile
// --counter-phases): "backward" before each micro-batch's backward, "forward" after each backward
// but the last, "optimizer" after the last. The step's first forward starts where the caller
// draws its batches, so the caller marks it.
struct StepHooks {
  std::function<bool()> should_stop = nullptr;  // asked before each micro-batch: true abandons the step
  std::function<void(const char* phase)> mark = nullptr;
};

struct StepResult {
  at::Tensor loss_sum;       // 0-d fp32 on the device: the token losses summed over micro-batches and ranks
  at::Tensor objective;      // with micro_targets: this rank's sum_i loss_i / micro_targets[i]; else undefined
  at::Tensor norm;           // 0-d: the gradient norm before clipping
  at::Tensor bad;            // 0-d bool on the device: a non-finite loss or norm (the update was skipped)
  double comm_seconds = 0;   // the host waited on gradient collectives (data parallel)
  bool interrupted = false;  // should_stop: the partial gradients were dropped, nothing updated
};

class TrainingStack {
 public:
  // Sets the model's loss head (fused, no full logits) and its recomputation; with a
  // communicator, every rank starts from rank 0's weights.
  TrainingStack(model::LlamaForCausalLM model, at::Device device, StackOptions options);
  ~TrainingStack();
  TrainingStack(const TrainingStack&) = delete;
  TrainingStack& operator=(const TrainingStack&) = delete;

  // One optimizer step over `micro` (host batches whose labels are target ids or -100, checked
  // where they entered: check_host_batch, TokenShards::check_ids_below; the loss head does not
  // check them again on a device), normalised by `total_targets` (the step's target tokens over
  // every rank, > 0), at learning rate `lr`. `micro_targets` (one per micro-batch, or empty):
  // each micro-batch normalised by its own window's targets instead (AccumulateOptions).
  StepResult step(const std::vector<MicroBatch>& micro, int64_t total_targets, double lr, const StepHooks& hooks = {},
                  const std::vector<int64_t>& micro_targets = {});

  model::LlamaForCausalLM& model() { return model_; }
  at::Device device() const { return device_; }
  const StackOptions& options() const { return options_; }
  optim::AdamW& optimizer() { return *optimizer_; }
  const optim::AdamW& optimizer() const { return *optimizer_; }
  optim::GradScaler* scaler() { return scaler_.get(); }
  dist::DataParallel* data_parallel() { return dp_.get(); }
  const dist::DataParallel* data_parallel() const { return dp_.get(); }
  void zero_grad();

 private:
  model::LlamaForCausalLM model_;
  at::Device device_;
  StackOptions options_;
  std::vector<at::Tensor> params_;
  std::unique_ptr<dist::DataParallel> dp_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::unique_ptr<optim::GradScaler> scaler_;
};

// A new model with fp32 parameters on `device`, initialised as HF initialises Llama (seeded).
model::LlamaForCausalLM fresh_model(const model::LlamaConfig& config, at::Device device, uint64_t seed);

// The config's learning-rate schedule (HF's) over `total_steps` optimizer steps.
optim::ScheduleConfig schedule_of(const PretrainConfig& config, int64_t total_steps);
// The learning rate of optimizer step `step` (0-based) under `schedule`: learning_rate x the
// schedule's multiplier (the trainer's step, its resume check and kiln-profile's points).
double step_learning_rate(const PretrainConfig& config, const optim::ScheduleConfig& schedule, int64_t step);

// One optimizer step's micro-batches as the trainer draws them (kiln-pretrain and kiln-profile's
// points): up to `window` from `next` (nullopt: the source ran out), each one's targets counted as
// the loss is normalised (`hf_items`: every label that is not -100 before the shift, transformers'
// num_items_in_batch for LLaMA-Factory's datasets; else count_targets), and with `comm` the
// counts summed over the ranks (host values: no device synchronisation).
struct StepWindow {
  std::vector<MicroBatch> micro;
  int64_t targets = 0, tokens = 0;  // of every rank
  // streaming: each micro-batch's window's targets (TrainingStack::step's micro_targets); empty
  // when the step's micro-batches are one window normalised by `targets`.
  std::vector<int64_t> micro_targets;
  bool exhausted = false;  // the source ran out (on any rank)
};
StepWindow draw_window(const std::function<std::optional<MicroBatch>()>& next, int64_t window, bool hf_items,
                       dist::Comm* comm);

// Sets a model's recomputation (train/recompute_layers.h) as `r` says.
void apply_recomputation(model::LlamaForCausalLM& model, const Recomputation& r);

}  // namespace kiln::train
