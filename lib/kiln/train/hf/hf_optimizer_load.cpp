// The parts of hf_optimizer_files.h that need a model and an optimizer: the parameters' HF
// layout, and optimizer.pt loaded into kiln's AdamW (whole, or this rank's ZeRO chunks). The
// readers themselves (hf_optimizer_files.cpp) depend on no model, so that the fuzz harnesses
// build them alone (tests/fuzz/CMakeLists.txt).
#include <regex>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/dist/data_parallel.h"
#include "kiln/io/input_file.h"
#include "kiln/io/torch_pickle.h"
#include "kiln/model/llama.h"
#include "kiln/optim/adamw.h"
#include "kiln/train/hf/hf_optimizer_files.h"

namespace kiln::train {

std::vector<HfParamShape> hf_param_shapes(const model::LlamaForCausalLM& model) {
  std::vector<HfParamShape> out;
  for (const auto& p : model->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    out.push_back({p.key(), p.value().dim() > 1, p.value().sizes().vec()});
  }
  return out;
}

void load_hf_optimizer_file(const std::string& file, const model::LlamaForCausalLM& model, optim::AdamW& optimizer,
                            const dist::DataParallel* zero, int64_t max_step) {
  const std::map<std::string, HfParamState> full =
      read_hf_adamw(io::load_torch_pickle(file), hf_param_shapes(model), file);
  std::map<std::string, at::Tensor> state;
  std::map<std::string, std::string> field_of;  // AdamW's key -> where optimizer.pt holds it
  const auto put = [&](const std::string& name, const HfParamState& p, int64_t begin, int64_t end) {
    const auto part = [&](const at::Tensor& t) { return begin < 0 ? t : t.flatten().slice(0, begin, end); };
    state[name + ".exp_avg"] = part(p.exp_avg);
    state[name + ".exp_avg_sq"] = part(p.exp_avg_sq);
    state[name + ".step"] = at::full({}, p.step, at::kFloat);
    for (const char* key : {"exp_avg", "exp_avg_sq", "step"}) field_of[name + "." + key] = p.source + "." + key;
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
    optimizer.load_state_dict(state, max_step);
  } catch (const optim::StateError& e) {
    const auto it = field_of.find(e.key());
    io::refuse(file, it != field_of.end() ? it->second : e.key(), e.expected(), e.found());
  }
}

}  // namespace kiln::train
