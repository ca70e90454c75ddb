// Learning-rate schedules with Hugging Face's definitions (transformers.optimization, get_scheduler
// with its scheduler_specific_kwargs = TrainingArguments.lr_scheduler_kwargs), so a run moved from
// HF Trainer or LLaMA-Factory keeps its curve. All are multipliers of the peak learning rate as a
// function of the optimizer step about to be taken (0-based; with warmup, step 0 uses 0), the
// value of HF's LambdaLR lambda at that step. docs/training.md, "Learning-rate schedules".
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::optim {

// lr_scheduler_kwargs: each as given (absent = HF's default). Numbers (integers included) in
// `numbers`, warmup_type / decay_type in `strings`.
struct ScheduleKwargs {
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;
  bool has(const std::string& key) const { return numbers.count(key) || strings.count(key); }
  bool empty() const { return numbers.empty() && strings.empty(); }
  double number(const std::string& key, double fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  std::vector<std::string> names() const;  // sorted
};

enum class KwargKind { kInteger, kNumber, kString };
struct KwargSpec {
  const char* name;
  KwargKind kind;
};

struct ScheduleConfig {
  // linear, cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup, inverse_sqrt,
  // cosine_with_min_lr, cosine_warmup_with_min_lr, warmup_stable_decay (schedule_types()).
  std::string type = "linear";
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;
  // kiln's own keys. min_lr_ratio: the floor of cosine, and of warmup_stable_decay's decay (not
  // of its warmup: the kwarg min_lr_ratio, HF's, lifts both). decay_ratio > 0: warmup_stable_decay
  // decays over round(decay_ratio * total_steps) steps and holds the rest; 0: LLaMA-Factory's split
  // (a third of the steps after warmup stable, the rest decaying) or the kwargs' step counts.
  double min_lr_ratio = 0.0;
  double decay_ratio = 0.0;
  double initial_lr = 1.0;  // the optimizer's learning rate: polynomial's lr_end and min_lr are absolute
  ScheduleKwargs kwargs;
};

// The multiplier for `step` in [0, total_steps]; throws std::invalid_argument for an unknown type.
// Assumes check_schedule(config) passed.
double lr_multiplier(const ScheduleConfig& config, int64_t step);

// transformers 5.6's TrainingArguments.get_warmup_steps (training_args.py:2107-2114): warmup_steps
// is a float, its integer part when >= 1, else ceil(total_steps * warmup_steps) (a ratio; what a
// given warmup_ratio becomes, PretrainConfig::hf_warmup_steps).
int64_t resolve_warmup_steps(double warmup_steps, int64_t total_steps);

// The types lr_multiplier knows, and the kwargs each takes (HF's signature less the optimizer,
// the step counts and last_epoch); schedule_kwargs throws std::invalid_argument for another type.
const std::vector<std::string>& schedule_types();
const std::vector<KwargSpec>& schedule_kwargs(const std::string& type);
// Every kwarg of any type, with its kind (one kind per name across the types).
const std::vector<KwargSpec>& all_schedule_kwargs();

// A schedule HF would refuse, or kiln cannot run: `key` is the config key at fault
// (lr_scheduler_type, lr_scheduler_kwargs.<name>, lr_scheduler_kwargs, min_lr_ratio, decay_ratio).
struct ScheduleError : std::invalid_argument {
  ScheduleError(std::string key_, const std::string& problem) : std::invalid_argument(problem), key(std::move(key_)) {}
  std::string key;
};
// Checks the type, that each kwarg is one of the type's, and the values HF checks (polynomial's
// lr_end below the learning rate, one of min_lr / min_lr_rate, WSD's warmup_type and decay_type).
void check_schedule(const ScheduleConfig& config);

}  // namespace kiln::optim
