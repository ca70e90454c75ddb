#include "kiln/train/hf/hf_optimizer_files.h"

#include <cmath>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/io/input_file.h"
#include "kiln/io/torch_pickle.h"

namespace kiln::train {

namespace tp = io::torch_pickle;

namespace {

c10::IValue group(const HfAdamWHyper& h, double weight_decay, int64_t first, int64_t count) {
  std::vector<c10::IValue> ids;
  for (int64_t i = 0; i < count; ++i) ids.emplace_back(first + i);
  // torch 2.11's AdamW.state_dict() keys, in its order; initial_lr is the scheduler's.
  return tp::dict({{"weight_decay", weight_decay},
                   {"lr", h.lr},
                   {"betas", c10::ivalue::Tuple::create({h.beta1, h.beta2})},
                   {"eps", h.eps},
                   {"amsgrad", false},
                   {"maximize", false},
                   {"foreach", c10::IValue()},
                   {"capturable", false},
                   {"differentiable", false},
                   {"fused", h.fused ? c10::IValue(true) : c10::IValue()},
                   {"decoupled_weight_decay", true},
                   {"initial_lr", h.initial_lr},
                   {"params", tp::list(ids)}});
}

// What a value of a pickle is, for "found ...".
std::string describe(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return fmt::format("a {} tensor of shape {}", c10::toString(t.scalar_type()), c10::str(t.sizes()));
  }
  if (v.isDouble()) return fmt::format("the float {}", v.toDouble());
  if (v.isInt()) return fmt::format("the int {}", v.toInt());
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isNone()) return "None";
  if (v.isString()) return fmt::format("the string '{}'", v.toStringRef().substr(0, 40));
  if (v.isList()) return fmt::format("a list of {}", v.toListRef().size());
  if (v.isGenericDict()) return fmt::format("a dict of {}", v.toGenericDict().size());
  if (v.isTuple()) return fmt::format("a tuple of {}", v.toTupleRef().elements().size());
  return v.tagKind();
}

std::string shown(const std::string& field) {
  return field.empty() ? "(the top level)" : field;
}

c10::Dict<c10::IValue, c10::IValue> dict_at(const c10::IValue& v, const std::string& file, const std::string& field) {
  if (!v.isGenericDict()) io::refuse(file, shown(field), "a dict", describe(v));
  return v.toGenericDict();
}

c10::IValue at_key(const c10::IValue& dict, const std::string& key, const std::string& file, const std::string& where) {
  const auto d = dict_at(dict, file, where);
  const auto it = d.find(key);
  if (it == d.end()) io::refuse(file, io::field_path(where, key), "a value", "no such key");
  return it->value();
}

// A number of a state dict: a float, an int, or a one-element floating or integer tensor (torch's
// AdamW keeps `step` as a 0-d float tensor); finite. Bools are not numbers here.
double number(const c10::IValue& v, const std::string& file, const std::string& field) {
  double d = 0;
  if (v.isDouble()) {
    d = v.toDouble();
  } else if (v.isInt()) {
    d = static_cast<double>(v.toInt());
  } else if (v.isTensor() && v.toTensor().numel() == 1 &&
             (at::isFloatingType(v.toTensor().scalar_type()) ||
              at::isIntegralType(v.toTensor().scalar_type(), /*includeBool=*/false))) {
    d = v.toTensor().item<double>();  // a CPU tensor inside its storage (io::load_torch_pickle checked it)
  } else {
    io::refuse(file, field, "a number (a float, an int or a one-element tensor)", describe(v));
  }
  if (!std::isfinite(d)) io::refuse(file, field, "a finite number", fmt::format("{}", d));
  return d;
}

// A whole number in [0, hi] (a float or tensor holding one, as torch stores steps).
int64_t whole(const c10::IValue& v, const std::string& file, const std::string& field, int64_t hi) {
  const double d = number(v, file, field);
  if (d < 0 || d > static_cast<double>(hi) || d != std::round(d))
    io::refuse(file, field, fmt::format("a whole number in [0, {}]", hi), fmt::format("{}", d));
  return static_cast<int64_t>(d);
}

std::vector<double> numbers(const c10::IValue& v, const std::string& file, const std::string& field, double lo) {
  if (!v.isList()) io::refuse(file, field, "a list of numbers", describe(v));
  std::vector<double> out;
  const auto list = v.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = io::field_path(field, static_cast<int64_t>(i));
    out.push_back(number(list.get(i), file, at));
    if (out.back() < lo) io::refuse(file, at, fmt::format("a number >= {}", lo), fmt::format("{}", out.back()));
  }
  return out;
}

}  // namespace

c10::IValue hf_adamw_state_dict(const std::vector<HfParamState>& params, const HfAdamWHyper& hyper) {
  std::vector<const HfParamState*> decay, no_decay;
  for (const auto& p : params) (p.decay ? decay : no_decay).push_back(&p);
  c10::Dict<c10::IValue, c10::IValue> state(c10::IntType::get(), c10::AnyType::get());
  int64_t index = 0;
  for (const auto* g : {&decay, &no_decay}) {
    for (const HfParamState* p : *g) {
      state.insert(index++, tp::dict({{"step", at::full({}, p->step, at::kFloat)},
                                      {"exp_avg", p->exp_avg.to(at::kFloat)},
                                      {"exp_avg_sq", p->exp_avg_sq.to(at::kFloat)}}));
    }
  }
  const auto n_decay = static_cast<int64_t>(decay.size()), n_rest = static_cast<int64_t>(no_decay.size());
  return tp::dict(
      {{"state", state},
       {"param_groups", tp::list({group(hyper, hyper.weight_decay, 0, n_decay), group(hyper, 0.0, n_decay, n_rest)})}});
}

c10::IValue hf_lambda_lr_state_dict(double base_lr, int64_t step, double last_lr) {
  return tp::dict({{"base_lrs", tp::list({base_lr, base_lr})},
                   {"last_epoch", step},
                   {"_step_count", step + 1},
                   {"_is_initial", false},
                   {"_get_lr_called_within_step", false},
                   {"_last_lr", tp::list({last_lr, last_lr})},
                   {"lr_lambdas", tp::list({c10::IValue(), c10::IValue()})}});
}

c10::IValue hf_grad_scaler_state_dict(double scale, int64_t growth_tracker) {
  return tp::dict({{"scale", scale},
                   {"growth_factor", 2.0},
                   {"backoff_factor", 0.5},
                   {"growth_interval", int64_t{2000}},
                   {"_growth_tracker", growth_tracker}});
}

std::map<std::string, HfParamState> read_hf_adamw(const c10::IValue& sd, const std::vector<HfParamShape>& expected,
                                                  const std::string& file) {
  const c10::IValue groups_v = at_key(sd, "param_groups", file, "");
  const c10::IValue state_v = at_key(sd, "state", file, "");
  if (!groups_v.isList()) io::refuse(file, "param_groups", "a list", describe(groups_v));
  const auto state = dict_at(state_v, file, "state");
  const auto groups = groups_v.toList();
  std::vector<const HfParamShape*> want[2];
  for (const auto& p : expected) want[p.decay ? 0 : 1].push_back(&p);
  // HF's layout: the decay group, then the no-decay group (an empty one is still there).
  if (groups.size() != 2) {
    io::refuse(file, "param_groups",
               fmt::format("the 2 groups of transformers' Trainer (decay: {} weights, no decay: {} norms)",
                           want[0].size(), want[1].size()),
               fmt::format("{} groups", groups.size()));
  }
  constexpr const char* kAdamW = "transformers' AdamW (adamw_torch)";
  std::map<std::string, HfParamState> out;
  for (size_t g = 0; g < 2; ++g) {
    const std::string where = io::field_path("param_groups", static_cast<int64_t>(g));
    const c10::IValue grp = groups.get(g);
    const auto group = dict_at(grp, file, where);
    if (group.find("betas") == group.end())
      io::refuse(file, io::field_path(where, "betas"), fmt::format("the betas of {}", kAdamW),
                 "no such key (another optimizer)");
    for (const char* key : {"amsgrad", "maximize"}) {
      const auto it = group.find(key);
      if (it != group.end() && it->value().isBool() && it->value().toBool())
        io::refuse(file, io::field_path(where, key), fmt::format("False ({})", kAdamW), "True (another optimizer)");
    }
    const std::string params_at = io::field_path(where, "params");
    const c10::IValue ids_v = at_key(grp, "params", file, where);
    if (!ids_v.isList()) io::refuse(file, params_at, "a list of parameter ids", describe(ids_v));
    const auto ids = ids_v.toList();
    if (ids.size() != want[g].size()) {
      io::refuse(file, params_at,
                 fmt::format("this model's {} {} (group {} of transformers' Trainer: {})", want[g].size(),
                             g == 0 ? "weights with weight decay" : "norms and biases without weight decay", g,
                             g == 0 ? "weights with more than one dimension" : "the rest"),
                 fmt::format("{} parameters", ids.size()));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const HfParamShape& p = *want[g][i];
      if (!ids.get(i).isInt())
        io::refuse(file, io::field_path(params_at, static_cast<int64_t>(i)), "an integer id", describe(ids.get(i)));
      const int64_t id = ids.get(i).toInt();
      const std::string at_id = io::field_path("state", id);
      const auto it = state.find(id);
      if (it == state.end())
        io::refuse(file, at_id, fmt::format("the state of parameter {}", p.name), "no such key (never stepped?)");
      HfParamState s;
      s.name = p.name;
      s.decay = p.decay;
      s.source = at_id;
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        const std::string at_key_path = io::field_path(at_id, key);
        const c10::IValue t = at_key(it->value(), key, file, at_id);
        if (!t.isTensor()) io::refuse(file, at_key_path, fmt::format("a tensor ({})", kAdamW), describe(t));
        const at::Tensor m = t.toTensor();
        if (m.sizes() != c10::IntArrayRef(p.shape) || !at::isFloatingType(m.scalar_type())) {
          io::refuse(file, at_key_path,
                     fmt::format("a floating-point tensor of shape {} (parameter {})",
                                 c10::str(c10::IntArrayRef(p.shape)), p.name),
                     describe(t));
        }
        (std::string(key) == "exp_avg" ? s.exp_avg : s.exp_avg_sq) = m.to(at::kFloat);
      }
      // A step count: a float32 tensor in torch's AdamW; at most 2^53 (exact in a double).
      s.step = static_cast<double>(
          whole(at_key(it->value(), "step", file, at_id), file, io::field_path(at_id, "step"), int64_t{1} << 53));
      out.emplace(p.name, std::move(s));
    }
  }
  return out;
}

HfSchedulerState read_hf_lambda_lr(const c10::IValue& sd, const std::string& file) {
  HfSchedulerState s;
  const c10::IValue last = at_key(sd, "last_epoch", file, "");
  if (!last.isInt() || last.toInt() < 0) io::refuse(file, "last_epoch", "an integer >= 0", describe(last));
  s.last_epoch = last.toInt();
  s.base_lrs = numbers(at_key(sd, "base_lrs", file, ""), file, "base_lrs", 0.0);
  s.last_lrs = numbers(at_key(sd, "_last_lr", file, ""), file, "_last_lr", 0.0);
  if (s.base_lrs.empty()) io::refuse(file, "base_lrs", "a learning rate per parameter group", "none");
  if (s.last_lrs.size() != s.base_lrs.size()) {
    io::refuse(file, "_last_lr", fmt::format("{} entries (one per base_lrs)", s.base_lrs.size()),
               fmt::format("{}", s.last_lrs.size()));
  }
  return s;
}

HfScalerState read_hf_grad_scaler(const c10::IValue& sd, const std::string& file) {
  HfScalerState s;
  s.scale = number(at_key(sd, "scale", file, ""), file, "scale");
  if (s.scale <= 0) io::refuse(file, "scale", "a finite number > 0", fmt::format("{}", s.scale));
  s.growth_tracker = whole(at_key(sd, "_growth_tracker", file, ""), file, "_growth_tracker", int64_t{1} << 31);
  return s;
}

}  // namespace kiln::train
