// The run's token shards: see training_data.h.
#include "kiln/train/training_data.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/common/logger.h"
#include "kiln/config/yaml.h"
#include "kiln/data/default_corpus.h"
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

int64_t llamafactory_pad_id(const PretrainConfig& config, int64_t eos_id) {
  const std::string spec = model_tokenizer_spec(config);
  if (spec == "byte") return eos_id;
  const fs::path file = fs::path(spec).parent_path() / "tokenizer_config.json";
  if (!fs::is_regular_file(file)) return eos_id;
  nlohmann::json j;
  try {
    std::ifstream in(file);
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw config::ConfigError(fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  if (!j.is_object() || !j.contains("pad_token") || j["pad_token"].is_null()) return eos_id;
  const auto& pad = j["pad_token"];
  const std::string content = pad.is_string() ? pad.get<std::string>() : pad.value("content", "");
  if (content.empty()) return eos_id;
  std::vector<int32_t> ids;
  data::load_tokenizer(spec)->encode_into(content, ids, false);
  if (ids.size() != 1) {
    throw config::ConfigError(fmt::format("{}: pad_token '{}' is not one token of {} (it encodes to {} ids)",
                                          file.string(), content, spec, ids.size()));
  }
  return ids[0];
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
  const std::string folder = config.dataset_dir.empty() ? "data" : config.dataset_dir;
  if (fs::exists(fs::path(folder) / "meta.json")) {
    return fail("dataset", fmt::format("dataset_dir {} is a shard folder (meta.json); dataset names datasets of a "
                                       "folder with dataset_info.json: give one of the two",
                                       folder));
  }
  std::vector<data::NamedDataset> datasets;
  try {
    datasets = data::resolve_datasets(config.dataset, folder);
  } catch (const std::runtime_error& e) {
    return fail("dataset", e.what());
  }
  const std::string spec = model_tokenizer_spec(config);
  const auto tokenizer = data::load_tokenizer(spec);
  data::NamedDatasetOptions o;
  o.tokenized_path = config.tokenized_path;
  o.max_samples = config.max_samples;
  o.overwrite_cache = config.overwrite_cache;
  o.reuse_only = reuse_only;
  if (reuse_only) o.on_info = [rank](const std::string& line) { logger()->info("rank {}: {}", rank, line); };
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
    const auto prepared = data::prepare_named_datasets(*tokenizer, datasets, o);
    if (bar) bar->finish();
    return prepared.shard_dir;
  } catch (const std::runtime_error& e) {
    if (bar) bar->finish();
    return fail("dataset", fmt::format("tokenizer {}: {}", spec, e.what()));
  }
}

}  // namespace kiln::train
