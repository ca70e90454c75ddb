// See command_keys.h. Each subcommand's table is the one list of its keys: the readers, the
// --help text and the check that refuses another subcommand's key all walk it.
#include "kiln/profile/command_keys.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include "kiln/common/device.h"
#include "kiln/cost/cpu_peak.h"
#include "kiln/cost/memory.h"
#include "kiln/optim/schedule.h"
#include "kiln/train/kernel_choices.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/pretrain_keys.h"
#include "kiln/train/recomputation.h"
#include "kiln/train/run_description.h"

namespace kiln::profile {

using config::ConfigError;
using config::ConfigReader;
using config::KeyTable;

namespace {

const char* const kModelHelp =
    "model preset (tiny, llama-100m, llama-3.2-1b), model YAML, or an HF folder or its config.json";
const char* const kKernelsHelp =
    "ops backends, as kiln-pretrain's key: kiln,attention=aten (default: kiln's kernels, SDPA's attention), kiln "
    "(every op, kiln's flash attention too), aten, or per op, e.g. kiln,linear_ce=aten";
const char* const kDtypeHelp = "bf16 | fp16 | fp32 compute (parameters stay fp32); default bf16";
const char* const kCheckpointingHelp = "recompute each layer in backward (kiln-pretrain's key)";
const char* const kEveryHelp =
    "with gradient_checkpointing: recompute layers 0, n, 2n, ... only (n >= 2: every_n; kiln-pretrain's key)";
const char* const kPolicyHelp =
    "full, every_n (n: gradient_checkpointing_every, default 2) or selective (keep matmul outputs, recompute "
    "RMSNorm/SwiGLU); left out: every_n when gradient_checkpointing_every >= 2, else full. Implies "
    "gradient_checkpointing unless that is given";
// The device names of cost/hardware.h, "V100-16GB, ...".
std::string device_names() {
  std::string names;
  for (const auto& spec : cost::hardware_specs()) names += (names.empty() ? "" : ", ") + spec.name;
  return names;
}

const KeyTable<SweepConfig>& sweep_table() {
  using S = SweepConfig;
  static const KeyTable<S> table = {
      {"model", &S::model, kModelHelp},
      {"cutoff_len", &S::cutoff_lens, "cutoff_len values (--cutoff-len)"},
      {"per_device_train_batch_size", &S::batch_sizes, "per-device batch sizes (--batch-size)"},
      {"gradient_accumulation_steps", &S::grad_accums, "gradient accumulation steps (--grad-accum)"},
      {"dtype", &S::dtype, kDtypeHelp},
      {"kernels", &S::kernels, kKernelsHelp},
      {"steps", &S::steps, "timed steps per point (default 3)"},
      {"warmup", &S::warmup, "untimed steps before them (default 1)"},
      {"device", &S::device, "auto | cpu | cuda (auto: the GPU if there is one, else the CPU)"},
      {"dataset_dir", &S::dataset_dir, "token shards (default: synthetic random ids)"},
      {"seed", &S::seed, "the model's initialisation (the synthetic ids draw from seed + 1); default 42"},
      {"gradient_checkpointing", &S::gradient_checkpointing, kCheckpointingHelp},
      {"gradient_checkpointing_every", &S::gradient_checkpointing_every, kEveryHelp},
      {"gradient_checkpointing_policy", &S::gradient_checkpointing_policy, kPolicyHelp},
      {"peak_tflops", &S::peak_tflops, "peak TFLOP/s for MFU instead of the device table or the CPU's peak"},
      {"memory_cap_bytes", &S::memory_cap_bytes, "fail allocations past this many bytes as out-of-memory"},
      {"format", &S::formats, "md,csv,json,html (default: all four)"},
      {"output_dir", &S::output_dir,
       "directory for profile.{md,csv,json,html} (with csv also profile_components.csv); default profile "
       "(--output)"},
      {"trace_dir", &S::trace_dir,
       "after each point's timed steps, profile as many more (LibTorch's Kineto profiler, not timed) and write "
       "DIR/trace_T<cutoff>_B<batch>_A<accum>.json (Chrome trace: Perfetto; bench_vs_hf.py --op-profile sums it "
       "per op) (--trace)"},
      {"task", &S::task, "the table's task column (default pretrain)"},
      {"zero_stage", &S::zero_stage, "under torchrun/srun: ZeRO stage 0, 1 or 2 of the data-parallel step"},
      {"ddp_bucket_cap_mb", &S::ddp_bucket_cap_mb, "under torchrun/srun: gradient bucket size (MB), default 25"},
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
  };
  return table;
}

// The step's optimisation keys, read into SweepConfig::training through kiln-pretrain's own table.
const KeyTable<train::PretrainConfig>& training_table() {
  static const KeyTable<train::PretrainConfig> table =
      config::select_keys(train::pretrain_key_table(),
                          {"learning_rate", "lr_scheduler_type", "warmup_ratio", "warmup_steps", "min_lr_ratio",
                           "decay_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm"});
  return table;
}

const KeyTable<PlanSettings>& plan_table() {
  using P = PlanSettings;
  static const KeyTable<P> table = {
      {"model", &P::model, kModelHelp},
      {"cutoff_len", &P::cutoff_lens, "cutoff_len values to plan for (default 1024)"},
      {"dtype", &P::dtype, kDtypeHelp},
      {"kernels", &P::kernels, kKernelsHelp},
      {"device", &P::device,
       "the device planned for: cpu, cuda, or auto (default): a GPU when device_memory names one, else this "
       "machine's device"},
      {"device_memory", &P::device_memory,
       "the device's memory (80GB, 16GiB, ...) or a device name: " + device_names() + " (default: this GPU's)"},
      {"target_tokens", &P::target_tokens, "global batch per optimizer step, in tokens"},
      {"target_sequences", &P::target_sequences, "global batch per optimizer step, in sequences (or target_tokens)"},
      {"world_size", &P::world_size, "data-parallel ranks (default 1)"},
      {"zero_stage", &P::zero_stage, "ZeRO stage 0, 1 or 2 (with world_size > 1)"},
      {"ddp_bucket_cap_mb", &P::ddp_bucket_cap_mb, "gradient bucket size (MB), default 25"},
      {"mfu", &P::mfu, "assumed MFU for the predicted tokens/s (default 0.4)"},
      {"peak_tflops", &P::peak_tflops, "peak TFLOP/s instead of the device table's"},
      {"format", &P::formats, "md,csv,json,html (default: all four)"},
      {"output_dir", &P::output_dir, "directory for plan.{md,csv,json,html}; default profile (--output)"},
  };
  return table;
}

const KeyTable<ExplainSettings>& explain_table() {
  using E = ExplainSettings;
  static const KeyTable<E> table = {
      {"model", &E::model, kModelHelp},
      {"cutoff_len", &E::cutoff_len, "tokens per sequence (one value; required)"},
      {"per_device_train_batch_size", &E::per_device_train_batch_size,
       "sequences per micro-batch (one value; required) (--batch-size)"},
      {"gradient_accumulation_steps", &E::gradient_accumulation_steps,
       "micro-batches per optimizer step (default 1) (--grad-accum)"},
      {"dtype", &E::dtype, kDtypeHelp},
      {"kernels", &E::kernels, kKernelsHelp},
      {"device", &E::device,
       "cpu: this CPU's theoretical peaks and measured copy bandwidth; cuda: the GPU device_memory names, else "
       "this one; auto (default): device_memory's GPU, else this machine's device"},
      {"device_memory", &E::device_memory, "a device name: " + device_names()},
      {"world_size", &E::world_size, "data-parallel ranks (default 1)"},
      {"zero_stage", &E::zero_stage, "ZeRO stage 0, 1 or 2 (with world_size > 1)"},
      {"peak_tflops", &E::peak_tflops, "the roofline's GEMM TFLOP/s instead of the device table's"},
      {"step_seconds", &E::step_seconds,
       "a measured step time: prints the modelled memory bandwidth, tensor core and fp engine use at it"},
      {"json", &E::json, "print the per-component rows and totals as JSON instead of Markdown"},
      {"gradient_checkpointing", &E::gradient_checkpointing, kCheckpointingHelp},
      {"gradient_checkpointing_every", &E::gradient_checkpointing_every, kEveryHelp},
      {"gradient_checkpointing_policy", &E::gradient_checkpointing_policy, kPolicyHelp},
  };
  return table;
}

const KeyTable<ReferenceSettings>& reference_table() {
  using R = ReferenceSettings;
  static const KeyTable<R> table = {
      {"data", &R::data,
       "the reference runs' figures (default: configs/reference/llamafactory_runs.yaml, compiled in)"},
      {"host_costs", &R::host_costs,
       "the host costs per op and per step (default: configs/reference/host_costs.yaml, compiled in)"},
      {"json", &R::json, "print the rows as JSON instead of Markdown"},
      {"format", &R::formats, "md,json,html (default: all three; files only with output_dir)"},
      {"output_dir", &R::output_dir, "directory for reference.{md,json,html}; default none (--output)"},
  };
  return table;
}

std::vector<std::string> names(Command command) {
  std::vector<std::string> out;
  for (const auto& doc : command_keys(command)) out.push_back(doc.name);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string hint(Command command) {
  return fmt::format("kiln-profile {} --help lists its keys", command_name(command));
}

// kiln-profile's one rule beside kiln-pretrain's: a recomputation policy implies
// gradient_checkpointing unless that key is given (given false beside a policy stays a contradiction).
template <class C>
void imply_checkpointing(C& c, bool checkpointing_given) {
  if (!c.gradient_checkpointing_policy.empty() && !checkpointing_given) c.gradient_checkpointing = true;
}

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& problem) {
  throw ConfigError(config::config_message(source, key, problem));
}

void check_device(const std::string& source, const std::string& spec) {
  try {
    device::check_spec(spec);
  } catch (const std::invalid_argument& e) {
    fail(source, "device", e.what());
  }
}

}  // namespace

const char* command_name(Command command) {
  switch (command) {
    case Command::kSweep:
      return "sweep";
    case Command::kPlan:
      return "plan";
    case Command::kExplain:
      return "explain";
    case Command::kReference:
      return "reference";
  }
  return "?";
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
  for (const auto& keys : {config::boolean_keys(sweep_table()), config::boolean_keys(explain_table()),
                           config::boolean_keys(reference_table())}) {
    s.switches.insert(s.switches.end(), keys.begin(), keys.end());
  }
  return s;
}

std::vector<config::KeyDoc> command_keys(Command command) {
  switch (command) {
    case Command::kSweep: {
      // The optimisation keys: kiln-pretrain's, with its defaults (docs/training.md).
      const train::PretrainConfig d;
      const std::vector<std::pair<std::string, std::string>> help = {
          {"learning_rate", fmt::format("AdamW's peak learning rate (default {:g})", d.learning_rate)},
          {"lr_scheduler_type", fmt::format("{} over the point's steps, with HF's default arguments "
                                            "(kiln-pretrain also takes lr_scheduler_kwargs) (default {})",
                                            fmt::join(optim::schedule_types(), ", "), d.lr_scheduler_type)},
          {"warmup_ratio", fmt::format("warmup share of the point's steps (default {:g})", d.warmup_ratio)},
          {"warmup_steps", fmt::format("warmup steps, or below 1 a share of the point's steps; a warmup_ratio > 0 "
                                       "replaces it, as in transformers 5.6 (default {})",
                                       d.warmup_steps)},
          {"min_lr_ratio", fmt::format("floor of cosine and warmup_stable_decay (default {:g})", d.min_lr_ratio)},
          {"decay_ratio",
           "> 0: warmup_stable_decay decays over this share of the steps (default 0: "
           "LLaMA-Factory's split, or lr_scheduler_kwargs' step counts)"},
          {"weight_decay", fmt::format("AdamW's weight decay (default {:g})", d.weight_decay)},
          {"adam_beta1", fmt::format("AdamW's beta1 (default {:g})", d.adam_beta1)},
          {"adam_beta2", fmt::format("AdamW's beta2 (default {:g})", d.adam_beta2)},
          {"adam_epsilon", fmt::format("AdamW's epsilon (default {:g})", d.adam_epsilon)},
          {"max_grad_norm", fmt::format("gradient clipping norm, 0 = none (default {:g})", d.max_grad_norm)},
      };
      auto docs = config::key_docs(sweep_table());
      for (auto doc : config::key_docs(training_table())) {
        for (const auto& [key, line] : help) {
          if (key == doc.name) doc.help = line + "; kiln-pretrain's key";
        }
        docs.push_back(doc);
      }
      return docs;
    }
    case Command::kPlan:
      return config::key_docs(plan_table());
    case Command::kExplain:
      return config::key_docs(explain_table());
    case Command::kReference:
      return config::key_docs(reference_table());
  }
  return {};
}

void check_command_keys(Command command, const Overrides& overrides) {
  const std::vector<std::string> own = names(command);
  for (const auto& [key, value] : overrides) {
    if (has(own, key)) continue;
    std::vector<std::string> others;
    for (const Command c : {Command::kSweep, Command::kPlan, Command::kExplain, Command::kReference}) {
      if (c != command && (has(names(c), key) || (key == "config" && c == Command::kSweep))) {
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

SweepConfig load_sweep_config(const std::string& path, const Overrides& overrides) {
  SweepConfig c;
  bool checkpointing_given = false;
  auto read = [&](ConfigReader& r) {
    config::read_keys(r, c, sweep_table());
    config::read_keys(r, c.training, training_table());
    checkpointing_given = checkpointing_given || r.has("gradient_checkpointing");
    r.finish(hint(Command::kSweep));
  };
  if (!path.empty()) {
    ConfigReader file = ConfigReader::from_file(path);
    if (!file.has("model")) file.fail("model", "missing required key (expected a string)");
    read(file);
    c.source = path;
  }
  if (!overrides.empty()) {
    check_command_keys(Command::kSweep, overrides);
    ConfigReader cli = config::overrides_reader(overrides);
    read(cli);
    c.source = path.empty() ? "command line" : path + " + command line";
  }
  if (c.counters_per_kernel || c.counter_phases) c.counters = true;
  imply_checkpointing(c, checkpointing_given);
  c.validate();
  return c;
}

PlanSettings read_plan_settings(const Overrides& overrides) {
  check_command_keys(Command::kPlan, overrides);
  PlanSettings s;
  ConfigReader r = config::overrides_reader(overrides);
  config::read_keys(r, s, plan_table());
  r.finish(hint(Command::kPlan));
  check_device(s.source, s.device);
  if (s.model.empty()) fail(s.source, "model", "missing: give --model (a preset, a model YAML or an HF folder)");
  return s;
}

cost::PlanConfig plan_config(const PlanSettings& s) {
  cost::PlanConfig c;
  c.source = s.source;
  c.model = s.model;
  c.cutoff_lens = s.cutoff_lens;
  c.kernels = s.kernels;
  check_device(s.source, s.device);
  if (s.dtype != "bf16" && s.dtype != "fp16" && s.dtype != "fp32")
    fail(s.source, "dtype", fmt::format("'{}' is not bf16, fp16 or fp32", s.dtype));
  if (s.world_size == 1 && s.zero_stage > 0) fail(s.source, "zero_stage", "ZeRO needs a world size above 1");
  const std::optional<cost::HardwareSpec> named =
      s.device_memory.empty() ? std::nullopt : cost::hardware_spec(s.device_memory);
  if (named && s.device == "cpu") {
    fail(s.source, "device_memory",
         fmt::format("'{}' is a GPU but device is cpu: give the CPU's memory as a size (e.g. 64GB)", s.device_memory));
  }
  train::RunTarget target;
  target.cuda = s.device == "cuda" || (s.device == "auto" && (named || device::resolve("auto").is_cuda()));
  if (target.cuda) target.hardware = named;
  target.world_size = static_cast<int>(s.world_size);
  target.data_parallel = s.world_size > 1;
  if (named) {
    c.device_memory_bytes = named->memory_bytes;
    c.device_name = named->name;
  } else if (!s.device_memory.empty()) {
    try {
      c.device_memory_bytes = cost::parse_bytes(s.device_memory, fmt::format("key 'device_memory'"));
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("{}: {}", s.source, e.what()));
    }
  } else if (target.cuda && torch::cuda::is_available()) {
    c.device_memory_bytes = device::device_memory_bytes(at::Device(at::kCUDA, 0));
  } else {
    fail(s.source, "device_memory",
         fmt::format("missing: give the {} memory (e.g. 80GB) or a device name (e.g. H100-80GB){}",
                     target.cuda ? "GPU's" : "CPU's", target.cuda ? ": no GPU here to ask" : ""));
  }
  c.target_tokens = s.target_tokens;
  c.target_sequences = s.target_sequences;
  c.mfu = s.mfu;
  c.peak_tflops = s.peak_tflops;
  // The run the planner varies: the plan's keys as kiln-pretrain's (its batch, accumulation and
  // recomputation are the planner's to choose).
  train::PretrainConfig t;
  t.source = s.source;
  train::set_compute_dtype(t, s.dtype);
  t.kernels = s.kernels;
  t.zero_stage = s.zero_stage;
  t.ddp_bucket_cap_mb = s.ddp_bucket_cap_mb;
  c.run = train::describe_run(t, model::load_llama_config(s.model), target);
  return c;
}

ExplainSettings read_explain_settings(const Overrides& overrides) {
  check_command_keys(Command::kExplain, overrides);
  ExplainSettings s;
  ConfigReader r = config::overrides_reader(overrides);
  config::read_keys(r, s, explain_table());
  const bool checkpointing_given = r.has("gradient_checkpointing");
  r.finish(hint(Command::kExplain));
  check_device(s.source, s.device);
  if (s.model.empty()) fail(s.source, "model", "missing: give --model (a preset, a model YAML or an HF folder)");
  if (s.cutoff_len <= 0) fail(s.source, "cutoff_len", "missing or not positive: give --cutoff_len (one value)");
  if (s.per_device_train_batch_size <= 0) {
    fail(s.source, "per_device_train_batch_size",
         "missing or not positive: give --per_device_train_batch_size (--batch-size, one value)");
  }
  if (s.gradient_accumulation_steps <= 0) {
    fail(s.source, "gradient_accumulation_steps", fmt::format("{} is not positive", s.gradient_accumulation_steps));
  }
  if (s.step_seconds < 0) fail(s.source, "step_seconds", fmt::format("{} is negative", s.step_seconds));
  if (s.peak_tflops < 0) fail(s.source, "peak_tflops", fmt::format("{} is negative", s.peak_tflops));
  imply_checkpointing(s, checkpointing_given);
  // kiln-pretrain's and the sweep's rule (train/recomputation.h): explain models what they run.
  if (const auto problem = train::recomputation_problem(s.gradient_checkpointing, s.gradient_checkpointing_policy,
                                                        s.gradient_checkpointing_every)) {
    fail(s.source, problem->first, problem->second);
  }
  return s;
}

ReferenceSettings read_reference_settings(const Overrides& overrides) {
  check_command_keys(Command::kReference, overrides);
  ReferenceSettings s;
  ConfigReader r = config::overrides_reader(overrides);
  config::read_keys(r, s, reference_table());
  r.finish(hint(Command::kReference));
  for (const std::string& f : s.formats) {
    if (f != "md" && f != "json" && f != "html")
      fail(s.source, "format", fmt::format("'{}' is not md, json or html", f));
  }
  return s;
}

ExplainDevice explain_device(const ExplainSettings& s) {
  check_device(s.source, s.device);
  ExplainDevice out;
  if (!s.device_memory.empty()) {
    if (s.device == "cpu") {
      fail(s.source, "device_memory",
           fmt::format("'{}' names a GPU, but device cpu models this CPU: give one of the two", s.device_memory));
    }
    const auto named = cost::hardware_spec(s.device_memory);
    if (!named)
      fail(s.source, "device_memory", fmt::format("'{}' is not a device name ({})", s.device_memory, device_names()));
    out.cuda = true;
    out.hardware = *named;
    out.bandwidth_source = named->source;
    return out;
  }
  at::Device here(at::kCPU);
  try {
    here = device::resolve(s.device);
  } catch (const std::invalid_argument& e) {
    fail(s.source, "device", fmt::format("{}: give device_memory with a device name ({})", e.what(), device_names()));
  }
  if (here.is_cuda()) {
    const auto spec = cost::hardware_for_device_name(device::name(here), device::device_memory_bytes(here));
    if (!spec) {
      fail(s.source, "device_memory",
           fmt::format("this GPU ({}) is not in the device table: give device_memory with a device name ({})",
                       device::name(here), device_names()));
    }
    out.cuda = true;
    out.hardware = *spec;
    out.bandwidth_source = spec->source;
    return out;
  }
  std::string why;
  const auto peak = cost::this_cpu_peak(&why);
  if (!peak) fail(s.source, "device", "cpu: no theoretical CPU peak: " + why);
  const double bandwidth = device::measure_cpu_copy_bandwidth();
  out.hardware = cost::cpu_hardware_spec(*peak, bandwidth, device::device_memory_bytes(at::Device(at::kCPU)));
  out.bandwidth_source = fmt::format("measured: STREAM-like copy of 64 MiB fp32, {:.1f} GB/s", bandwidth / 1e9);
  return out;
}

cost::RunDescription explain_run(const ExplainSettings& s, const model::LlamaConfig& model,
                                 const ExplainDevice& device) {
  train::PretrainConfig t;
  t.source = s.source;
  train::set_compute_dtype(t, s.dtype);
  t.kernels = s.kernels;
  t.cutoff_len = s.cutoff_len;
  t.per_device_train_batch_size = s.per_device_train_batch_size;
  t.gradient_accumulation_steps = s.gradient_accumulation_steps;
  t.gradient_checkpointing = s.gradient_checkpointing;
  t.gradient_checkpointing_policy = s.gradient_checkpointing_policy;
  t.gradient_checkpointing_every = s.gradient_checkpointing_every;
  t.zero_stage = s.zero_stage;
  train::RunTarget target;
  target.cuda = device.cuda;
  if (device.cuda) target.hardware = device.hardware;
  target.world_size = static_cast<int>(s.world_size);
  target.data_parallel = s.world_size > 1;
  return train::describe_run(t, model, target);
}

}  // namespace kiln::profile
