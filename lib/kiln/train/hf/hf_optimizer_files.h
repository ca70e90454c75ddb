// optimizer.pt, scheduler.pt and scaler.pt as transformers' Trainer writes and reads them
// (docs/formats.md, "HF Trainer's optimizer.pt, scheduler.pt, scaler.pt"), so that a run moves
// between kiln and transformers / LLaMA-Factory at a checkpoint (docs/training.md, "Moving a run
// between LLaMA-Factory and kiln").
//
// optimizer.pt is torch.optim.AdamW.state_dict() over HF's two parameter groups (Trainer's
// create_optimizer: the decay group holds the weights with more than one dimension, the other one
// the norms and biases, each in named_parameters() order); its `state` is keyed by the position
// over both groups. scheduler.pt is LambdaLR.state_dict(); scaler.pt torch.amp.GradScaler's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace kiln::model {
class LlamaForCausalLM;
}
namespace kiln::optim {
class AdamW;
}
namespace kiln::dist {
class DataParallel;
}

namespace kiln::train {

// One parameter in HF's layout: the whole tensor's state, in the parameter's shape.
struct HfParamState {
  std::string name;
  bool decay = true;
  at::Tensor exp_avg, exp_avg_sq;  // fp32
  double step = 0;
  std::string source;  // read_hf_adamw: where in optimizer.pt it was ("state[3]"), for messages
};

struct HfAdamWHyper {
  double lr = 0;          // the learning rate of the next step (what the scheduler set last)
  double initial_lr = 0;  // the peak (LambdaLR's base_lrs)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool fused = true;  // transformers' default optim, adamw_torch_fused: the kernel kiln's AdamW runs
};

// torch.optim.AdamW.state_dict() of `params` (in named_parameters() order) over HF's two groups.
c10::IValue hf_adamw_state_dict(const std::vector<HfParamState>& params, const HfAdamWHyper& hyper);
// LambdaLR.state_dict() after `step` scheduler steps over two groups.
c10::IValue hf_lambda_lr_state_dict(double base_lr, int64_t step, double last_lr);
// torch.amp.GradScaler.state_dict() with kiln's (HF's default) growth settings.
c10::IValue hf_grad_scaler_state_dict(double scale, int64_t growth_tracker);

// What the model expects of each parameter, in named_parameters() order.
struct HfParamShape {
  std::string name;
  bool decay = true;
  std::vector<int64_t> shape;
};

// Reads optimizer.pt's AdamW state for `expected`. Throws io::InputError "<file>: <field>: expected
// ..., found ..." for another optimizer, another group layout, a missing or mis-shaped moment, a
// step that is not a whole number.
std::map<std::string, HfParamState> read_hf_adamw(const c10::IValue& state_dict,
                                                  const std::vector<HfParamShape>& expected, const std::string& file);

// The parameters as transformers' Trainer groups them: named_parameters() order (kiln's modules
// register in transformers' order, under its names), decay for more than one dimension
// (get_decay_parameter_names leaves out the norms and biases, kiln's 1-D parameters).
std::vector<HfParamShape> hf_param_shapes(const model::LlamaForCausalLM& model);

// Reads optimizer.pt into `optimizer`, an AdamW over `model`'s parameters, or over this rank's
// ZeRO chunks of them when `zero` is given (each rank reads the whole file and keeps its part).
// Throws io::InputError naming the file and field; a refused file leaves `optimizer` as it was.
// `max_step`: the largest step count a parameter's state may hold (the checkpoint's global_step:
// a step an fp16 overflow skipped is not counted).
void load_hf_optimizer_file(const std::string& file, const model::LlamaForCausalLM& model, optim::AdamW& optimizer,
                            const dist::DataParallel* zero = nullptr, int64_t max_step = int64_t{1} << 53);

struct HfSchedulerState {
  int64_t last_epoch = 0;
  std::vector<double> base_lrs, last_lrs;
};
HfSchedulerState read_hf_lambda_lr(const c10::IValue& state_dict, const std::string& file);

struct HfScalerState {
  double scale = 0;
  int64_t growth_tracker = 0;
};
HfScalerState read_hf_grad_scaler(const c10::IValue& state_dict, const std::string& file);

}  // namespace kiln::train
