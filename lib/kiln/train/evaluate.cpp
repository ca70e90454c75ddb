#include "kiln/train/evaluate.h"

#include <cmath>
#include <stdexcept>

#include <ATen/ATen.h>

#include "kiln/common/nvtx.h"
#include "kiln/data/loader.h"
#include "kiln/data/stream_dataset.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/trainer.h"

namespace kiln::train {

namespace {

// A batch to evaluate and, for HF's loss (ignore_label_id), the rows its loss counts for in the
// mean over rows: its own rows, except in a stream (evaluate_stream).
struct EvalBatch {
  MicroBatch batch;
  int64_t weight = -1;  // -1: the batch's rows
};

std::function<std::optional<EvalBatch>()> by_rows(const std::function<std::optional<MicroBatch>()>& next) {
  return [&next]() -> std::optional<EvalBatch> {
    std::optional<MicroBatch> b = next();
    if (!b) return std::nullopt;
    return EvalBatch{std::move(*b), -1};
  };
}

// The loop the entry points share. `next` yields this rank's next batch (nullopt: none now);
// with `slots` every rank runs exactly that many iterations, otherwise until no rank has one.
EvalResult run_eval(model::LlamaForCausalLM& model, const std::function<std::optional<EvalBatch>()>& next_batch,
                    const EvalOptions& o, std::optional<int64_t> slots) {
  const nvtx::Range range("kiln::evaluate");
  at::NoGradGuard no_grad;
  model->eval();
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(o.device).dtype(at::kDouble));
  int64_t targets = 0, examples = 0;
  for (int64_t i = 0; !slots || i < *slots; ++i) {
    if (o.should_stop && o.should_stop()) {
      EvalResult r;
      r.interrupted = true;
      r.loss = r.perplexity = NAN;
      return r;
    }
    std::optional<EvalBatch> item = next_batch();
    std::optional<MicroBatch> batch;
    int64_t weight = -1;
    if (item) {
      batch = std::move(item->batch);
      weight = item->weight;
    }
    if (!slots) {
      const bool any = o.host_max ? o.host_max({batch ? 1 : 0})[0] > 0 : batch.has_value();
      if (!any) break;
    }
    if (!batch) continue;  // this rank's share is done; the others go on
    examples += batch->input_ids.size(0);
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
      const int64_t rows = weight >= 0 ? weight : batch->input_ids.size(0);
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
    const auto total = o.host_sum({sum, static_cast<double>(targets), static_cast<double>(examples)});
    sum = total[0];
    targets = static_cast<int64_t>(total[1]);
    examples = static_cast<int64_t>(total[2]);
  }
  r.tokens = targets;
  r.examples = examples;
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
  return run_eval(model, by_rows(next), o, slots);
}

EvalResult evaluate_stream(model::LlamaForCausalLM& model, const data::StreamSpec& stream, const EvalOptions& o) {
  if (o.world_size > 1) throw std::logic_error("evaluate_stream: a stream is evaluated in one process");
  data::StreamLoader loader(stream);  // epoch 0: HF makes the eval DataLoader afresh for each evaluation
  // HF's evaluation_loop repeats each batch's loss args.eval_batch_size times (trainer.py:2718)
  // and accelerate's gather_for_metrics cuts only the dataloader's last batch to its rows (the
  // DataLoaderDispatcher's remainder): a worker's shorter last batch before it counts as a full
  // one. One batch of look-ahead tells the last.
  std::optional<data::Batch> ahead = loader.next();
  const int64_t full = stream.batches.batch_size;
  const auto next = [&]() -> std::optional<EvalBatch> {
    if (!ahead) return std::nullopt;
    data::Batch b = std::move(*ahead);
    ahead = loader.next();
    const int64_t weight = ahead ? full : b.input_ids.size(0);
    return EvalBatch{MicroBatch{std::move(b.input_ids), std::move(b.labels), std::move(b.segment_ids)}, weight};
  };
  EvalOptions one = o;
  one.host_max = nullptr;
  return run_eval(model, next, one, std::nullopt);
}

EvalResult evaluate_batches(model::LlamaForCausalLM& model, const std::function<std::optional<MicroBatch>()>& next,
                            const EvalOptions& o) {
  return run_eval(model, by_rows(next), o, std::nullopt);
}

}  // namespace kiln::train
