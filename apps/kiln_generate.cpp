// kiln-generate: sample text from a checkpoint (an HF-layout folder: kiln-pretrain's
// checkpoint-N or any LlamaForCausalLM directory) with a KV cache.
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli.h"
#include "kiln/data/shards.h"
#include "kiln/data/tokenize.h"
#include "kiln/data/tokenizer.h"
#include "kiln/model/generate.h"
#include "kiln/model/hf.h"
#include "settings.h"

int main(int argc, char** argv) {
  try {
    const auto line =
        kiln::config::parse_command_line(kiln::cli::arguments(argc, argv), kiln::cli::generate_spelling());
    if (line.help) {
      std::cout << kiln::cli::settings_help(
          "Usage: kiln-generate --model_name_or_path DIR --prompt TEXT [--KEY VALUE ...]\n\n"
          "Generate text from a kiln or Hugging Face LLaMA checkpoint.",
          kiln::cli::generate_keys());
      return 0;
    }
    const kiln::cli::GenerateSettings s = kiln::cli::read_generate_settings(line);
    const std::string& dir = s.model_name_or_path;
    // The tokenizer: the key tokenizer, else the folder's tokenizer.json, else the one the checkpoint's
    // training shards were made with (kiln_data.json), else the byte tokenizer.
    const auto record = kiln::data::DataRecord::read(dir);
    std::string tok = s.tokenizer;
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
    const at::Device device = kiln::cli::device(s.given, s.device);
    auto model = kiln::model::load_pretrained(dir, {.dtype = at::kFloat, .device = device});

    const auto encoded = kiln::data::encode_prompt(*tokenizer, s.prompt, kiln::cli::bos_rule(s.add_bos), record);
    if (encoded.ids.empty()) s.given.fail("prompt", "encodes to no tokens (and no BOS is added)");
    const std::vector<int64_t> prompt(encoded.ids.begin(), encoded.ids.end());
    kiln::model::GenerateOptions o;
    o.max_new_tokens = s.max_new_tokens;
    o.greedy = s.greedy;
    o.temperature = s.temperature;
    o.top_k = s.top_k;
    o.top_p = s.top_p;
    o.seed = static_cast<uint64_t>(s.seed);
    o.eos_token_id = tokenizer->eos_id();
    o.vocab_limit = tokenizer->vocab_size();  // never an id the tokenizer cannot decode
    const auto ids = kiln::model::generate(model, prompt, o);
    if (s.ids) {
      std::cout << fmt::format("{{\"prompt\": [{}], \"generated\": [{}]}}\n", fmt::join(prompt, ", "),
                               fmt::join(ids, ", "));
      return 0;
    }
    const std::vector<int32_t> out(ids.begin(), ids.end());
    std::cout << s.prompt << kiln::data::decode_continuation(*tokenizer, encoded.ids, out) << "\n";
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-generate: error: {}\n", kiln::cli::error_text(e));
    return 2;
  }
}
