// kiln-profile's settings: one key table per subcommand (config/key_table.h), read with
// kiln-pretrain's mechanism and rules. `sweep` reads a configs/profile/*.yaml and then the command
// line's `--key value` overrides through its table (load_sweep_config, sweep.h); `plan` and
// `explain` read the command line through theirs. The keys are snake_case, LLaMA-Factory's and
// kiln-pretrain's names where they exist (cutoff_len, per_device_train_batch_size,
// gradient_accumulation_steps, learning_rate, ...). On the command line a key may also be written
// in kebab case (--cutoff-len), a boolean key may stand alone (--counters), and a few aliases keep
// the older flags: --batch-size, --grad-accum, --output, --trace, --no-overlap (command_spelling).
// An unknown key, a repeated one and contradictory ones follow config/key_table.h's rules; a key
// of another subcommand is refused naming the subcommands that take it.
//
// The device of plan and explain is described, not used: nothing runs there. `device` says which
// kind (cpu, cuda, or auto: the GPU that device_memory names, else this machine's device by
// common/device.h's resolver), device_memory which one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/config/key_table.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/plan.h"
#include "kiln/cost/run.h"
#include "kiln/model/llama_config.h"
#include "kiln/ops/dispatch.h"
#include "kiln/profile/sweep.h"

namespace kiln::profile {

using Overrides = std::vector<std::pair<std::string, std::string>>;

enum class Command { kSweep, kPlan, kExplain, kReference };
const char* command_name(Command command);  // "sweep", "plan", "explain", "reference"

// How `command`'s command line may write its keys: kebab case, the older flags' aliases, its
// boolean keys as switches.
config::Spelling command_spelling(Command command);
// The keys `command` takes, in --help order, each with its value and help line (the aliases are
// in the lines).
std::vector<config::KeyDoc> command_keys(Command command);
// Throws config::ConfigError ("command line: key 'format': ...") for an override key `command`
// does not take, naming the subcommands that do take it, or calling it unknown.
void check_command_keys(Command command, const Overrides& overrides);

// kiln-profile plan: the memory planner (cost/plan.h) from the analytic models.
struct PlanSettings {
  std::string source = "command line";
  std::string model;  // required
  std::vector<int64_t> cutoff_lens{1024};
  std::string dtype = "bf16";
  std::string kernels = ops::kDefaultKernels;
  std::string device = "auto";
  std::string device_memory;  // a size (80GB) or a cost/hardware.h name; "" = this GPU's
  int64_t target_tokens = 0, target_sequences = 0;
  int64_t world_size = 1, zero_stage = 0, ddp_bucket_cap_mb = 25;
  double mfu = 0.4, peak_tflops = 0;
  std::vector<std::string> formats{"md", "csv", "json", "html"};
  std::string output_dir = "profile";
};
PlanSettings read_plan_settings(const Overrides& overrides);
// The planner's input: the device kind (see above), its memory (device_memory, or asked of this
// machine's GPU), the kernels that run there. Throws config::ConfigError naming the key.
cost::PlanConfig plan_config(const PlanSettings& settings);

// kiln-profile explain: the traffic and FLOP model of one step (cost/traffic.h).
struct ExplainSettings {
  std::string source = "command line";
  std::string model;                        // required
  int64_t cutoff_len = 0;                   // required
  int64_t per_device_train_batch_size = 0;  // required
  int64_t gradient_accumulation_steps = 1;
  std::string dtype = "bf16";
  std::string kernels = ops::kDefaultKernels;
  std::string device = "auto";
  std::string device_memory;  // a cost/hardware.h name
  int64_t world_size = 1, zero_stage = 0;
  double peak_tflops = 0;
  double step_seconds = 0;  // > 0: the modelled counters at this measured step time
  bool json = false;
  bool gradient_checkpointing = false;
  std::string gradient_checkpointing_policy;
  int64_t gradient_checkpointing_every = 0;
};
ExplainSettings read_explain_settings(const Overrides& overrides);

// What explain models the step on: a GPU of cost/hardware.h (device_memory's name, or this
// machine's GPU), or with device cpu (auto on a machine without a GPU) this CPU's theoretical
// peaks and measured copy bandwidth. Throws config::ConfigError naming the key.
struct ExplainDevice {
  bool cuda = false;
  cost::HardwareSpec hardware;
  std::string bandwidth_source;
};
ExplainDevice explain_device(const ExplainSettings& settings);
// The step explain models: its keys as kiln-pretrain's, described as every program describes a
// run (train::describe_run) on `device` for a job of world_size ranks.
cost::RunDescription explain_run(const ExplainSettings& settings, const model::LlamaConfig& model,
                                 const ExplainDevice& device);

// kiln-profile reference: the reference runs' rows predicted (profile/reference_report.h).
struct ReferenceSettings {
  std::string source = "command line";
  std::string data;        // the data file; "" = configs/reference/llamafactory_runs.yaml as compiled in
  std::string host_costs;  // the host costs; "" = configs/reference/host_costs.yaml as compiled in
  bool json = false;       // print JSON instead of Markdown
  std::vector<std::string> formats{"md", "json", "html"};
  std::string output_dir;  // "" = write no files
};
ReferenceSettings read_reference_settings(const Overrides& overrides);

}  // namespace kiln::profile
