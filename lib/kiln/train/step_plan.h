// HF Trainer's step arithmetic and its "***** Running training *****" banner, so that the
// numbers a user knows from LLaMA-Factory logs (configs/reference/llamafactory_runs.yaml) come out the
// same here for the same settings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::train {

struct StepPlan {
  int64_t num_examples = 0;  // packed blocks in the training split
  double num_epochs = 0;     // as configured (may be fractional)
  int64_t batch_size_per_device = 0;
  int64_t world_size = 1;
  int64_t gradient_accumulation_steps = 1;
  int64_t batches_per_epoch = 0;  // ceil(examples / (batch * world))
  // max(ceil(batches_per_epoch / accumulation), 1): the last window of an epoch may hold fewer
  // than `accumulation` batches and still makes an optimizer step (transformers >= 4.52.1;
  // 4.51 and older used the floor and dropped it).
  int64_t updates_per_epoch = 0;
  int64_t last_window_batches() const {
    const int64_t r = batches_per_epoch % gradient_accumulation_steps;
    return r == 0 ? gradient_accumulation_steps : r;
  }
  int64_t total_steps = 0;  // max_steps, or ceil(epochs * updates_per_epoch)
  int64_t total_batch_size() const { return batch_size_per_device * world_size * gradient_accumulation_steps; }
  // An iterable train set (LLaMA-Factory's streaming): no length, so HF's figures come from
  // max_steps alone (plan_stream_steps).
  bool streamed = false;
  // The banner's "Num Epochs": ceil(num_epochs), or sys.maxsize for a stream.
  int64_t banner_epochs() const;
};

StepPlan plan_steps(int64_t num_examples, int64_t batch_size_per_device, int64_t world_size,
                    int64_t gradient_accumulation_steps, double num_epochs, int64_t max_steps);

// HF's figures for a train set without a length (transformers 5.6 set_initial_training_values,
// trainer.py:2339-2349, the "max_steps > 0 and no length" branch): Num Epochs = sys.maxsize,
// updates per epoch = max_steps, Num examples = total batch x max_steps, steps_in_epoch (batches
// per epoch) = max_steps x accumulation, so every window holds `accumulation` batches.
StepPlan plan_stream_steps(int64_t batch_size_per_device, int64_t world_size, int64_t gradient_accumulation_steps,
                           int64_t max_steps);

// The banner lines exactly as HF Trainer logs them (transformers 5.6.0, trainer.py
// _inner_training_loop, without its log prefix), "\n"-separated. Older transformers (the user's
// logs) had no "Num update steps per epoch" line.
std::string training_banner(const StepPlan& plan, int64_t trainable_parameters);

// HF Trainer's evaluation_loop lines: "***** Running Evaluation *****", "  Num examples = N" (no
// thousands separators there) and "  Batch size = B" (per device).
// An evaluation set without a length (a stream): "  Num examples: Unknown", as HF logs it
// (trainer.py:2669-2672).
std::string evaluation_banner(std::optional<int64_t> num_examples, int64_t batch_size_per_device);

}  // namespace kiln::train
