// kiln-profile's settings: kiln-pretrain's settings (a train::PretrainConfig, read through its own
// key table, with its defaults, rules and words) plus a grid and the measurement's own keys. Each
// subcommand takes a selection of those keys: `sweep` from a configs/profile/*.yaml and then the
// command line's `--key value` overrides, `plan`, `explain` and `reference` from the command line.
// The key rules are every program's (config/key_table.h; docs/training.md, "Config"); on the
// command line a few aliases keep the older flags: --batch-size, --grad-accum, --output, --trace,
// --no-overlap (command_spelling). A key of another subcommand is refused naming the subcommands
// that take it.
//
// Where the run executes is train::run_target's rule for all four (train/run_plan.h). For plan
// and explain the device is described, not used: `device` says which kind (cpu, cuda, or auto: the
// GPU that device_memory names, else this machine's device), device_memory which one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/config/key_table.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/plan.h"
#include "kiln/cost/run.h"
#include "kiln/model/llama_config.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/recomputation.h"

namespace kiln::profile {

using Overrides = std::vector<std::pair<std::string, std::string>>;

enum class Command { kSweep, kPlan, kExplain, kReference };
const char* command_name(Command command);  // "sweep", "plan", "explain", "reference"
// The subcommand's --help paragraph (what it does, its usage line).
std::string command_summary(Command command);

// One point of the grid.
struct SweepPoint {
  int64_t batch_size = 1, gradient_accumulation_steps = 1, cutoff_len = 128;
  std::string recomputation;  // a name of the grid's recomputation list; "" = run's keys decide
};

struct ProfileSettings {
  Command command = Command::kSweep;
  std::string source = "command line";  // the file and/or "command line", for messages
  // kiln-pretrain's keys: model, device, kernels, seed, dataset_dir, the recomputation keys,
  // zero_stage, ddp_bucket_cap_mb, the optimisation keys (each point runs the trainer's step with
  // this schedule over its own steps), output_dir.
  train::PretrainConfig run;
  // The compute dtype, bf16 | fp16 | fp32: kiln-pretrain's bf16 and fp16 keys as one key, set into
  // `run` by train::set_compute_dtype when read.
  std::string dtype = "bf16";
  // The grid: kiln-pretrain's keys with a list of values each (explain: one value).
  std::vector<int64_t> cutoff_len{128}, per_device_train_batch_size{1}, gradient_accumulation_steps{1};
  // Recomputations by name (none, full, every_<n>, selective; train::recomputation_keys), each
  // point run with each; empty: the run's gradient_checkpointing keys decide (one value).
  std::vector<std::string> recomputation;

  // sweep: the measurement.
  int64_t steps = 3;              // timed steps per point
  int64_t warmup = 1;             // untimed steps first
  double peak_tflops = 0;         // > 0 overrides the device table / CPU peak (plan, explain: the roofline's)
  int64_t memory_cap_bytes = 0;   // > 0: allocations past it fail as out-of-memory
  std::string task = "pretrain";  // the table's first column
  std::vector<std::string> formats{"md", "csv", "json", "html"};
  // Non-empty: after each point's timed steps, `steps` more under LibTorch's (Kineto) profiler,
  // written as trace_cutoff_len<N>_batch<B>_gradient_accumulation_steps<A>.json here (Chrome
  // trace format: Perfetto; scripts/bench_vs_hf.py --op-profile sums it per op). Not timed.
  std::string trace_dir;
  bool ddp_overlap = true;  // false: every bucket after backward (to measure what the overlap hides)
  // Hardware counters (profile/counters/counters.h) over counter_steps more steps (0: as many as
  // `steps`); per kernel (CUPTI serialises the kernels) or per phase as well. Both imply counters.
  bool counters = false, counters_per_kernel = false, counter_phases = false;
  int64_t counter_steps = 0;
  // Measured time per component (profile/counters/component_times.h) over `steps` more steps.
  bool component_times = false;

  // plan and explain: the device described, and the job.
  std::string device_memory;                        // a size (80GB; plan) or a cost/hardware.h name
  int64_t target_tokens = 0, target_sequences = 0;  // plan: the global batch per optimizer step
  int64_t world_size = 1;
  double mfu = 0.4;         // plan: assumed for the predicted tokens/s
  double step_seconds = 0;  // explain: > 0 prints the modelled counters at this measured step time
  bool json = false;        // explain, reference: JSON on stdout instead of Markdown

  // reference: the data files ("" = configs/reference/*.yaml as compiled in).
  std::string data, host_costs;

  int64_t counted_steps() const { return counter_steps > 0 ? counter_steps : steps; }
  // The recomputation the run's keys ask for (train::resolve_recomputation): "none", "full",
  // "every_2", "selective"; a grid's list names each point's own (SweepPoint::recomputation).
  std::string run_recomputation() const {
    return train::resolve_recomputation(run.gradient_checkpointing, run.gradient_checkpointing_policy,
                                        run.gradient_checkpointing_every)
        .name();
  }
};

// How `command`'s command line may write its keys: kebab case, the older flags' aliases, its
// boolean keys as switches.
config::Spelling command_spelling(Command command);
// The keys `command` takes, in --help order, each with its value and help line.
std::vector<config::KeyDoc> command_keys(Command command);
// Throws config::ConfigError ("command line: key 'format': ...") for an override key `command`
// does not take, naming the subcommands that do take it, or calling it unknown.
void check_command_keys(Command command, const Overrides& overrides);

// Reads `command`'s keys from the YAML file `path` ("" = none; sweep only) and then the command
// line's overrides (config::parse_overrides), and validates them: the profile's own rules, then
// kiln-pretrain's (PretrainConfig::validate) on every point's run. Throws config::ConfigError
// naming the source and the key.
ProfileSettings read_settings(Command command, const std::string& path, const Overrides& overrides);

// The profile's own rules, then kiln-pretrain's (PretrainConfig::validate) on every point's run;
// settles what the keys imply (dtype into run's bf16/fp16; counters_per_kernel and counter_phases
// imply counters). read_settings and run_sweep call it; a program that fills the struct itself
// may too. Throws config::ConfigError naming the source and the key.
void settle(ProfileSettings& settings);

// "cutoff_len 64, batch 2, gradient_accumulation_steps 1" (", recomputation full" from a grid's
// list): a point in logs, warnings and reports.
std::string point_label(const SweepPoint& point);

// The grid's points: cutoff_len outermost, then batch size, then accumulation, then recomputation.
std::vector<SweepPoint> grid_points(const ProfileSettings& settings);

// The trainer's settings for one point: `run` with the point's shapes and recomputation and as
// many steps as a point runs (what train::stack_options, train::schedule_of and train::describe_run read).
train::PretrainConfig point_config(const ProfileSettings& settings, const SweepPoint& point);

// plan: the planner's input (cost/plan.h): the device kind, its memory (device_memory, or asked
// of this machine's GPU), the run it varies as train::describe_run prices it there.
cost::PlanConfig plan_config(const ProfileSettings& settings);

// explain: the device it models the step on (a GPU of cost/hardware.h: device_memory's name, or
// this machine's GPU; or with device cpu, auto on a machine without a GPU, this CPU's theoretical
// peaks and measured copy bandwidth), and the step as every program describes a run.
struct ExplainDevice {
  bool cuda = false;
  cost::HardwareSpec hardware;
  std::string bandwidth_source;
};
ExplainDevice explain_device(const ProfileSettings& settings);
cost::RunDescription explain_run(const ProfileSettings& settings, const model::LlamaConfig& model,
                                 const ExplainDevice& device);

}  // namespace kiln::profile
