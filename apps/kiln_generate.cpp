// kiln-generate: sample text from a checkpoint (an HF-layout folder: kiln-pretrain's
// checkpoint-N or any LlamaForCausalLM directory) with a KV cache.
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <cxxopts.hpp>

#include "cli.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "kiln/data/tokenizer.h"
#include "kiln/model/generate.h"
#include "kiln/model/hf.h"

int main(int argc, char** argv) {
  cxxopts::Options options("kiln-generate", "Generate text from a kiln or Hugging Face LLaMA checkpoint");
  // clang-format off
  options.add_options()
    ("model", "checkpoint folder (config.json + safetensors)", cxxopts::value<std::string>())
    ("prompt", "text to continue", cxxopts::value<std::string>())
    ("tokenizer", "byte, or a tokenizer.json / folder (default: the model folder's tokenizer.json, else the one "
     "its training shards were made with (kiln_data.json), else byte)",
     cxxopts::value<std::string>())
    ("max-new-tokens", "tokens to generate (>= 0)", cxxopts::value<int64_t>()->default_value("200"))
    ("add-bos", "put the tokenizer's BOS before the prompt")
    ("no-add-bos", "encode the prompt without any BOS or template tokens (default: as the model's training "
     "shards were, from the checkpoint's kiln_data.json, else as HF's tokenizer(prompt))")
    ("greedy", "argmax decoding (ignores temperature, top-k, top-p)")
    ("temperature", "softmax temperature", cxxopts::value<double>()->default_value("0.8"))
    ("top-k", "keep the k most likely tokens (0 = off)", cxxopts::value<int64_t>()->default_value("50"))
    ("top-p", "nucleus sampling threshold (1 = off)", cxxopts::value<double>()->default_value("0.95"))
    ("ids", "print the prompt's and the new tokens' ids as one JSON line instead of text")
    ("seed", "sampling seed", cxxopts::value<uint64_t>()->default_value("0"))
    ("device", "auto, cpu or cuda (default auto: cuda when present)", cxxopts::value<std::string>())
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    kiln::cli::require(args, {"model", "prompt"});
    if (args.count("add-bos") && args.count("no-add-bos"))
      throw std::invalid_argument("--add-bos and --no-add-bos: give at most one");
    const int64_t max_new = args["max-new-tokens"].as<int64_t>();
    if (max_new < 0) throw std::invalid_argument(fmt::format("--max-new-tokens must be >= 0, got {}", max_new));
    const std::string dir = args["model"].as<std::string>();
    // The tokenizer: --tokenizer, else the folder's tokenizer.json, else the one the checkpoint's
    // training shards were made with (kiln_data.json), else the byte tokenizer.
    const auto record = kiln::data::DataRecord::read(dir);
    std::string tok = kiln::cli::optional_string(args, "tokenizer");
    if (tok.empty()) {
      if (std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
        tok = dir;
      } else if (record && (record->tokenizer == "byte" || std::filesystem::exists(record->tokenizer))) {
        tok = record->tokenizer;
      } else {
        tok = "byte";
      }
    }
    const auto tokenizer = kiln::data::load_tokenizer(tok);
    if (record && record->tokenizer_fingerprint != tokenizer->fingerprint()) {
      fmt::print(stderr, "kiln-generate: warning: {} was trained on shards of tokenizer '{}', not '{}' ({})\n", dir,
                 record->tokenizer, tokenizer->name(), kiln::data::DataRecord::kFile);
    }
    const at::Device device = kiln::cli::device(kiln::cli::optional_string(args, "device"));
    auto model = kiln::model::load_pretrained(dir, {.dtype = at::kFloat, .device = device});

    const auto rule = args.count("add-bos")      ? kiln::data::BosRule::kAdd
                      : args.count("no-add-bos") ? kiln::data::BosRule::kNone
                                                 : kiln::data::BosRule::kAuto;
    const auto encoded = kiln::data::encode_prompt(*tokenizer, args["prompt"].as<std::string>(), rule, record);
    if (encoded.ids.empty()) throw std::invalid_argument("--prompt: encodes to no tokens (and no BOS is added)");
    const std::vector<int64_t> prompt(encoded.ids.begin(), encoded.ids.end());
    kiln::model::GenerateOptions o;
    o.max_new_tokens = max_new;
    o.greedy = args.count("greedy") > 0;
    o.temperature = args["temperature"].as<double>();
    o.top_k = args["top-k"].as<int64_t>();
    o.top_p = args["top-p"].as<double>();
    o.seed = args["seed"].as<uint64_t>();
    o.eos_token_id = tokenizer->eos_id();
    o.vocab_limit = tokenizer->vocab_size();  // never an id the tokenizer cannot decode
    const auto ids = kiln::model::generate(model, prompt, o);
    if (args.count("ids")) {
      std::cout << fmt::format("{{\"prompt\": [{}], \"generated\": [{}]}}\n", fmt::join(prompt, ", "),
                               fmt::join(ids, ", "));
      return 0;
    }
    const std::vector<int32_t> out(ids.begin(), ids.end());
    std::cout << args["prompt"].as<std::string>() << kiln::data::decode_continuation(*tokenizer, encoded.ids, out)
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-generate: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
