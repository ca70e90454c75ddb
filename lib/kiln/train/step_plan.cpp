#include "kiln/train/step_plan.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/common/format.h"

namespace kiln::train {

StepPlan plan_steps(int64_t num_examples, int64_t batch_size_per_device, int64_t world_size,
                    int64_t gradient_accumulation_steps, double num_epochs, int64_t max_steps) {
  StepPlan p;
  p.num_examples = num_examples;
  p.batch_size_per_device = batch_size_per_device;
  p.world_size = world_size;
  p.gradient_accumulation_steps = gradient_accumulation_steps;
  const int64_t per_batch = batch_size_per_device * world_size;
  p.batches_per_epoch = (num_examples + per_batch - 1) / per_batch;
  // transformers >= 4.52.1 (every version LLaMA-Factory 0.9.5 admits; trainer.py,
  // set_initial_training_values): the last, shorter accumulation window of an epoch is a step.
  p.updates_per_epoch =
      std::max<int64_t>((p.batches_per_epoch + gradient_accumulation_steps - 1) / gradient_accumulation_steps, 1);
  if (max_steps > 0) {
    p.total_steps = max_steps;
    // HF: epochs = max_steps // updates_per_epoch + (1 if there is a remainder)
    p.num_epochs = static_cast<double>(max_steps / p.updates_per_epoch + (max_steps % p.updates_per_epoch > 0));
  } else {
    p.num_epochs = num_epochs;
    p.total_steps = static_cast<int64_t>(std::ceil(num_epochs * static_cast<double>(p.updates_per_epoch)));
  }
  return p;
}

int64_t StepPlan::banner_epochs() const {
  return streamed ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(std::ceil(num_epochs));
}

StepPlan plan_stream_steps(int64_t batch_size_per_device, int64_t world_size, int64_t gradient_accumulation_steps,
                           int64_t max_steps) {
  if (max_steps <= 0) throw std::invalid_argument("a stream has no length: max_steps must be > 0");
  StepPlan p;
  p.streamed = true;
  p.batch_size_per_device = batch_size_per_device;
  p.world_size = world_size;
  p.gradient_accumulation_steps = gradient_accumulation_steps;
  p.total_steps = max_steps;
  p.updates_per_epoch = max_steps;
  p.batches_per_epoch = max_steps * gradient_accumulation_steps;
  p.num_examples = p.total_batch_size() * max_steps;
  p.num_epochs = static_cast<double>(std::numeric_limits<int64_t>::max());
  return p;
}

std::string training_banner(const StepPlan& p, int64_t trainable_parameters) {
  return fmt::format(
      "***** Running training *****\n"
      "  Num examples = {}\n"
      "  Num Epochs = {}\n"
      "  Num update steps per epoch = {}\n"
      "  Instantaneous batch size per device = {}\n"
      "  Total train batch size (w. parallel, distributed & accumulation) = {}\n"
      "  Gradient Accumulation steps = {}\n"
      "  Total optimization steps = {}\n"
      "  Number of trainable parameters = {}",
      with_commas(p.num_examples), with_commas(p.banner_epochs()), with_commas(p.updates_per_epoch),
      with_commas(p.batch_size_per_device), with_commas(p.total_batch_size()), p.gradient_accumulation_steps,
      with_commas(p.total_steps), with_commas(trainable_parameters));
}

std::string evaluation_banner(std::optional<int64_t> num_examples, int64_t batch_size_per_device) {
  return fmt::format(
      "***** Running Evaluation *****\n"
      "  Num examples{}\n"
      "  Batch size = {}",
      num_examples ? fmt::format(" = {}", *num_examples) : std::string(": Unknown"), batch_size_per_device);
}

}  // namespace kiln::train
