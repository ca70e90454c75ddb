// LLaMA-Factory's datasets by name: `dataset: a,b` resolved through `dataset_dir/dataset_info.json`
// as its pretraining stage reads it (file_name: a file or a folder, columns.prompt: the text
// column), then tokenized on first use into kiln's shard format (tokenize.h, the kiln-tokenize
// code path) in a cache folder keyed by the files' content, the text columns, max_samples and the
// tokenizer. Hub entries (hf_hub_url, ms_hub_url, om_hub_url, script_url, cloud_file_name) are
// refused: kiln has no network, download the data first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/data/tokenize.h"
#include "kiln/data/tokenizer.h"

namespace kiln::data {

struct NamedDataset {
  std::string name;
  std::vector<std::string> files;    // file_name's file, or the files of its folder (sorted)
  std::string text_column = "text";  // columns.prompt
};

// Parses dataset_info.json's text (`source` names it in errors) and resolves `names` (comma
// separated, blanks trimmed) against it; file names are relative to `dataset_dir`. Throws
// std::runtime_error naming the file, the dataset and the problem.
std::vector<NamedDataset> parse_dataset_info(const std::string& json_text, const std::string& names,
                                             const std::string& dataset_dir, const std::string& source);
// Reads dataset_dir/dataset_info.json, then as parse_dataset_info.
std::vector<NamedDataset> resolve_datasets(const std::string& names, const std::string& dataset_dir);

struct NamedDatasetOptions {
  std::string tokenized_path;    // "" = cache_dir/datasets/<names>-<key>
  std::string cache_dir;         // "" = default_cache_dir()
  int64_t max_samples = 0;       // > 0: the first max_samples documents of each dataset
  bool overwrite_cache = false;  // tokenize again even when the folder holds these datasets
  // Never tokenize: the folder must already hold these datasets (the ranks after rank 0, which
  // prepared them); otherwise an error. overwrite_cache is then ignored.
  bool reuse_only = false;
  // The id written after each document (-1: the tokenizer's EOS); LLaMA-Factory's templates
  // change it (train/hf/lf_template.h). Part of the cache key.
  int32_t separator_id = -1;
  std::function<void(const TokenizeProgress&)> on_progress;
  std::function<void(const std::string&)> on_info;  // "reusing ..." / "tokenized ..." lines
};

struct PreparedDatasets {
  std::string shard_dir;
  std::string key;         // 16 hex digits: content, columns, max_samples, tokenizer
  bool tokenized = false;  // false: the cache was reused
  TokenizeReport report;   // when tokenized
  // Documents of each dataset, in `datasets` order (their shards hold them one after another):
  // what a mixture (data/mixture.h) interleaves.
  std::vector<int64_t> documents;
  std::vector<std::string> names;  // the datasets' names, in that order (a name listed twice once)
};

// The cache key of these datasets for this tokenizer (reads every file once).
std::string named_datasets_key(const Tokenizer& tokenizer, const std::vector<NamedDataset>& datasets,
                               int64_t max_samples, int32_t separator_id = -1);

// The documents per dataset that a prepared folder's kiln_dataset.json records; std::runtime_error
// naming the file when it records none.
std::vector<int64_t> named_dataset_documents(const std::string& shard_dir);

// Shards of the datasets' documents (each followed by EOS, no BOS) in order, reusing the folder
// when it already holds them (its kiln_dataset.json has the same key) unless overwrite_cache.
PreparedDatasets prepare_named_datasets(const Tokenizer& tokenizer, const std::vector<NamedDataset>& datasets,
                                        const NamedDatasetOptions& options);

}  // namespace kiln::data
