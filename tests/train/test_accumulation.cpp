// Gradient accumulation normalises by the target tokens of the whole step. Reference: the same
// 4 sequences as one batch (GA = 1) must give the same gradients as 4 micro-batches of 1
// (GA = 4); and the per-micro-batch-mean formulation (HF's old bug) must NOT, which shows the
// test can fail.
#include <catch2/catch.hpp>

#include "kiln/train/gradient_accumulation.h"
#include "support.h"

using kiln::train::MicroBatch;

namespace {
std::map<std::string, at::Tensor> grads_of(kiln::model::LlamaForCausalLM& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().grad().clone();
  return out;
}
double max_grad_diff(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  for (const auto& [k, v] : a) worst = std::max(worst, kiln::test::max_abs_diff(v, b.at(k)));
  return worst;
}
}  // namespace

TEST_CASE("GA = 4 x batch 1 has the gradient of GA = 1 x batch 4", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(11);
  const at::Tensor ids = at::randint(0, 320, {4, 16}, at::kLong);
  at::Tensor labels = ids.clone();
  // Unequal target counts per sequence: 15, 5, 12, 1.
  labels.index_put_({1, at::indexing::Slice(6, 16)}, -100);
  labels.index_put_({2, at::indexing::Slice(0, 4)}, -100);
  labels.index_put_({3, at::indexing::Slice(2, 16)}, -100);
  const int64_t total = kiln::train::count_targets(labels);
  CHECK(total == 15 + 5 + 12 + 1);

  kiln::train::AccumulateOptions opt{.total_targets = total};
  m->zero_grad();
  const auto one = kiln::train::accumulate_gradients(m, {MicroBatch{ids, labels}}, opt);
  const auto g1 = grads_of(m);

  std::vector<MicroBatch> micro;
  for (int64_t i = 0; i < 4; ++i) micro.push_back({ids.narrow(0, i, 1), labels.narrow(0, i, 1)});
  m->zero_grad();
  const auto four = kiln::train::accumulate_gradients(m, micro, opt);
  const auto g4 = grads_of(m);
  CHECK(four.loss_sum.item<double>() == Approx(one.loss_sum.item<double>()).epsilon(1e-6));
  CHECK(max_grad_diff(g1, g4) < 1e-6);

  // The buggy formulation: mean loss per micro-batch, averaged over micro-batches.
  m->zero_grad();
  for (const auto& mb : micro) (m->forward(mb.input_ids, mb.labels).loss / 4.0).backward();
  CHECK(max_grad_diff(g1, grads_of(m)) > 1e-4);
}

TEST_CASE("bf16 autocast accumulation stays close to fp32", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(12);
  const at::Tensor ids = at::randint(0, 320, {2, 16}, at::kLong);
  const int64_t total = kiln::train::count_targets(ids);
  m->zero_grad();
  const auto fp32 = kiln::train::accumulate_gradients(m, {MicroBatch{ids, ids}}, {.total_targets = total});
  const auto g32 = grads_of(m);
  m->zero_grad();
  const auto bf16 = kiln::train::accumulate_gradients(m, {MicroBatch{ids, ids}},
                                                      {.autocast_dtype = at::kBFloat16, .total_targets = total});
  CHECK(bf16.loss_sum.item<double>() == Approx(fp32.loss_sum.item<double>()).epsilon(0.01));
  for (const auto& p : m->parameters()) CHECK(p.grad().scalar_type() == at::kFloat);  // fp32 master grads
  double largest = 0;
  for (const auto& [k, v] : g32) largest = std::max(largest, v.abs().max().item<double>());
  CHECK(max_grad_diff(g32, grads_of(m)) < 0.05 * largest);
}
