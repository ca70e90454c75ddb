// kiln-generate: sample text from a checkpoint (an HF-layout folder: kiln-pretrain's
// checkpoint-N or any LlamaForCausalLM directory) with a KV cache.
#include <iostream>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "cli.h"
#include "kiln/data/tokenizer.h"
#include "kiln/model/generate.h"
#include "kiln/model/hf.h"

#include <filesystem>

int main(int argc, char** argv) {
  cxxopts::Options options("kiln-generate", "Generate text from a kiln or Hugging Face LLaMA checkpoint");
  // clang-format off
  options.add_options()
    ("model", "checkpoint folder (config.json + safetensors)", cxxopts::value<std::string>())
    ("prompt", "text to continue", cxxopts::value<std::string>())
    ("tokenizer", "byte, or a tokenizer.json / folder (default: the model folder's tokenizer.json, else byte)",
     cxxopts::value<std::string>()->default_value(""))
    ("max-new-tokens", "tokens to generate", cxxopts::value<int64_t>()->default_value("200"))
    ("greedy", "argmax decoding (ignores temperature, top-k, top-p)")
    ("temperature", "softmax temperature", cxxopts::value<double>()->default_value("0.8"))
    ("top-k", "keep the k most likely tokens (0 = off)", cxxopts::value<int64_t>()->default_value("50"))
    ("top-p", "nucleus sampling threshold (1 = off)", cxxopts::value<double>()->default_value("0.95"))
    ("seed", "sampling seed", cxxopts::value<uint64_t>()->default_value("0"))
    ("device", "cpu or cuda (default: cuda when present)", cxxopts::value<std::string>()->default_value(""))
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    kiln::cli::require(args, {"model", "prompt"});
    const std::string dir = args["model"].as<std::string>();
    std::string tok = args["tokenizer"].as<std::string>();
    if (tok.empty()) tok = std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json") ? dir : "byte";
    const auto tokenizer = kiln::data::load_tokenizer(tok);
    const at::Device device = kiln::cli::device(args["device"].as<std::string>());
    auto model = kiln::model::load_pretrained(dir, {.dtype = at::kFloat, .device = device});

    std::vector<int64_t> prompt;
    if (tokenizer->bos_id() >= 0) prompt.push_back(tokenizer->bos_id());
    for (int32_t id : tokenizer->encode(args["prompt"].as<std::string>())) prompt.push_back(id);
    kiln::model::GenerateOptions o;
    o.max_new_tokens = args["max-new-tokens"].as<int64_t>();
    o.greedy = args.count("greedy") > 0;
    o.temperature = args["temperature"].as<double>();
    o.top_k = args["top-k"].as<int64_t>();
    o.top_p = args["top-p"].as<double>();
    o.seed = args["seed"].as<uint64_t>();
    o.eos_token_id = tokenizer->eos_id();
    const auto ids = kiln::model::generate(model, prompt, o);
    const std::vector<int32_t> out(ids.begin(), ids.end());
    std::cout << args["prompt"].as<std::string>() << tokenizer->decode(out, /*skip_special_tokens=*/true) << "\n";
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-generate: error: {}\n", e.what());
    return 2;
  }
}
