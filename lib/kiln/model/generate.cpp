#include "kiln/model/generate.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

namespace kiln::model {

namespace {

// logits [V] restricted to the ids the tokenizer has.
at::Tensor within_vocab(const at::Tensor& logits, int64_t limit) {
  return limit > 0 && limit < logits.size(-1) ? logits.narrow(-1, 0, limit) : logits;
}

}  // namespace

at::Tensor sampling_distribution(const at::Tensor& all_logits, const GenerateOptions& o) {
  const at::Tensor logits = within_vocab(all_logits, o.vocab_limit);
  at::Tensor scores = logits.to(at::kFloat) / o.temperature;
  const int64_t vocab = scores.size(-1);
  if (o.top_k > 0 && o.top_k < vocab) {
    const at::Tensor kth = std::get<0>(scores.topk(o.top_k)).select(-1, o.top_k - 1);
    scores = scores.masked_fill(scores < kth, -INFINITY);
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = scores.sort(/*dim=*/-1, /*descending=*/true);
    const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    // Drop a token when the tokens before it already reach top_p (so the first always stays).
    const at::Tensor drop_sorted = (cumulative - sorted.softmax(-1)) >= o.top_p;
    const at::Tensor drop = at::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    scores = scores.masked_fill(drop, -INFINITY);
  }
  return scores.softmax(-1);
}

std::vector<int64_t> generate(LlamaForCausalLM& model, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  if (o.max_new_tokens < 0)
    throw std::invalid_argument(fmt::format("generate: max_new_tokens must be >= 0, got {}", o.max_new_tokens));
  const int64_t vocab = model->config().vocab_size;
  for (const int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      throw std::invalid_argument(fmt::format("generate: prompt token id {} is outside the model's vocab_size {} ({})",
                                              id, vocab, model->config().source));
    }
  }
  if (o.vocab_limit < 0) throw std::invalid_argument("generate: vocab_limit must be >= 0");
  if (!o.greedy && !(o.temperature > 0)) throw std::invalid_argument("generate: temperature must be > 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw std::invalid_argument("generate: top_p must be in (0, 1]");
  at::NoGradGuard no_grad;
  model->eval();
  const at::Device device = model->parameters().front().device();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  KVCache cache;
  at::Tensor input = at::tensor(prompt, at::kLong).unsqueeze(0).to(device);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const at::Tensor logits = model->forward_cached(input, cache).select(1, -1).squeeze(0).cpu();  // [V]
    const int64_t next = o.greedy ? within_vocab(logits, o.vocab_limit).argmax().item<int64_t>()
                                  : at::multinomial(sampling_distribution(logits, o), 1, false, gen).item<int64_t>();
    out.push_back(next);
    if (next == o.eos_token_id) break;
    input = at::full({1, 1}, next, at::TensorOptions().dtype(at::kLong).device(device));
  }
  return out;
}

}  // namespace kiln::model
