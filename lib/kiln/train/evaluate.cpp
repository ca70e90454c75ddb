#include "kiln/train/evaluate.h"

#include <cmath>

#include <ATen/ATen.h>

#include "kiln/data/loader.h"
#include "kiln/train/step.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

EvalResult evaluate_dataset(model::LlamaForCausalLM& model, const std::shared_ptr<const data::PackedDataset>& dataset,
                            const EvalOptions& o) {
  at::NoGradGuard no_grad;
  model->eval();
  data::LoaderOptions options;
  options.batch_size = o.batch_size;
  options.shuffle = false;
  options.segment_ids = o.neat_packing;
  // This rank's blocks: [rank * B / world, (rank + 1) * B / world).
  const int64_t blocks = dataset->num_blocks();
  const int64_t first = o.rank * blocks / o.world_size, count = (o.rank + 1) * blocks / o.world_size - first;
  const int64_t most = (blocks + o.world_size - 1) / o.world_size;  // the largest share of any rank
  const int64_t slots = (most + o.batch_size - 1) / o.batch_size;
  std::unique_ptr<data::DataLoader> loader;
  if (count > 0) {
    loader = std::make_unique<data::DataLoader>(o.world_size > 1 ? dataset->range(first, count) : dataset, options);
  }
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(o.device).dtype(at::kDouble));
  int64_t targets = 0;
  for (int64_t i = 0; i < slots; ++i) {
    if (o.should_stop && o.should_stop()) {
      EvalResult r;
      r.interrupted = true;
      r.loss = r.perplexity = NAN;
      return r;
    }
    if (!loader || i >= loader->batches_per_epoch()) continue;  // this rank's share is done
    data::Batch batch = loader->next();
    if (o.prepend_token_id >= 0) {
      const at::Tensor first = at::full({batch.input_ids.size(0), 1}, o.prepend_token_id, batch.input_ids.options());
      batch.input_ids = at::cat({first, batch.input_ids}, 1);
      batch.labels = at::cat({first, batch.labels}, 1);  // position 0 is never a target after the shift
      if (batch.segment_ids.defined())
        batch.segment_ids = at::cat({batch.segment_ids.narrow(1, 0, 1), batch.segment_ids}, 1);
    }
    AutocastGuard autocast(o.device.type(), o.autocast_dtype);
    const at::Tensor segments = batch.segment_ids.defined() ? batch.segment_ids.to(o.device) : at::Tensor();
    const auto out = model->forward(batch.input_ids.to(o.device), batch.labels.to(o.device), {}, segments);
    loss_sum.add_(out.loss_sum.to(at::kDouble));
    targets += count_targets(batch.labels);
  }
  EvalResult r;
  double sum = loss_sum.item<double>();
  if (o.host_sum) {
    const auto total = o.host_sum({sum, static_cast<double>(targets)});
    sum = total[0];
    targets = static_cast<int64_t>(total[1]);
  }
  r.tokens = targets;
  r.loss = targets > 0 ? sum / static_cast<double>(targets) : NAN;
  r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace kiln::train
