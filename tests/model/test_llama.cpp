// The LLaMA model end to end on CPU. References: causality (a property), the loss written out
// as log-softmax + gather, gradients against central finite differences in fp64, and the fp32
// model as reference for bf16/fp16.
#include <cmath>
#include <string>

#include <torch/cuda.h>
#include <catch2/catch.hpp>

#include "kiln/model/llama.h"
#include "support.h"

using kiln::model::LlamaConfig;
using kiln::model::LlamaForCausalLM;
using kiln::test::max_abs_diff;

namespace {

// A model small enough to difference every parameter: 2 layers, GQA 4:2, head_dim 4, llama3 RoPE.
LlamaConfig micro_config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.rope_theta = 50;
  c.rope_scaling = {.rope_type = "llama3",
                    .factor = 4,
                    .low_freq_factor = 1,
                    .high_freq_factor = 2,
                    .original_max_position_embeddings = 8};
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.5;  // large weights so every path contributes visibly to the loss
  c.bos_token_id = c.eos_token_id = -1;
  return c;
}

}  // namespace

TEST_CASE("changing token t never changes logits before t", "[model]") {
  LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(1);
  at::NoGradGuard no_grad;
  const at::Tensor ids = at::randint(0, 320, {2, 24}, at::kLong);
  const at::Tensor base = m->forward(ids).logits;
  for (int64_t t : {0, 7, 23}) {
    at::Tensor changed = ids.clone();
    changed.select(1, t).add_(1).remainder_(320);
    const at::Tensor logits = m->forward(changed).logits;
    CAPTURE(t);
    if (t > 0) CHECK(max_abs_diff(logits.narrow(1, 0, t), base.narrow(1, 0, t)) < 1e-6);
    CHECK(max_abs_diff(logits.narrow(1, t, 1), base.narrow(1, t, 1)) > 1e-4);
  }
}

TEST_CASE("loss is the mean next-token cross-entropy, ignoring -100", "[model]") {
  LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(2);
  const at::Tensor ids = at::randint(0, 320, {3, 10}, at::kLong);
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(3, 6)}, -100);
  labels.index_put_({2, 9}, -100);
  const auto out = m->forward(ids, labels);
  const at::Tensor logp = at::log_softmax(out.logits.to(at::kDouble), -1);
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t + 1 < 10; ++t) {
      const int64_t target = labels[b][t + 1].item<int64_t>();
      if (target == -100) continue;
      sum -= logp[b][t][target].item<double>();
      ++count;
    }
  CHECK(out.num_tokens.item<int64_t>() == count);
  CHECK(out.loss_sum.item<double>() == Approx(sum).epsilon(1e-5));
  CHECK(out.loss.item<double>() == Approx(sum / count).epsilon(1e-5));
  // A freshly initialised model predicts close to uniform: loss near ln(V).
  CHECK(out.loss.item<double>() == Approx(std::log(320.0)).epsilon(0.05));
}

TEST_CASE("gradients of every parameter match finite differences in fp64", "[model]") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    LlamaForCausalLM m(micro_config(tied), at::TensorOptions().dtype(at::kDouble));
    m->init_weights(3);
    const at::Tensor ids = at::randint(0, 11, {2, 6}, at::kLong);
    m->forward(ids, ids).loss.backward();
    at::NoGradGuard no_grad;
    const double eps = 1e-6;
    int64_t checked = 0;
    double worst = 0;
    std::string worst_at;
    for (const auto& item : m->named_parameters()) {
      at::Tensor p = item.value().view({-1});
      const at::Tensor grad = item.value().grad().view({-1});
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double orig = p[i].item<double>();
        p[i].fill_(orig + eps);
        const double up = m->forward(ids, ids).loss.item<double>();
        p[i].fill_(orig - eps);
        const double down = m->forward(ids, ids).loss.item<double>();
        p[i].fill_(orig);
        const double fd = (up - down) / (2 * eps), ag = grad[i].item<double>();
        // Tolerance 1e-8 absolute + 1e-5 relative: central differences with eps 1e-6 in fp64 are
        // good to ~1e-10, so anything past this is a wrong gradient, not rounding.
        const double rel = std::abs(fd - ag) / (1e-8 + 1e-5 * std::abs(ag));
        if (rel > worst) worst_at = item.key() + "[" + std::to_string(i) + "]";
        worst = std::max(worst, rel);
        ++checked;
      }
    }
    CHECK(checked == m->num_parameters());
    INFO("largest relative difference at " << worst_at);
    CHECK(worst < 1.0);
  }
}

TEST_CASE("bf16 and fp16 run on CPU and stay close to fp32", "[model]") {
  LlamaForCausalLM ref(kiln::model::load_llama_config("tiny"));
  ref->init_weights(4);
  const at::Tensor ids = at::randint(0, 320, {2, 16}, at::kLong);
  const auto want = ref->forward(ids, ids);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    CAPTURE(dtype);
    LlamaForCausalLM m(kiln::model::load_llama_config("tiny"), at::TensorOptions().dtype(dtype));
    m->init_weights(4);  // same seed: the same weights, rounded to `dtype`
    const auto got = m->forward(ids, ids);
    CHECK(got.logits.scalar_type() == dtype);
    CHECK(got.loss.scalar_type() == at::kFloat);
    CHECK(got.loss.item<double>() == Approx(want.loss.item<double>()).epsilon(0.01));
    CHECK(max_abs_diff(got.logits, want.logits) < 0.05);
    got.loss.backward();
    for (const auto& p : m->parameters()) CHECK(at::isfinite(p.grad()).all().item<bool>());
  }
}

TEST_CASE("initialisation follows HF: N(0, initializer_range), norms at 1, seeded", "[model]") {
  LlamaForCausalLM a(kiln::model::load_llama_config("tiny")), b(kiln::model::load_llama_config("tiny"));
  a->init_weights(7);
  b->init_weights(7);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) CHECK(at::equal(item.value(), pb[item.key()]));
  const at::Tensor w = pa["model.layers.0.mlp.gate_proj.weight"];
  CHECK(w.mean().item<double>() == Approx(0).margin(0.002));
  CHECK(w.std().item<double>() == Approx(0.02).epsilon(0.02));
  CHECK(at::equal(pa["model.norm.weight"], at::ones({128})));
  b->init_weights(8);
  CHECK_FALSE(at::equal(pa["model.embed_tokens.weight"], b->named_parameters()["model.embed_tokens.weight"]));
}

TEST_CASE("the model on CUDA matches the model on CPU", "[model][cuda]") {
  REQUIRE(torch::cuda::is_available());
  LlamaForCausalLM cpu(kiln::model::load_llama_config("tiny"));
  cpu->init_weights(5);
  LlamaForCausalLM gpu(kiln::model::load_llama_config("tiny"), at::TensorOptions().device(at::kCUDA));
  gpu->init_weights(5);
  const at::Tensor ids = at::randint(0, 320, {2, 32}, at::kLong);
  const auto want = cpu->forward(ids, ids);
  const auto got = gpu->forward(ids.cuda(), ids.cuda());
  CHECK(max_abs_diff(got.logits, want.logits) < 1e-3);
  CHECK(got.loss.item<double>() == Approx(want.loss.item<double>()).epsilon(1e-4));
}

TEST_CASE("neat packing: documents packed with segment ids compute as if each were alone", "[model]") {
  // Reference: each document run on its own (positions from 0, no other document to attend to).
  LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(5);
  const at::Tensor d1 = at::randint(0, 320, {1, 7}, at::kLong), d2 = at::randint(0, 320, {1, 9}, at::kLong),
                   d3 = at::randint(0, 320, {1, 4}, at::kLong);
  const at::Tensor packed = at::cat({d1, d2, d3}, 1);
  const at::Tensor seg = at::cat({at::zeros({1, 7}), at::ones({1, 9}), at::full({1, 4}, 2)}, 1).to(at::kInt);
  CHECK(kiln::model::LlamaForCausalLMImpl::document_positions(seg).equal(
      at::cat({at::arange(7), at::arange(9), at::arange(4)}).unsqueeze(0)));
  const at::NoGradGuard no_grad;
  const at::Tensor got = m->forward(packed, {}, {}, seg).logits;
  CHECK(kiln::test::max_abs_diff(got.narrow(1, 0, 7), m->forward(d1).logits) < 1e-5);
  CHECK(kiln::test::max_abs_diff(got.narrow(1, 7, 9), m->forward(d2).logits) < 1e-5);
  CHECK(kiln::test::max_abs_diff(got.narrow(1, 16, 4), m->forward(d3).logits) < 1e-5);
  // Without segment ids the second document sees the first: different logits.
  CHECK(kiln::test::max_abs_diff(m->forward(packed).logits.narrow(1, 7, 9), m->forward(d2).logits) > 1e-3);
  CHECK_THAT(kiln::test::error_of([&] { m->forward(packed, {}, {}, seg.narrow(1, 0, 5)); }),
             Catch::Matchers::Contains("segment_ids"));
}
