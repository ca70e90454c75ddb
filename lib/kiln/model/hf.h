// Hugging Face interoperability: a transformers `LlamaForCausalLM` directory (config.json +
// model.safetensors or shards + index) <-> kiln's LlamaForCausalLM.
//
// kiln's parameter names already equal HF's state-dict keys and its LlamaConfig uses HF's key
// names, so the mapping is one to one; what lives here is the checking: every tensor of the
// checkpoint must be a parameter of the model and vice versa (mismatches are reported by name),
// shapes must agree with config.json, and a config that describes something kiln does not
// implement (another architecture, activation, RoPE variant, quantisation) is rejected instead
// of being loaded wrongly. See docs/formats.md.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <ATen/core/Tensor.h>

#include "kiln/io/safetensors.h"
#include "kiln/model/llama.h"
#include "kiln/model/llama_config.h"

namespace kiln::model {

// A checkpoint whose tensors do not fit the model: missing/unknown names, wrong shapes.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct HfConfig {
  LlamaConfig config;
  at::ScalarType dtype = at::kFloat;  // `dtype` (transformers 5) or `torch_dtype` (4.x)
};

// config.json text -> config; `source` names it in errors (kiln::config::ConfigError naming the
// key and value). Accepts both RoPE spellings: `rope_theta` + `rope_scaling` (transformers 4,
// Meta's Llama 3.x files) and `rope_parameters` (transformers 5).
HfConfig llama_config_from_hf_json(const std::string& text, const std::string& source);
HfConfig read_hf_config(const std::string& path);
// config -> config.json text in the transformers-4 spelling (rope_theta + rope_scaling,
// torch_dtype), which transformers 4.43+ and 5.x both read. pad_token_id >= 0 is written as
// `pad_token_id` (kiln's LlamaConfig has no pad token: nothing in the model uses it).
std::string llama_config_to_hf_json(const LlamaConfig& config, at::ScalarType dtype, int64_t pad_token_id = -1);

// "float32"/"bfloat16"/"float16"/"float64" <-> LibTorch.
at::ScalarType dtype_from_hf(const std::string& name);
std::string hf_dtype_name(at::ScalarType type);

struct LoadOptions {
  std::optional<at::ScalarType> dtype;  // default: the checkpoint's config dtype
  at::Device device = at::kCPU;
};

// Loads a HF directory (config.json + safetensors). Throws ConfigError, SafetensorsError or
// CheckpointError, each naming the file and the key or tensor.
LlamaForCausalLM load_pretrained(const std::string& dir, const LoadOptions& options = {});

// Copies the checkpoint's tensors into `model`'s parameters (cast to their dtype and device).
// Every parameter must be present and every checkpoint tensor known; a tied model tolerates an
// `lm_head.weight` equal to the embedding. `source` names the checkpoint in errors.
void load_weights(LlamaForCausalLMImpl& model, io::SafetensorsCheckpoint& checkpoint, const std::string& source);

struct SaveOptions {
  std::optional<at::ScalarType> dtype;    // default: the parameters' dtype
  uint64_t max_shard_bytes = 5000000000;  // transformers 4's default max_shard_size, "5GB" (10^9 bytes per GB)
  // config.json's special tokens as transformers' Trainer aligns them with the tokenizer it saves
  // beside the model (trainer_utils.align_special_tokens): a value replaces the model config's
  // (-1 writes null); pad_token_id unset writes none.
  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
};

// Writes config.json and the parameters (no buffers; no lm_head.weight when tied, as HF does)
// into `dir`, each file atomically. transformers.AutoModelForCausalLM.from_pretrained(dir)
// loads the result.
void save_pretrained(const LlamaForCausalLMImpl& model, const std::string& dir, const SaveOptions& options = {});
inline void save_pretrained(const LlamaForCausalLM& model, const std::string& dir, const SaveOptions& options = {}) {
  save_pretrained(*model, dir, options);
}

}  // namespace kiln::model
