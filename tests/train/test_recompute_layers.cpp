// Recomputation (full, every_n, selective) must not change the result. Reference: the
// same model's gradients computed without checkpointing (fp32 and bf16 autocast).
#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <catch2/catch.hpp>

#include "kiln/ops/dispatch.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/recompute_layers.h"
#include "support.h"

namespace {
// Names of the autograd nodes reachable from `t` (to see that checkpointing is really in use).
std::set<std::string> graph_node_names(const at::Tensor& t) {
  std::set<std::string> names;
  std::vector<torch::autograd::Node*> stack = {t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    names.insert(n->name());
    for (const auto& edge : n->next_edges()) stack.push_back(edge.function.get());
  }
  return names;
}
}  // namespace

TEST_CASE("checkpointing replaces the layers' graphs with one recomputing node each", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  const at::Tensor ids = at::randint(0, 320, {1, 8}, at::kLong);
  auto has = [](const std::set<std::string>& names, const std::string& part) {
    return std::any_of(names.begin(), names.end(),
                       [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  const auto plain = graph_node_names(m->forward(ids, ids).loss);
  kiln::train::set_layer_recomputation(m, true);
  const auto checkpointed = graph_node_names(m->forward(ids, ids).loss);
  kiln::train::set_layer_recomputation(m, false);
  CHECK_FALSE(has(plain, "CheckpointedLayer"));
  CHECK(has(checkpointed, "CheckpointedLayer"));
  // The MLP's gating node (ATen's or kiln's fused one, by backend) is gone from the saved graph.
  CHECK((has(plain, "SiluBackward") || has(plain, "SwiGlu")));
  CHECK_FALSE((has(checkpointed, "SiluBackward") || has(checkpointed, "SwiGlu")));
}

TEST_CASE("checkpointed layers give the same loss and gradients", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(31);
  const at::Tensor ids = at::randint(0, 320, {2, 24}, at::kLong);
  for (std::optional<at::ScalarType> dtype : {std::optional<at::ScalarType>(), std::optional(at::kBFloat16)}) {
    CAPTURE(dtype.has_value());
    auto grads = [&](bool checkpointing) {
      kiln::train::set_layer_recomputation(m, checkpointing);
      m->zero_grad();
      const kiln::train::AutocastGuard autocast(at::kCPU, dtype);
      const auto out = m->forward(ids, ids);
      out.loss.backward();
      std::vector<at::Tensor> g;
      for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
      g.push_back(out.loss.detach());
      return g;
    };
    const auto plain = grads(false), checkpointed = grads(true);
    double worst = 0;
    for (size_t i = 0; i < plain.size(); ++i)
      worst = std::max(worst, kiln::test::max_abs_diff(plain[i], checkpointed[i]));
    CHECK(worst < (dtype ? 1e-3 : 1e-6));
    for (size_t i = 0; i + 1 < plain.size(); ++i) CHECK(checkpointed[i].abs().sum().item<double>() > 0);
  }
  kiln::train::set_layer_recomputation(m, false);
}

TEST_CASE("checkpointed layers pass segment ids through (neat packing)", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(32);
  const at::Tensor ids = at::randint(0, 320, {2, 20}, at::kLong);
  const at::Tensor seg = at::div(at::arange(20), 6, "floor").to(at::kInt).unsqueeze(0).expand({2, 20}).contiguous();
  auto grads = [&](bool checkpointing, const at::Tensor& segments) {
    kiln::train::set_layer_recomputation(m, checkpointing);
    m->zero_grad();
    m->forward(ids, ids, {}, segments).loss.backward();
    std::vector<at::Tensor> g;
    for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
    kiln::train::set_layer_recomputation(m, false);
    return g;
  };
  const auto plain = grads(false, seg), checkpointed = grads(true, seg), unmasked = grads(true, {});
  double diff = 0, masked_vs_not = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    diff = std::max(diff, kiln::test::max_abs_diff(plain[i], checkpointed[i]));
    masked_vs_not = std::max(masked_vs_not, kiln::test::max_abs_diff(plain[i], unmasked[i]));
  }
  CHECK(diff < 1e-6);
  CHECK(masked_vs_not > 1e-4);  // the segments reached the recomputed layers
}

TEST_CASE("every_n recomputes layers 0, n, 2n, ... with the gradients of no recomputation", "[train]") {
  // 5 layers, every 2: layers 0, 2, 4 are recomputed, 1 and 3 keep their activations.
  auto config = kiln::model::load_llama_config("tiny");
  config.num_hidden_layers = 5;
  kiln::model::LlamaForCausalLM m(config);
  m->init_weights(33);
  const at::Tensor ids = at::randint(0, 320, {2, 18}, at::kLong);
  const at::Tensor seg = at::div(at::arange(18), 5, "floor").to(at::kInt).unsqueeze(0).expand({2, 18}).contiguous();
  auto count_recomputing = [](const at::Tensor& loss) {
    int n = 0;
    std::vector<torch::autograd::Node*> stack = {loss.grad_fn().get()};
    std::set<torch::autograd::Node*> seen;
    while (!stack.empty()) {
      torch::autograd::Node* node = stack.back();
      stack.pop_back();
      if (node == nullptr || !seen.insert(node).second) continue;
      n += node->name().find("CheckpointedLayer") != std::string::npos;
      for (const auto& e : node->next_edges()) stack.push_back(e.function.get());
    }
    return n;
  };
  auto grads = [&](bool on, int every, int* recomputing) {
    kiln::train::set_layer_recomputation(m, on, every);
    m->zero_grad();
    const auto out = m->forward(ids, ids, {}, seg);
    if (recomputing) *recomputing = count_recomputing(out.loss);
    out.loss.backward();
    std::vector<at::Tensor> g;
    for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  int every2 = 0, every3 = 0, full = 0;
  const auto plain = grads(false, 1, nullptr), two = grads(true, 2, &every2), three = grads(true, 3, &every3);
  grads(true, 1, &full);
  CHECK(every2 == 3);
  CHECK(every3 == 2);
  CHECK(full == 5);
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    worst = std::max({worst, kiln::test::max_abs_diff(plain[i], two[i]), kiln::test::max_abs_diff(plain[i], three[i])});
  }
  CHECK(worst < 1e-6);
  kiln::train::set_layer_recomputation(m, false);
  CHECK_THROWS_WITH(kiln::train::set_layer_recomputation(m, true, 0), Catch::Contains("every"));
}

namespace {
// Every parameter's gradient and the loss (last) of one forward/backward of `m`, with selective
// recomputation on or off, under autocast to `dtype` if given, with `segments` if defined.
std::vector<at::Tensor> selective_grads(kiln::model::LlamaForCausalLM& m, bool selective, const at::Tensor& ids,
                                        std::optional<at::ScalarType> dtype = {}, const at::Tensor& segments = {}) {
  kiln::train::set_selective_recomputation(m, selective);
  m->zero_grad();
  std::vector<at::Tensor> g;
  {
    const kiln::train::AutocastGuard autocast(at::kCPU, dtype);
    const auto out = m->forward(ids, ids, {}, segments);
    out.loss.backward();
    for (const auto& p : m->parameters()) g.push_back(p.grad().clone());
    g.push_back(out.loss.detach());
  }
  kiln::train::set_selective_recomputation(m, false);
  return g;
}
}  // namespace

TEST_CASE("selective recomputation keeps the matmul outputs and drops the element-wise parts' saved tensors",
          "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  const at::Tensor ids = at::randint(0, 320, {1, 8}, at::kLong);
  auto count = [](const std::set<std::string>& names, const std::string& part) {
    return std::count_if(names.begin(), names.end(),
                         [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  kiln::train::set_selective_recomputation(m, true);
  const auto selective = graph_node_names(m->forward(ids, ids).loss);
  {
    const at::NoGradGuard no_grad;  // evaluation runs the plain layers
    CHECK(m->forward(ids, ids).loss.defined());
  }
  kiln::train::set_selective_recomputation(m, false);
  CHECK(count(selective, "NormLinears") == 1);  // node types (one name for all of a type's nodes)
  CHECK(count(selective, "SwiGluLinear") == 1);
  CHECK(count(selective, "HeadsLinear") == 1);
  CHECK_FALSE(count(selective, "CheckpointedLayer"));
  // The decoder layers' norms and gating are inside the fused nodes: no RMSNorm node but the
  // final norm's, no SiLU / SwiGLU node of their own.
  CHECK(count(selective, "SiluBackward") == 0);
  CHECK(count(selective, "SwiGluFunction") == 0);
}

TEST_CASE("selective recomputation gives the loss and gradients of no recomputation", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(34);
  const at::Tensor ids = at::randint(0, 320, {2, 24}, at::kLong);
  for (const std::string kernels : {"kiln", "aten"}) {  // kiln's fused RMSNorm/SwiGLU Functions, or ATen's
    CAPTURE(kernels);
    const kiln::ops::BackendScope scope(kernels);
    const auto plain = selective_grads(m, false, ids), selective = selective_grads(m, true, ids);
    double worst = 0;
    for (size_t i = 0; i < plain.size(); ++i) worst = std::max(worst, kiln::test::max_abs_diff(plain[i], selective[i]));
    CHECK(worst < 1e-6);
    for (size_t i = 0; i + 1 < plain.size(); ++i) CHECK(selective[i].abs().sum().item<double>() > 0);
  }
}

TEST_CASE("selective recomputation under bf16 autocast: the gradients of no recomputation within bf16 rounding",
          "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(35);
  const at::Tensor ids = at::randint(0, 320, {2, 24}, at::kLong);
  const auto plain = selective_grads(m, false, ids, at::kBFloat16);
  const auto selective = selective_grads(m, true, ids, at::kBFloat16);
  for (size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(selective[i].scalar_type() == plain[i].scalar_type());  // fp32 gradients of fp32 parameters
    // The same bf16 matmuls on the same operands (bitwise equal on the machine this was written
    // on); allowed: one bf16 rounding step (2^-8) of the tensor's scale, for a matmul library
    // that orders dY^T p differently from (p^T dY)^T.
    const double scale = plain[i].abs().max().item<double>();
    CHECK(kiln::test::max_abs_diff(plain[i], selective[i]) <= scale / 256 + 1e-9);
  }
}

TEST_CASE("selective recomputation passes segment ids through (neat packing)", "[train]") {
  kiln::model::LlamaForCausalLM m(kiln::model::load_llama_config("tiny"));
  m->init_weights(36);
  const at::Tensor ids = at::randint(0, 320, {2, 20}, at::kLong);
  const at::Tensor seg = at::div(at::arange(20), 6, "floor").to(at::kInt).unsqueeze(0).expand({2, 20}).contiguous();
  const auto plain = selective_grads(m, false, ids, {}, seg), selective = selective_grads(m, true, ids, {}, seg);
  const auto unmasked = selective_grads(m, true, ids);
  double diff = 0, masked_vs_not = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    diff = std::max(diff, kiln::test::max_abs_diff(plain[i], selective[i]));
    masked_vs_not = std::max(masked_vs_not, kiln::test::max_abs_diff(plain[i], unmasked[i]));
  }
  CHECK(diff < 1e-6);
  CHECK(masked_vs_not > 1e-4);  // the segments reached the attention of the selective layers
}
