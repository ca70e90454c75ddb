#include "kiln/train/evaluate.h"

#include <cmath>

#include <ATen/ATen.h>

#include "kiln/common/nvtx.h"
#include "kiln/data/loader.h"
#include "kiln/train/step.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

namespace {

// The loop both entry points share. `next` yields this rank's next batch (nullopt: none now);
// with `slots` every rank runs exactly that many iterations, otherwise until no rank has one.
EvalResult run_eval(model::LlamaForCausalLM& model, const std::function<std::optional<MicroBatch>()>& next,
                    const EvalOptions& o, std::optional<int64_t> slots) {
  const nvtx::Range range("kiln::evaluate");
  at::NoGradGuard no_grad;
  model->eval();
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(o.device).dtype(at::kDouble));
  int64_t targets = 0;
  for (int64_t i = 0; !slots || i < *slots; ++i) {
    if (o.should_stop && o.should_stop()) {
      EvalResult r;
      r.interrupted = true;
      r.loss = r.perplexity = NAN;
      return r;
    }
    std::optional<MicroBatch> batch = next();
    if (!slots) {
      const bool any = o.host_max ? o.host_max({batch ? 1 : 0})[0] > 0 : batch.has_value();
      if (!any) break;
    }
    if (!batch) continue;  // this rank's share is done; the others go on
    if (o.prepend_token_id >= 0) {
      const at::Tensor first = at::full({batch->input_ids.size(0), 1}, o.prepend_token_id, batch->input_ids.options());
      batch->input_ids = at::cat({first, batch->input_ids}, 1);
      batch->labels = at::cat({first, batch->labels}, 1);  // position 0 is never a target after the shift
      if (batch->segment_ids.defined())
        batch->segment_ids = at::cat({batch->segment_ids.narrow(1, 0, 1), batch->segment_ids}, 1);
    }
    AutocastGuard autocast(o.device.type(), o.autocast_dtype);
    const at::Tensor segments = batch->segment_ids.defined() ? batch->segment_ids.to(o.device) : at::Tensor();
    const auto out = model->forward(batch->input_ids.to(o.device), batch->labels.to(o.device), {}, segments);
    if (o.ignore_label_id >= 0) {
      // HF: this batch's loss (normalised by its own num_items_in_batch), repeated per row.
      const int64_t items = batch->labels.ne(-100).sum().item<int64_t>();
      const int64_t rows = batch->input_ids.size(0);
      if (items > 0) {
        loss_sum.add_(out.loss_sum.to(at::kDouble) * (static_cast<double>(rows) / static_cast<double>(items)));
        targets += rows;
      }
      continue;
    }
    loss_sum.add_(out.loss_sum.to(at::kDouble));
    targets += count_targets(batch->labels.cpu());
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

}  // namespace

EvalResult evaluate_dataset(model::LlamaForCausalLM& model, const std::shared_ptr<const data::PackedDataset>& dataset,
                            const EvalOptions& o) {
  data::LoaderOptions options;
  options.batch_size = o.batch_size;
  options.shuffle = false;
  options.segment_ids = o.neat_packing;
  if (o.ignore_label_id >= 0) options.ignore_label_id = options.pad_id = o.ignore_label_id;
  // This rank's blocks: [rank * B / world, (rank + 1) * B / world); every rank runs as many batch
  // slots as the largest share needs, so no collective is needed to agree on the end.
  const int64_t blocks = dataset->num_blocks();
  const int64_t first = o.rank * blocks / o.world_size, count = (o.rank + 1) * blocks / o.world_size - first;
  const int64_t most = (blocks + o.world_size - 1) / o.world_size;
  const int64_t slots = (most + o.batch_size - 1) / o.batch_size;
  std::unique_ptr<data::DataLoader> loader;
  if (count > 0) {
    loader = std::make_unique<data::DataLoader>(o.world_size > 1 ? dataset->range(first, count) : dataset, options);
  }
  int64_t served = 0;
  const auto next = [&]() -> std::optional<MicroBatch> {
    if (!loader || served >= loader->batches_per_epoch()) return std::nullopt;
    ++served;
    data::Batch b = loader->next();
    return MicroBatch{std::move(b.input_ids), std::move(b.labels), std::move(b.segment_ids)};
  };
  return run_eval(model, next, o, slots);
}

EvalResult evaluate_batches(model::LlamaForCausalLM& model, const std::function<std::optional<MicroBatch>()>& next,
                            const EvalOptions& o) {
  return run_eval(model, next, o, std::nullopt);
}

}  // namespace kiln::train
