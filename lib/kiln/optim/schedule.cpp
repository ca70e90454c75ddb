#include "kiln/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::optim {

double ScheduleKwargs::number(const std::string& key, double fallback) const {
  const auto it = numbers.find(key);
  return it == numbers.end() ? fallback : it->second;
}

std::string ScheduleKwargs::string(const std::string& key, const std::string& fallback) const {
  const auto it = strings.find(key);
  return it == strings.end() ? fallback : it->second;
}

std::vector<std::string> ScheduleKwargs::names() const {
  std::vector<std::string> out;
  for (const auto& kv : numbers) out.push_back(kv.first);
  for (const auto& kv : strings) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

int64_t resolve_warmup_steps(double warmup_steps, int64_t total_steps) {
  if (warmup_steps >= 1) return static_cast<int64_t>(warmup_steps);
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * warmup_steps));
}

namespace {

using K = KwargKind;
const KwargSpec kNumCycles{"num_cycles", K::kNumber};
const KwargSpec kMinLr{"min_lr", K::kNumber};
const KwargSpec kMinLrRate{"min_lr_rate", K::kNumber};

const std::vector<std::pair<std::string, std::vector<KwargSpec>>>& table() {
  static const std::vector<std::pair<std::string, std::vector<KwargSpec>>> t = {
      {"linear", {}},
      {"cosine", {kNumCycles}},
      {"cosine_with_restarts", {kNumCycles}},
      {"polynomial", {{"lr_end", K::kNumber}, {"power", K::kNumber}}},
      {"constant", {}},
      {"constant_with_warmup", {}},
      {"inverse_sqrt", {{"timescale", K::kInteger}}},
      {"cosine_with_min_lr", {kNumCycles, kMinLr, kMinLrRate}},
      {"cosine_warmup_with_min_lr", {kNumCycles, kMinLr, kMinLrRate, {"warmup_lr_rate", K::kNumber}}},
      {"warmup_stable_decay",
       {{"num_stable_steps", K::kInteger},
        {"num_decay_steps", K::kInteger},
        {"warmup_type", K::kString},
        {"decay_type", K::kString},
        {"min_lr_ratio", K::kNumber},
        kNumCycles}},
  };
  return t;
}

// Python's floor division (LLaMA-Factory's remaining_steps // 3 when warmup exceeds the run).
int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

// HF's linear warmup: float(step) / float(max(1, num_warmup_steps)).
double linear_warmup(int64_t step, int64_t warmup) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
}

// float(step - warmup) / float(max(1, total - warmup)), the decay's progress of HF's cosines.
double decay_progress(int64_t step, int64_t warmup, int64_t total) {
  return static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
}

double wsd(const ScheduleConfig& c, int64_t step) {
  const ScheduleKwargs& k = c.kwargs;
  const int64_t warmup = c.warmup_steps;
  int64_t stable = 0, decay = 0;
  if (c.decay_ratio > 0) {  // kiln's decay_ratio
    decay = static_cast<int64_t>(std::round(c.decay_ratio * static_cast<double>(c.total_steps)));
    stable = std::max<int64_t>(0, c.total_steps - warmup - decay);
  } else {
    // LLaMA-Factory's create_custom_scheduler fills each kwarg that is missing from one split: a
    // third of the steps after warmup stable, the rest decaying (even beside a given num_stable_steps).
    const int64_t remaining = c.total_steps - warmup;
    const int64_t default_stable = floor_div(remaining, 3);
    stable = k.has("num_stable_steps") ? static_cast<int64_t>(k.number("num_stable_steps", 0)) : default_stable;
    decay =
        k.has("num_decay_steps") ? static_cast<int64_t>(k.number("num_decay_steps", 0)) : remaining - default_stable;
  }
  const double min_lr_ratio = k.number("min_lr_ratio", c.min_lr_ratio);
  const double num_cycles = k.number("num_cycles", 0.5);
  if (step < warmup) {
    const double floor = k.number("min_lr_ratio", 0.0);  // kiln's min_lr_ratio leaves warmup from 0
    const double progress = linear_warmup(step, warmup);
    const std::string type = k.string("warmup_type", "linear");
    double factor = progress;
    if (type == "cosine") factor = 0.5 * (1.0 - std::cos(M_PI * progress));
    if (type == "1-sqrt") factor = 1.0 - std::sqrt(1.0 - progress);
    return std::max(0.0, factor * (1.0 - floor) + floor);
  }
  if (step < warmup + stable) return 1.0;
  if (step < warmup + stable + decay) {
    const double progress =
        static_cast<double>(step - warmup - stable) / static_cast<double>(std::max<int64_t>(1, decay));
    const std::string type = k.string("decay_type", "cosine");
    double factor = 1.0 - progress;
    if (type == "cosine") factor = 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress));
    if (type == "1-sqrt") factor = 1.0 - std::sqrt(progress);
    return std::max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio);
  }
  return min_lr_ratio;
}

// min_lr_rate of cosine_with_min_lr and cosine_warmup_with_min_lr: given, or min_lr / lr.
double min_lr_rate(const ScheduleConfig& c) {
  if (c.kwargs.has("min_lr_rate")) return c.kwargs.number("min_lr_rate", 0.0);
  return c.kwargs.number("min_lr", 0.0) / c.initial_lr;
}

}  // namespace

const std::vector<std::string>& schedule_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> out;
    for (const auto& e : table()) out.push_back(e.first);
    return out;
  }();
  return types;
}

const std::vector<KwargSpec>& schedule_kwargs(const std::string& type) {
  for (const auto& e : table()) {
    if (e.first == type) return e.second;
  }
  throw std::invalid_argument("unknown lr_scheduler_type '" + type + "'");
}

const std::vector<KwargSpec>& all_schedule_kwargs() {
  static const std::vector<KwargSpec> all = [] {
    std::vector<KwargSpec> out;
    for (const auto& e : table()) {
      for (const KwargSpec& s : e.second) {
        if (std::none_of(out.begin(), out.end(), [&](const KwargSpec& o) { return std::string(o.name) == s.name; })) {
          out.push_back(s);
        }
      }
    }
    return out;
  }();
  return all;
}

double lr_multiplier(const ScheduleConfig& c, int64_t step) {
  // Each branch is HF's lambda with its operations in HF's order, so the values agree to the last
  // bit or two (tests/optim/fixtures/hf_schedules.json).
  const ScheduleKwargs& k = c.kwargs;
  const int64_t warmup = c.warmup_steps, total = c.total_steps;
  const bool warming = step < warmup;
  const std::string& t = c.type;
  if (t == "constant") return 1.0;
  if (t == "constant_with_warmup") return warming ? linear_warmup(step, warmup) : 1.0;
  if (t == "linear") {
    if (warming) return linear_warmup(step, warmup);
    return std::max(0.0, static_cast<double>(total - step) / static_cast<double>(std::max<int64_t>(1, total - warmup)));
  }
  if (t == "cosine" || t == "cosine_with_min_lr") {
    // get_cosine_schedule_with_warmup; with kiln's min_lr_ratio (or the kwargs' min_lr_rate) that
    // of get_cosine_with_min_lr_schedule_with_warmup.
    if (warming) return linear_warmup(step, warmup);
    const double progress = decay_progress(step, warmup, total);
    const double num_cycles = k.number("num_cycles", 0.5);
    const double floor = t == "cosine" ? c.min_lr_ratio : min_lr_rate(c);
    const double factor = 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress));
    return std::max(0.0, factor * (1 - floor) + floor);
  }
  if (t == "cosine_with_restarts") {
    if (warming) return linear_warmup(step, warmup);
    const double progress = decay_progress(step, warmup, total);
    if (progress >= 1.0) return 0.0;
    const double num_cycles = k.number("num_cycles", 1.0);
    return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(num_cycles * progress, 1.0))));
  }
  if (t == "polynomial") {
    if (warming) return linear_warmup(step, warmup);
    const double lr_init = c.initial_lr, lr_end = k.number("lr_end", 1e-7), power = k.number("power", 1.0);
    const int64_t decay_steps = total - warmup;
    if (step > total || decay_steps <= 0) return lr_end / lr_init;  // HF divides by zero for the latter
    const double pct_remaining = 1 - static_cast<double>(step - warmup) / static_cast<double>(decay_steps);
    return ((lr_init - lr_end) * std::pow(pct_remaining, power) + lr_end) / lr_init;
  }
  if (t == "inverse_sqrt") {
    if (warming) return linear_warmup(step, warmup);
    const int64_t timescale =
        k.has("timescale") ? static_cast<int64_t>(k.number("timescale", 0)) : (warmup != 0 ? warmup : 10'000);
    const int64_t shift = timescale - warmup;
    return 1.0 / std::sqrt(static_cast<double>(step + shift) / static_cast<double>(timescale));
  }
  if (t == "cosine_warmup_with_min_lr") {
    // get_cosine_with_min_lr_schedule_with_warmup_lr_rate: all in floats, warmup from 1/warmup (or
    // warmup_lr_rate) and the decay's progress one step ahead of cosine_with_min_lr's.
    const double s = static_cast<double>(step), w = static_cast<double>(warmup), n = static_cast<double>(total);
    if (s < w) {
      if (!k.has("warmup_lr_rate")) return (s + 1.0) / std::max(1.0, w);
      const double rate = k.number("warmup_lr_rate", 0.0);
      return rate + (1.0 - rate) * s / std::max(1.0, w - 1);
    }
    const double progress = (s - w + 1.0) / std::max(1.0, n - w);
    const double floor = min_lr_rate(c);
    const double factor = 0.5 * (1.0 + std::cos(M_PI * k.number("num_cycles", 0.5) * 2.0 * progress));
    return std::max(0.0, factor * (1 - floor) + floor);
  }
  if (t == "warmup_stable_decay") return wsd(c, step);
  throw std::invalid_argument("unknown lr_scheduler_type '" + c.type + "'");
}

void check_schedule(const ScheduleConfig& c) {
  const std::string& t = c.type;
  if (t == "reduce_lr_on_plateau" || t == "greedy") {
    throw ScheduleError(
        "lr_scheduler_type",
        fmt::format("{} is not supported: it follows the evaluation loss (HF's {}), and kiln's "
                    "schedules are functions of the step; the others: {}",
                    t, t == "greedy" ? "GreedyLR" : "ReduceLROnPlateau", fmt::join(schedule_types(), ", ")));
  }
  if (std::find(schedule_types().begin(), schedule_types().end(), t) == schedule_types().end()) {
    throw ScheduleError("lr_scheduler_type",
                        fmt::format("must be one of {}; got '{}'", fmt::join(schedule_types(), ", "), t));
  }
  const auto& specs = schedule_kwargs(t);
  const ScheduleKwargs& k = c.kwargs;
  for (const std::string& name : k.names()) {
    if (std::none_of(specs.begin(), specs.end(), [&](const KwargSpec& s) { return name == s.name; })) {
      std::vector<std::string> takes;
      for (const KwargSpec& s : specs) takes.emplace_back(s.name);
      throw ScheduleError("lr_scheduler_kwargs." + name,
                          fmt::format("is not a keyword of lr_scheduler_type {} (it takes {})", t,
                                      takes.empty() ? std::string("none") : fmt::format("{}", fmt::join(takes, ", "))));
    }
  }
  for (const auto& [name, value] : k.numbers) {
    if (!std::isfinite(value))
      throw ScheduleError("lr_scheduler_kwargs." + name, fmt::format("must be finite, got {}", value));
  }
  auto at_least = [&](const char* name, double lo) {
    if (k.has(name) && !(k.number(name, 0) >= lo)) {
      throw ScheduleError(std::string("lr_scheduler_kwargs.") + name,
                          fmt::format("must be >= {}, got {}", lo, k.number(name, 0)));
    }
  };
  if (t == "polynomial" && !(k.number("lr_end", 1e-7) < c.initial_lr)) {
    throw ScheduleError("lr_scheduler_kwargs.lr_end",
                        fmt::format("must be smaller than learning_rate {} (HF raises), got {}", c.initial_lr,
                                    k.number("lr_end", 1e-7)));
  }
  if (t == "inverse_sqrt") at_least("timescale", 1);
  if (t == "cosine_with_min_lr" || t == "cosine_warmup_with_min_lr") {
    if (k.has("min_lr") && k.has("min_lr_rate")) {
      throw ScheduleError("lr_scheduler_kwargs.min_lr_rate", "give one of min_lr and min_lr_rate (HF raises on both)");
    }
    if (!k.has("min_lr") && !k.has("min_lr_rate")) {
      throw ScheduleError("lr_scheduler_kwargs", fmt::format("lr_scheduler_type {} needs min_lr or min_lr_rate "
                                                             "(HF raises without one)",
                                                             t));
    }
  }
  if (t == "warmup_stable_decay") {
    at_least("num_stable_steps", 0);
    at_least("num_decay_steps", 0);
    for (const char* name : {"warmup_type", "decay_type"}) {
      const std::string v = k.string(name, "linear");
      if (v != "linear" && v != "cosine" && v != "1-sqrt") {
        throw ScheduleError(std::string("lr_scheduler_kwargs.") + name,
                            fmt::format("must be linear, cosine or 1-sqrt, got '{}'", v));
      }
    }
    if (k.has("min_lr_ratio") && c.min_lr_ratio > 0) {
      throw ScheduleError("min_lr_ratio",
                          "give the floor once: kiln's min_lr_ratio or lr_scheduler_kwargs.min_lr_ratio");
    }
    if (k.has("min_lr_ratio") && !(k.number("min_lr_ratio", 0) >= 0 && k.number("min_lr_ratio", 0) <= 1)) {
      throw ScheduleError("lr_scheduler_kwargs.min_lr_ratio",
                          fmt::format("must be in [0, 1], got {}", k.number("min_lr_ratio", 0)));
    }
    if (c.decay_ratio > 0 && (k.has("num_stable_steps") || k.has("num_decay_steps"))) {
      throw ScheduleError("decay_ratio",
                          "give the split once: kiln's decay_ratio or lr_scheduler_kwargs.num_stable_steps / "
                          "num_decay_steps");
    }
  }
}

}  // namespace kiln::optim
