// Generation. References: greedy decoding with the KV cache must equal greedy decoding that
// recomputes the whole sequence each step (no cache); attention with S > T against the
// composition; top-k/top-p filtering against their definitions.
#include <algorithm>

#include <catch2/catch.hpp>

#include "kiln/model/generate.h"
#include "support.h"

TEST_CASE("KV-cache greedy decoding equals full recomputation", "[model][generate]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(21);
  const std::vector<int64_t> prompt = {5, 17, 42, 99, 3};
  const auto fast = kiln::model::generate(m, prompt, {.max_new_tokens = 12, .greedy = true});
  at::NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt, slow;
  for (int i = 0; i < 12; ++i) {
    const at::Tensor logits = m->forward(at::tensor(seq, at::kLong).unsqueeze(0)).logits;
    slow.push_back(logits[0][-1].argmax().item<int64_t>());
    seq.push_back(slow.back());
  }
  CHECK(fast == slow);
  // The cached logits themselves match the full forward at every position.
  kiln::model::KVCache cache;
  const at::Tensor ids = at::tensor(seq, at::kLong).unsqueeze(0);
  const at::Tensor first = m->forward_cached(ids.narrow(1, 0, 7), cache);
  const at::Tensor second = m->forward_cached(ids.narrow(1, 7, 3), cache);
  const at::Tensor full = m->forward(ids.narrow(1, 0, 10)).logits;
  CHECK(cache.length == 10);
  CHECK(kiln::test::max_abs_diff(at::cat({first, second}, 1), full) < 1e-5);
}

TEST_CASE("top-k and top-p keep exactly the tokens their definitions keep", "[model][generate]") {
  const at::Tensor logits = at::log(at::tensor({0.05f, 0.4f, 0.1f, 0.3f, 0.15f}));
  const at::Tensor k2 = kiln::model::sampling_distribution(logits, {.top_k = 2});
  CHECK(at::equal((k2 > 0).to(at::kInt), at::tensor({0, 1, 0, 1, 0}, at::kInt)));
  CHECK(k2[1].item<double>() == Approx(0.4 / 0.7));
  // top_p 0.75: 0.4 + 0.3 = 0.7 < 0.75, so 0.15 is needed too; 0.1 and 0.05 are dropped.
  const at::Tensor p = kiln::model::sampling_distribution(logits, {.top_p = 0.75});
  CHECK(at::equal((p > 0).to(at::kInt), at::tensor({0, 1, 0, 1, 1}, at::kInt)));
  // top_p below the largest probability still keeps that one token.
  const at::Tensor one = kiln::model::sampling_distribution(logits, {.top_p = 0.1});
  CHECK(one[1].item<double>() == Approx(1.0));
  // Temperature sharpens: T -> 0 approaches argmax.
  CHECK(kiln::model::sampling_distribution(logits, {.temperature = 0.01})[1].item<double>() > 0.999);
}

TEST_CASE("sampling is seeded and stops at EOS", "[model][generate]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(22);
  const kiln::model::GenerateOptions o{.max_new_tokens = 20, .top_k = 50, .top_p = 0.9, .seed = 7};
  CHECK(kiln::model::generate(m, {1, 2, 3}, o) == kiln::model::generate(m, {1, 2, 3}, o));
  const auto first = kiln::model::generate(m, {1, 2, 3}, {.max_new_tokens = 1, .greedy = true});
  const auto stopped =
      kiln::model::generate(m, {1, 2, 3}, {.max_new_tokens = 20, .greedy = true, .eos_token_id = first[0]});
  CHECK(stopped.size() == 1);
}

TEST_CASE("generation never produces an id outside the tokenizer's vocabulary", "[model][generate]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));  // 320 rows
  m->init_weights(3);
  {
    // Make the rows past the byte tokenizer's 259 ids the most likely by far.
    at::NoGradGuard no_grad;
    m->named_parameters()["lm_head.weight"].narrow(0, 259, 61).mul_(50);
  }
  const std::vector<int64_t> prompt = {72, 101, 108};
  const auto free = kiln::model::generate(m, prompt, {.max_new_tokens = 16, .greedy = true});
  CHECK(*std::max_element(free.begin(), free.end()) >= 259);  // the model alone does go there
  for (const bool greedy : {true, false}) {
    const auto ids = kiln::model::generate(
        m, prompt, {.max_new_tokens = 32, .greedy = greedy, .temperature = 2.0, .seed = 5, .vocab_limit = 259});
    REQUIRE(ids.size() == 32);
    CHECK(*std::max_element(ids.begin(), ids.end()) < 259);
  }
  CHECK_THAT(kiln::test::error_of([&] { kiln::model::generate(m, prompt, {.max_new_tokens = -1}); }),
             Catch::Contains("max_new_tokens") && Catch::Contains("-1"));
  CHECK_THAT(kiln::test::error_of([&] {
               kiln::model::generate(m, {5, 4000}, {.max_new_tokens = 1});
             }),
             Catch::Contains("token id 4000") && Catch::Contains("vocab_size 320"));
  CHECK(kiln::model::generate(m, prompt, {.max_new_tokens = 0}).empty());
}
