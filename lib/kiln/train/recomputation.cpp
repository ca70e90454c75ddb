#include "kiln/train/recomputation.h"

#include <stdexcept>

#include <fmt/format.h>

namespace kiln::train {

std::string Recomputation::name() const {
  return policy == "every_n" ? fmt::format("every_{}", every) : policy;
}

std::optional<std::pair<std::string, std::string>> recomputation_problem(bool gradient_checkpointing,
                                                                         const std::string& policy, int64_t every) {
  using Problem = std::pair<std::string, std::string>;
  if (!policy.empty() && policy != "full" && policy != "every_n" && policy != "selective") {
    return Problem{"gradient_checkpointing_policy",
                   fmt::format("must be full, every_n or selective, got '{}'", policy)};
  }
  if (every < 0) return Problem{"gradient_checkpointing_every", fmt::format("must be >= 1, got {}", every)};
  if (!gradient_checkpointing) {
    if (!policy.empty()) {
      return Problem{"gradient_checkpointing_policy",
                     fmt::format("'{}' has no effect without gradient_checkpointing: true", policy)};
    }
    if (every != 0) {
      return Problem{"gradient_checkpointing_every",
                     fmt::format("{} has no effect without gradient_checkpointing: true", every)};
    }
    return std::nullopt;
  }
  if ((policy == "full" || policy == "selective") && every >= 2) {
    return Problem{
        "gradient_checkpointing_every",
        fmt::format("{} contradicts gradient_checkpointing_policy {}, which {}: use policy every_n (or "
                    "leave the policy out) to recompute layers 0, {}, {}, ...",
                    every, policy, policy == "full" ? "recomputes every layer" : "keeps every layer's matmul outputs",
                    every, 2 * every)};
  }
  if (policy == "every_n" && every == 1) {
    return Problem{"gradient_checkpointing_every",
                   "1 with policy every_n recomputes every layer: give n >= 2, or "
                   "use policy full"};
  }
  return std::nullopt;
}

Recomputation resolve_recomputation(bool gradient_checkpointing, const std::string& policy, int64_t every) {
  if (const auto problem = recomputation_problem(gradient_checkpointing, policy, every)) {
    throw std::invalid_argument(problem->first + ": " + problem->second);
  }
  if (!gradient_checkpointing) return {"none", 0};
  if (policy == "selective") return {"selective", 0};
  if (policy == "every_n") return {"every_n", every == 0 ? 2 : static_cast<int>(every)};
  if (policy.empty() && every >= 2) return {"every_n", static_cast<int>(every)};
  return {"full", 1};
}

RecomputationKeys recomputation_keys(const std::string& name) {
  if (name == "none") return {};
  if (name == "full" || name == "selective") return {true, name, 0};
  if (name.rfind("every_", 0) == 0 && name.size() > 6 && name.find_first_not_of("0123456789", 6) == std::string::npos &&
      std::stoll(name.substr(6)) >= 2) {
    return {true, "every_n", std::stoll(name.substr(6))};
  }
  throw std::invalid_argument(
      fmt::format("'{}' is not none, full, selective or every_<n> with n >= 2 (e.g. every_4)", name));
}

}  // namespace kiln::train
