// Mean next-token loss over a whole split: the sum of token losses over the number of target
// tokens, so the result does not depend on batch size or order (kiln-eval, Trainer evaluation).
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "kiln/model/llama.h"

namespace kiln::data {
class PackedDataset;
}

namespace kiln::train {

struct EvalResult;

// neat_packing: documents in a block do not see each other (as in training with neat_packing).
// should_stop is asked before every batch; when it answers true the evaluation is abandoned and
// the result has interrupted = true (and no loss), so a stop request waits for one batch at most.
EvalResult evaluate_dataset(model::LlamaForCausalLM& model, const std::shared_ptr<const data::PackedDataset>& dataset,
                            int64_t batch_size, const at::Device& device, std::optional<at::ScalarType> autocast_dtype,
                            bool neat_packing = false, const std::function<bool()>& should_stop = {});

}  // namespace kiln::train
