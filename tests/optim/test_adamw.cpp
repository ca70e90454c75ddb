// kiln's fused AdamW against LibTorch's own (unfused) torch::optim::AdamW, one instance per
// parameter group; clipping against the norm written out; the loss scaler against its contract.
#include <torch/optim/adamw.h>
#include <catch2/catch.hpp>

#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "support.h"

using kiln::test::max_abs_diff;

TEST_CASE("fused AdamW with parameter groups equals torch::optim::AdamW", "[optim]") {
  std::vector<std::pair<std::string, at::Tensor>> mine = {{"w", at::randn({5, 7}).requires_grad_()},
                                                          {"norm.weight", at::randn({7}).requires_grad_()}};
  std::vector<at::Tensor> ref_decay = {mine[0].second.detach().clone().requires_grad_()};
  std::vector<at::Tensor> ref_plain = {mine[1].second.detach().clone().requires_grad_()};
  kiln::optim::AdamW opt(mine, {.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1});
  CHECK(opt.decayed_names() == std::vector<std::string>{"w"});
  torch::optim::AdamW ref1(ref_decay, torch::optim::AdamWOptions(1e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1));
  torch::optim::AdamW ref2(ref_plain, torch::optim::AdamWOptions(1e-2).betas({0.8, 0.95}).eps(1e-6).weight_decay(0));
  for (int step = 0; step < 5; ++step) {
    const double lr = 1e-2 * (step + 1) / 5.0;
    static_cast<torch::optim::AdamWOptions&>(ref1.param_groups()[0].options()).lr(lr);
    static_cast<torch::optim::AdamWOptions&>(ref2.param_groups()[0].options()).lr(lr);
    for (size_t i = 0; i < 2; ++i) {
      const at::Tensor g = at::randn(mine[i].second.sizes());
      mine[i].second.mutable_grad() = g.clone();
      (i == 0 ? ref_decay[0] : ref_plain[0]).mutable_grad() = g.clone();
    }
    opt.step(lr);
    ref1.step();
    ref2.step();
  }
  CHECK(max_abs_diff(mine[0].second, ref_decay[0]) < 1e-6);
  CHECK(max_abs_diff(mine[1].second, ref_plain[0]) < 1e-6);
  CHECK(opt.state_dict().at("w.step").item<double>() == 5.0);
}

TEST_CASE("an overflowed step is skipped entirely, step counter included", "[optim]") {
  std::vector<std::pair<std::string, at::Tensor>> p = {{"w", at::randn({4, 4}).requires_grad_()}};
  const at::Tensor before = p[0].second.detach().clone();
  kiln::optim::AdamW opt(p, {});
  p[0].second.mutable_grad() = at::randn({4, 4});
  opt.step(0.1, std::nullopt, at::ones({1}));
  CHECK(at::equal(p[0].second.detach(), before));
  CHECK(opt.state_dict().at("w.step").item<double>() == 0.0);
  opt.step(0.1, std::nullopt, at::zeros({1}));
  CHECK_FALSE(at::equal(p[0].second.detach(), before));
  CHECK(opt.state_dict().at("w.step").item<double>() == 1.0);
}

TEST_CASE("optimizer state round-trips and bad state is named", "[optim]") {
  std::vector<std::pair<std::string, at::Tensor>> p = {{"w", at::randn({3, 2}).requires_grad_()}};
  kiln::optim::AdamW a(p, {}), b(p, {});
  p[0].second.mutable_grad() = at::randn({3, 2});
  a.step(0.1);
  b.load_state_dict(a.state_dict());
  for (const auto& [k, v] : a.state_dict()) CHECK(at::equal(v, b.state_dict().at(k)));
  auto bad = a.state_dict();
  bad.erase("w.exp_avg_sq");
  CHECK_THAT(kiln::test::error_of([&] { b.load_state_dict(bad); }), Catch::Matchers::Contains("w.exp_avg_sq"));
  // A step count above the bound a resume gives (its checkpoint's global_step) is refused, naming
  // the entry and the value; nothing is copied then. a took one step.
  const auto before = b.state_dict().at("w.exp_avg").clone();
  auto ahead = a.state_dict();
  ahead["w.exp_avg"] = at::zeros({3, 2});
  CHECK_THAT(kiln::test::error_of([&] { b.load_state_dict(ahead, /*max_step=*/0); }),
             Catch::Matchers::Equals("optimizer state: w.step: expected a whole number of steps in [0, 0], found 1"));
  CHECK(at::equal(b.state_dict().at("w.exp_avg"), before));
  CHECK_NOTHROW(b.load_state_dict(a.state_dict(), /*max_step=*/1));
  auto negative = a.state_dict();
  negative["w.exp_avg_sq"] = at::full({3, 2}, -2.0);
  CHECK_THAT(kiln::test::error_of([&] { b.load_state_dict(negative); }),
             Catch::Matchers::Equals("optimizer state: w.exp_avg_sq: expected finite values >= 0, found -2"));
}

TEST_CASE("clip_grad_norm scales to max_norm and returns the pre-clip norm", "[optim]") {
  std::vector<at::Tensor> params = {at::zeros({3}).requires_grad_(), at::zeros({2, 2}).requires_grad_()};
  params[0].mutable_grad() = at::tensor({3.0f, 0.0f, 0.0f});
  params[1].mutable_grad() = at::full({2, 2}, 2.0f);  // norm sqrt(9 + 16) = 5
  const at::Tensor norm = kiln::optim::clip_grad_norm(params, 1.0);
  CHECK(norm.item<double>() == Approx(5.0));
  CHECK(params[0].grad()[0].item<double>() == Approx(3.0 / (5.0 + 1e-6)));
  CHECK(params[1].grad()[0][0].item<double>() == Approx(2.0 / (5.0 + 1e-6)));
  CHECK(kiln::optim::clip_grad_norm(params, 10.0).item<double>() == Approx(1.0).epsilon(1e-5));  // no-op under max
}

TEST_CASE("GradScaler unscales, detects overflow and adapts the scale", "[optim]") {
  kiln::optim::GradScaler scaler(at::kCPU, 1024.0, 2.0, 0.5, 2);
  std::vector<at::Tensor> params = {at::zeros({2}).requires_grad_()};
  params[0].mutable_grad() = at::tensor({1024.0f, 2048.0f});
  scaler.unscale(params);
  CHECK(scaler.found_inf().item<double>() == 0.0);
  CHECK(at::allclose(params[0].grad(), at::tensor({1.0f, 2.0f})));
  scaler.update();
  params[0].mutable_grad() = at::tensor({1.0f, INFINITY});
  scaler.unscale(params);
  CHECK(scaler.found_inf().item<double>() == 1.0);
  scaler.update();
  CHECK(scaler.scale().item<double>() == 512.0);  // backed off
  for (int i = 0; i < 2; ++i) {
    params[0].mutable_grad() = at::ones({2});
    scaler.unscale(params);
    scaler.update();
  }
  CHECK(scaler.scale().item<double>() == 1024.0);  // grew after growth_interval clean steps
}
