// See settings.h. One table holds the profile's own keys and one list per subcommand names the
// keys it takes, its own and kiln-pretrain's: the reader, the --help text and the check that
// refuses another subcommand's key all walk those lists.
#include "kiln/profile/settings.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include "kiln/common/device.h"
#include "kiln/cost/cpu_peak.h"
#include "kiln/cost/memory.h"
#include "kiln/dist/env.h"
#include "kiln/optim/schedule.h"
#include "kiln/train/pretrain_keys.h"
#include "kiln/train/run_description.h"
#include "kiln/train/run_plan.h"

namespace kiln::profile {

using config::ConfigError;
using config::ConfigReader;
using config::KeyTable;

namespace {

constexpr Command kCommands[] = {Command::kSweep, Command::kPlan, Command::kExplain, Command::kReference};

// The device names of cost/hardware.h, "V100-16GB, ...".
std::string device_names() {
  std::string names;
  for (const auto& spec : cost::hardware_specs()) names += (names.empty() ? "" : ", ") + spec.name;
  return names;
}

// The profile's own keys (the grid's lists, the measurement's and the described device's).
const KeyTable<ProfileSettings>& own_table() {
  using S = ProfileSettings;
  static const KeyTable<S> table = {
      {"cutoff_len", &S::cutoff_len, "cutoff_len values (--cutoff-len)"},
      {"per_device_train_batch_size", &S::per_device_train_batch_size, "per-device batch sizes (--batch-size)"},
      {"gradient_accumulation_steps", &S::gradient_accumulation_steps, "gradient accumulation steps (--grad-accum)"},
      {"recomputation", &S::recomputation,
       "recomputations to sweep, by name: none, full, every_<n> (n >= 2), selective (default: the "
       "gradient_checkpointing keys' one)"},
      {"dtype", &S::dtype,
       "bf16 | fp16 | fp32 compute (parameters stay fp32); default bf16 (kiln-pretrain's bf16/fp16 keys)"},
      {"steps", &S::steps, "timed steps per point (default 3)"},
      {"warmup", &S::warmup, "untimed steps before them (default 1)"},
      {"peak_tflops", &S::peak_tflops, "peak TFLOP/s for MFU instead of the device table or the CPU's peak"},
      {"memory_cap_bytes", &S::memory_cap_bytes, "fail allocations past this many bytes as out-of-memory"},
      {"format", &S::formats, "md,csv,json,html (default: all four)"},
      {"trace_dir", &S::trace_dir,
       "after each point's timed steps, profile as many more (LibTorch's Kineto profiler, not timed) and write "
       "DIR/trace_cutoff_len<N>_batch<B>_gradient_accumulation_steps<A>.json (Chrome trace: Perfetto; "
       "bench_vs_hf.py --op-profile sums it per op) (--trace)"},
      {"task", &S::task, "the table's task column (default pretrain)"},
      {"ddp_overlap", &S::ddp_overlap,
       "under torchrun/srun: reduce buckets during backward (default true); false (--no-overlap) reduces every "
       "bucket after it, to measure what the overlap hides"},
      {"counters", &S::counters,
       "read hardware counters (perf_event on the CPU, CUPTI on a GPU: one range over the counted steps) over "
       "counter_steps more steps after each point's timed ones; the counted memory bandwidth, tensor core and fp "
       "engine columns sit beside the modelled ones (docs/performance.md)"},
      {"counter_phases", &S::counter_phases,
       "count forward, backward and the optimizer apart as well (on a GPU a device synchronisation at each phase "
       "boundary of the counted steps); implies counters"},
      {"counter_steps", &S::counter_steps, "with counters: steps counted per point (default: as many as steps)"},
      {"counters_per_kernel", &S::counters_per_kernel,
       "counters on a GPU with one CUPTI range per kernel (each kernel's columns in profile.json); CUPTI serialises "
       "the kernels, so the counted steps run much slower; implies counters"},
      {"component_times", &S::component_times,
       "measure each component's time over as many steps again under LibTorch's profiler after each point's timed "
       "ones: its ops' CPU time on a CPU, the GPU time of its kernels on a GPU (docs/performance.md)"},
      {"device_memory", &S::device_memory,
       "the device's memory (80GB, 16GiB, ...) or a device name: " + device_names() + " (default: this GPU's)"},
      {"target_tokens", &S::target_tokens, "global batch per optimizer step, in tokens"},
      {"target_sequences", &S::target_sequences, "global batch per optimizer step, in sequences (or target_tokens)"},
      {"world_size", &S::world_size, "data-parallel ranks (default 1)"},
      {"mfu", &S::mfu, "assumed MFU for the predicted tokens/s (default 0.4)"},
      {"step_seconds", &S::step_seconds,
       "a measured step time: prints the modelled memory bandwidth, tensor core and fp engine use at it"},
      {"json", &S::json, "print the per-component rows and totals as JSON instead of Markdown"},
      {"data", &S::data,
       "the reference runs' figures (default: configs/reference/llamafactory_runs.yaml, compiled in)"},
      {"host_costs", &S::host_costs,
       "the host costs per op and per step (default: configs/reference/host_costs.yaml, compiled in)"},
  };
  return table;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

// Each subcommand's keys, in --help order: the profile's own and kiln-pretrain's.
std::vector<std::string> key_names(Command command) {
  switch (command) {
    case Command::kSweep:
      return words(
          "model cutoff_len per_device_train_batch_size gradient_accumulation_steps recomputation dtype kernels steps "
          "warmup device dataset_dir seed gradient_checkpointing gradient_checkpointing_every "
          "gradient_checkpointing_policy "
          "peak_tflops memory_cap_bytes format output_dir trace_dir task zero_stage ddp_bucket_cap_mb ddp_overlap "
          "counters counter_phases counter_steps counters_per_kernel component_times learning_rate lr_scheduler_type "
          "warmup_ratio warmup_steps min_lr_ratio decay_ratio weight_decay adam_beta1 adam_beta2 adam_epsilon "
          "max_grad_norm");
    case Command::kPlan:
      return words(
          "model cutoff_len dtype kernels device device_memory target_tokens target_sequences world_size zero_stage "
          "ddp_bucket_cap_mb mfu peak_tflops format output_dir");
    case Command::kExplain:
      return words(
          "model cutoff_len per_device_train_batch_size gradient_accumulation_steps dtype kernels device device_memory "
          "world_size zero_stage peak_tflops step_seconds json gradient_checkpointing gradient_checkpointing_every "
          "gradient_checkpointing_policy");
    case Command::kReference:
      return words("data host_costs json format output_dir");
  }
  return {};
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

template <class C>
KeyTable<C> keys_of(const KeyTable<C>& table, Command command) {
  const std::vector<std::string> names = key_names(command);
  KeyTable<C> out;
  for (const auto& key : table) {
    if (has(names, key.name)) out.push_back(key);
  }
  return out;
}

// kiln-pretrain's keys that `command` takes, less those the profile reads itself (the grid's lists).
KeyTable<train::PretrainConfig> pretrain_keys(Command command) {
  const KeyTable<ProfileSettings>& own = own_table();
  KeyTable<train::PretrainConfig> out;
  for (const auto& key : keys_of(train::pretrain_key_table(), command)) {
    if (std::none_of(own.begin(), own.end(), [&](const auto& k) { return k.name == key.name; })) out.push_back(key);
  }
  return out;
}

// A key's --help line where it differs from its table's: per subcommand ("<command>:<key>"), or
// the profile's words for a key of kiln-pretrain's ("<key>").
std::string help_line(Command command, const std::string& key) {
  static const std::map<std::string, std::string> lines = {
      {"plan:cutoff_len", "cutoff_len values to plan for (default 1024)"},
      {"explain:cutoff_len", "tokens per sequence (one value; required)"},
      {"explain:per_device_train_batch_size", "sequences per micro-batch (one value; required) (--batch-size)"},
      {"explain:gradient_accumulation_steps", "micro-batches per optimizer step (default 1) (--grad-accum)"},
      {"plan:device",
       "the device planned for: cpu, cuda, or auto (default): a GPU when device_memory names one, else this "
       "machine's device"},
      {"explain:device",
       "cpu: this CPU's theoretical peaks and measured copy bandwidth; cuda: the GPU device_memory names, else "
       "this one; auto (default): device_memory's GPU, else this machine's device"},
      {"dataset_dir", "token shards (default: synthetic random ids)"},
      {"seed", "the model's initialisation (the synthetic ids draw from seed + 1); default 42"},
      {"plan:peak_tflops", "peak TFLOP/s instead of the device table's"},
      {"explain:peak_tflops", "the roofline's GEMM TFLOP/s instead of the device table's"},
      {"reference:format", "md,json,html (default: all three; files only with output_dir)"},
      {"output_dir",
       "directory for profile.{md,csv,json,html} (with csv also profile_components.csv); default profile "
       "(--output)"},
      {"plan:output_dir", "directory for plan.{md,csv,json,html}; default profile (--output)"},
      {"reference:output_dir", "directory for reference.{md,json,html}; default none (--output)"},
      {"plan:zero_stage", "ZeRO stage 0, 1 or 2 (with world_size > 1)"},
      {"explain:zero_stage", "ZeRO stage 0, 1 or 2 (with world_size > 1)"},
      {"plan:ddp_bucket_cap_mb", "gradient bucket size (MB), default 25"},
      {"explain:device_memory", "a device name: " + device_names()},
      {"reference:json", "print the rows as JSON instead of Markdown"},
  };
  for (const std::string& name : {fmt::format("{}:{}", command_name(command), key), key}) {
    if (const auto it = lines.find(name); it != lines.end()) return it->second;
  }
  return "";
}

std::string hint(Command command) {
  return fmt::format("kiln-profile {} --help lists its keys", command_name(command));
}

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& problem) {
  throw ConfigError(config::config_message(source, key, problem));
}

// Each subcommand's defaults where they differ from the struct's.
ProfileSettings defaults(Command command) {
  ProfileSettings s;
  s.command = command;
  s.run.output_dir = "profile";
  if (command == Command::kPlan) s.cutoff_len = {1024};
  if (command == Command::kExplain) s.cutoff_len = s.per_device_train_batch_size = {};
  if (command == Command::kReference) {
    s.run.output_dir.clear();  // write no files
    s.formats = {"md", "json", "html"};
  }
  return s;
}

// The report formats: md, csv, json and html (reference: no csv).
void check_formats(const ProfileSettings& s) {
  const bool csv = s.command != Command::kReference;
  for (const auto& f : s.formats) {
    if (f != "md" && f != "json" && f != "html" && !(csv && f == "csv"))
      fail(s.source, "format", fmt::format("'{}' is not {}", f, csv ? "md, csv, json or html" : "md, json or html"));
  }
}

}  // namespace

void settle(ProfileSettings& s) {
  const std::string& src = s.source;
  s.run.source = src;
  if (s.command == Command::kReference) return check_formats(s);
  try {
    device::check_spec(s.run.device);
  } catch (const std::invalid_argument& e) {
    fail(src, "device", e.what());
  }
  if (s.run.model.empty()) {
    if (s.command == Command::kSweep) fail(src, "model", "missing required key (expected a string)");
    fail(src, "model", "missing: give --model (a preset, a model YAML or an HF folder)");
  }
  if (s.dtype != "bf16" && s.dtype != "fp16" && s.dtype != "fp32")
    fail(src, "dtype", fmt::format("'{}' is not bf16, fp16 or fp32", s.dtype));
  train::set_compute_dtype(s.run, s.dtype);
  // The grid's lists (explain: one value each, `flag` saying how to give it).
  const bool explain = s.command == Command::kExplain;
  for (const auto& [key, list, flag] : {std::tuple{"cutoff_len", &s.cutoff_len, "--cutoff_len (one value)"},
                                        {"per_device_train_batch_size", &s.per_device_train_batch_size,
                                         "--per_device_train_batch_size (--batch-size, one value)"},
                                        {"gradient_accumulation_steps", &s.gradient_accumulation_steps,
                                         "--gradient_accumulation_steps (--grad-accum, one value)"}}) {
    if (explain && list->size() > 1) fail(src, key, fmt::format("{} values: explain models one", list->size()));
    if (explain && (list->empty() || (*list)[0] <= 0))
      fail(src, key, fmt::format("missing or not positive: give {}", flag));
    if (list->empty() && has(key_names(s.command), key)) fail(src, key, "empty list");
    for (int64_t x : *list) {
      if (x <= 0) fail(src, key, fmt::format("{} is not positive", x));
    }
  }
  if (explain && s.step_seconds < 0) fail(src, "step_seconds", fmt::format("{} is negative", s.step_seconds));
  if (s.peak_tflops < 0) fail(src, "peak_tflops", fmt::format("{} is negative", s.peak_tflops));
  if (s.command == Command::kPlan && s.world_size == 1 && s.run.zero_stage > 0)
    fail(src, "zero_stage", "ZeRO needs a world size above 1");
  if (s.command == Command::kSweep) {
    if (s.counters_per_kernel || s.counter_phases) s.counters = true;
    if (s.steps < 1) fail(src, "steps", fmt::format("{} (at least 1 timed step)", s.steps));
    if (s.warmup < 0) fail(src, "warmup", fmt::format("{} is negative", s.warmup));
    if (s.counter_steps < 0)
      fail(src, "counter_steps", fmt::format("{} is negative (0: as many as steps)", s.counter_steps));
    if (s.counter_steps > 0 && !s.counters)
      fail(src, "counter_steps", "has no effect without counters: true (--counters)");
    if (s.run.seed < 0) fail(src, "seed", fmt::format("{} is negative", s.run.seed));
    if (s.memory_cap_bytes < 0) fail(src, "memory_cap_bytes", fmt::format("{} is negative", s.memory_cap_bytes));
  }
  if (!explain) check_formats(s);
  for (const std::string& name : s.recomputation) {
    try {
      train::recomputation_keys(name);
    } catch (const std::invalid_argument& e) {
      fail(src, "recomputation", e.what());
    }
    if (s.run.gradient_checkpointing)
      fail(src, "recomputation", "lists the recomputations itself: leave gradient_checkpointing and its keys out");
  }
  // kiln-pretrain's rules and words (device, kernels, recomputation, ZeRO, the schedule, ...).
  for (const SweepPoint& point : grid_points(s)) point_config(s, point).validate();
}

std::string point_label(const SweepPoint& p) {
  return fmt::format("cutoff_len {}, batch {}, gradient_accumulation_steps {}{}", p.cutoff_len, p.batch_size,
                     p.gradient_accumulation_steps,
                     p.recomputation.empty() ? "" : ", recomputation " + p.recomputation);
}

std::vector<SweepPoint> grid_points(const ProfileSettings& s) {
  std::vector<SweepPoint> points;
  const std::vector<std::string> recomputations =
      s.recomputation.empty() ? std::vector<std::string>{""} : s.recomputation;
  for (int64_t cutoff : s.cutoff_len) {
    for (int64_t batch : s.per_device_train_batch_size) {
      for (int64_t accum : s.gradient_accumulation_steps) {
        for (const std::string& r : recomputations) points.push_back({batch, accum, cutoff, r});
      }
    }
  }
  return points;
}

const char* command_name(Command command) {
  static const char* const names[] = {"sweep", "plan", "explain", "reference"};  // Command's order
  return names[static_cast<int>(command)];
}

std::string command_summary(Command command) {
  switch (command) {
    case Command::kSweep:
      return "Usage: kiln-profile sweep [--config FILE] [--KEY VALUE ...]\n\n"
             "Measures speed, memory and MFU at every point of cutoff_len x per_device_train_batch_size x\n"
             "gradient_accumulation_steps (x recomputation; each a list), each point a short run of kiln-pretrain's\n"
             "step with the config's schedule, beside the FLOP, memory and traffic models. Launched by torchrun or\n"
             "srun, the step is data-parallel (rank 0 reports). KILN_MALLOC_TUNING=1 raises glibc's malloc\n"
             "thresholds.\n\n";
    case Command::kPlan:
      return "Usage: kiln-profile plan --model M --device_memory SIZE|NAME (--target_tokens N | --target_sequences N)"
             " [--KEY VALUE ...]\n\n"
             "The settings (micro-batch, accumulation, recomputation) that fit the device's memory at each\n"
             "cutoff_len, ranked by predicted speed, from the analytic models only (docs/performance.md).\n\n";
    case Command::kReference:
      return "Usage: kiln-profile reference [--json] [--output_dir DIR] [--KEY VALUE ...]\n\n"
             "Every row of the reference runs' data file with its measured speed, nvidia-smi memory and counters, the\n"
             "reference stack's prediction (LLaMA-Factory 0.9 on transformers 4.45: SDPA attention, gradient\n"
             "checkpointing, fp32 logits, foreach AdamW; host and device time; the caching allocator's segments,\n"
             "replayed tensor by tensor, and the CUDA context) and the ratio, and kiln's own prediction for the same\n"
             "work on the same GPU (docs/performance.md, \"The reference runs, predicted\"). Nothing runs.\n\n";
    case Command::kExplain:
      return "Usage: kiln-profile explain --model M --cutoff_len N --per_device_train_batch_size N [--KEY VALUE "
             "...]\n\n"
             "The modelled FLOPs and memory traffic of one step per component (kiln's and an unfused eager HF\n"
             "step's) against the roofline of a device of the table (device_memory), this GPU, or this CPU\n"
             "(device cpu): nothing runs (cost/traffic.h).\n\n";
  }
  return "";
}

config::Spelling command_spelling(Command) {
  config::Spelling s;
  s.kebab_case = true;
  s.aliases = {{"batch-size", "per_device_train_batch_size", std::nullopt},
               {"grad-accum", "gradient_accumulation_steps", std::nullopt},
               {"output", "output_dir", std::nullopt},
               {"trace", "trace_dir", std::nullopt},
               {"no-overlap", "ddp_overlap", "false"}};
  // Every subcommand's boolean keys stand alone, so that one given to another subcommand is
  // refused as such, not read as taking the next argument for its value.
  for (const Command c : kCommands) {
    for (const auto& keys : {config::boolean_keys(keys_of(own_table(), c)), config::boolean_keys(pretrain_keys(c))}) {
      for (const auto& k : keys) {
        if (!has(s.switches, k)) s.switches.push_back(k);
      }
    }
  }
  return s;
}

std::vector<config::KeyDoc> command_keys(Command command) {
  std::vector<config::KeyDoc> docs = config::key_docs(keys_of(own_table(), command));
  const size_t own = docs.size();
  for (const config::KeyDoc& doc : config::key_docs(pretrain_keys(command))) docs.push_back(doc);
  for (size_t i = 0; i < docs.size(); ++i) {
    if (const std::string line = help_line(command, docs[i].name); !line.empty()) docs[i].help = line;
    if (i >= own) docs[i].help += "; kiln-pretrain's key";
  }
  const std::vector<std::string> order = key_names(command);
  std::sort(docs.begin(), docs.end(), [&](const auto& a, const auto& b) {
    return std::find(order.begin(), order.end(), a.name) < std::find(order.begin(), order.end(), b.name);
  });
  return docs;
}

void check_command_keys(Command command, const Overrides& overrides) {
  const std::vector<std::string> own = key_names(command);
  for (const auto& [key, value] : overrides) {
    if (has(own, key)) continue;
    std::vector<std::string> others;
    for (const Command c : kCommands) {
      if (c != command && (has(key_names(c), key) || (key == "config" && c == Command::kSweep))) {
        others.push_back(command_name(c));
      }
    }
    if (others.empty()) {
      fail("command line", key, "unknown key (misspelled, or not supported by this version of kiln); " + hint(command));
    }
    std::string takers = others[0];
    for (size_t i = 1; i < others.size(); ++i) takers += (i + 1 == others.size() ? " and " : ", ") + others[i];
    fail("command line", key,
         fmt::format("not a key of kiln-profile {} (kiln-profile {} take{} it); {}", command_name(command), takers,
                     others.size() == 1 ? "s" : "", hint(command)));
  }
}

ProfileSettings read_settings(Command command, const std::string& path, const Overrides& overrides) {
  ProfileSettings s = defaults(command);
  auto read = [&](ConfigReader& r) {
    config::read_keys(r, s, keys_of(own_table(), command));
    config::read_keys(r, s.run, pretrain_keys(command));
    r.finish(hint(command));
  };
  if (!path.empty()) {
    ConfigReader file = ConfigReader::from_file(path);
    if (!file.has("model")) file.fail("model", "missing required key (expected a string)");
    read(file);
    s.source = path;
  }
  if (!overrides.empty() || path.empty()) {
    check_command_keys(command, overrides);
    ConfigReader cli = config::overrides_reader(overrides);
    read(cli);
    s.source = path.empty() ? "command line" : path + " + command line";
  }
  settle(s);
  return s;
}

train::PretrainConfig point_config(const ProfileSettings& s, const SweepPoint& p) {
  train::PretrainConfig t = s.run;
  t.cutoff_len = p.cutoff_len;
  t.per_device_train_batch_size = p.batch_size;
  t.gradient_accumulation_steps = p.gradient_accumulation_steps;
  if (!p.recomputation.empty()) {
    const train::RecomputationKeys keys = train::recomputation_keys(p.recomputation);
    t.gradient_checkpointing = keys.gradient_checkpointing;
    t.gradient_checkpointing_policy = keys.policy;
    t.gradient_checkpointing_every = keys.every;
  }
  // The steps a point runs: warmup, timed, counted, profiled and traced.
  t.max_steps = s.warmup + s.steps + (s.counters ? s.counted_steps() : 0) + (s.component_times ? s.steps : 0) +
                (s.trace_dir.empty() ? 0 : s.steps);
  return t;
}

namespace {

// The GPU of cost/hardware.h that device_memory names, which device cpu contradicts (explain's
// device_memory is a name; plan's may be a size instead: none).
std::optional<cost::HardwareSpec> named_gpu(const ProfileSettings& s) {
  if (s.device_memory.empty()) return std::nullopt;
  const bool plan = s.command == Command::kPlan;
  const std::optional<cost::HardwareSpec> gpu = cost::hardware_spec(s.device_memory);
  if (s.run.device == "cpu" && (gpu || !plan)) {
    fail(s.source, "device_memory",
         "'" + s.device_memory +
             (plan ? "' is a GPU but device is cpu: give the CPU's memory as a size (e.g. 64GB)"
                   : "' names a GPU, but device cpu models this CPU: give one of the two"));
  }
  if (!gpu && !plan)
    fail(s.source, "device_memory", fmt::format("'{}' is not a device name ({})", s.device_memory, device_names()));
  return gpu;
}

// The run at `point` as train::describe_run prices it for a job of world_size ranks on the
// described device (`gpu`: a GPU of the table; none: `device` decides).
cost::RunDescription described_run(const ProfileSettings& s, const model::LlamaConfig& model,
                                   const std::optional<cost::HardwareSpec>& gpu, const SweepPoint& point) {
  const train::PretrainConfig run = point_config(s, point);
  train::RunEnvironment env;
  env.dist.world_size = static_cast<int>(s.world_size);
  env.described = true;
  env.gpu = gpu;
  return train::describe_run(run, model, train::run_target(run, model, env).target);
}

}  // namespace

cost::PlanConfig plan_config(const ProfileSettings& s) {
  const std::optional<cost::HardwareSpec> gpu = named_gpu(s);
  cost::PlanConfig c;
  c.source = s.source;
  c.model = s.run.model;
  c.cutoff_lens = s.cutoff_len;
  c.kernels = s.run.kernels;
  c.target_tokens = s.target_tokens;
  c.target_sequences = s.target_sequences;
  c.mfu = s.mfu;
  c.peak_tflops = s.peak_tflops;
  // The run the planner varies (its batch, accumulation and recomputation are the planner's to
  // choose), at the plan's longest cutoff_len.
  const int64_t longest = *std::max_element(s.cutoff_len.begin(), s.cutoff_len.end());
  c.run = described_run(s, model::load_llama_config(s.run.model), gpu, {1, 1, longest});
  if (gpu) {
    c.device_memory_bytes = gpu->memory_bytes;
    c.device_name = gpu->name;
  } else if (!s.device_memory.empty()) {
    try {
      c.device_memory_bytes = cost::parse_bytes(s.device_memory, "key 'device_memory'");
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("{}: {}", s.source, e.what()));
    }
  } else if (c.run.cuda && torch::cuda::is_available()) {  // this machine's GPU
    c.device_memory_bytes = device::device_memory_bytes(at::Device(at::kCUDA, 0));
  } else {
    fail(s.source, "device_memory",
         fmt::format("missing: give the {} memory (e.g. 80GB) or a device name (e.g. H100-80GB){}",
                     c.run.cuda ? "GPU's" : "CPU's", c.run.cuda ? ": no GPU here to ask" : ""));
  }
  return c;
}

ExplainDevice explain_device(const ProfileSettings& s) {
  if (const auto gpu = named_gpu(s)) return {true, *gpu, gpu->source};
  at::Device here(at::kCPU);
  try {
    here = device::resolve(s.run.device);
  } catch (const std::invalid_argument& e) {
    fail(s.source, "device", fmt::format("{}: give device_memory with a device name ({})", e.what(), device_names()));
  }
  const cost::MachineHardware machine = cost::machine_hardware(here);
  if (!machine.spec && here.is_cuda()) {
    fail(s.source, "device_memory",
         fmt::format("this GPU ({}) is not in the device table: give device_memory with a device name ({})",
                     device::name(here), device_names()));
  }
  if (!machine.spec) fail(s.source, "device", "cpu: no theoretical CPU peak: " + machine.cpu_peak_missing);
  return {here.is_cuda(), *machine.spec, machine.bandwidth_source};
}

cost::RunDescription explain_run(const ProfileSettings& s, const model::LlamaConfig& model,
                                 const ExplainDevice& device) {
  return described_run(s, model, device.cuda ? std::optional(device.hardware) : std::nullopt,
                       {s.per_device_train_batch_size[0], s.gradient_accumulation_steps[0], s.cutoff_len[0]});
}

}  // namespace kiln::profile
