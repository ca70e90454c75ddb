// The run's token shards: see training_data.h.
#include "kiln/train/training_data.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/common/logger.h"
#include "kiln/config/yaml.h"
#include "kiln/data/default_corpus.h"
#include "kiln/data/hf_tokenizer.h"
#include "kiln/data/named_datasets.h"
#include "kiln/train/progress.h"
#include "kiln/train/stop_request.h"

namespace kiln::train {

namespace fs = std::filesystem;

std::string model_tokenizer_spec(const PretrainConfig& config) {
  if (!config.model_name_or_path.empty() && fs::exists(fs::path(config.model_name_or_path) / "tokenizer.json")) {
    return (fs::path(config.model_name_or_path) / "tokenizer.json").string();
  }
  return "byte";
}

namespace {

// tokenizer_config.json's pad_token beside the tokenizer, if any (its content).
std::optional<std::string> tokenizer_pad_token(const std::string& spec) {
  const fs::path file = fs::path(spec).parent_path() / "tokenizer_config.json";
  if (!fs::is_regular_file(file)) return std::nullopt;
  nlohmann::json j;
  try {
    std::ifstream in(file);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw config::ConfigError(fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  if (!j.is_object() || !j.contains("pad_token") || j["pad_token"].is_null()) return std::nullopt;
  const auto& pad = j["pad_token"];
  const std::string content = pad.is_string() ? pad.get<std::string>() : pad.value("content", "");
  if (content.empty()) return std::nullopt;
  return content;
}

LfSpecialTokens special_tokens(const PretrainConfig& config, const std::string& spec,
                               const data::Tokenizer& tokenizer) {
  const auto* hf = dynamic_cast<const data::HfTokenizer*>(&tokenizer);
  try {
    return lf_special_tokens(config.template_name, hf, tokenizer.eos_id(),
                             hf ? tokenizer_pad_token(spec) : std::nullopt);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(config::config_message(config.source, "template", e.what()));
  }
}

// LLaMA-Factory's datasets `names` of the config's dataset_dir, tokenized (or found) in their
// shard folder; `tokenized_path` "" = the cache. See training_shard_dir.
data::PreparedDatasets prepare_datasets(const PretrainConfig& config, const std::string& names, const char* key,
                                        const std::string& tokenized_path, bool main_process, bool reuse_only,
                                        int rank) {
  auto fail = [&](const std::string& problem) -> data::PreparedDatasets {
    throw config::ConfigError(config::config_message(config.source, key, problem));
  };
  const std::string folder = config.dataset_dir.empty() ? "data" : config.dataset_dir;
  if (fs::exists(fs::path(folder) / "meta.json")) {
    return fail(
        fmt::format("dataset_dir {} is a shard folder (meta.json); {} names datasets of a "
                    "folder with dataset_info.json: give one of the two",
                    folder, key));
  }
  std::vector<data::NamedDataset> datasets;
  try {
    datasets = data::resolve_datasets(names, folder);
  } catch (const std::runtime_error& e) {
    return fail(e.what());
  }
  const std::string spec = model_tokenizer_spec(config);
  const auto tokenizer = data::load_tokenizer(spec);
  const LfSpecialTokens special = special_tokens(config, spec, *tokenizer);
  data::NamedDatasetOptions o;
  o.tokenized_path = tokenized_path;
  o.max_samples = config.max_samples;
  o.overwrite_cache = config.overwrite_cache;
  o.reuse_only = reuse_only;
  if (special.separator_id != tokenizer->eos_id()) o.separator_id = special.separator_id;
  if (reuse_only && rank >= 0)
    o.on_info = [rank](const std::string& line) { logger()->info("rank {}: {}", rank, line); };
  std::unique_ptr<ProgressBar> bar;
  if (main_process) {
    o.on_info = [](const std::string& line) { logger()->info("{}", line); };
    o.on_progress = [&bar](const data::TokenizeProgress& p) {
      // Between chunks: a SIGTERM during a long tokenization ends the program within a chunk.
      if (const int sig = pending_stop_signal().load(); sig != 0) {
        throw StopRequested(
            fmt::format("{} received while tokenizing the training data: stopped before training, "
                        "nothing saved (the partial tokenization was removed)",
                        stop_signal_name(sig)));
      }
      if (!bar) bar = std::make_unique<ProgressBar>(std::max<int64_t>(p.bytes_total >> 10, 1), 0, stderr);
      bar->update(p.bytes_done >> 10);
    };
  }
  try {
    auto prepared = data::prepare_named_datasets(*tokenizer, datasets, o);
    if (bar) bar->finish();
    return prepared;
  } catch (const std::runtime_error& e) {
    if (bar) bar->finish();
    return fail(fmt::format("tokenizer {}: {}", spec, e.what()));
  }
}

}  // namespace

LfSpecialTokens llamafactory_special_tokens(const PretrainConfig& config) {
  const std::string spec = model_tokenizer_spec(config);
  return special_tokens(config, spec, *data::load_tokenizer(spec));
}

data::PreparedDatasets eval_datasets(const PretrainConfig& config) {
  return prepare_datasets(config, config.eval_dataset, "eval_dataset", "", /*main_process=*/false,
                          /*reuse_only=*/true, /*rank=*/-1);  // -1: silent
}

std::string training_shard_dir(const PretrainConfig& config, bool main_process, bool reuse_only, int rank) {
  auto fail = [&](const std::string& key, const std::string& problem) -> std::string {
    throw config::ConfigError(config::config_message(config.source, key, problem));
  };
  if (config.dataset.empty()) {
    if (!config.tokenized_path.empty()) {
      if (!fs::exists(fs::path(config.tokenized_path) / "meta.json"))
        return fail("tokenized_path", fmt::format("{}: no meta.json (name the datasets to tokenize with dataset)",
                                                  config.tokenized_path));
      return config.tokenized_path;
    }
    if (config.dataset_dir.empty()) return data::default_corpus_shards();
    const fs::path dir(config.dataset_dir);
    if (!fs::exists(dir / "meta.json") && fs::exists(dir / "dataset_info.json")) {
      return fail("dataset_dir", fmt::format("{} holds dataset_info.json, not token shards: name the datasets with "
                                             "dataset (e.g. dataset: a,b)",
                                             config.dataset_dir));
    }
    return config.dataset_dir;
  }
  const auto train =
      prepare_datasets(config, config.dataset, "dataset", config.tokenized_path, main_process, reuse_only, rank);
  if (!config.eval_dataset.empty()) {
    // Prepared here too, so that rank 0 tokenizes both before the other ranks reuse them.
    prepare_datasets(config, config.eval_dataset, "eval_dataset", "", main_process, reuse_only, rank);
  }
  return train.shard_dir;
}

}  // namespace kiln::train
