// LLaMA-Factory's templates at stage pt: see lf_template.h.
#include "kiln/train/hf/lf_template.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "kiln/data/hf_tokenizer.h"

namespace kiln::train {

const std::vector<LfTemplate>& lf_templates() {
  static const std::vector<LfTemplate> table = {
#include "kiln/train/hf/lf_templates.inc"
  };
  return table;
}

const LfTemplate* find_lf_template(std::string_view name) {
  const auto& t = lf_templates();
  const auto it = std::find_if(t.begin(), t.end(), [&](const LfTemplate& e) { return e.name == name; });
  return it == t.end() ? nullptr : &*it;
}

LfSpecialTokens lf_special_tokens(const std::string& template_name, const data::HfTokenizer* tokenizer,
                                  int32_t tokenizer_eos_id, const std::optional<std::string>& pad_token) {
  LfSpecialTokens out;
  out.eos_id = tokenizer_eos_id;
  const LfTemplate* t = nullptr;
  if (!template_name.empty()) {
    t = find_lf_template(template_name);
    if (!t) {
      throw std::invalid_argument(fmt::format(
          "Template {} does not exist. (LLaMA-Factory 0.9.5's words; kiln knows its {} templates, e.g. llama3, "
          "qwen, qwen3, gemma, phi4, empty)",
          template_name, lf_templates().size()));
    }
    if (!tokenizer && (t->replace_eos || !t->stop_words.empty() || t->name == "llama3")) {
      throw std::invalid_argument(
          fmt::format("template {} changes the tokenizer's special tokens, and kiln's byte "
                      "tokenizer has none of them: give model_name_or_path a tokenizer.json",
                      template_name));
    }
  }
  auto id_of = [&](std::string_view token, const char* role) {
    const int32_t id = tokenizer->token_to_id(token);
    if (id < 0) {
      throw std::invalid_argument(fmt::format(
          "template {}: its {} '{}' is not a token of {}; LLaMA-Factory would add it as a new token, which needs "
          "resize_vocab (kiln does not resize the vocabulary)",
          template_name, role, token, tokenizer->name()));
    }
    return id;
  };
  std::vector<std::string_view> stop_words = t ? t->stop_words : std::vector<std::string_view>{};
  if (t && t->replace_eos) {
    if (stop_words.empty()) throw std::invalid_argument("Stop words are required to replace the EOS token.");
    const int32_t eos = id_of(stop_words[0], "EOS (its first stop word)");
    if (eos != out.eos_id)
      out.lines.push_back(fmt::format("template {}: EOS replaced by {}", template_name, stop_words[0]));
    out.eos_id = eos;
    stop_words.erase(stop_words.begin());
  }
  // fix_special_tokens: pad = eos when the tokenizer has none.
  out.pad_id = out.eos_id;
  if (pad_token && !pad_token->empty()) {
    if (!tokenizer) throw std::invalid_argument("a pad token needs a tokenizer.json");
    out.pad_id = id_of(*pad_token, "pad token");
  }
  out.separator_id = out.eos_id;
  if (t && t->name == "llama3") {  // data/processor/pretrain.py: the literal string, not the EOS
    out.separator_id = id_of("<|end_of_text|>", "document separator");
  }
  for (const auto word : stop_words) {
    if (!tokenizer->is_added_token(word)) {
      out.lines.push_back(fmt::format(
          "template {}: LLaMA-Factory adds the stop word {} as a special token; it is not an added token of {}, so "
          "kiln tokenizes a document that contains its text as the tokenizer does (LLaMA-Factory as one token)",
          template_name, word, tokenizer->name()));
    }
  }
  if (t) {
    out.lines.push_back(fmt::format(
        "template {}: each document ends with id {}{}; labels -100 at the pad id {}", template_name, out.separator_id,
        out.separator_id == out.pad_id ? " (the pad: not scored)" : " (scored)", out.pad_id));
  }
  return out;
}

}  // namespace kiln::train
