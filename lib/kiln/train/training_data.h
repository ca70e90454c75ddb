// Which token shards a run trains on (docs/training.md, "Data"):
//   `dataset` given      LLaMA-Factory's datasets by name: dataset_dir ("" = "data") holds
//                        dataset_info.json; they are tokenized on first use into a cache (or
//                        tokenized_path) with the model's tokenizer (data/named_datasets.h);
//   `tokenized_path`     (without `dataset`) a shard folder tokenized earlier;
//   `dataset_dir`        a shard folder of kiln-tokenize (it holds meta.json), as before;
//   none                 the embedded corpus.
#pragma once

#include <string>

#include "kiln/data/named_datasets.h"
#include "kiln/train/hf/lf_template.h"
#include "kiln/train/pretrain_config.h"

namespace kiln::train {

// The shard folder, tokenizing first when needed; `main_process` draws the progress bar and logs.
// With `reuse_only` (the other ranks, after rank 0 prepared the data) named datasets are never
// tokenized: their shards must be there (logged as used, with `rank` in the line).
// Errors are config::ConfigError naming the config's source and the key.
std::string training_shard_dir(const PretrainConfig& config, bool main_process, bool reuse_only = false, int rank = 0);

// The tokenizer of the model: model_name_or_path's tokenizer.json when it has one, else "byte".
std::string model_tokenizer_spec(const PretrainConfig& config);

// The ids LLaMA-Factory's stage pt uses with the model's tokenizer and the config's template
// (hf/lf_template.h): what ends each document and the pad id the collator labels -100 (the
// tokenizer's pad token, tokenizer_config.json's pad_token, else the EOS after the template, as
// LLaMA-Factory's fix_special_tokens sets pad = EOS). Errors name the file or the key.
LfSpecialTokens llamafactory_special_tokens(const PretrainConfig& config);

// The evaluation datasets (eval_dataset), as training_shard_dir prepared them (never tokenizes:
// an error when they are not there).
data::PreparedDatasets eval_datasets(const PretrainConfig& config);

}  // namespace kiln::train
