// What LLaMA-Factory 0.9.5's `template:` key does to a pretraining run (stage pt), from one table
// of all its templates (lf_templates.inc, written from its TEMPLATES registry by
// scripts/make_lf_templates.py). Stage pt formats no chat, but the template still fixes the
// tokenizer (data/template.py Template.fix_special_tokens) before the documents are tokenized
// (data/processor/pretrain.py):
//   1. replace_eos: the tokenizer's EOS becomes the template's first stop word (llama3:
//      <|eot_id|>, qwen: <|im_end|>);
//   2. a tokenizer without a pad token gets pad = that (new) EOS;
//   3. each document's text is followed by the (new) EOS; for the template llama3 by the literal
//      "<|end_of_text|>" instead;
//   4. the collator (DataCollatorForLanguageModeling) labels -100 wherever the input is the pad id.
// So with template: llama3 and Llama 3's tokenizer (no pad) each document ends in <|end_of_text|>,
// which is scored, and <|eot_id|> (the pad) is masked; with template: qwen and Qwen2.5's (pad
// <|endoftext|>) each ends in <|im_end|>, scored. Without a template the tokenizer's EOS ends each
// document and is masked when it is also the pad.
// The other stop words become special tokens in LLaMA-Factory; kiln's tokenizer splits them out
// only when tokenizer.json already holds them as added tokens, otherwise a line says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {
class HfTokenizer;
}

namespace kiln::train {

struct LfTemplate {
  std::string_view name;
  bool replace_eos;
  std::vector<std::string_view> stop_words;
};

// Every LLaMA-Factory 0.9.5 template, by name.
const std::vector<LfTemplate>& lf_templates();
// nullptr for a name LLaMA-Factory does not have.
const LfTemplate* find_lf_template(std::string_view name);

struct LfSpecialTokens {
  int32_t separator_id = -1;       // written after each document
  int32_t pad_id = -1;             // labelled -100 by the collator
  int32_t eos_id = -1;             // the tokenizer's EOS after the template
  std::vector<std::string> lines;  // what the template changed, for the log
};

// The ids stage pt uses for `template_name` ("" = no template: LLaMA-Factory's empty or parsed
// template, which change nothing here). `tokenizer` is null for kiln's byte tokenizer (a template
// is then refused); `pad_token` is tokenizer_config.json's pad token content, if any.
// std::invalid_argument, naming the template and the token, for an unknown template or an EOS
// the tokenizer does not hold (LLaMA-Factory would add a new token, and kiln does not resize the
// vocabulary).
LfSpecialTokens lf_special_tokens(const std::string& template_name, const data::HfTokenizer* tokenizer,
                                  int32_t tokenizer_eos_id, const std::optional<std::string>& pad_token);

}  // namespace kiln::train
