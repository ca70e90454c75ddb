// One table maps each key to its field (config/key_table.h, train/pretrain_keys.h), so the YAML
// reader, the command-line overrides and the --help key list can never disagree about which keys exist.
#include "kiln/train/pretrain_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/common/device.h"
#include "kiln/common/logger.h"
#include "kiln/config/yaml.h"
#include "kiln/data/mixture.h"
#include "kiln/model/presets.h"
#include "kiln/ops/dispatch.h"
#include "kiln/optim/schedule.h"
#include "kiln/train/hf/lf_keys.h"
#include "kiln/train/hf/lf_template.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/pretrain_keys.h"
#include "kiln/train/recomputation.h"

namespace kiln::train {

using config::ConfigError;
using config::ConfigReader;

const config::KeyTable<PretrainConfig>& pretrain_key_table() {
  using C = PretrainConfig;
  const PretrainConfig d;  // the defaults the help lines name
  static const config::KeyTable<PretrainConfig> table = {
      {"model", &C::model,
       "model preset (tiny, llama-100m, llama-3.2-1b), model YAML, or an HF folder or its config.json"},
      {"model_name_or_path", &C::model_name_or_path},
      {"train_from_scratch", &C::train_from_scratch},
      {"dataset_dir", &C::dataset_dir},
      {"dataset", &C::dataset},
      {"tokenized_path", &C::tokenized_path},
      {"max_samples", &C::max_samples},
      {"overwrite_cache", &C::overwrite_cache},
      {"cutoff_len", &C::cutoff_len},
      {"val_size", &C::val_size},
      {"packing", &C::packing},
      {"preprocessing_batch_size", &C::preprocessing_batch_size},
      {"preprocessing_num_workers", &C::preprocessing_num_workers},
      {"streaming", &C::streaming},
      {"buffer_size", &C::buffer_size},
      {"dataloader_num_workers", &C::dataloader_num_workers},
      {"mix_strategy", &C::mix_strategy},
      {"interleave_probs", &C::interleave_probs},
      {"template", &C::template_name},
      {"eval_dataset", &C::eval_dataset},
      {"eval_on_each_dataset", &C::eval_on_each_dataset},
      {"per_device_train_batch_size", &C::per_device_train_batch_size},
      {"per_device_eval_batch_size", &C::per_device_eval_batch_size},
      {"gradient_accumulation_steps", &C::gradient_accumulation_steps},
      {"num_train_epochs", &C::num_train_epochs},
      {"max_steps", &C::max_steps},
      {"learning_rate", &C::learning_rate, fmt::format("AdamW's peak learning rate (default {:g})", d.learning_rate)},
      {"lr_scheduler_type", &C::lr_scheduler_type,
       fmt::format("{} over the run's steps, with HF's default arguments (default {})",
                   fmt::join(optim::schedule_types(), ", "), d.lr_scheduler_type)},
      {"warmup_ratio", &C::warmup_ratio, fmt::format("warmup share of the steps (default {:g})", d.warmup_ratio)},
      {"warmup_steps", &C::warmup_steps,
       fmt::format("warmup steps, or below 1 a share of the steps; a warmup_ratio > 0 replaces it, as in "
                   "transformers 5.6 (default {:g})",
                   d.warmup_steps)},
      {"min_lr_ratio", &C::min_lr_ratio,
       fmt::format("floor of cosine and warmup_stable_decay (default {:g})", d.min_lr_ratio)},
      {"decay_ratio", &C::decay_ratio,
       "> 0: warmup_stable_decay decays over this share of the steps (default 0: LLaMA-Factory's split, or "
       "lr_scheduler_kwargs' step counts)"},
      {"weight_decay", &C::weight_decay, fmt::format("AdamW's weight decay (default {:g})", d.weight_decay)},
      {"adam_beta1", &C::adam_beta1, fmt::format("AdamW's beta1 (default {:g})", d.adam_beta1)},
      {"adam_beta2", &C::adam_beta2, fmt::format("AdamW's beta2 (default {:g})", d.adam_beta2)},
      {"adam_epsilon", &C::adam_epsilon, fmt::format("AdamW's epsilon (default {:g})", d.adam_epsilon)},
      {"max_grad_norm", &C::max_grad_norm,
       fmt::format("gradient clipping norm, 0 = none (default {:g})", d.max_grad_norm)},
      {"bf16", &C::bf16},
      {"fp16", &C::fp16},
      {"gradient_checkpointing", &C::gradient_checkpointing, "recompute each layer in backward"},
      {"gradient_checkpointing_policy", &C::gradient_checkpointing_policy,
       "with gradient_checkpointing: full, every_n (n: gradient_checkpointing_every, default 2) or selective "
       "(keep matmul outputs, recompute RMSNorm/SwiGLU); left out: every_n when gradient_checkpointing_every >= 2, "
       "else "
       "full"},
      {"gradient_checkpointing_every", &C::gradient_checkpointing_every,
       "with gradient_checkpointing: recompute layers 0, n, 2n, ... only (n >= 2: every_n)"},
      {"auto_fit", &C::auto_fit},
      {"auto_fit_memory", &C::auto_fit_memory},
      {"device", &C::device, "auto | cpu | cuda (auto: the GPU if there is one, else the CPU)"},
      {"kernels", &C::kernels,
       "ops backends: kiln,attention=aten (default: kiln's kernels, SDPA's attention), kiln (every op, kiln's flash "
       "attention too), aten, or per op, e.g. kiln,linear_ce=aten"},
      {"nan_policy", &C::nan_policy},
      {"full_determinism", &C::full_determinism},
      {"neat_packing", &C::neat_packing},
      {"seed", &C::seed},
      {"data_seed", &C::data_seed},
      {"logging_steps", &C::logging_steps},
      {"save_steps", &C::save_steps},
      {"save_total_limit", &C::save_total_limit},
      {"eval_steps", &C::eval_steps},
      {"output_dir", &C::output_dir},
      {"overwrite_output_dir", &C::overwrite_output_dir},
      {"resume_from_checkpoint", &C::resume_from_checkpoint},
      {"plot_loss", &C::plot_loss},
      {"logging_dir", &C::logging_dir},
      {"ddp_timeout", &C::ddp_timeout},
      {"ddp_bucket_cap_mb", &C::ddp_bucket_cap_mb, "under torchrun/srun: gradient bucket size (MB), default 25"},
      {"zero_stage", &C::zero_stage, "under torchrun/srun: ZeRO stage 0, 1 or 2 of the data-parallel step"},
      {"deepspeed", &C::deepspeed},
  };
  return table;
}

namespace {

// An integer as YAML writes it ("20", not "20.0" or "2e1"): LLaMA-Factory hands val_size to
// datasets as the Python int or float the YAML parser produced, and datasets reads an int as a
// count of documents.
bool integer_text(const std::string& text) {
  const size_t start = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  return text.size() > start && text.find_first_not_of("0123456789", start) == std::string::npos;
}

void read_fields(ConfigReader& r, PretrainConfig& c) {
  if (r.has("val_size")) {
    if (const auto text = r.read_text("val_size")) c.val_size_is_count = integer_text(*text);
  }
  if (r.has("warmup_ratio") && !r.is_null("warmup_ratio")) c.warmup_ratio_given = true;
  for (const char* key : {"dataset", "eval_dataset", "interleave_probs"}) r.join_list(key);
  config::read_keys(r, c, pretrain_key_table());
  std::transform(c.packing.begin(), c.packing.end(), c.packing.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  read_lf_keys(r, c);  // LLaMA-Factory / HF keys without a field: acted on, accepted or refused
  r.finish();
}

// What the reading leaves to be settled once every source is read (the file, then the command
// line), as LLaMA-Factory settles its merged arguments: the recomputation of an LLaMA-Factory YAML.
// Returns the info lines that say what was decided and why.
std::vector<std::string> settle(PretrainConfig& c) {
  std::vector<std::string> notes;
  // LLaMA-Factory recomputes unless disable_gradient_checkpointing: true (its default false;
  // model/model_utils/checkpointing.py:164), and HF's gradient_checkpointing: true turns it on
  // too (transformers trainer.py:1378), so a false there does not turn it off.
  if ((c.llamafactory_data() || c.disable_gradient_checkpointing >= 0) && c.disable_gradient_checkpointing != 1 &&
      !c.gradient_checkpointing) {
    c.gradient_checkpointing = true;
    if (!c.auto_fit) {
      // The policy's name when the keys agree (validate() reports a contradiction).
      const bool valid = !recomputation_problem(true, c.gradient_checkpointing_policy, c.gradient_checkpointing_every);
      notes.push_back(fmt::format(
          "gradient checkpointing on{}: LLaMA-Factory's default for this YAML (disable_gradient_checkpointing: {}); "
          "disable_gradient_checkpointing: true turns it off",
          valid
              ? fmt::format(
                    " (recomputation {})",
                    resolve_recomputation(true, c.gradient_checkpointing_policy, c.gradient_checkpointing_every).name())
              : "",
          c.disable_gradient_checkpointing == 0 ? "false" : "false by default"));
    }
  }
  if (c.neat_packing) {
    notes.push_back(
        "neat_packing: true is kiln's extension at stage pt: LLaMA-Factory 0.9.5 refuses it (\"`neat_packing` "
        "cannot be set as True except SFT.\", hparams/parser.py:320-321)");
  }
  return notes;
}

}  // namespace

double PretrainConfig::hf_warmup_steps() const {
  return warmup_ratio_given || warmup_ratio > 0 ? warmup_ratio : warmup_steps;
}

int64_t resolve_steps(double value, int64_t total_steps) {
  if (value >= 1) return static_cast<int64_t>(value);
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * value));
}

const std::vector<std::string>& pretrain_config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& key : pretrain_key_table()) k.push_back(key.name);
    return k;
  }();
  return keys;
}

void PretrainConfig::validate() const {
  auto fail = [&](const std::string& key, const std::string& problem) {
    throw ConfigError(config::config_message(source, key, problem));
  };
  auto at_least = [&](const char* key, int64_t v, int64_t lo) {
    if (v < lo) fail(key, fmt::format("must be >= {}, got {}", lo, v));
  };
  auto in_range = [&](const char* key, double v, double lo, double hi, bool hi_open) {
    if (!(v >= lo && (hi_open ? v < hi : v <= hi))) {
      fail(key, fmt::format("must be in [{}, {}{}, got {}", lo, hi, hi_open ? ")" : "]", v));
    }
  };
  if (model.empty() == model_name_or_path.empty()) {
    fail(model.empty() ? "model" : "model_name_or_path",
         "give exactly one of 'model' (preset or model YAML) and 'model_name_or_path' (HF directory)");
  }
  at_least("cutoff_len", cutoff_len, 1);
  at_least("per_device_train_batch_size", per_device_train_batch_size, 1);
  at_least("per_device_eval_batch_size", per_device_eval_batch_size, 1);
  at_least("gradient_accumulation_steps", gradient_accumulation_steps, 1);
  if (max_steps <= 0 && !(num_train_epochs > 0)) {
    fail("num_train_epochs", fmt::format("must be > 0 when max_steps is not set, got {}", num_train_epochs));
  }
  if (!(learning_rate > 0)) fail("learning_rate", fmt::format("must be > 0, got {}", learning_rate));
  try {
    optim::ScheduleConfig schedule{.type = lr_scheduler_type,
                                   .min_lr_ratio = min_lr_ratio,
                                   .decay_ratio = decay_ratio,
                                   .initial_lr = learning_rate,
                                   .kwargs = lr_scheduler_kwargs};
    optim::check_schedule(schedule);
  } catch (const optim::ScheduleError& e) {
    fail(e.key, e.what());
  }
  in_range("warmup_ratio", warmup_ratio, 0, 1, true);
  if (!(warmup_steps >= 0))
    fail("warmup_steps", fmt::format("must be >= 0 (a count, or below 1 a share of the steps), got {}", warmup_steps));
  in_range("min_lr_ratio", min_lr_ratio, 0, 1, false);
  in_range("decay_ratio", decay_ratio, 0, 1, false);
  if (!(weight_decay >= 0)) fail("weight_decay", fmt::format("must be >= 0, got {}", weight_decay));
  in_range("adam_beta1", adam_beta1, 0, 1, true);
  in_range("adam_beta2", adam_beta2, 0, 1, true);
  if (!(adam_epsilon > 0)) fail("adam_epsilon", fmt::format("must be > 0, got {}", adam_epsilon));
  if (!(max_grad_norm >= 0))
    fail("max_grad_norm", fmt::format("must be >= 0 (0 = no clipping), got {}", max_grad_norm));
  if (bf16 && fp16) fail("fp16", "bf16 and fp16 are both true; choose one");
  try {
    device::check_spec(device);
  } catch (const std::invalid_argument& e) {
    fail("device", e.what());
  }
  try {
    ops::validate_backends(kernels);
  } catch (const std::invalid_argument& e) {
    fail("kernels", e.what());
  }
  if (nan_policy != "stop" && nan_policy != "skip") {
    fail("nan_policy", fmt::format("must be stop or skip, got '{}'", nan_policy));
  }
  if (llamafactory_data()) {
    // LLaMA-Factory: int(val_size) above 1; datasets refuses a float test_size of 1.0.
    // (Streaming takes int(val_size) documents, 1.0 included: data_utils.py:110-112.)
    if (!(val_size >= 0) || (val_size == 1 && !val_size_is_count && !streaming)) {
      fail("val_size", fmt::format("must be a fraction in (0, 1) or a number of documents written as an integer "
                                   "(e.g. 1 or 200), got {}{}",
                                   val_size, val_size == 1 ? ".0 (datasets refuses test_size=1.0)" : ""));
    }
  } else if (!(val_size >= 0) || (val_size >= 1 && val_size != static_cast<double>(static_cast<int64_t>(val_size)))) {
    fail("val_size", fmt::format("must be a fraction in [0, 1) or a whole number of blocks, got {}", val_size));
  }
  if (packing != "" && packing != "true" && packing != "false") {
    fail("packing", fmt::format("must be true or false, got '{}'", packing));
  }
  if (!llamafactory_data() && packing == "false") {
    fail("packing",
         "a shard folder is always packed into cutoff_len blocks; packing: false (one truncated document per "
         "example) applies to LLaMA-Factory datasets named with dataset");
  }
  if (llamafactory_data() && packing == "true" && cutoff_len < 3) {
    fail("cutoff_len", fmt::format("packing: true trains on blocks of cutoff_len - 1 tokens (as LLaMA-Factory); "
                                   "cutoff_len {} leaves fewer than 2",
                                   cutoff_len));
  }
  at_least("preprocessing_batch_size", preprocessing_batch_size, 1);
  at_least("preprocessing_num_workers", preprocessing_num_workers, 0);
  if (data_seed < -1) fail("data_seed", fmt::format("must be >= 0 (or -1: the seed), got {}", data_seed));
  if (streaming) {
    // LLaMA-Factory's own checks and words first (hparams/data_args.py, hparams/parser.py), so a
    // YAML it refuses is refused here the same way.
    if (val_size > 1e-6 && val_size < 1) fail("val_size", "Streaming mode should have an integer val size.");
    if (max_samples > 0) fail("max_samples", "`max_samples` is incompatible with `streaming`.");
    if (max_steps <= 0) fail("max_steps", "Please specify `max_steps` in streaming mode.");
    if (!llamafactory_data()) {
      fail("streaming",
           "true applies to LLaMA-Factory datasets named with dataset: (a shard folder is read memory-mapped, "
           "without streaming)");
    }
    if (!tokenized_path.empty()) {
      // LLaMA-Factory's data/loader.py: with tokenized_path and no saved data.
      fail("tokenized_path",
           "Turn off `streaming` when saving dataset to disk. (LLaMA-Factory's words: it saves no streamed "
           "dataset; kiln's shard cache needs no tokenized_path)");
    }
    if (dataloader_num_workers == 0) {
      fail("dataloader_num_workers",
           "0 (transformers' default) with streaming: true: LLaMA-Factory 0.9.5 shards a local dataset into "
           "dataloader_num_workers shards for streaming (to_iterable_dataset(num_shards=0)), so the stream is "
           "empty and LLaMA-Factory itself fails (StopIteration in align_dataset). Set dataloader_num_workers: 1 "
           "or more (each DataLoader worker streams one shard)");
    }
    if (eval_on_each_dataset && !eval_dataset.empty()) {
      fail("eval_on_each_dataset",
           "true with streaming: true is not supported: LLaMA-Factory streams each evaluation dataset "
           "unshuffled, which kiln does not reproduce; use eval_dataset without eval_on_each_dataset, or "
           "val_size");
    }
  }
  at_least("dataloader_num_workers", dataloader_num_workers, 0);
  // LLaMA-Factory's DataArguments.__post_init__ (hparams/data_args.py), in its order and words.
  const auto count_names = [](const std::string& names) {  // split_arg: before the dict drops repeats
    return names.empty() ? size_t{0} : static_cast<size_t>(std::count(names.begin(), names.end(), ',')) + 1;
  };
  if (!eval_dataset.empty() && val_size > 1e-6)
    fail("val_size", "Cannot specify `val_size` if `eval_dataset` is not None.");
  if (!eval_dataset.empty() && dataset.empty())
    fail("eval_dataset", "needs dataset: evaluation datasets are LLaMA-Factory datasets of dataset_info.json");
  std::vector<double> probabilities;
  try {
    probabilities = interleave_probabilities();
  } catch (const std::invalid_argument& e) {
    fail("interleave_probs", e.what());
  }
  if (!interleave_probs.empty()) {
    if (mix_strategy == "concat") fail("interleave_probs", "`interleave_probs` is only valid for interleaved mixing.");
    if (!dataset.empty() && count_names(dataset) != probabilities.size())
      fail("interleave_probs", fmt::format("The length of dataset and interleave probs should be identical. ({} "
                                           "datasets, {} probabilities)",
                                           count_names(dataset), probabilities.size()));
    if (!eval_dataset.empty() && count_names(eval_dataset) != probabilities.size())
      fail("interleave_probs", fmt::format("The length of eval dataset and interleave probs should be identical. ({} "
                                           "eval datasets, {} probabilities)",
                                           count_names(eval_dataset), probabilities.size()));
  }
  try {
    data::parse_mix_strategy(mix_strategy);
  } catch (const std::invalid_argument& e) {
    fail("mix_strategy", e.what());
  }
  if (!template_name.empty() && !find_lf_template(template_name)) {
    fail("template", fmt::format("Template {} does not exist. (LLaMA-Factory 0.9.5's words; kiln knows its {} "
                                 "templates: lib/kiln/train/hf/lf_templates.inc)",
                                 template_name, lf_templates().size()));
  }
  at_least("buffer_size", buffer_size, 1);
  at_least("max_samples", max_samples, 0);
  // HF's float step intervals (training_args.py:1687-1702): below 1 a share of the steps, above 1
  // a whole number; eval_steps is checked where it is used (HF: under eval_strategy steps).
  auto interval = [&](const char* key, double v, bool zero_ok, bool checked) {
    if (!(zero_ok ? v >= 0 : v > 0)) {
      fail(key,
           fmt::format("must be {} (a count, or below 1 a share of the steps), got {}", zero_ok ? ">= 0" : "> 0", v));
    }
    if (checked && v > 1 && v != std::floor(v)) {
      fail(key, fmt::format("--{} must be an integer if bigger than 1: {} (HF's check)", key, v));
    }
  };
  interval("logging_steps", logging_steps, false, true);
  interval("save_steps", save_steps, true, true);
  interval("eval_steps", eval_steps, true, !hf_evaluation_rules(*this) || eval_strategy == "steps");
  at_least("save_total_limit", save_total_limit, 0);
  // LLaMA-Factory refuses evaluation without evaluation data (hparams/parser.py:362-365; HF's
  // TrainingArguments turns do_eval on for eval_strategy steps, training_args.py:1537-1538).
  if (llamafactory_data() && (do_eval == 1 || eval_strategy == "steps") && eval_dataset.empty() && val_size < 1e-6) {
    fail(eval_strategy == "steps" ? "eval_strategy" : "do_eval",
         fmt::format("{} needs evaluation data: \"Please make sure eval_dataset be provided or val_size >1e-6\" "
                     "(LLaMA-Factory, hparams/parser.py:362-365)",
                     eval_strategy == "steps" ? "steps" : "true"));
  }
  if (output_dir.empty()) fail("output_dir", "must not be empty");
  if (const auto problem =
          recomputation_problem(gradient_checkpointing, gradient_checkpointing_policy, gradient_checkpointing_every)) {
    fail(problem->first, problem->second);
  }
  at_least("ddp_timeout", ddp_timeout, 1);
  at_least("ddp_bucket_cap_mb", ddp_bucket_cap_mb, 1);
  if (zero_stage == 3) fail("zero_stage", "ZeRO stage 3 (sharded parameters) is not supported yet; use 0, 1 or 2");
  if (zero_stage < 0 || zero_stage > 3) fail("zero_stage", fmt::format("must be 0, 1 or 2, got {}", zero_stage));
  if (report_to != "none" && report_to != "tensorboard") {
    fail("report_to", fmt::format("must be none or tensorboard, got '{}'", report_to));
  }
  resolved_zero_stage();
}

std::vector<double> PretrainConfig::interleave_probabilities() const {
  std::vector<double> out;
  if (interleave_probs.empty()) return out;
  std::string item;
  std::stringstream ss(interleave_probs);
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t[]");
    const auto e = item.find_last_not_of(" \t[]");
    const std::string v = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (v.empty() || used != v.size())
      throw std::invalid_argument(
          fmt::format("could not convert string to float: '{}' (in '{}')", v, interleave_probs));
    out.push_back(x);
  }
  return out;
}

bool PretrainConfig::report_to_tensorboard() const {
  return report_to == "tensorboard";
}

int PretrainConfig::checkpoint_every() const {
  return resolve_recomputation(gradient_checkpointing, gradient_checkpointing_policy, gradient_checkpointing_every)
      .every;
}

bool PretrainConfig::selective_recomputation() const {
  return resolve_recomputation(gradient_checkpointing, gradient_checkpointing_policy, gradient_checkpointing_every)
             .policy == "selective";
}

int PretrainConfig::resolved_zero_stage() const {
  if (deepspeed.empty()) return static_cast<int>(zero_stage);
  auto fail = [&](const std::string& problem) {
    throw ConfigError(config::config_message(source, "deepspeed", fmt::format("{}: {}", deepspeed, problem)));
  };
  std::ifstream in(deepspeed);
  if (!in) fail("cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(fmt::format("not JSON: {}", e.what()));
  }
  const nlohmann::json zero =
      j.is_object() && j.contains("zero_optimization") ? j["zero_optimization"] : nlohmann::json::object();
  if (!zero.is_object()) fail("zero_optimization: expected an object");
  int stage = 0;
  if (zero.contains("stage")) {
    if (!zero["stage"].is_number_integer()) fail("zero_optimization.stage: expected 0, 1 or 2");
    stage = zero["stage"].get<int>();
  }
  if (stage == 3) fail("zero_optimization.stage 3 (sharded parameters) is not supported yet; use 0, 1 or 2");
  if (stage < 0 || stage > 3) fail(fmt::format("zero_optimization.stage: expected 0, 1 or 2, got {}", stage));
  for (const char* key : {"offload_optimizer", "offload_param"}) {
    if (zero.contains(key) && zero[key].is_object() && zero[key].value("device", "none") != "none") {
      fail(fmt::format("zero_optimization.{}.device '{}': offloading is not supported yet", key,
                       zero[key].value("device", "")));
    }
  }
  if (zero_stage != 0 && zero_stage != stage) {
    throw ConfigError(config::config_message(
        source, "zero_stage", fmt::format("{} but the deepspeed file {} says stage {}", zero_stage, deepspeed, stage)));
  }
  return stage;
}

config::Spelling pretrain_spelling() {
  config::Spelling s;
  s.kebab_case = true;
  s.switches = config::boolean_keys(pretrain_key_table());
  s.keys = pretrain_config_keys();
  const auto& lf = lf_keys();
  s.keys.insert(s.keys.end(), lf.begin(), lf.end());
  return s;
}

std::vector<std::pair<std::string, std::string>> parse_overrides(const std::vector<std::string>& args) {
  return config::parse_overrides(args, pretrain_spelling());
}

PretrainConfig pretrain_config_from_yaml_text(const std::string& text, const std::string& source) {
  PretrainConfig c;
  ConfigReader reader = ConfigReader::from_string(text, source);
  read_fields(reader, c);
  c.source = reader.source();
  settle(c);
  c.validate();
  return c;
}

std::string pretrain_config_json(const PretrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& key : pretrain_key_table()) {
    std::visit([&](auto member) { j[key.name] = c.*member; }, key.field);
  }
  if (!c.lr_scheduler_kwargs.empty()) {
    nlohmann::json kwargs = nlohmann::json::object();
    for (const auto& [key, value] : c.lr_scheduler_kwargs.numbers) kwargs[key] = value;
    for (const auto& [key, value] : c.lr_scheduler_kwargs.strings) kwargs[key] = value;
    j["lr_scheduler_kwargs"] = kwargs;
  }
  // HF's float step keys: a whole number is written as one (10, not 10.0), as HF's own ints.
  for (const char* key : {"logging_steps", "save_steps", "eval_steps", "warmup_steps"}) {
    const double v = j[key].get<double>();
    if (v == std::floor(v) && std::abs(v) < 9e15) j[key] = static_cast<int64_t>(v);
  }
  j["report_to"] = c.report_to;  // read by the LLaMA-Factory key table (hf/lf_keys.h), not fields()
  if (c.do_eval >= 0) j["do_eval"] = c.do_eval == 1;
  if (c.disable_gradient_checkpointing >= 0)
    j["disable_gradient_checkpointing"] = c.disable_gradient_checkpointing == 1;
  if (!c.eval_strategy.empty()) j["eval_strategy"] = c.eval_strategy;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

PretrainConfig load_pretrain_config(const std::string& path,
                                    const std::vector<std::pair<std::string, std::string>>& overrides) {
  PretrainConfig c;
  std::set<std::string> given;  // keys the file or the command line set: for keys_without_effect
  for (const auto& [key, value] : overrides) given.insert(key);
  if (!path.empty()) {
    const auto& embedded = model::detail::embedded_pretrain_configs();
    const auto it = std::find_if(embedded.begin(), embedded.end(), [&](const auto& e) { return e.first == path; });
    const bool use_embedded = it != embedded.end() && !std::filesystem::exists(path);
    ConfigReader file = use_embedded ? ConfigReader::from_string(std::string(it->second), "preset '" + path + "'")
                                     : ConfigReader::from_file(path);
    read_fields(file, c);
    c.source = file.source();
    for (const auto& key : pretrain_config_keys()) {
      if (file.has(key)) given.insert(key);
    }
  }
  if (!overrides.empty()) {
    // Naming a model on the command line replaces the file's, whichever of the two keys it used.
    auto given = [&](const char* key) {
      return std::any_of(overrides.begin(), overrides.end(), [&](const auto& kv) { return kv.first == key; });
    };
    if (given("model_name_or_path") && !given("model")) c.model.clear();
    if (given("model") && !given("model_name_or_path")) c.model_name_or_path.clear();
    ConfigReader cli = config::overrides_reader(overrides);
    read_fields(cli, c);
    c.source = path.empty() ? "command line" : c.source + " + command line";
  }
  const std::vector<std::string> notes = settle(c);
  c.validate();
  for (const auto& line : notes) logger()->info("kiln: {}: {}", c.source, line);
  for (const auto& line : keys_without_effect(c, given)) logger()->warn("kiln: warning: {}: {}", c.source, line);
  return c;
}

}  // namespace kiln::train
