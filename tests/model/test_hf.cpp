// HF mapping: config.json <-> LlamaConfig and checkpoint <-> model. References: Meta's published
// Llama-3.2-1B config.json (must describe the llama-3.2-1b preset), the config.json transformers
// 5.24 writes (rope_parameters, dtype), bit-exact save/load round trips, and the error text for
// every kind of mismatch. Logit parity with transformers is tests/python/test_hf_parity.py.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include "kiln/model/hf.h"
#include "kiln/model/llama.h"
#include "support.h"

namespace fs = std::filesystem;
using kiln::model::LlamaConfig;
using kiln::model::LlamaForCausalLM;
using kiln::test::error_of;

namespace {

// meta-llama/Llama-3.2-1B config.json as published.
constexpr const char* kLlama32Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// What transformers 5.24 writes for a small llama3 model (rope_parameters, dtype, pad_token_id).
constexpr const char* kTransformers5Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
  "initializer_range": 0.02, "intermediate_size": 48, "max_position_embeddings": 64, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 16, "rope_theta": 500000.0, "rope_type": "llama3"},
  "tie_word_embeddings": true, "transformers_version": "5.24.0", "use_cache": true, "vocab_size": 64})";

void check_same(const LlamaConfig& a, const LlamaConfig& b) {
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.hidden_size == b.hidden_size);
  CHECK(a.intermediate_size == b.intermediate_size);
  CHECK(a.num_hidden_layers == b.num_hidden_layers);
  CHECK(a.num_attention_heads == b.num_attention_heads);
  CHECK(a.kv_heads() == b.kv_heads());
  CHECK(a.resolved_head_dim() == b.resolved_head_dim());
  CHECK(a.max_position_embeddings == b.max_position_embeddings);
  CHECK(a.rms_norm_eps == b.rms_norm_eps);
  CHECK(a.rope_theta == b.rope_theta);
  CHECK(a.rope_scaling.rope_type == b.rope_scaling.rope_type);
  CHECK(a.rope_scaling.factor == b.rope_scaling.factor);
  CHECK(a.rope_scaling.low_freq_factor == b.rope_scaling.low_freq_factor);
  CHECK(a.rope_scaling.high_freq_factor == b.rope_scaling.high_freq_factor);
  CHECK(a.rope_scaling.original_max_position_embeddings == b.rope_scaling.original_max_position_embeddings);
  CHECK(a.tie_word_embeddings == b.tie_word_embeddings);
  CHECK(a.attention_bias == b.attention_bias);
  CHECK(a.mlp_bias == b.mlp_bias);
  CHECK(a.initializer_range == b.initializer_range);
  CHECK(a.bos_token_id == b.bos_token_id);
  CHECK(a.eos_token_id == b.eos_token_id);
}

LlamaConfig small_config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.rope_scaling = {.rope_type = "llama3", .original_max_position_embeddings = 32};
  c.rope_scaling.factor = 4;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 0;
  c.eos_token_id = -1;
  return c;
}

}  // namespace

TEST_CASE("Meta's Llama-3.2-1B config.json is the llama-3.2-1b preset", "[model][hf]") {
  const auto hf = kiln::model::llama_config_from_hf_json(kLlama32Config, "config.json");
  CHECK(hf.dtype == at::kBFloat16);
  check_same(hf.config, kiln::model::load_llama_config("llama-3.2-1b"));
}

TEST_CASE("transformers 5 config.json (rope_parameters, dtype) is read", "[model][hf]") {
  const auto hf = kiln::model::llama_config_from_hf_json(kTransformers5Config, "config.json");
  CHECK(hf.dtype == at::kFloat);
  CHECK(hf.config.rope_theta == 500000.0);
  CHECK(hf.config.rope_scaling.rope_type == "llama3");
  CHECK(hf.config.rope_scaling.factor == 8.0);
  CHECK(hf.config.rope_scaling.original_max_position_embeddings == 16);
  CHECK(hf.config.kv_heads() == 2);
  CHECK(hf.config.rms_norm_eps == 1e-6);
}

TEST_CASE("config.json written by kiln reads back to the same config", "[model][hf]") {
  for (bool tied : {false, true}) {
    const LlamaConfig c = small_config(tied);
    const auto back =
        kiln::model::llama_config_from_hf_json(kiln::model::llama_config_to_hf_json(c, at::kBFloat16), "config.json");
    CHECK(back.dtype == at::kBFloat16);
    check_same(back.config, c);
    CHECK(back.config.head_dim == c.head_dim);  // unset stays unset
  }
}

TEST_CASE("load_llama_config reads a Hugging Face folder or its config.json", "[model][hf]") {
  // What kiln-profile sweep --model and kiln-hf init accept, so that a benchmark builds kiln's model and
  // transformers' from the very same config.json (scripts/bench_vs_hf.py).
  const fs::path dir = kiln::test::scratch_dir("hf_config_folder");
  {
    std::ofstream out(dir / "config.json");
    out << kTransformers5Config;
  }
  const LlamaConfig expected = kiln::model::llama_config_from_hf_json(kTransformers5Config, "config.json").config;
  check_same(kiln::model::load_llama_config(dir.string()), expected);
  check_same(kiln::model::load_llama_config((dir / "config.json").string()), expected);
  CHECK(kiln::model::load_llama_config(dir.string()).source == (dir / "config.json").string());
  // A folder without config.json is neither a preset nor a file.
  const fs::path empty = kiln::test::scratch_dir("hf_config_empty");
  CHECK_THAT(error_of([&] { kiln::model::load_llama_config(empty.string()); }),
             Catch::Contains("config.json") && Catch::Contains(empty.string()));
  // A config.json that is not a Llama config is refused with the file's name.
  {
    std::ofstream out(empty / "bad.json");
    out << R"({"model_type": "gpt2"})";
  }
  CHECK_THAT(error_of([&] { kiln::model::load_llama_config((empty / "bad.json").string()); }),
             Catch::Contains("bad.json"));
}

TEST_CASE("config.json problems name the file and the key", "[model][hf]") {
  auto error = [](const std::string& edit_from, const std::string& edit_to) {
    std::string text = kTransformers5Config;
    const auto at = text.find(edit_from);
    REQUIRE(at != std::string::npos);
    text.replace(at, edit_from.size(), edit_to);
    return error_of([&] { kiln::model::llama_config_from_hf_json(text, "/ckpt/config.json"); });
  };
  CHECK_THAT(error(R"("hidden_act": "silu")", R"("hidden_act": "gelu")"),
             Catch::Contains("/ckpt/config.json") && Catch::Contains("'hidden_act'") && Catch::Contains("gelu"));
  CHECK_THAT(error(R"("model_type": "llama")", R"("model_type": "mistral")"), Catch::Contains("'model_type'"));
  CHECK_THAT(error(R"(["LlamaForCausalLM"])", R"(["GPT2LMHeadModel"])"), Catch::Contains("'architectures'"));
  CHECK_THAT(error(R"("rope_type": "llama3")", R"("rope_type": "yarn")"),
             Catch::Contains("rope_scaling.rope_type") && Catch::Contains("yarn"));
  CHECK_THAT(error(R"("hidden_size": 32)", R"("hidden_size": "32")"),
             Catch::Contains("'hidden_size'") && Catch::Contains("integer"));
  CHECK_THAT(error(R"("vocab_size": 64)", R"("n": 1)"), Catch::Contains("'vocab_size'") && Catch::Contains("missing"));
  CHECK_THAT(error(R"("dtype": "float32")", R"("dtype": "int8")"), Catch::Contains("'dtype'"));
  CHECK_THAT(error(R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)"),
             Catch::Contains("'num_key_value_heads'"));
  CHECK_THAT(error(R"("vocab_size": 64})", R"("vocab_size": 64)"), Catch::Contains("expected valid JSON"));
  CHECK_THAT(error(R"("use_cache": true)", R"("quantization_config": {})"), Catch::Contains("quantization_config"));
  // A vocab_size no 32-bit token id can reach: the key, the limit, and the memory it would take.
  CHECK_THAT(error(R"("vocab_size": 64)", R"("vocab_size": 1099511627776)"),
             Catch::Contains("'vocab_size'") && Catch::Contains("1099511627776") && Catch::Contains("32-bit") &&
                 Catch::Contains("TiB"));
}

TEST_CASE("a model too large for this machine's memory is refused before allocating, with the size it needs",
          "[model][hf]") {
  auto c = kiln::model::load_llama_config("tiny");
  c.source = "/ckpt/config.json";
  c.vocab_size = int64_t{1} << 31;  // valid, but 2^31 x hidden_size fp32 rows are far beyond any CPU's memory
  c.hidden_size = 65536;
  c.intermediate_size = 65536;
  c.num_attention_heads = 512;
  c.num_key_value_heads = 512;
  const std::string e = error_of([&] { kiln::model::LlamaForCausalLM m(c, at::TensorOptions().dtype(at::kFloat)); });
  CHECK_THAT(e, Catch::Contains("/ckpt/config.json") && Catch::Contains("needs") && Catch::Contains("TiB") &&
                    Catch::Contains("vocab_size 2147483648") && Catch::Contains("this machine's"));
}

TEST_CASE("save_pretrained then load_pretrained is bit-exact, sharded or not, in bf16 too", "[model][hf]") {
  for (bool tied : {false, true}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      CAPTURE(tied, dtype);
      LlamaForCausalLM model(small_config(tied), at::TensorOptions().dtype(dtype));
      model->init_weights(5);
      const fs::path dir = kiln::test::scratch_dir("hf_roundtrip");
      kiln::model::SaveOptions options;
      options.max_shard_bytes = 4096;  // several shards
      kiln::model::save_pretrained(model, dir.string(), options);
      CHECK(fs::exists(dir / "model.safetensors.index.json"));
      kiln::io::SafetensorsCheckpoint ckpt(dir.string());
      CHECK(ckpt.contains("lm_head.weight") == !tied);  // HF omits the tied head
      CHECK(!ckpt.contains("model.inv_freq"));          // buffers are not checkpoint tensors

      LlamaForCausalLM back = kiln::model::load_pretrained(dir.string());
      const auto a = model->named_parameters(), b = back->named_parameters();
      REQUIRE(a.size() == b.size());
      for (const auto& item : a) {
        CAPTURE(item.key());
        CHECK(b[item.key()].scalar_type() == dtype);
        CHECK(at::equal(b[item.key()], item.value()));
      }
      check_same(back->config(), model->config());
      const at::Tensor ids = at::randint(0, 40, {1, 9}, at::kLong);
      CHECK(at::equal(back->forward(ids).logits, model->forward(ids).logits));
    }
  }
}

TEST_CASE("checkpoint mismatches are reported by tensor name", "[model][hf]") {
  LlamaForCausalLM model(small_config(false));
  model->init_weights(1);
  const fs::path base = kiln::test::scratch_dir("hf_base");
  kiln::model::save_pretrained(model, base.string());
  kiln::io::NamedTensors tensors;
  for (const auto& item : model->named_parameters()) tensors.emplace_back(item.key(), item.value().detach());

  auto with = [&](const std::string& name, kiln::io::NamedTensors ts, const std::string& config_text) {
    const fs::path dir = kiln::test::scratch_dir("hf_" + name);
    kiln::io::save_safetensors((dir / "model.safetensors").string(), ts);
    std::ofstream(dir / "config.json") << config_text;
    return error_of([&] { kiln::model::load_pretrained(dir.string()); });
  };
  std::string config_text;
  {
    std::ifstream in(base / "config.json");
    config_text.assign(std::istreambuf_iterator<char>(in), {});
  }

  auto missing = tensors;
  missing.erase(missing.begin() + 3);
  CHECK_THAT(with("missing", missing, config_text),
             Catch::Contains("missing tensors: " + tensors[3].first) && Catch::Contains("missing"));
  auto extra = tensors;
  extra.emplace_back("model.layers.9.mlp.up_proj.weight", at::zeros({2}));
  CHECK_THAT(with("extra", extra, config_text), Catch::Contains("does not have: model.layers.9.mlp.up_proj.weight"));
  auto wrong_shape = tensors;
  wrong_shape[0].second = at::zeros({40, 15});
  CHECK_THAT(with("shape", wrong_shape, config_text), Catch::Contains("'model.embed_tokens.weight'") &&
                                                          Catch::Contains("[40, 15]") && Catch::Contains("[40, 16]"));
  auto int_tensor = tensors;
  int_tensor[0].second = at::zeros({40, 16}, at::kInt);
  CHECK_THAT(with("dtype", int_tensor, config_text),
             Catch::Contains("'model.embed_tokens.weight'") && Catch::Contains("floating"));

  // A tied config tolerates an lm_head.weight equal to the embedding, and rejects a different one.
  std::string tied_text = config_text;
  const std::string untied_key = R"("tie_word_embeddings": false)";
  const auto at = tied_text.find(untied_key);
  REQUIRE(at != std::string::npos);
  tied_text.replace(at, untied_key.size(), R"("tie_word_embeddings": true)");
  auto tied = tensors;
  tied.erase(std::remove_if(tied.begin(), tied.end(), [](const auto& t) { return t.first == "lm_head.weight"; }),
             tied.end());
  auto tied_equal = tied;
  tied_equal.emplace_back("lm_head.weight", model->model->embed_tokens->weight.detach());
  CHECK(with("tied_equal", tied_equal, tied_text).empty());
  auto tied_other = tied;
  tied_other.emplace_back("lm_head.weight", model->lm_head->weight.detach());
  CHECK_THAT(with("tied_other", tied_other, tied_text), Catch::Contains("'lm_head.weight' differs"));
  CHECK_THAT(error_of([&] { kiln::model::load_pretrained((base / "nope").string()); }),
             Catch::Contains("nope/config.json"));
}
