// LlamaConfig YAML loading and validation. Keys are Hugging Face's `LlamaConfig` names; the
// size keys are required (a model file that forgets its width is a mistake, not a default).
#include "kiln/model/llama_config.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/common/format.h"
#include "kiln/config/yaml.h"
#include "kiln/model/hf.h"
#include "kiln/model/presets.h"

namespace kiln::model {

using config::ConfigError;
using config::ConfigReader;
using config::Need;

namespace {

LlamaConfig read_llama_config(ConfigReader& r) {
  LlamaConfig c;
  c.source = r.source();
  r.read("vocab_size", c.vocab_size, Need::kRequired);
  r.read("hidden_size", c.hidden_size, Need::kRequired);
  r.read("intermediate_size", c.intermediate_size, Need::kRequired);
  r.read("num_hidden_layers", c.num_hidden_layers, Need::kRequired);
  r.read("num_attention_heads", c.num_attention_heads, Need::kRequired);
  r.read("num_key_value_heads", c.num_key_value_heads);
  r.read("head_dim", c.head_dim);
  r.read("max_position_embeddings", c.max_position_embeddings);
  r.read("rms_norm_eps", c.rms_norm_eps);
  r.read("rope_theta", c.rope_theta);
  r.read("tie_word_embeddings", c.tie_word_embeddings);
  r.read("attention_bias", c.attention_bias);
  r.read("mlp_bias", c.mlp_bias);
  r.read("initializer_range", c.initializer_range);
  r.read("bos_token_id", c.bos_token_id);
  r.read("eos_token_id", c.eos_token_id);
  r.accept("name");  // free-form description in preset files
  if (r.has("rope_scaling") && !r.is_null("rope_scaling")) {
    ConfigReader s = r.child("rope_scaling");
    // transformers writes `rope_type` (older files: `type`); accept either, not both.
    if (s.has("type") && s.has("rope_type")) s.fail("type", "give either 'rope_type' or 'type', not both");
    // Without a type the scaling would be silently dropped (transformers fails on it: KeyError).
    s.read(s.has("type") ? "type" : "rope_type", c.rope_scaling.rope_type, config::Need::kRequired);
    s.read("factor", c.rope_scaling.factor);
    s.read("low_freq_factor", c.rope_scaling.low_freq_factor);
    s.read("high_freq_factor", c.rope_scaling.high_freq_factor);
    s.read("original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings);
    s.finish();
  } else {
    r.accept("rope_scaling");
  }
  r.finish();
  return c;
}

}  // namespace

void LlamaConfig::validate() const {
  auto fail = [&](const std::string& key, const std::string& problem) {
    throw ConfigError(config::config_message(source, key, problem));
  };
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) fail(key, fmt::format("must be a positive integer, got {}", v));
  };
  positive("vocab_size", vocab_size);
  // Token ids are 32-bit everywhere in kiln (tokenizers, shards, the kernels' index math).
  constexpr int64_t kMaxVocab = int64_t{1} << 31;
  if (vocab_size > kMaxVocab) {
    const double embedding = static_cast<double>(vocab_size) * static_cast<double>(std::max<int64_t>(hidden_size, 1));
    fail("vocab_size", fmt::format("{} is more than 32-bit token ids can address (at most {}); its embedding alone "
                                   "({} x hidden_size {}) would need {} in fp32",
                                   vocab_size, kMaxVocab, vocab_size, hidden_size, human_bytes(4 * embedding)));
  }
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_key_value_heads < 0) {
    fail("num_key_value_heads",
         fmt::format("must be positive (or 0 for num_attention_heads), got {}", num_key_value_heads));
  }
  if (num_attention_heads % kv_heads() != 0) {
    fail("num_key_value_heads",
         fmt::format("must divide num_attention_heads ({}), got {}", num_attention_heads, num_key_value_heads));
  }
  if (head_dim < 0) fail("head_dim", fmt::format("must be positive (or 0 for hidden_size / heads), got {}", head_dim));
  if (head_dim == 0 && hidden_size % num_attention_heads != 0) {
    fail("hidden_size", fmt::format("must be a multiple of num_attention_heads ({}) unless head_dim is set, got {}",
                                    num_attention_heads, hidden_size));
  }
  if (resolved_head_dim() % 2 != 0) {
    fail("head_dim", fmt::format("must be even for rotary embeddings, got {}", resolved_head_dim()));
  }
  if (!(rms_norm_eps > 0)) fail("rms_norm_eps", fmt::format("must be > 0, got {}", rms_norm_eps));
  if (!(rope_theta > 0)) fail("rope_theta", fmt::format("must be > 0, got {}", rope_theta));
  if (!(initializer_range >= 0)) fail("initializer_range", fmt::format("must be >= 0, got {}", initializer_range));
  for (auto [key, id] : {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id}}) {
    if (id < -1 || id >= vocab_size)
      fail(key, fmt::format("must be -1 or in [0, vocab_size={}), got {}", vocab_size, id));
  }
  const RopeScaling& s = rope_scaling;
  if (s.rope_type == "llama3") {
    if (!(s.factor >= 1)) fail("rope_scaling.factor", fmt::format("must be >= 1, got {}", s.factor));
    if (!(s.low_freq_factor > 0)) {
      fail("rope_scaling.low_freq_factor", fmt::format("must be > 0, got {}", s.low_freq_factor));
    }
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      fail("rope_scaling.high_freq_factor",
           fmt::format("must be > low_freq_factor ({}), got {}", s.low_freq_factor, s.high_freq_factor));
    }
    if (s.original_max_position_embeddings <= 0) {
      fail("rope_scaling.original_max_position_embeddings",
           fmt::format("must be a positive integer, got {}", s.original_max_position_embeddings));
    }
  } else if (s.rope_type == "default") {
    if (s.factor != 1.0) {
      fail("rope_scaling.factor",
           fmt::format("{} has no effect with rope_type 'default' (kiln scales by rope_type 'llama3' only)", s.factor));
    }
  } else {
    fail("rope_scaling.rope_type", fmt::format("must be 'default' or 'llama3', got '{}'", s.rope_type));
  }
}

int64_t LlamaConfig::num_non_embedding_parameters() const {
  const int64_t h = hidden_size, d = resolved_head_dim();
  const int64_t q = num_attention_heads * d, kv = kv_heads() * d;
  const int64_t attention = h * q + 2 * h * kv + q * h + (attention_bias ? q + 2 * kv + h : 0);
  const int64_t mlp = 3 * h * intermediate_size + (mlp_bias ? 2 * intermediate_size + h : 0);
  const int64_t norms = 2 * h;
  return num_hidden_layers * (attention + mlp + norms) + h;  // + final norm
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t embedding = vocab_size * hidden_size;
  return num_non_embedding_parameters() + embedding + (tie_word_embeddings ? 0 : embedding);
}

LlamaConfig parse_llama_config(const std::string& yaml_text, const std::string& source) {
  ConfigReader r = ConfigReader::from_string(yaml_text, source);
  LlamaConfig c = read_llama_config(r);
  c.validate();
  return c;
}

std::vector<std::string> llama_presets() {
  std::vector<std::string> names;
  for (const auto& [name, text] : detail::embedded_presets()) names.emplace_back(name);
  return names;
}

LlamaConfig load_llama_config(const std::string& preset_or_path) {
  for (const auto& [name, text] : detail::embedded_presets()) {
    if (name == preset_or_path) return parse_llama_config(std::string(text), fmt::format("preset '{}'", name));
  }
  namespace fs = std::filesystem;
  // A Hugging Face model folder (its config.json) or a config.json itself: the same file
  // transformers builds LlamaForCausalLM from, so both sides of a comparison read one config.
  const fs::path path(preset_or_path);
  if (fs::is_directory(path) && fs::is_regular_file(path / "config.json")) {
    return read_hf_config((path / "config.json").string()).config;
  }
  if (fs::is_regular_file(path) && path.extension() == ".json") return read_hf_config(preset_or_path).config;
  if (fs::is_regular_file(preset_or_path)) {
    ConfigReader r = ConfigReader::from_file(preset_or_path);
    LlamaConfig c = read_llama_config(r);
    c.validate();
    return c;
  }
  throw ConfigError(
      fmt::format("model '{}': neither a preset ({}), a readable YAML file, nor a Hugging Face folder with config.json "
                  "or a config.json",
                  preset_or_path, fmt::join(llama_presets(), ", ")));
}

}  // namespace kiln::model
