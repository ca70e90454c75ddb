// The gradient computation of one optimizer step over its micro-batches.
//
// The loss is normalised by the number of target tokens of the *whole step* (all micro-batches,
// all ranks), not averaged per micro-batch: sum_i loss_sum_i / N. Averaging per micro-batch (HF
// Trainer's long-standing gradient-accumulation bug) weighs a token in a short micro-batch more
// than one in a long one; here gradient accumulation 4 x batch 1 equals batch 4 exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include "kiln/model/llama.h"

namespace kiln::ops {
class BackendScope;
}

namespace kiln::train {

struct MicroBatch {
  at::Tensor input_ids;    // [B, T] int64
  at::Tensor labels;       // [B, T] int64, -100 = ignored; the model shifts
  at::Tensor segment_ids;  // [B, T] int32 document index (neat packing), or undefined
};

// Target tokens of a micro-batch: labels[:, 1:] != -100. Counted on the host from CPU labels.
int64_t count_targets(const at::Tensor& labels);

struct AccumulateOptions {
  std::optional<at::ScalarType> autocast_dtype;  // bf16/fp16 compute with fp32 parameters
  std::optional<at::Tensor> loss_scale;          // fp16: multiply the loss before backward
  int64_t total_targets = 0;                     // target tokens of the whole step (sum over micro-batches and ranks)
  // Non-empty (one per micro-batch): micro-batch i's loss is divided by micro_targets[i] instead
  // of total_targets: HF's windows of an iterable train set, where a window cut short by the
  // stream's end joins the next epoch's first window in one optimizer step, each normalised by
  // its own num_items_in_batch (data/stream_dataset.h, next_stream_step).
  std::vector<int64_t> micro_targets;
  at::Device device = at::kCPU;
  // Asked before each micro-batch; true abandons the step (AccumulateResult::interrupted), so a
  // stop request waits for one micro-batch's forward and backward at most.
  std::function<bool()> should_stop;
  // Around each micro-batch's backward (data parallelism: arm and drain the gradient reduction);
  // `last` = the step's last micro-batch.
  std::function<void(bool last)> before_backward;
  std::function<void()> after_backward;
};

struct AccumulateResult {
  at::Tensor loss_sum;  // 0-d fp32 on the device: sum of token losses over the micro-batches
  // With micro_targets: 0-d fp32, the normalised loss sum_i loss_sum_i / micro_targets[i]
  // (unscaled; HF's logged loss of the step). Undefined otherwise (loss_sum / total_targets).
  at::Tensor objective;
  bool interrupted = false;  // should_stop answered true: .grad holds a partial sum, to be discarded
};

// Forward and backward of each micro-batch (moved to options.device), accumulating into the
// parameters' .grad. Gradients equal those of (sum of token losses) / total_targets (or
// sum_i loss_i / micro_targets[i]).
AccumulateResult accumulate_gradients(model::LlamaForCausalLM& model, const std::vector<MicroBatch>& micro_batches,
                                      const AccumulateOptions& options);

// Enables autocast for a device type and dtype for its lifetime; restores the previous state.
class AutocastGuard {
 public:
  AutocastGuard(at::DeviceType device_type, std::optional<at::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  at::DeviceType device_type_;
  bool active_ = false, prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

// What a forward ran under that its recomputation in backward must see again: the device's
// autocast dtype (when autocast was on) and the kernel choice (ops::effective_backends_spec()).
// Backward may run on another thread (CUDA's autograd engine), where neither is set.
struct ForwardState {
  std::optional<at::ScalarType> autocast;
  std::string kernels;
  static ForwardState current(at::DeviceType device_type);
};

// Re-enters a ForwardState while it lives, with autograd on: autocast as an AutocastGuard sets it
// (its weight casts dropped at the end), the kernels as an ops::BackendScope.
class ForwardStateScope {
 public:
  ForwardStateScope(at::DeviceType device_type, const ForwardState& state);
  ~ForwardStateScope();
  ForwardStateScope(const ForwardStateScope&) = delete;
  ForwardStateScope& operator=(const ForwardStateScope&) = delete;

 private:
  at::AutoGradMode grad_{true};
  AutocastGuard autocast_;
  std::unique_ptr<ops::BackendScope> kernels_;
};

}  // namespace kiln::train
