// Mean next-token loss over a whole split: the sum of token losses over the number of target
// tokens, so the result does not depend on batch size or order (kiln-eval, Trainer evaluation).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "kiln/model/llama.h"
#include "kiln/train/gradient_accumulation.h"

namespace kiln::data {
class PackedDataset;
struct StreamSpec;
}  // namespace kiln::data

namespace kiln::train {

struct EvalResult;

struct EvalOptions {
  int64_t batch_size = 8;  // blocks per forward pass
  at::Device device = at::kCPU;
  std::optional<at::ScalarType> autocast_dtype;
  bool neat_packing = false;  // documents in a block do not see each other (as in training with neat_packing)
  // >= 0: this token (a BOS) is put before every block, so every token of the block is a target
  // (kiln-eval --add-bos, for a model trained with a BOS at the start of each sequence).
  int64_t prepend_token_id = -1;
  // LLaMA-Factory's datasets (>= 0: the pad id, usually EOS): tokens of this id get label -100,
  // and the loss is HF's (trainer.py, prediction_step): per batch the summed cross-entropy over
  // that batch's labels that are not -100 before the shift, then the mean over rows.
  int64_t ignore_label_id = -1;
  // Asked before every batch; when it answers true the evaluation is abandoned and the result has
  // interrupted = true (and no loss), so a stop request waits for one batch at most.
  std::function<bool()> should_stop;
  // Data parallel: rank r of world_size scores a contiguous 1/world of the blocks, every rank runs
  // the same number of batch slots (so should_stop, a collective there, is asked alike), and
  // host_sum adds (loss sum, targets) over the ranks.
  int64_t rank = 0, world_size = 1;
  std::function<std::vector<double>(std::vector<double>)> host_sum;
  // evaluate_batches under data parallelism: "does any rank still have a batch" (max over ranks).
  std::function<std::vector<int64_t>(std::vector<int64_t>)> host_max;
};

EvalResult evaluate_dataset(model::LlamaForCausalLM& model, const std::shared_ptr<const data::PackedDataset>& dataset,
                            const EvalOptions& options);

// Mean loss over one pass of a stream (LLaMA-Factory's streaming evaluation: epoch 0 of the
// stream, in the DataLoader's batches of `stream`'s batch size, data/stream_dataset.h), HF's loss
// as for a dataset except that every batch but the last counts for a full batch in the mean over
// rows, as transformers' evaluation_loop and accelerate's gather_for_metrics weigh an iterable's
// batches (a worker's shorter last batch in the middle included). One process (streaming refuses
// several).
EvalResult evaluate_stream(model::LlamaForCausalLM& model, const data::StreamSpec& stream, const EvalOptions& options);

// Mean token loss over the batches `next` yields until it returns nullopt (a host's own data;
// labels -100 are ignored, the model shifts). batch_size and neat_packing do not apply; with
// host_max, ranks go on until every rank's `next` is exhausted.
EvalResult evaluate_batches(model::LlamaForCausalLM& model, const std::function<std::optional<MicroBatch>()>& next,
                            const EvalOptions& options);

}  // namespace kiln::train
