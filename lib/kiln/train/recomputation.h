// The recomputation that the keys gradient_checkpointing, gradient_checkpointing_policy and
// gradient_checkpointing_every ask for: one rule for kiln-pretrain and kiln-profile (sweeps and
// explain), so a setting means the same in both and none is silently ignored.
//   policy "" (not given): by the stride, every >= 2 -> every_n, else full;
//   full: every layer (a stride >= 2 beside it is a contradiction);
//   every_n: layers 0, n, 2n, ... with n = every (2 when not given; 1 would be full);
//   selective: every layer keeps its matmul outputs (a stride >= 2 is a contradiction).
// A policy or a stride given without gradient_checkpointing is an error: it would do nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace kiln::train {

struct Recomputation {
  std::string policy;  // none | full | every_n | selective
  int every = 0;       // the recomputed layers' stride: 1 for full, n for every_n, 0 otherwise
  // "none", "full", "every_4", "selective": as reports and banners print it.
  std::string name() const;
};

// {key, problem} for the first contradiction among the three settings (`every` 0 = not given),
// or nullopt.
std::optional<std::pair<std::string, std::string>> recomputation_problem(bool gradient_checkpointing,
                                                                         const std::string& policy, int64_t every);
// What the settings ask for; throws std::invalid_argument with recomputation_problem's words.
Recomputation resolve_recomputation(bool gradient_checkpointing, const std::string& policy, int64_t every);

// The three keys' values that ask for the recomputation called `name` (Recomputation::name():
// "none", "full", "every_<n>" with n >= 2, "selective"), so that a grid of kiln-profile can list
// recomputations by name; throws std::invalid_argument for another word.
struct RecomputationKeys {
  bool gradient_checkpointing = false;
  std::string policy;
  int64_t every = 0;
};
RecomputationKeys recomputation_keys(const std::string& name);

}  // namespace kiln::train
