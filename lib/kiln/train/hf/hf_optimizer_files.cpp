#include "kiln/train/hf/hf_optimizer_files.h"

#include <cmath>
#include <regex>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/dist/data_parallel.h"
#include "kiln/io/torch_pickle.h"
#include "kiln/optim/adamw.h"

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

[[noreturn]] void fail(const std::string& file, const std::string& field, const std::string& problem) {
  throw std::runtime_error(fmt::format("{}: {} {}", file, field, problem));
}

c10::IValue at_key(const c10::IValue& dict, const std::string& key, const std::string& file, const std::string& where) {
  if (!dict.isGenericDict()) fail(file, where, "is not a dict");
  const auto d = dict.toGenericDict();
  const auto it = d.find(key);
  if (it == d.end()) fail(file, where.empty() ? key : where + "." + key, "is missing");
  return it->value();
}

double number(const c10::IValue& v, const std::string& file, const std::string& field) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  fail(file, field, fmt::format("is a {}, not a number", v.tagKind()));
}

std::vector<double> numbers(const c10::IValue& v, const std::string& file, const std::string& field) {
  if (!v.isList()) fail(file, field, "is not a list");
  std::vector<double> out;
  for (const c10::IValue& e : v.toList()) out.push_back(number(e, file, field));
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
  if (!groups_v.isList()) fail(file, "param_groups", "is not a list");
  if (!state_v.isGenericDict()) fail(file, "state", "is not a dict");
  const auto groups = groups_v.toList();
  std::vector<const HfParamShape*> want[2];
  for (const auto& p : expected) want[p.decay ? 0 : 1].push_back(&p);
  // HF's layout: the decay group, then the no-decay group (an empty one is still there).
  if (groups.size() != 2) {
    fail(file, "param_groups",
         fmt::format("has {} groups; transformers' Trainer makes 2 (decay: {} weights, no decay: {} norms)",
                     groups.size(), want[0].size(), want[1].size()));
  }
  const auto state = state_v.toGenericDict();
  std::map<std::string, HfParamState> out;
  for (size_t g = 0; g < 2; ++g) {
    const std::string where = fmt::format("param_groups[{}]", g);
    const c10::IValue grp = groups.get(g);
    if (!grp.isGenericDict() || grp.toGenericDict().find("betas") == grp.toGenericDict().end()) {
      fail(file, where + ".betas", "is missing: another optimizer than transformers' AdamW (adamw_torch)");
    }
    for (const char* key : {"amsgrad", "maximize"}) {
      const auto it = grp.toGenericDict().find(key);
      if (it != grp.toGenericDict().end() && it->value().isBool() && it->value().toBool()) {
        fail(file, where + "." + key, "is True: another optimizer than transformers' AdamW (adamw_torch)");
      }
    }
    const c10::IValue ids_v = at_key(grp, "params", file, where);
    if (!ids_v.isList()) fail(file, where + ".params", "is not a list");
    const auto ids = ids_v.toList();
    if (ids.size() != want[g].size()) {
      fail(file, where + ".params",
           fmt::format("has {} parameters; this model has {} {} (group {} of transformers' Trainer: {})", ids.size(),
                       want[g].size(), g == 0 ? "weights with weight decay" : "norms and biases without weight decay",
                       g, g == 0 ? "weights with more than one dimension" : "the rest"));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const HfParamShape& p = *want[g][i];
      if (!ids.get(i).isInt()) fail(file, where + ".params", "holds a non-integer id");
      const int64_t id = ids.get(i).toInt();
      const auto it = state.find(id);
      if (it == state.end()) {
        fail(file, fmt::format("state[{}]", id), fmt::format("is missing (parameter {}, never stepped?)", p.name));
      }
      HfParamState s;
      s.name = p.name;
      s.decay = p.decay;
      const std::string at_id = fmt::format("state[{}]", id);
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        const c10::IValue t = at_key(it->value(), key, file, at_id);
        if (!t.isTensor()) fail(file, at_id + "." + key, "is not a tensor: another optimizer than AdamW");
        const at::Tensor m = t.toTensor();
        if (m.sizes() != c10::IntArrayRef(p.shape)) {
          fail(file, at_id + "." + key,
               fmt::format("has shape {}; parameter {} of this model has shape {}", c10::str(m.sizes()), p.name,
                           c10::str(c10::IntArrayRef(p.shape))));
        }
        if (!at::isFloatingType(m.scalar_type())) fail(file, at_id + "." + key, "is not a floating-point tensor");
        (std::string(key) == "exp_avg" ? s.exp_avg : s.exp_avg_sq) = m.to(at::kFloat);
      }
      s.step = number(at_key(it->value(), "step", file, at_id), file, at_id + ".step");
      if (!std::isfinite(s.step) || s.step < 0 || s.step != std::round(s.step)) {
        fail(file, at_id + ".step", fmt::format("is {}, not a whole number >= 0", s.step));
      }
      out.emplace(p.name, std::move(s));
    }
  }
  return out;
}

std::vector<HfParamShape> hf_param_shapes(const model::LlamaForCausalLM& model) {
  std::vector<HfParamShape> out;
  for (const auto& p : model->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    out.push_back({p.key(), p.value().dim() > 1, p.value().sizes().vec()});
  }
  return out;
}

void load_hf_optimizer_file(const std::string& file, const model::LlamaForCausalLM& model, optim::AdamW& optimizer,
                            const dist::DataParallel* zero) {
  const std::map<std::string, HfParamState> full =
      read_hf_adamw(io::load_torch_pickle(file), hf_param_shapes(model), file);
  std::map<std::string, at::Tensor> state;
  const auto put = [&](const std::string& name, const HfParamState& p, int64_t begin, int64_t end) {
    const auto part = [&](const at::Tensor& t) { return begin < 0 ? t : t.flatten().slice(0, begin, end); };
    state[name + ".exp_avg"] = part(p.exp_avg);
    state[name + ".exp_avg_sq"] = part(p.exp_avg_sq);
    state[name + ".step"] = at::full({}, p.step, at::kFloat);
  };
  if (zero) {
    // This rank's chunks: "<param>[begin:end]" slices of the flattened parameter.
    static const std::regex slice(R"((.*)\[([0-9]+):([0-9]+)\])");
    for (const optim::ParamSpec& spec : zero->optimizer_params()) {
      std::smatch m;
      if (!std::regex_match(spec.name, m, slice)) throw std::logic_error("ZeRO shard without a slice: " + spec.name);
      put(spec.name, full.at(m[1].str()), std::stoll(m[2].str()), std::stoll(m[3].str()));
    }
  } else {
    for (const auto& [name, p] : full) put(name, p, -1, -1);
  }
  try {
    optimizer.load_state_dict(state);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", file, e.what()));
  }
}

HfSchedulerState read_hf_lambda_lr(const c10::IValue& sd, const std::string& file) {
  HfSchedulerState s;
  const c10::IValue last = at_key(sd, "last_epoch", file, "");
  if (!last.isInt()) fail(file, "last_epoch", "is not an integer");
  s.last_epoch = last.toInt();
  s.base_lrs = numbers(at_key(sd, "base_lrs", file, ""), file, "base_lrs");
  s.last_lrs = numbers(at_key(sd, "_last_lr", file, ""), file, "_last_lr");
  if (s.base_lrs.empty() || s.last_lrs.size() != s.base_lrs.size()) {
    fail(file, "_last_lr", fmt::format("has {} entries for {} base_lrs", s.last_lrs.size(), s.base_lrs.size()));
  }
  return s;
}

HfScalerState read_hf_grad_scaler(const c10::IValue& sd, const std::string& file) {
  HfScalerState s;
  s.scale = number(at_key(sd, "scale", file, ""), file, "scale");
  if (!std::isfinite(s.scale) || s.scale <= 0) fail(file, "scale", fmt::format("is {}, not a number > 0", s.scale));
  const double tracker = number(at_key(sd, "_growth_tracker", file, ""), file, "_growth_tracker");
  if (tracker < 0 || tracker != std::round(tracker)) fail(file, "_growth_tracker", "is not a whole number >= 0");
  s.growth_tracker = static_cast<int64_t>(tracker);
  return s;
}

}  // namespace kiln::train
