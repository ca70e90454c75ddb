// AdamW on at::_fused_adamw_ (one fused kernel per parameter group, CPU and CUDA), with HF's
// parameter groups: no weight decay for 1-D tensors (RMSNorm weights, biases), decay for the
// rest (embeddings included, as HF Trainer does).
//
// Mixed precision in kiln keeps the model's parameters in fp32 and computes in bf16/fp16 through
// autocast (as HF Trainer does), so the parameters this optimizer updates are the fp32 master
// weights themselves and no copies are needed.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// One tensor the optimizer updates, with its decay choice made by the caller: ZeRO's shards are
// flat slices of parameters, so the 1-D rule cannot be read off their shape (kiln/dist/).
// `grad`, when defined, is used instead of param.grad().
struct ParamSpec {
  std::string name;
  at::Tensor param;
  bool decay = true;
  at::Tensor grad;
};

// A state load_state_dict refuses: the entry's key, what was expected and what was found
// (callers that read it from a file name the file: "<file>: <key>: expected ..., found ...").
class StateError : public std::invalid_argument {
 public:
  StateError(std::string key, std::string expected, std::string found);
  const std::string& key() const { return key_; }
  const std::string& expected() const { return expected_; }
  const std::string& found() const { return found_; }

 private:
  std::string key_, expected_, found_;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, at::Tensor>> named_parameters, AdamWConfig config);
  explicit AdamW(std::vector<ParamSpec> params, AdamWConfig config);

  // One update with learning rate `lr`. With `found_inf` (a [1] float tensor from the loss
  // scaler) the update is skipped on every parameter, step counters included, when it is
  // non-zero, without a host sync; `grad_scale` divides the gradients inside the kernel.
  void step(double lr, const std::optional<at::Tensor>& grad_scale = std::nullopt,
            const std::optional<at::Tensor>& found_inf = std::nullopt);
  void zero_grad();

  // Bytes of optimizer state (exp_avg, exp_avg_sq, step) held by this object.
  int64_t state_bytes() const;

  // Names that get weight decay (for tests and the run log).
  std::vector<std::string> decayed_names() const;

  // Optimizer state as flat tensors: "<param>.exp_avg", "<param>.exp_avg_sq", "<param>.step".
  std::map<std::string, at::Tensor> state_dict() const;
  // Restores state_dict(); throws StateError naming a missing, mis-shaped or non-finite entry (moments
  // finite, second moments >= 0, steps whole numbers in [0, 2^53]); nothing is changed then.
  // `max_step`: the largest step count a state may hold (a resume passes its checkpoint's
  // global_step: a step an fp16 overflow skipped is not counted, so no parameter has more).
  void load_state_dict(const std::map<std::string, at::Tensor>& state, int64_t max_step = int64_t{1} << 53);

 private:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq, steps;  // grads[i] undefined: params[i].grad()
    double weight_decay = 0;
  };
  AdamWConfig config_;
  std::vector<Group> groups_;
};

}  // namespace kiln::optim
