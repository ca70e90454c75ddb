// LLaMA-Factory's templates at stage pt (train/hf/lf_template.h). The ids are checked against the
// fixture tokenizers' own ids (tests/python/fixtures/lf_parity/model_llama3 and model_qwen, written
// by llamafactory_reference.py --make-chat-models: the tiny BPE with a Llama 3 or a Qwen2.5 base
// tokenizer's special tokens after its 384 entries); what LLaMA-Factory does with them is
// test_lf_parity.py's template cases, against LLaMA-Factory itself.
#include <string>

#include <catch2/catch.hpp>

#include "kiln/data/hf_tokenizer.h"
#include "kiln/train/hf/lf_template.h"

using namespace kiln;
using kiln::train::lf_special_tokens;

namespace {
const std::string kFixtures = KILN_PYTHON_FIXTURES "/lf_parity/";
}

TEST_CASE("template llama3: documents end in <|end_of_text|>, scored; <|eot_id|> is EOS and pad", "[lf_template]") {
  data::HfTokenizer tok(kFixtures + "model_llama3/tokenizer.json");
  const int32_t end_of_text = tok.token_to_id("<|end_of_text|>"), eot = tok.token_to_id("<|eot_id|>");
  REQUIRE(tok.eos_id() == end_of_text);  // tokenizer_config.json's eos_token
  const auto s = lf_special_tokens("llama3", &tok, tok.eos_id(), std::nullopt);
  CHECK(s.separator_id == end_of_text);
  CHECK(s.eos_id == eot);
  CHECK(s.pad_id == eot);
  // Without a template the tokenizer's EOS ends each document and, being the pad too, is masked.
  const auto none = lf_special_tokens("", &tok, tok.eos_id(), std::nullopt);
  CHECK(none.separator_id == end_of_text);
  CHECK(none.pad_id == end_of_text);
  CHECK(none.lines.empty());
}

TEST_CASE("template qwen: documents end in <|im_end|>, scored; the tokenizer's pad stays", "[lf_template]") {
  data::HfTokenizer tok(kFixtures + "model_qwen/tokenizer.json");
  const int32_t endoftext = tok.token_to_id("<|endoftext|>"), im_end = tok.token_to_id("<|im_end|>");
  const auto s = lf_special_tokens("qwen", &tok, tok.eos_id(), std::string("<|endoftext|>"));
  CHECK(s.separator_id == im_end);
  CHECK(s.eos_id == im_end);
  CHECK(s.pad_id == endoftext);
}

TEST_CASE("templates kiln cannot follow are errors naming the template and the token", "[lf_template]") {
  data::HfTokenizer plain(kFixtures + "model/tokenizer.json");  // no chat tokens
  CHECK_THROWS_WITH(
      lf_special_tokens("llama3", &plain, plain.eos_id(), std::nullopt),
      Catch::Contains("template llama3") && Catch::Contains("<|eot_id|>") && Catch::Contains("resize_vocab"));
  CHECK_THROWS_WITH(lf_special_tokens("nope", &plain, plain.eos_id(), std::nullopt),
                    Catch::Contains("Template nope does not exist"));
  CHECK_THROWS_WITH(lf_special_tokens("qwen", nullptr, 1, std::nullopt), Catch::Contains("byte"));
  // A template that changes nothing at stage pt (no EOS replacement, no stop words) is fine anywhere.
  CHECK(lf_special_tokens("empty", nullptr, 1, std::nullopt).separator_id == 1);
  // A stop word the tokenizer lacks (not the EOS) is a line, not an error: LLaMA-Factory adds it.
  const auto s = lf_special_tokens("yi", &plain, plain.eos_id(), std::nullopt);
  CHECK(s.separator_id == plain.eos_id());
  REQUIRE(s.lines.size() == 2);
  CHECK_THAT(s.lines[0], Catch::Contains("<|im_end|>"));
}

TEST_CASE("the template table holds LLaMA-Factory 0.9.5's templates", "[lf_template]") {
  // The table is generated (scripts/make_lf_templates.py; test_lf_templates.py compares it with
  // LLaMA-Factory's TEMPLATES): here only that the file was compiled in whole.
  CHECK(train::lf_templates().size() == 121);
  REQUIRE(train::find_lf_template("llama3"));
  CHECK(train::find_lf_template("llama3")->stop_words.size() == 2);
  CHECK_FALSE(train::find_lf_template("llama2_chat_nope"));
}
