// config.json <-> LlamaConfig and checkpoint <-> LlamaForCausalLM parameters. config.json files
// carry many keys kiln has no use for (use_cache, transformers_version, ...); those are ignored,
// but keys that change the computation (architecture, activation, RoPE type, quantisation) are
// checked, so an unsupported model fails loudly instead of loading with the wrong arithmetic.
#include "kiln/model/hf.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/config/yaml.h"
#include "kiln/io/input_file.h"

namespace kiln::model {

namespace fs = std::filesystem;

// config.json: a few KB; anything near this is not one.
constexpr uint64_t kMaxConfigBytes = uint64_t{16} << 20;
using config::ConfigError;
using nlohmann::json;

namespace {

constexpr const char* kConfigFile = "config.json";

// Typed reads from one JSON object; errors read "<source>: key '<prefix.key>': <problem>".
class JsonReader {
 public:
  JsonReader(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw ConfigError(config::config_message(source_, prefix_ + key, problem));
  }
  // The value at `key`, or nullptr when absent or null.
  const json* find(const std::string& key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }

  void read(const std::string& key, int64_t& out, bool required = false) const {
    const json* v = need(key, required);
    if (!v) return;
    if (!v->is_number_integer()) fail(key, fmt::format("expected an integer, got {}", v->dump()));
    out = v->get<int64_t>();
  }
  void read(const std::string& key, double& out, bool required = false) const {
    const json* v = need(key, required);
    if (!v) return;
    if (!v->is_number()) fail(key, fmt::format("expected a number, got {}", v->dump()));
    out = v->get<double>();
  }
  void read(const std::string& key, bool& out) const {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_boolean()) fail(key, fmt::format("expected true or false, got {}", v->dump()));
    out = v->get<bool>();
  }
  void read(const std::string& key, std::string& out) const {
    const json* v = find(key);
    if (!v) return;
    if (!v->is_string()) fail(key, fmt::format("expected a string, got {}", v->dump()));
    out = v->get<std::string>();
  }
  // A token id: integer, null (= none, -1), or a list whose first entry is used.
  void read_token(const std::string& key, int64_t& out) const {
    const auto it = object_.find(key);
    if (it == object_.end()) return;
    if (it->is_null()) {
      out = -1;
    } else if (it->is_number_integer()) {
      out = it->get<int64_t>();
    } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
      out = (*it)[0].get<int64_t>();
    } else {
      fail(key, fmt::format("expected a token id, a list of them or null, got {}", it->dump()));
    }
  }
  JsonReader child(const std::string& key) const {
    const json* v = find(key);
    if (!v->is_object()) fail(key, fmt::format("expected an object, got {}", v->dump()));
    return JsonReader(*v, source_, prefix_ + key + ".");
  }

 private:
  const json* need(const std::string& key, bool required) const {
    const json* v = find(key);
    if (!v && required) fail(key, "required key is missing");
    return v;
  }
  const json& object_;
  std::string source_;
  std::string prefix_;
};

void read_rope(const JsonReader& r, RopeScaling& s, double* theta) {
  if (theta) r.read("rope_theta", *theta);
  // transformers writes `rope_type` (older files: `type`).
  if (r.has("type") && r.has("rope_type")) r.fail("type", "give either 'rope_type' or 'type', not both");
  r.read(r.has("type") ? "type" : "rope_type", s.rope_type);
  r.read("factor", s.factor);
  r.read("low_freq_factor", s.low_freq_factor);
  r.read("high_freq_factor", s.high_freq_factor);
  r.read("original_max_position_embeddings", s.original_max_position_embeddings);
}

std::string join_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 20;
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(names.size(), kShown));
  std::string s = fmt::format("{}", fmt::join(shown, ", "));
  if (names.size() > kShown) s += fmt::format(" (and {} more)", names.size() - kShown);
  return s;
}

std::string shape_text(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

at::ScalarType dtype_from_hf(const std::string& name) {
  static const std::map<std::string, at::ScalarType> kNames = {
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}, {"float64", at::kDouble}};
  std::string bare = name.starts_with("torch.") ? name.substr(6) : name;
  if (bare == "float") bare = "float32";
  if (bare == "half") bare = "float16";
  const auto it = kNames.find(bare);
  if (it == kNames.end()) {
    throw std::invalid_argument(fmt::format("'{}' is not float32, bfloat16, float16 or float64", name));
  }
  return it->second;
}

std::string hf_dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      throw std::invalid_argument(fmt::format("dtype {} has no HF model dtype", c10::toString(type)));
  }
}

HfConfig llama_config_from_hf_json(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = io::parse_json(text, source);
  } catch (const io::InputError& e) {
    throw ConfigError(e.what());
  }
  if (!doc.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object", source));
  const JsonReader r(doc, source);

  // What this file describes must be what kiln computes.
  std::string model_type = "llama", hidden_act = "silu";
  r.read("model_type", model_type);
  if (model_type != "llama") r.fail("model_type", fmt::format("must be 'llama', got '{}'", model_type));
  if (const json* arch = r.find("architectures")) {
    if (!arch->is_array() || std::find(arch->begin(), arch->end(), json("LlamaForCausalLM")) == arch->end()) {
      r.fail("architectures", fmt::format("must list LlamaForCausalLM, got {}", arch->dump()));
    }
  }
  r.read("hidden_act", hidden_act);
  if (hidden_act != "silu") r.fail("hidden_act", fmt::format("kiln implements 'silu' only, got '{}'", hidden_act));
  if (r.has("quantization_config")) r.fail("quantization_config", "quantized checkpoints are not supported");

  HfConfig out;
  LlamaConfig& c = out.config;
  c.source = source;
  r.read("vocab_size", c.vocab_size, true);
  r.read("hidden_size", c.hidden_size, true);
  r.read("intermediate_size", c.intermediate_size, true);
  r.read("num_hidden_layers", c.num_hidden_layers, true);
  r.read("num_attention_heads", c.num_attention_heads, true);
  r.read("num_key_value_heads", c.num_key_value_heads);
  r.read("head_dim", c.head_dim);
  r.read("max_position_embeddings", c.max_position_embeddings);
  r.read("rms_norm_eps", c.rms_norm_eps);
  r.read("tie_word_embeddings", c.tie_word_embeddings);
  r.read("attention_bias", c.attention_bias);
  r.read("mlp_bias", c.mlp_bias);
  r.read("initializer_range", c.initializer_range);
  r.read_token("bos_token_id", c.bos_token_id);
  r.read_token("eos_token_id", c.eos_token_id);
  if (r.has("rope_parameters")) {
    read_rope(r.child("rope_parameters"), c.rope_scaling, &c.rope_theta);  // transformers 5
  } else {
    r.read("rope_theta", c.rope_theta);
    if (r.has("rope_scaling")) read_rope(r.child("rope_scaling"), c.rope_scaling, nullptr);
  }
  // transformers 5 writes `dtype`, 4.x `torch_dtype`; the newer key wins when both are there.
  for (const char* key : {"torch_dtype", "dtype"}) {
    std::string name;
    r.read(key, name);
    if (name.empty() || name == "auto") continue;
    try {
      out.dtype = dtype_from_hf(name);
    } catch (const std::invalid_argument& e) {
      r.fail(key, e.what());
    }
  }
  c.validate();
  return out;
}

HfConfig read_hf_config(const std::string& path) {
  std::string text;
  try {
    text = io::read_input_file(path, kMaxConfigBytes);
  } catch (const io::InputError& e) {
    throw ConfigError(e.what());
  }
  return llama_config_from_hf_json(text, path);
}

std::string llama_config_to_hf_json(const LlamaConfig& c, at::ScalarType dtype, int64_t pad_token_id) {
  auto token = [](int64_t id) { return id < 0 ? json(nullptr) : json(id); };
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"attention_bias", c.attention_bias},
      {"attention_dropout", 0.0},
      {"bos_token_id", token(c.bos_token_id)},
      {"eos_token_id", token(c.eos_token_id)},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", c.initializer_range},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"mlp_bias", c.mlp_bias},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"pretraining_tp", 1},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", hf_dtype_name(dtype)},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
  };
  // Unset (0) sizes stay absent: transformers derives the same defaults, and a round trip
  // returns the config unchanged.
  if (c.num_key_value_heads > 0) j["num_key_value_heads"] = c.num_key_value_heads;
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  if (c.head_dim > 0) j["head_dim"] = c.head_dim;
  const RopeScaling& s = c.rope_scaling;
  if (s.rope_type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", s.rope_type},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }
  return j.dump(2) + "\n";
}

void load_weights(LlamaForCausalLMImpl& model, io::SafetensorsCheckpoint& checkpoint, const std::string& source) {
  const auto params = model.named_parameters(/*recurse=*/true);
  const bool tied = model.config().tie_word_embeddings;
  std::vector<std::string> missing, unknown;
  for (const auto& item : params) {
    if (!checkpoint.contains(item.key())) missing.push_back(item.key());
  }
  for (const auto& name : checkpoint.names()) {
    if (params.contains(name)) continue;
    if (tied && name == "lm_head.weight") continue;       // checked against the embedding below
    if (name.ends_with("rotary_emb.inv_freq")) continue;  // a buffer older transformers saved
    unknown.push_back(name);
  }
  if (!missing.empty() || !unknown.empty()) {
    std::string problem;
    if (!missing.empty()) problem += fmt::format("missing tensors: {}", join_names(missing));
    if (!unknown.empty()) {
      problem += fmt::format("{}tensors the model does not have: {}", problem.empty() ? "" : "; ", join_names(unknown));
    }
    throw CheckpointError(
        fmt::format("checkpoint '{}' does not match its config ({}): {}", source, model.config().source, problem));
  }
  auto checked = [&](const std::string& name, const at::Tensor& param) {
    const io::TensorInfo& info = checkpoint.info(name);
    if (info.shape != param.sizes().vec()) {
      throw CheckpointError(fmt::format("checkpoint '{}': tensor '{}' has shape {} but the config expects {}", source,
                                        name, shape_text(info.shape), shape_text(param.sizes())));
    }
    if (!at::isFloatingType(info.dtype)) {
      throw CheckpointError(fmt::format("checkpoint '{}': tensor '{}' has dtype {}, not a floating-point type", source,
                                        name, c10::toString(info.dtype)));
    }
    return checkpoint.tensor(name);
  };
  at::NoGradGuard no_grad;
  for (const auto& item : params) {
    at::Tensor param = item.value();
    param.copy_(checked(item.key(), param));
  }
  if (tied && checkpoint.contains("lm_head.weight")) {
    const at::Tensor& embed = model.model->embed_tokens->weight;
    const at::Tensor head = checked("lm_head.weight", embed).to(embed.options());
    if (!at::equal(head, embed)) {
      throw CheckpointError(
          fmt::format("checkpoint '{}': tie_word_embeddings is true but tensor 'lm_head.weight' differs from "
                      "'model.embed_tokens.weight'",
                      source));
    }
  }
}

LlamaForCausalLM load_pretrained(const std::string& dir, const LoadOptions& options) {
  const HfConfig hf = read_hf_config((fs::path(dir) / kConfigFile).string());
  io::SafetensorsCheckpoint checkpoint(dir);
  LlamaForCausalLM model(hf.config, at::TensorOptions().dtype(options.dtype.value_or(hf.dtype)).device(options.device));
  load_weights(*model, checkpoint, dir);
  return model;
}

void save_pretrained(const LlamaForCausalLMImpl& model, const std::string& dir, const SaveOptions& options) {
  io::NamedTensors tensors;
  std::optional<at::ScalarType> dtype = options.dtype;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor t = item.value().detach();
    if (!dtype) dtype = t.scalar_type();
    tensors.emplace_back(item.key(), t.to(*dtype));
  }
  io::save_safetensors_checkpoint(dir, tensors, {{"format", "pt"}}, options.max_shard_bytes);
  LlamaConfig config = model.config();
  if (options.bos_token_id) config.bos_token_id = *options.bos_token_id;
  if (options.eos_token_id) config.eos_token_id = *options.eos_token_id;
  io::write_file_atomic((fs::path(dir) / kConfigFile).string(),
                        llama_config_to_hf_json(config, dtype.value_or(at::kFloat), options.pad_token_id.value_or(-1)));
}

}  // namespace kiln::model
