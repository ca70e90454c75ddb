#include "kiln/train/evaluate.h"

#include <cmath>

#include <ATen/ATen.h>

#include "kiln/data/loader.h"
#include "kiln/train/step.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

EvalResult evaluate_dataset(model::LlamaForCausalLM& model, const std::shared_ptr<const data::PackedDataset>& dataset,
                            int64_t batch_size, const at::Device& device, std::optional<at::ScalarType> autocast_dtype,
                            bool neat_packing, const std::function<bool()>& should_stop) {
  at::NoGradGuard no_grad;
  model->eval();
  data::LoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = false;
  options.segment_ids = neat_packing;
  data::DataLoader loader(dataset, options);
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(device).dtype(at::kDouble));
  int64_t targets = 0;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    if (should_stop && should_stop()) {
      EvalResult r;
      r.interrupted = true;
      r.loss = r.perplexity = NAN;
      return r;
    }
    const data::Batch batch = loader.next();
    AutocastGuard autocast(device.type(), autocast_dtype);
    const at::Tensor segments = batch.segment_ids.defined() ? batch.segment_ids.to(device) : at::Tensor();
    const auto out = model->forward(batch.input_ids.to(device), batch.labels.to(device), {}, segments);
    loss_sum.add_(out.loss_sum.to(at::kDouble));
    targets += count_targets(batch.labels);
  }
  EvalResult r;
  r.tokens = targets;
  r.loss = targets > 0 ? loss_sum.item<double>() / static_cast<double>(targets) : NAN;
  r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace kiln::train
