// kiln-eval: mean next-token loss and perplexity of a checkpoint over a whole split of token
// shards. Sum of token losses / number of targets, so the result does not depend on the batch
// size or the order.
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "cli.h"
#include "kiln/common/format.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "kiln/model/hf.h"
#include "kiln/train/evaluate.h"
#include "kiln/train/trainer.h"

int main(int argc, char** argv) {
  cxxopts::Options options("kiln-eval", "Mean loss and perplexity of a checkpoint over a token-shard split");
  // clang-format off
  options.add_options()
    ("model", "checkpoint folder (config.json + safetensors)", cxxopts::value<std::string>())
    ("dataset-dir", "token shards from kiln-tokenize", cxxopts::value<std::string>())
    ("split", "split to score (default: val when present, else train)", cxxopts::value<std::string>())
    ("cutoff-len", "tokens per packed block", cxxopts::value<int64_t>()->default_value("1024"))
    ("batch-size", "blocks per forward pass", cxxopts::value<int64_t>()->default_value("8"))
    ("bf16", "compute in bf16 (autocast)")
    ("add-bos", "put the shards' BOS token before every block (every block token is then scored)")
    ("no-add-bos", "score the blocks as the shards hold them")
    ("device", "auto, cpu or cuda (default auto: cuda when present)", cxxopts::value<std::string>())
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    kiln::cli::require(args, {"model", "dataset-dir"});
    const int64_t cutoff = args["cutoff-len"].as<int64_t>(), batch = args["batch-size"].as<int64_t>();
    if (cutoff < 2 || batch < 1) throw std::invalid_argument("--cutoff-len must be >= 2 and --batch-size >= 1");
    const at::Device device = kiln::cli::device(kiln::cli::optional_string(args, "device"));
    auto model = kiln::model::load_pretrained(args["model"].as<std::string>(), {.dtype = at::kFloat, .device = device});
    if (args.count("add-bos") && args.count("no-add-bos"))
      throw std::invalid_argument("--add-bos and --no-add-bos: give at most one");
    if (cutoff > model->config().max_position_embeddings) {
      fmt::print(stderr, "kiln-eval: warning: --cutoff-len {} is beyond the model's max_position_embeddings {} ({})\n",
                 cutoff, model->config().max_position_embeddings, model->config().source);
    }
    const auto shards = kiln::data::TokenShards::open(args["dataset-dir"].as<std::string>());
    shards->check_ids_below(model->config().vocab_size,
                            fmt::format("the model's vocab_size ({})", model->config().source));
    // The BOS rule (docs/data.md): as the model was trained (kiln_data.json), else as HF's
    // tokenizer(text) starts a sequence (the checkpoint's tokenizer.json, else the shards').
    const std::string dir = args["model"].as<std::string>();
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
    const auto rule = args.count("add-bos")      ? kiln::data::BosRule::kAdd
                      : args.count("no-add-bos") ? kiln::data::BosRule::kNone
                                                 : kiln::data::BosRule::kAuto;
    const auto bos_rule = kiln::data::block_bos(rule, record, tokenizer.get(), shards->meta());
    const int64_t bos = bos_rule.id;
    if (bos >= model->config().vocab_size)
      throw std::invalid_argument(
          fmt::format("BOS id {} is outside the model's vocab_size {}", bos, model->config().vocab_size));
    std::string split = kiln::cli::optional_string(args, "split");
    if (split.empty()) split = shards->has_split("val") ? "val" : "train";
    const auto dataset = std::make_shared<kiln::data::PackedDataset>(shards->split(split), cutoff);
    if (dataset->num_blocks() == 0) {
      throw std::invalid_argument(fmt::format("split '{}' has fewer tokens than --cutoff-len {}", split, cutoff));
    }
    std::optional<at::ScalarType> autocast;
    if (args.count("bf16")) autocast = at::kBFloat16;
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
