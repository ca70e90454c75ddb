// Parameter counts. References: the "Number of trainable parameters = 1,235,814,400" that HF
// Trainer printed for Llama-3.2-1B (configs/reference/llamafactory_runs.yaml), and hand counts of the
// other presets written out below; each is checked against both the closed-form count and the
// module actually built (on the meta device, so no memory is allocated).
#include <set>

#include <catch2/catch.hpp>

#include "kiln/model/llama.h"

using kiln::model::LlamaForCausalLM;
using kiln::model::load_llama_config;

namespace {
int64_t built_parameters(const std::string& preset) {
  LlamaForCausalLM m(load_llama_config(preset), at::TensorOptions().device(at::kMeta));
  return m->num_parameters();
}
}  // namespace

TEST_CASE("llama-3.2-1b has exactly 1,235,814,400 trainable parameters", "[model]") {
  CHECK(load_llama_config("llama-3.2-1b").num_parameters() == 1235814400);
  CHECK(built_parameters("llama-3.2-1b") == 1235814400);
}

TEST_CASE("llama-100m and tiny parameter counts", "[model]") {
  // llama-100m: embed 32000*768 (tied) + 12 * (q 768*768 + k,v 2*768*256 + o 768*768
  //             + mlp 3*768*2048 + norms 2*768) + final norm 768
  const int64_t layer_100m = 768 * 768 + 2 * 768 * 256 + 768 * 768 + 3 * 768 * 2048 + 2 * 768;
  const int64_t expect_100m = 32000 * 768 + 12 * layer_100m + 768;
  CHECK(expect_100m == 100092672);
  CHECK(load_llama_config("llama-100m").num_parameters() == expect_100m);
  CHECK(built_parameters("llama-100m") == expect_100m);
  // tiny: untied embed + head 2*320*128, 2 layers of (128*128 + 2*128*64 + 128*128 + 3*128*384 + 256), + 128
  const int64_t expect_tiny = 2 * 320 * 128 + 2 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 384 + 256) + 128;
  CHECK(expect_tiny == 475776);
  CHECK(load_llama_config("tiny").num_parameters() == expect_tiny);
  CHECK(built_parameters("tiny") == expect_tiny);
}

TEST_CASE("parameter names are Hugging Face's state-dict keys", "[model]") {
  LlamaForCausalLM tiny(load_llama_config("tiny"), at::TensorOptions().device(at::kMeta));
  std::set<std::string> names;
  for (const auto& p : tiny->named_parameters()) names.insert(p.key());
  for (const char* expected :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight", "model.layers.1.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight"}) {
    CHECK(names.count(expected) == 1);
  }
  CHECK(names.size() == 2 + 2 * 9 + 1);
  LlamaForCausalLM tied(load_llama_config("llama-3.2-1b"), at::TensorOptions().device(at::kMeta));
  for (const auto& p : tied->named_parameters()) CHECK(p.key() != "lm_head.weight");
  CHECK(tied->named_parameters()["model.layers.15.self_attn.k_proj.weight"].sizes() == at::IntArrayRef({512, 2048}));
}
