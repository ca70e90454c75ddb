#include "kiln/optim/adamw.h"

#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace kiln::optim {

namespace {
std::vector<ParamSpec> hf_groups(std::vector<std::pair<std::string, at::Tensor>> named_parameters) {
  std::vector<ParamSpec> out;
  for (auto& [name, p] : named_parameters) {
    if (p.requires_grad()) out.push_back({name, p, /*decay=*/p.dim() > 1, at::Tensor()});
  }
  return out;
}
}  // namespace

AdamW::AdamW(std::vector<std::pair<std::string, at::Tensor>> named_parameters, AdamWConfig config)
    : AdamW(hf_groups(std::move(named_parameters)), config) {}

AdamW::AdamW(std::vector<ParamSpec> specs, AdamWConfig config) : config_(config) {
  Group decay, no_decay;
  decay.weight_decay = config.weight_decay;
  for (auto& spec : specs) {
    const at::Tensor& p = spec.param;
    Group& g = spec.decay ? decay : no_decay;
    g.names.push_back(spec.name);
    g.params.push_back(p);
    g.grads.push_back(spec.grad);
    g.exp_avg.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    g.exp_avg_sq.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    // The fused kernel wants a float32 scalar step per parameter, on the parameter's device.
    g.steps.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
  }
  for (Group* g : {&decay, &no_decay}) {
    if (!g->params.empty()) groups_.push_back(std::move(*g));
  }
}

void AdamW::step(double lr, const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  at::NoGradGuard no_grad;
  for (Group& g : groups_) {
    std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const at::Tensor& grad = g.grads[i].defined() ? g.grads[i] : g.params[i].grad();
      if (!grad.defined()) continue;  // a parameter unused this step keeps its state (as torch.optim)
      params.push_back(g.params[i]);
      grads.push_back(grad);
      exp_avg.push_back(g.exp_avg[i]);
      exp_avg_sq.push_back(g.exp_avg_sq[i]);
      steps.push_back(g.steps[i]);
    }
    if (params.empty()) continue;
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avg, exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr, config_.beta1,
                      config_.beta2, g.weight_decay, config_.eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale,
                      found_inf);
    // A skipped (overflowed) step must not count: undo the increment where found_inf is set.
    if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), found_inf->reshape({})));
  }
}

void AdamW::zero_grad() {
  for (Group& g : groups_) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (g.grads[i].defined()) {
        g.grads[i].zero_();  // a caller-owned buffer (ZeRO shard): kept, zeroed
      } else {
        g.params[i].mutable_grad() = at::Tensor();
      }
    }
  }
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const Group& g : groups_) {
    for (size_t i = 0; i < g.names.size(); ++i) {
      bytes += g.exp_avg[i].nbytes() + g.exp_avg_sq[i].nbytes() + g.steps[i].nbytes();
    }
  }
  return bytes;
}

std::vector<std::string> AdamW::decayed_names() const {
  std::vector<std::string> out;
  for (const Group& g : groups_) {
    if (g.weight_decay > 0) out.insert(out.end(), g.names.begin(), g.names.end());
  }
  return out;
}

std::map<std::string, at::Tensor> AdamW::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (const Group& g : groups_) {
    for (size_t i = 0; i < g.names.size(); ++i) {
      out[g.names[i] + ".exp_avg"] = g.exp_avg[i];
      out[g.names[i] + ".exp_avg_sq"] = g.exp_avg_sq[i];
      out[g.names[i] + ".step"] = g.steps[i];
    }
  }
  return out;
}

StateError::StateError(std::string key, std::string expected, std::string found)
    : std::invalid_argument(fmt::format("optimizer state: {}: expected {}, found {}", key, expected, found)),
      key_(std::move(key)),
      expected_(std::move(expected)),
      found_(std::move(found)) {}

void AdamW::load_state_dict(const std::map<std::string, at::Tensor>& state, int64_t max_step) {
  at::NoGradGuard no_grad;
  // Everything is checked before anything is copied: a refused state leaves the optimizer as it was.
  enum class Kind { kMoment, kSecondMoment, kStep };
  auto checked = [&](const std::string& key, const at::Tensor& dst, Kind kind) -> const at::Tensor& {
    const auto it = state.find(key);
    if (it == state.end()) throw StateError(key, "a tensor", "no such entry");
    const at::Tensor& t = it->second;
    if (t.sizes() != dst.sizes() || !at::isFloatingType(t.scalar_type())) {
      throw StateError(key, fmt::format("a floating-point tensor of shape {}", c10::str(dst.sizes())),
                       fmt::format("a {} tensor of shape {}", c10::toString(t.scalar_type()), c10::str(t.sizes())));
    }
    const at::Tensor v = t.to(at::kDouble);
    const at::Tensor good = kind == Kind::kMoment ? v.isfinite()
                            : kind == Kind::kSecondMoment
                                ? v.isfinite() & (v >= 0)
                                : v.isfinite() & (v >= 0) & (v <= static_cast<double>(max_step)) & (v == v.round());
    if (!good.all().item<bool>()) {
      throw StateError(key,
                       kind == Kind::kMoment         ? "finite values"
                       : kind == Kind::kSecondMoment ? "finite values >= 0"
                                                     : fmt::format("a whole number of steps in [0, {}]", max_step),
                       fmt::format("{}", v.masked_select(good.logical_not())[0].item<double>()));
    }
    return t;
  };
  std::vector<std::pair<at::Tensor*, const at::Tensor*>> copies;
  for (Group& g : groups_) {
    for (size_t i = 0; i < g.names.size(); ++i) {
      copies.emplace_back(&g.exp_avg[i], &checked(g.names[i] + ".exp_avg", g.exp_avg[i], Kind::kMoment));
      copies.emplace_back(&g.exp_avg_sq[i], &checked(g.names[i] + ".exp_avg_sq", g.exp_avg_sq[i], Kind::kSecondMoment));
      copies.emplace_back(&g.steps[i], &checked(g.names[i] + ".step", g.steps[i], Kind::kStep));
    }
  }
  for (auto& [dst, src] : copies) dst->copy_(*src);
}

}  // namespace kiln::optim
