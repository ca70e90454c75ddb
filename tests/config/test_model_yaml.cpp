// Model YAML loading: every preset loads, and bad files give errors naming the file, the key and
// the value. Reference: the error contract of docs/config.md (file, key, value in the message).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "kiln/config/yaml.h"
#include "kiln/model/llama_config.h"
#include "support.h"

using Catch::Matchers::Contains;
using kiln::model::load_llama_config;
using kiln::model::parse_llama_config;
using kiln::test::error_of;

namespace {
const char* kGood = R"(
vocab_size: 100
hidden_size: 32
intermediate_size: 64
num_hidden_layers: 2
num_attention_heads: 4
num_key_value_heads: 2
)";

// kGood with one line replaced or added.
std::string with(const std::string& key, const std::string& line) {
  std::string text = kGood, out;
  std::istringstream in(text);
  bool replaced = false;
  for (std::string l; std::getline(in, l);) {
    if (!key.empty() && l.rfind(key + ":", 0) == 0) {
      if (!line.empty()) out += line + "\n";
      replaced = true;
    } else {
      out += l + "\n";
    }
  }
  if (!replaced) out += line + "\n";
  return out;
}
}  // namespace

TEST_CASE("every model preset loads and validates", "[config]") {
  const auto presets = kiln::model::llama_presets();
  REQUIRE(presets.size() >= 3);
  for (const auto& name : presets) {
    const auto c = load_llama_config(name);
    CHECK(c.source == "preset '" + name + "'");
  }
  const auto c = load_llama_config("llama-3.2-1b");
  CHECK(c.rope_scaling.rope_type == "llama3");
  CHECK(c.rope_scaling.factor == 32.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(c.kv_heads() == 8);
  CHECK(c.tie_word_embeddings);
}

TEST_CASE("a missing required key is named", "[config]") {
  const std::string msg = error_of([] { parse_llama_config(with("hidden_size", ""), "bad.yaml"); });
  CHECK_THAT(msg, Contains("bad.yaml") && Contains("hidden_size") && Contains("missing"));
}

TEST_CASE("a wrong type names the key and the value", "[config]") {
  const std::string msg = error_of([] { parse_llama_config(with("hidden_size", "hidden_size: wide"), "bad.yaml"); });
  CHECK_THAT(msg, Contains("bad.yaml") && Contains("'hidden_size'") && Contains("'wide'") && Contains("integer"));
  const std::string msg2 =
      error_of([] { parse_llama_config(with("tie_word_embeddings", "tie_word_embeddings: maybe"), "bad.yaml"); });
  CHECK_THAT(msg2, Contains("tie_word_embeddings") && Contains("'maybe'"));
  const std::string msg3 = error_of([] { parse_llama_config(with("hidden_size", "hidden_size: 32.5"), "bad.yaml"); });
  CHECK_THAT(msg3, Contains("hidden_size") && Contains("'32.5'"));
}

TEST_CASE("a negative size names the key and the value", "[config]") {
  const std::string msg =
      error_of([] { parse_llama_config(with("num_hidden_layers", "num_hidden_layers: -2"), "bad.yaml"); });
  CHECK_THAT(msg, Contains("bad.yaml") && Contains("num_hidden_layers") && Contains("-2"));
}

TEST_CASE("impossible shapes are rejected", "[config]") {
  CHECK_THAT(error_of([] { parse_llama_config(with("num_key_value_heads", "num_key_value_heads: 3"), "m.yaml"); }),
             Contains("num_key_value_heads") && Contains("3"));
  CHECK_THAT(error_of([] { parse_llama_config(with("hidden_size", "hidden_size: 30"), "m.yaml"); }),
             Contains("hidden_size") && Contains("30"));
  CHECK_THAT(error_of([] { parse_llama_config(with("", "rope_scaling: {rope_type: yarn}"), "m.yaml"); }),
             Contains("rope_scaling.rope_type") && Contains("yarn"));
  CHECK_THAT(error_of([] { parse_llama_config(with("", "rope_scaling: {rope_type: llama3, factor: abc}"), "m.yaml"); }),
             Contains("'rope_scaling.factor'") && Contains("'abc'"));
  // A scaling without its type, or a factor under the default type, would train unscaled: refused
  // (transformers fails on the first too).
  CHECK_THAT(error_of([] { parse_llama_config(with("", "rope_scaling: {factor: 8.0}"), "m.yaml"); }),
             Contains("m.yaml") && Contains("rope_scaling.rope_type"));
  CHECK_THAT(
      error_of([] { parse_llama_config(with("", "rope_scaling: {rope_type: default, factor: 8.0}"), "m.yaml"); }),
      Contains("rope_scaling.factor") && Contains("no effect"));
  CHECK(parse_llama_config(with("", "rope_scaling: {type: default}"), "m.yaml").rope_scaling.factor == 1.0);
  CHECK(parse_llama_config(with("", "rope_scaling: null"), "m.yaml").rope_scaling.rope_type == "default");
}

TEST_CASE("unknown keys are errors, not silently ignored", "[config]") {
  CHECK_THAT(error_of([] { parse_llama_config(with("", "hiden_size: 32"), "m.yaml"); }),
             Contains("m.yaml") && Contains("'hiden_size'") && Contains("unknown"));
  CHECK_THAT(error_of([] { parse_llama_config(with("", "rope_scaling: {rope_type: llama3, facter: 2}"), "m.yaml"); }),
             Contains("rope_scaling.facter"));
}

TEST_CASE("invalid YAML reports the line", "[config]") {
  CHECK_THAT(error_of([] { parse_llama_config("vocab_size: 10\nhidden_size: [1, 2\n", "broken.yaml"); }),
             Contains("broken.yaml") && Contains("line"));
}

TEST_CASE("model files load by path and errors name the path", "[config]") {
  const auto dir = kiln::test::scratch_dir("model_yaml");
  const auto good = dir / "good.yaml", bad = dir / "bad.yaml";
  std::ofstream(good) << kGood;
  std::ofstream(bad) << with("intermediate_size", "intermediate_size: -64");
  const auto c = load_llama_config(good.string());
  CHECK(c.hidden_size == 32);
  CHECK(c.kv_heads() == 2);
  CHECK(c.resolved_head_dim() == 8);
  CHECK_THAT(error_of([&] { load_llama_config(bad.string()); }),
             Contains(bad.string()) && Contains("intermediate_size") && Contains("-64"));
  CHECK_THAT(error_of([] { load_llama_config("no-such-preset"); }), Contains("no-such-preset") && Contains("tiny"));
}
