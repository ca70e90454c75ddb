// The behaviour kiln relies on from each LibTorch impl/detail API it still uses, through the one
// wrapper that holds them (lib/kiln/common/torch_internals.h), and the public replacements of the
// ones it dropped (ops/autocast_off.h). A LibTorch upgrade that changes any of these fails here.
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/common/torch_internals.h"
#include "kiln/ops/autocast_off.h"
#include "support.h"

namespace ti = kiln::torch_internals;

namespace {
// Records what running_autograd_node() says inside its own backward.
struct Recorded {
  static inline std::optional<ti::RunningNode> seen;
};
struct Twice : public torch::autograd::Function<Twice> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x * 2; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    Recorded::seen = ti::running_autograd_node();
    return {g[0] * 2};
  }
};
}  // namespace

TEST_CASE("a post-accumulate-grad hook fires once per backward, after the incoming gradients are summed",
          "[common][torch_internals]") {
  const at::Tensor p = at::ones({3}).requires_grad_(true);
  std::vector<at::Tensor> seen;
  ti::set_post_accumulate_grad_hook(p, [&] { seen.push_back(p.grad().clone()); });
  // Two uses of p in one graph: two incoming gradients (2 and 3), one accumulation, one call.
  ((p * 2).sum() + (p * 3).sum()).backward();
  REQUIRE(seen.size() == 1);
  CHECK(at::equal(seen[0], at::full({3}, 5.0)));
  // The next backward accumulates into .grad; the hook sees the total.
  (p * 2).sum().backward();
  REQUIRE(seen.size() == 2);
  CHECK(at::equal(seen[1], at::full({3}, 7.0)));
  // Replaced, then cleared.
  int other = 0;
  ti::set_post_accumulate_grad_hook(p, [&] { ++other; });
  (p * 2).sum().backward();
  CHECK(other == 1);
  CHECK(seen.size() == 2);
  ti::clear_post_accumulate_grad_hook(p);
  (p * 2).sum().backward();
  CHECK(other == 1);
  // Only leaves that require grad accumulate.
  CHECK_THAT(kiln::test::error_of([&] { ti::set_post_accumulate_grad_hook(p * 2, [] {}); }),
             Catch::Matchers::Contains("leaf"));
}

TEST_CASE("backprop_from a dropped output equals torch::autograd::grad and accumulates nothing",
          "[common][torch_internals]") {
  at::manual_seed(3);
  const at::Tensor x0 = at::randn({4, 6}), w0 = at::randn({6}), g = at::randn({4, 6});
  // The public reference on its own graph.
  const at::Tensor xr = x0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
  const at::Tensor pr = at::tanh(xr) * wr;
  const auto want = torch::autograd::grad({pr}, {xr, wr}, {g});
  // The wrapper: the output dropped before the backward.
  const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor p = at::tanh(x) * w;
  const ti::GradientRoot root(p);
  p = at::Tensor();
  const auto got = ti::backprop_from(root, g, {x, w});
  REQUIRE(got.size() == 2);
  CHECK(at::equal(got[0], want[0]));
  CHECK(at::equal(got[1], want[1]));
  CHECK_FALSE(x.grad().defined());
  CHECK_FALSE(w.grad().defined());
  // A tensor outside any graph has no root.
  CHECK_THAT(kiln::test::error_of([&] { ti::GradientRoot bad(at::ones({2})); }),
             Catch::Matchers::Contains("gradient function"));
}

TEST_CASE("a Kineto trace of a region is a Chrome trace naming its ATen ops", "[common][torch_internals]") {
  const auto dir = kiln::test::scratch_dir("kineto_trace");
  const std::string path = (dir / "trace.json").string();
  {
    ti::KinetoTrace trace(/*cuda=*/false);
    const at::Tensor a = at::randn({64, 64});
    (void)at::mm(a, a);
    trace.save(path);
  }
  std::ifstream in(path);
  REQUIRE(in);
  const auto j = nlohmann::json::parse(in);
  bool mm = false;
  for (const auto& e : j.at("traceEvents")) mm = mm || e.value("name", "") == "aten::mm";
  CHECK(mm);
  // A trace that is never saved turns the profiler off on destruction: a second one can start.
  { ti::KinetoTrace unsaved(false); }
  ti::KinetoTrace again(false);
  again.save((dir / "again.json").string());
  CHECK(std::filesystem::exists(dir / "again.json"));
}

TEST_CASE("OpEventRecorder on the CPU: ops and user scopes, each with its own correlation id",
          "[common][torch_internals]") {
  std::vector<ti::OpEvent> events;
  {
    ti::OpEventRecorder recorder;  // CPU activity only
    at::RecordFunction scope(at::RecordScope::USER_SCOPE);
    if (scope.isActive()) scope.before("kiln::test scope", -1);
    const at::Tensor a = at::randn({64, 64});
    (void)at::mm(a, a);
    scope.end();
    events = recorder.stop();
  }
  std::set<uint64_t> ids;
  bool mm = false, user = false;
  for (const ti::OpEvent& e : events) {
    CAPTURE(e.name);
    CHECK(e.kind == ti::OpEventKind::op);  // no launches or GPU activities without CUDA activity
    CHECK(e.end_ns >= e.start_ns);
    CHECK(e.linked_correlation_id == 0);
    // What a GPU activity's link names (component_times.cpp): every op has an id of its own.
    CHECK(e.correlation_id != 0);
    CHECK(ids.insert(e.correlation_id).second);
    mm = mm || e.name == "aten::mm";
    user = user || e.name == "kiln::test scope";
  }
  CHECK(mm);
  CHECK(user);
  // Stopped by its destructor when stop() is never called: another can start.
  { ti::OpEventRecorder unstopped; }
  ti::OpEventRecorder again;
  CHECK_NOTHROW(again.stop());
  CHECK_THROWS(again.stop());  // once only
}

TEST_CASE("AutocastOff disables autocast on this thread and restores it (the public form of excluding its keys)",
          "[common][torch_internals]") {
  const at::Tensor a = at::randn({8, 8}), b = at::randn({8, 8});
  const bool before = at::autocast::is_autocast_enabled(at::kCPU);
  const at::ScalarType dtype_before = at::autocast::get_autocast_dtype(at::kCPU);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  CHECK(at::mm(a, b).scalar_type() == at::kBFloat16);  // autocast casts the product
  {
    const kiln::ops::AutocastOff off;
    CHECK_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
    CHECK(at::mm(a, b).scalar_type() == at::kFloat);
    CHECK(at::equal(at::mm(a, b), a.mm(b)));
  }
  CHECK(at::autocast::is_autocast_enabled(at::kCPU));
  CHECK(at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16);
  CHECK(at::mm(a, b).scalar_type() == at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, before);
  at::autocast::set_autocast_dtype(at::kCPU, dtype_before);
  at::autocast::clear_cache();
  {
    const kiln::ops::AutocastOff off;  // with autocast already off, nothing to restore
  }
  CHECK(at::autocast::is_autocast_enabled(at::kCPU) == before);
}

TEST_CASE("running_autograd_node: inside a node's backward, that node's sequence number and forward thread",
          "[common][torch_internals]") {
  CHECK_FALSE(ti::running_autograd_node().has_value());  // no backward runs here
  const at::Tensor x = at::randn({4}).requires_grad_(true);
  const at::Tensor before = x.sin();  // another node first, so the sequence number is not trivially 0
  const at::Tensor y = Twice::apply(before);
  const std::shared_ptr<torch::autograd::Node> node = y.grad_fn();
  REQUIRE(node != nullptr);
  Recorded::seen.reset();
  y.sum().backward();
  REQUIRE(Recorded::seen.has_value());
  CHECK(Recorded::seen->sequence_nr == static_cast<int64_t>(node->sequence_nr()));
  CHECK(Recorded::seen->sequence_nr > static_cast<int64_t>(before.grad_fn()->sequence_nr()));
  CHECK(Recorded::seen->forward_thread == node->thread_id());
  CHECK(at::allclose(x.grad(), 2 * x.cos()));
  CHECK_FALSE(ti::running_autograd_node().has_value());
}
