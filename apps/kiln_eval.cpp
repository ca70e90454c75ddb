// kiln-eval: mean next-token loss and perplexity of a checkpoint over a whole split of token
// shards. Sum of token losses / number of targets, so the result does not depend on the batch
// size or the order.
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "cli.h"
#include "kiln/common/format.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "kiln/model/hf.h"
#include "kiln/train/evaluate.h"
#include "kiln/train/trainer.h"
#include "settings.h"

int main(int argc, char** argv) {
  try {
    const auto line = kiln::config::parse_command_line(kiln::cli::arguments(argc, argv), kiln::cli::eval_spelling());
    if (line.help) {
      std::cout << kiln::cli::settings_help(
          "Usage: kiln-eval --model_name_or_path DIR --dataset_dir DIR [--KEY VALUE ...]\n\n"
          "Mean loss and perplexity of a checkpoint over a token-shard split.",
          kiln::cli::eval_keys());
      return 0;
    }
    const kiln::cli::EvalSettings s = kiln::cli::read_eval_settings(line);
    const int64_t cutoff = s.cutoff_len, batch = s.per_device_eval_batch_size;
    const at::Device device = kiln::cli::device(s.given, s.device);
    auto model = kiln::model::load_pretrained(s.model_name_or_path, {.dtype = at::kFloat, .device = device});
    if (cutoff > model->config().max_position_embeddings) {
      fmt::print(stderr, "kiln-eval: warning: cutoff_len {} is beyond the model's max_position_embeddings {} ({})\n",
                 cutoff, model->config().max_position_embeddings, model->config().source);
    }
    const auto shards = kiln::data::TokenShards::open(s.dataset_dir);
    shards->check_ids_below(model->config().vocab_size,
                            fmt::format("the model's vocab_size ({})", model->config().source));
    // The BOS rule (docs/data.md): as the model was trained (kiln_data.json), else as HF's
    // tokenizer(text) starts a sequence (the checkpoint's tokenizer.json, else the shards').
    const std::string& dir = s.model_name_or_path;
    const auto record = kiln::data::DataRecord::read(dir);
    std::unique_ptr<kiln::data::Tokenizer> tokenizer;
    if (!record) {
      const std::string& shard_tok = shards->meta().tokenizer;
      if (std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
        tokenizer = kiln::data::load_tokenizer(dir);
      } else if (shard_tok == "byte" || std::filesystem::exists(shard_tok)) {
        tokenizer = kiln::data::load_tokenizer(shard_tok);
      }
    }
    const auto bos_rule =
        kiln::data::block_bos(kiln::cli::bos_rule(s.add_bos), record, tokenizer.get(), shards->meta());
    const int64_t bos = bos_rule.id;
    if (bos >= model->config().vocab_size)
      throw std::invalid_argument(
          fmt::format("BOS id {} is outside the model's vocab_size {}", bos, model->config().vocab_size));
    std::string split = s.split;
    if (split.empty()) split = shards->has_split("val") ? "val" : "train";
    const auto dataset = std::make_shared<kiln::data::PackedDataset>(shards->split(split), cutoff);
    if (dataset->num_blocks() == 0) {
      throw std::invalid_argument(fmt::format("split '{}' has fewer tokens than cutoff_len {}", split, cutoff));
    }
    std::optional<at::ScalarType> autocast;
    if (s.bf16) autocast = at::kBFloat16;
    const auto r = kiln::train::evaluate_dataset(
        model, dataset, {.batch_size = batch, .device = device, .autocast_dtype = autocast, .prepend_token_id = bos});
    fmt::print("split {}: {} blocks of {}{}, {} target tokens (BOS: {})\n", split,
               kiln::with_commas(dataset->num_blocks()), cutoff, bos >= 0 ? fmt::format(" after BOS {}", bos) : "",
               kiln::with_commas(r.tokens), bos_rule.rule);
    fmt::print("loss {:.6f}\nperplexity {:.4f}\n", r.loss, r.perplexity);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-eval: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
