// The LLaMA-Factory / HF TrainingArguments key table: see lf_keys.h and docs/training.md.
#include "kiln/train/hf/lf_keys.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "kiln/common/logger.h"
#include "kiln/config/yaml.h"
#include "kiln/train/hf/run_outputs.h"

namespace kiln::train {

namespace {

struct Entry {
  const char* key;
  // Values kiln accepts (lower case); empty = any value.
  std::vector<std::string> allowed;
  // For an allowed value: the info line ("" = silent: what kiln does anyway); for the others the
  // error, which says what kiln supports.
  const char* info;
  const char* refusal;
  LfKeyClass cls = LfKeyClass::kNoEffect;  // of an allowed value
};

constexpr const char* kFullOnly =
    "kiln trains all weights (finetuning_type: full); LoRA and freeze tuning are not supported";
constexpr const char* kPtOnly =
    "kiln-pretrain does pretraining only (stage: pt); sft, rm, ppo, dpo and kto are not supported";

const std::vector<Entry>& table() {
  using C = LfKeyClass;
  static const std::vector<Entry> t = {
      // What to train: kiln does full-weight pretraining only.
      {"stage", {"pt"}, "", kPtOnly, C::kActed},
      {"finetuning_type", {"full"}, "", kFullOnly, C::kActed},
      {"do_train", {"true"}, "", "kiln-pretrain always trains: do_train must be true", C::kActed},
      {"do_eval",
       {"true", "false"},
       "",
       "expected true or false (do_eval: evaluate once after training, into eval_results.json)",
       C::kActed},
      {"do_predict", {"false"}, "", "prediction is not supported: use kiln-eval (loss, perplexity) or kiln-generate"},
      {"mix_strategy",
       {"concat"},
       "",
       "datasets are concatenated (mix_strategy: concat); interleaving is not supported",
       C::kActed},
      {"interleave_probs",
       {"__never__"},
       "",
       "datasets are concatenated (mix_strategy: concat); interleaving is not supported"},
      {"eval_dataset",
       {"__never__"},
       "",
       "not supported yet: hold out evaluation data with val_size, or give a shard folder with a val split"},
      {"optim",
       {"adamw_torch", "adamw_torch_fused", "adamw_hf"},
       "",
       "kiln's optimizer is AdamW (one fused kernel): optim adamw_torch, adamw_torch_fused or adamw_hf",
       C::kActed},
      {"eval_strategy",
       {"steps", "no"},
       "",
       "kiln evaluates every eval_steps (eval_strategy: steps) or not at all (no); epoch is not supported",
       C::kActed},
      {"evaluation_strategy",
       {"steps", "no"},
       "",
       "kiln evaluates every eval_steps (eval_strategy: steps) or not at all (no); epoch is not supported",
       C::kActed},
      {"save_strategy",
       {"steps"},
       "",
       "kiln saves every save_steps and at the end (save_strategy: steps); no, epoch and best are not supported",
       C::kActed},
      {"logging_strategy", {"steps"}, "", "kiln logs every logging_steps (logging_strategy: steps)", C::kActed},
      {"disable_gradient_checkpointing", {}, "", "", C::kActed},
      {"save_safetensors", {"true"}, "", "kiln always saves model.safetensors", C::kActed},
      {"load_best_model_at_end",
       {"false"},
       "",
       "not supported: kiln keeps the checkpoints of save_steps (save_total_limit)"},
      {"push_to_hub", {"false"}, "", "kiln does not upload (no network); push the output_dir yourself"},
      {"pure_bf16",
       {"false"},
       "",
       "kiln keeps fp32 weights and optimizer state under bf16 autocast (bf16: true); pure_bf16 is not supported"},
      {"use_unsloth", {"false"}, "", "kiln uses its own kernels (the kernels key); unsloth is not supported"},
      {"resize_vocab", {"false"}, "", "not supported: the model's vocab_size must cover the tokenizer"},
      {"quantization_bit", {"__never__"}, "", "kiln does not train quantized models"},
      {"quantization_method", {"__never__"}, "", "kiln does not train quantized models"},
      {"rope_scaling", {"__never__"}, "", "set rope_scaling in the model's config.json (or model YAML) instead"},
      {"lr_scheduler_kwargs", {}, "", "", C::kActed},  // a mapping or a JSON string: see read_schedule_kwargs
      {"adapter_name_or_path", {"__never__"}, "", kFullOnly},
      {"lora_rank", {"__never__"}, "", kFullOnly},
      {"lora_alpha", {"__never__"}, "", kFullOnly},
      {"lora_dropout", {"__never__"}, "", kFullOnly},
      {"lora_target", {"__never__"}, "", kFullOnly},
      {"use_dora", {"__never__"}, "", kFullOnly},
      {"use_rslora", {"__never__"}, "", kFullOnly},
      {"freeze_trainable_layers", {"__never__"}, "", kFullOnly},
      {"freeze_trainable_modules", {"__never__"}, "", kFullOnly},
      {"pref_beta", {"__never__"}, "", kPtOnly},
      {"pref_loss", {"__never__"}, "", kPtOnly},
      {"reward_model", {"__never__"}, "", kPtOnly},
      // Accepted without effect: they cannot change a kiln run.
      {"trust_remote_code",
       {},
       "kiln reads config.json, safetensors and tokenizer.json itself and never runs a model's Python code",
       ""},
      {"dataloader_num_workers", {}, "kiln's loader reads memory-mapped shards on one prefetch thread", ""},
      {"dataloader_pin_memory", {}, "kiln pins batch memory whenever CUDA is present", ""},
      {"dataloader_persistent_workers", {}, "kiln's loader has no worker processes", ""},
      {"dataloader_prefetch_factor", {}, "kiln's loader prefetches 2 batches", ""},
      {"template", {}, "stage pt uses no chat template (documents + EOS, as LLaMA-Factory)", ""},
      {"flash_attn", {}, "kiln's attention is its own kernels (the kernels key, docs/kernels.md)", ""},
      {"enable_liger_kernel",
       {},
       "kiln's own fused kernels are used (RMSNorm, RoPE, SwiGLU, linear + cross-entropy)",
       ""},
      {"torch_compile", {}, "kiln is compiled C++; there is nothing for torch.compile to do", ""},
      {"use_fast_tokenizer", {}, "kiln has one tokenizer implementation (docs/data.md)", ""},
      {"cache_dir",
       {},
       "kiln downloads nothing; its tokenized datasets are cached under $KILN_HOME/data (or tokenized_path)",
       ""},
      {"hf_hub_token", {}, "kiln downloads nothing", ""},
      {"ms_hub_token", {}, "kiln downloads nothing", ""},
      {"low_cpu_mem_usage", {}, "kiln loads safetensors memory-mapped", ""},
      {"report_to", {}, "", "", C::kActed},  // a list: see report_to_verdict
      {"run_name", {}, "kiln names runs by output_dir", ""},
      {"disable_tqdm", {}, "kiln's progress bar redraws only on a terminal", ""},
      {"ddp_find_unused_parameters", {}, "kiln's data parallelism has no unused parameters to find", ""},
      {"ddp_broadcast_buffers", {}, "a Llama model has no buffers to broadcast", ""},
      {"include_num_input_tokens_seen", {}, "kiln logs tokens/s at every logging step", ""},
      {"include_tokens_per_second", {}, "kiln logs tokens/s at every logging step", ""},
      {"save_only_model", {}, "kiln's checkpoints always hold the optimizer and RNG state, for an exact resume", ""},
      {"remove_unused_columns", {}, "kiln's batches hold only input ids and labels", ""},
      {"prediction_loss_only", {}, "kiln's evaluation computes the loss only", ""},
      {"local_rank", {}, "kiln reads the rank from torchrun's or srun's environment", ""},
      {"print_param_status", {}, "no effect in kiln", ""},
      {"hub_model_id", {}, "kiln does not upload", ""},
  };
  return t;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t[]'\"");
  const auto e = s.find_last_not_of(" \t[]'\"");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// HF's reporting integrations (transformers' INTEGRATION_TO_CALLBACK) other than tensorboard:
// kiln has none of them (no network, no Python), and they only watch a run, so they are dropped
// with a warning rather than refused.
constexpr const char* kOtherIntegrations[] = {"azure_ml", "comet_ml",   "mlflow",  "neptune", "trackio",
                                              "wandb",    "codecarbon", "clearml", "dagshub", "flyte",
                                              "dvclive",  "swanlab",    "kubeflow"};

// report_to as HF reads it: "none", "all", one name or a list (a YAML list arrives joined by ',').
// Sets `tensorboard` and returns the verdict.
LfKeyVerdict report_to_verdict(std::string_view value, bool& tensorboard) {
  tensorboard = false;
  std::vector<std::string> dropped;
  bool all = false;
  std::string rest(value);
  for (size_t start = 0; start <= rest.size();) {
    const size_t comma = std::min(rest.find(',', start), rest.size());
    const std::string name = lower(trim(std::string_view(rest).substr(start, comma - start)));
    start = comma + 1;
    if (name.empty() || name == "none") continue;
    if (name == "tensorboard") {
      tensorboard = true;
    } else if (name == "all") {
      tensorboard = all = true;
    } else if (std::find_if(std::begin(kOtherIntegrations), std::end(kOtherIntegrations),
                            [&](const char* n) { return name == n; }) != std::end(kOtherIntegrations)) {
      dropped.push_back(name);
    } else {
      return {LfKeyClass::kRefused,
              fmt::format("'{}' is not a reporting integration: kiln writes tensorboard (or none); HF's others "
                          "(wandb, mlflow, ...) are ignored with a warning",
                          name)};
    }
  }
  if (!dropped.empty()) {
    return {tensorboard ? LfKeyClass::kActed : LfKeyClass::kNoEffect,
            fmt::format("warning: kiln does not report to {} (no network, no Python): ignored{}; the logs are in "
                        "output_dir/trainer_state.json and metrics.jsonl",
                        fmt::join(dropped, ", "), tensorboard ? "; TensorBoard event files are written" : "")};
  }
  if (all) return {LfKeyClass::kActed, "kiln's one integration is tensorboard: TensorBoard event files are written"};
  return {tensorboard ? LfKeyClass::kActed : LfKeyClass::kNoEffect, ""};
}

const Entry* find(std::string_view key) {
  for (const auto& e : table()) {
    if (key == e.key) return &e;
  }
  return nullptr;
}

}  // namespace

const std::vector<std::string>& lf_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const auto& e : table()) k.emplace_back(e.key);
    return k;
  }();
  return keys;
}

std::optional<LfKeyVerdict> classify_lf_key(std::string_view key, std::string_view value) {
  const Entry* e = find(key);
  if (!e) return std::nullopt;
  if (key == "report_to") {
    bool tensorboard = false;
    return report_to_verdict(value, tensorboard);
  }
  const std::string v = lower(value);
  const bool allowed = e->allowed.empty() || std::find(e->allowed.begin(), e->allowed.end(), v) != e->allowed.end();
  if (!allowed) {
    return LfKeyVerdict{LfKeyClass::kRefused, fmt::format("'{}' is not supported: {}", value, e->refusal)};
  }
  if (key == "disable_gradient_checkpointing") {
    if (v == "true") return LfKeyVerdict{LfKeyClass::kActed, ""};
    if (v == "false")
      return LfKeyVerdict{LfKeyClass::kNoEffect,
                          "LLaMA-Factory recomputes activations unless this is true; kiln does only with "
                          "gradient_checkpointing: true"};
    return LfKeyVerdict{LfKeyClass::kRefused, fmt::format("expected true or false, got '{}'", value)};
  }
  return LfKeyVerdict{e->cls, e->info};
}

namespace {

// lr_scheduler_kwargs: a YAML mapping, or a JSON object in a string (LLaMA-Factory's command line,
// HF's TrainingArguments). Each key is read with its kind (optim::all_schedule_kwargs: a number,
// an integer or a string), so a wrong type or an unknown key is an error naming
// lr_scheduler_kwargs.<key>; whether the key belongs to lr_scheduler_type is validate()'s check.
// A later source (the command line) replaces the whole mapping, as HF does.
void read_schedule_kwargs(config::ConfigReader& r, const std::string& text, optim::ScheduleKwargs& out) {
  const auto json = nlohmann::json::parse(text, nullptr, false);
  std::optional<config::ConfigReader> k;
  if (!json.is_discarded() && json.is_object()) {
    k.emplace(YAML::Load(text), r.source(), "lr_scheduler_kwargs.");  // JSON is YAML
  } else {
    k.emplace(r.child("lr_scheduler_kwargs"));  // a mapping, or the error "expected a mapping"
  }
  out = {};
  std::vector<std::string> names;
  for (const optim::KwargSpec& s : optim::all_schedule_kwargs()) {
    names.emplace_back(s.name);
    if (!k->has(s.name) || k->is_null(s.name)) continue;
    if (s.kind == optim::KwargKind::kString) {
      k->read(s.name, out.strings[s.name]);
    } else if (s.kind == optim::KwargKind::kInteger) {
      int64_t v = 0;
      k->read(s.name, v);
      out.numbers[s.name] = static_cast<double>(v);
    } else {
      k->read(s.name, out.numbers[s.name]);
    }
  }
  k->finish(fmt::format("the schedules' keyword arguments are {}", fmt::join(names, ", ")));
}

}  // namespace

void read_lf_keys(config::ConfigReader& r, PretrainConfig& c) {
  for (const auto& e : table()) {
    if (!r.has(e.key)) continue;
    const auto value = r.read_text(e.key);
    if (!value) continue;  // key: null
    const auto verdict = classify_lf_key(e.key, *value);
    if (verdict->cls == LfKeyClass::kRefused) r.fail(e.key, verdict->message);
    if (!verdict->message.empty()) {
      logger()->info("{}: {}: {}: {}", r.source(), e.key, *value, verdict->message);
    }
    const std::string v = lower(*value);
    const std::string key = e.key;
    if (key == "lr_scheduler_kwargs") read_schedule_kwargs(r, *value, c.lr_scheduler_kwargs);
    if (key == "disable_gradient_checkpointing" && v == "true") c.gradient_checkpointing = false;
    if (key == "do_eval") c.do_eval = v == "true" ? 1 : 0;
    if (key == "eval_strategy" || key == "evaluation_strategy") c.eval_strategy = v;
    if (key == "report_to") {
      bool tensorboard = false;
      report_to_verdict(*value, tensorboard);
      c.report_to = tensorboard ? "tensorboard" : "none";
    }
    // HF: eval_strategy steps without eval_steps evaluates every logging_steps (eval_steps given
    // in the file or on the command line, in either order, wins).
    if ((key == "eval_strategy" || key == "evaluation_strategy") && v == "steps" && !r.has("eval_steps") &&
        c.eval_steps == 0) {
      c.eval_steps = c.logging_steps;
    }
  }
}

std::vector<std::string> keys_without_effect(const PretrainConfig& c, const std::set<std::string>& given) {
  std::vector<std::string> out;
  auto note = [&](const char* key, const std::string& why) {
    if (given.count(key)) out.push_back(fmt::format("{}: {}", key, why));
  };
  if (!c.llamafactory_data()) {
    for (const char* key :
         {"max_samples", "overwrite_cache", "packing", "preprocessing_batch_size", "preprocessing_num_workers"}) {
      note(key,
           "has no effect without dataset: (it shapes LLaMA-Factory's datasets; a shard folder is already "
           "tokenized and packed into cutoff_len blocks)");
    }
    if (!c.tokenized_path.empty()) note("dataset_dir", "ignored: without dataset:, tokenized_path names the shards");
  }
  if (!c.auto_fit) note("auto_fit_memory", "has no effect without auto_fit: true (--auto-fit)");
  // Under HF's evaluation rules (train/hf/run_outputs.h) eval_steps needs eval_strategy steps.
  if (hf_evaluation_rules(c) && c.eval_strategy != "steps") {
    note("eval_steps", "has no effect without eval_strategy: steps (HF's default strategy is no)");
    if (c.do_eval != 1) {
      note("val_size",
           "holds out examples that are neither trained on nor evaluated (no eval_strategy: steps or "
           "do_eval: true)");
    }
  }
  if (!c.report_to_tensorboard()) note("logging_dir", "has no effect without report_to: tensorboard");
  if (c.lr_scheduler_type != "cosine" && c.lr_scheduler_type != "warmup_stable_decay") {
    note("min_lr_ratio", fmt::format("has no effect with lr_scheduler_type {} (a floor of cosine and "
                                     "warmup_stable_decay)",
                                     c.lr_scheduler_type));
  }
  if (c.lr_scheduler_type != "warmup_stable_decay") {
    note("decay_ratio", fmt::format("has no effect with lr_scheduler_type {} (warmup_stable_decay's decay share)",
                                    c.lr_scheduler_type));
  }
  if (c.lr_scheduler_type == "constant") {
    note("warmup_steps", "has no effect with lr_scheduler_type constant (constant_with_warmup warms up)");
    note("warmup_ratio", "has no effect with lr_scheduler_type constant (constant_with_warmup warms up)");
  } else if (c.warmup_steps > 0 && c.warmup_ratio > 0) {
    note("warmup_ratio", fmt::format("ignored: warmup_steps {} wins, as in HF", c.warmup_steps));
  }
  return out;
}

}  // namespace kiln::train
