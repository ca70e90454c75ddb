// LlamaConfig: the shape of a LLaMA-family decoder, with Hugging Face's key names so that a
// model YAML and a transformers config.json say the same thing in the same words.
//
// Presets live as YAML files in configs/models/ and are compiled into the library, so that
// `load_llama_config("tiny")` works from any directory and in installed programs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::model {

// RoPE frequency scaling. "default" = plain RoPE; "llama3" = Llama 3.1/3.2's piecewise scaling
// of the low frequencies (wavelengths longer than original_max_position_embeddings / low_freq_factor
// are divided by `factor`, short ones kept, a smooth blend between).
struct RopeScaling {
  std::string rope_type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // 0 = num_attention_heads (multi-head attention)
  int64_t head_dim = 0;             // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  int64_t bos_token_id = 1;  // -1 = none
  int64_t eos_token_id = 2;  // -1 = none

  // Where this config came from ("preset 'tiny'" or a path), for messages.
  std::string source = "<defaults>";

  int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }

  // Throws kiln::config::ConfigError naming `source`, the key and the value.
  void validate() const;

  // Trainable parameters, from the formula (tests check it against the built module).
  int64_t num_parameters() const;
  // Parameters outside the embedding and LM head: the "N" of FLOP estimates.
  int64_t num_non_embedding_parameters() const;
};

// A preset name (see llama_presets()), a path to a model YAML file, a Hugging Face model folder
// holding config.json, or a config.json path (read by model::read_hf_config, model/hf.h).
LlamaConfig load_llama_config(const std::string& preset_or_path);
// Parses model YAML text; `source` names it in errors.
LlamaConfig parse_llama_config(const std::string& yaml_text, const std::string& source);
std::vector<std::string> llama_presets();

}  // namespace kiln::model
