// PretrainConfig: every setting of a pretraining run, with LLaMA-Factory / HF TrainingArguments
// key names so that an existing LLaMA-Factory YAML reads the same here. Defaults live only in
// this struct; a YAML file and then `--key value` command-line overrides are read into it by the
// same typed reader, so both give the same errors (source, key, value).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/export.h"
#include "kiln/optim/schedule.h"

namespace kiln::train {

struct KILN_API PretrainConfig {
  // Model: a preset / model YAML (`model`) or a Hugging Face directory to continue from.
  std::string model;
  std::string model_name_or_path;
  // LLaMA-Factory's train_from_scratch: the model is initialised at random (by seed, as a `model`
  // preset: LlamaForCausalLMImpl::init_weights, HF's _init_weights distribution) from
  // model_name_or_path's config.json instead of loading its weights, which the folder need not
  // have; its tokenizer.json tokenizes `dataset` and is saved with the model.
  bool train_from_scratch = false;
  // Data: a folder of token shards written by kiln-tokenize (it holds meta.json); empty = the
  // embedded corpus. With `dataset`: LLaMA-Factory's folder of dataset_info.json ("" = "data").
  std::string dataset_dir;
  // LLaMA-Factory's datasets by name ("a,b"), resolved through dataset_dir/dataset_info.json and
  // tokenized into a cache on first use (data/named_datasets.h).
  std::string dataset;
  std::string tokenized_path;    // the tokenized shards' folder instead of the cache's
  int64_t max_samples = 0;       // > 0: the first max_samples documents of each dataset
  bool overwrite_cache = false;  // tokenize again even when the cache holds these datasets
  int64_t cutoff_len = 1024;
  // > 0: hold out evaluation data, chosen at random by seed. With `dataset` (LLaMA-Factory's
  // pipeline, data/lf_examples.h): documents, before packing; a fraction in (0, 1) (the count
  // rounded up), or a count when written as an integer or above 1. With a shard folder: blocks
  // of the packed train split (< 1: fraction, >= 1: count).
  double val_size = 0.0;
  bool val_size_is_count = false;  // val_size was written as an integer (set by the reader)
  // LLaMA-Factory's data keys (with `dataset`; docs/training.md, "Coming from LLaMA-Factory"):
  // packing "" (not written: pack into cutoff_len blocks, stage pt's default), "true" (written
  // out: blocks of cutoff_len - 1, LLaMA-Factory's DataArguments quirk) or "false" (no packing:
  // each document is an example, truncated to cutoff_len); documents are packed per
  // preprocessing_batch_size documents, each batch's tail dropped, within
  // preprocessing_num_workers contiguous shards.
  std::string packing;
  int64_t preprocessing_batch_size = 1000;
  int64_t preprocessing_num_workers = 0;  // 0 or 1: one shard
  // LLaMA-Factory's streaming over local files (data/stream_dataset.h): the documents in datasets'
  // streamed order (a shuffle buffer of buffer_size documents, dataloader_num_workers shards, one
  // per DataLoader worker), packed as they are read; max_steps required, val_size a count.
  bool streaming = false;
  int64_t buffer_size = 16384;         // streaming's shuffle buffer (LLaMA-Factory's default)
  int64_t dataloader_num_workers = 0;  // streaming: HF's DataLoader workers = the stream's shards (>= 1)
  // How the datasets of `dataset` are merged (data/mixture.h): concat, interleave_under or
  // interleave_over, with interleave_probs ("0.7,0.3": one per dataset; "" = round robin).
  std::string mix_strategy = "concat";
  std::string interleave_probs;
  // LLaMA-Factory's chat template: at stage pt it fixes the tokenizer's EOS and pad and what ends
  // each document (train/hf/lf_template.h); "" = none.
  std::string template_name;
  // Evaluation datasets by name ("a,b"; with `dataset`, not with val_size): loaded, merged and
  // packed as the training data, in file order; eval_on_each_dataset evaluates each one alone
  // (eval_<name>_loss).
  std::string eval_dataset;
  bool eval_on_each_dataset = false;
  // interleave_probs as numbers (empty = none); std::invalid_argument naming a bad entry.
  std::vector<double> interleave_probabilities() const;
  int64_t data_seed = -1;  // the sampler's seed (HF's data_seed); -1 = seed
  // `dataset` names LLaMA-Factory datasets: its data pipeline, collator and loss normalisation apply.
  bool llamafactory_data() const { return !dataset.empty(); }
  // The examples' length: cutoff_len, less one when a LLaMA-Factory YAML writes packing: true.
  int64_t block_len() const { return llamafactory_data() && packing == "true" ? cutoff_len - 1 : cutoff_len; }

  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;  // blocks per forward pass of the evaluation (HF's default 8)
  int64_t gradient_accumulation_steps = 1;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 overrides num_train_epochs (as in HF)

  double learning_rate = 5e-5;
  std::string lr_scheduler_type = "linear";   // HF's SchedulerType values (optim::schedule_types())
  optim::ScheduleKwargs lr_scheduler_kwargs;  // HF's, checked against the type (optim/schedule.h)
  // Warmup as transformers 5.6 reads it: warmup_steps is a float, a count (its integer part) or,
  // below 1, a share of the run's steps, ceil(total x warmup_steps) (training_args.py:2107-2114);
  // a warmup_ratio that is written (HF's "not None", even 0) replaces warmup_steps
  // (training_args.py:1511-1513, the deprecated key). hf_warmup_steps() is the value that wins.
  double warmup_ratio = 0.0;
  double warmup_steps = 0;
  bool warmup_ratio_given = false;  // warmup_ratio was written (set by the reader)
  double hf_warmup_steps() const;
  double min_lr_ratio = 0.0;  // floor of cosine / warmup_stable_decay's decay, as a fraction of learning_rate
  double decay_ratio = 0.0;   // > 0: warmup_stable_decay decays over this fraction of all steps (kiln's split)
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;  // 0 = no clipping

  bool bf16 = false;
  bool fp16 = false;
  // Recomputation. LLaMA-Factory's rule applies to a YAML that names `dataset` or writes
  // disable_gradient_checkpointing: on unless disable_gradient_checkpointing is true, whatever
  // gradient_checkpointing says (model/model_utils/checkpointing.py:164; HF's key only turns it
  // on, trainer.py:1378), so an LLaMA-Factory YAML recomputes by default (the reader sets
  // gradient_checkpointing and logs why). kiln's own configs: gradient_checkpointing alone.
  bool gradient_checkpointing = false;
  int64_t disable_gradient_checkpointing = -1;  // LLaMA-Factory's key: -1 (not written), 0 or 1
  // With gradient_checkpointing: full (every decoder layer, HF's), every_n (layers 0, n, 2n, ...
  // with n = gradient_checkpointing_every, default 2): a memory/time point between none and full,
  // or selective (every layer keeps its matmul outputs and recomputes only the element-wise parts:
  // RMSNorm, SwiGLU; train/recompute_layers.h). Left out ("", 0): by the stride, n >= 2 is
  // every_n, else full. The same rule as kiln-profile's; a contradiction is a ConfigError.
  std::string gradient_checkpointing_policy;
  int64_t gradient_checkpointing_every = 0;
  // kiln-pretrain --auto-fit: the memory planner (cost/plan.h) picks the micro-batch, the
  // accumulation and the recomputation for this cutoff_len that keep the global batch
  // (per_device_train_batch_size x gradient_accumulation_steps x world) and fit auto_fit_memory
  // ("" = the device's own memory; a size such as 80GB, or a device name such as A100-80GB).
  bool auto_fit = false;
  std::string auto_fit_memory;
  // The layer stride the policy recomputes (1 = every layer); 0 without gradient_checkpointing
  // and for selective (no whole layer is recomputed).
  int checkpoint_every() const;
  // gradient_checkpointing with policy selective.
  bool selective_recomputation() const;
  std::string device = "auto";  // auto (cuda if available), cpu, cuda
  // kiln, aten, or per op: "kiln,rope=aten"; the default is ops::kDefaultKernels (ops/dispatch.h,
  // not an installed header; tests/ops/test_dispatch.cpp checks the two agree).
  std::string kernels = "kiln,attention=aten";
  std::string nan_policy = "stop";  // stop or skip: what a non-finite loss does
  // HF's full_determinism: PyTorch's deterministic algorithms (warn-only for ops without one),
  // which also selects the flash-attention kernels' deterministic backward, and cuBLAS's
  // reproducible workspace (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless already set).
  bool full_determinism = false;
  // LLaMA-Factory's neat_packing: documents packed into one block do not attend to each other,
  // positions restart at each document, and a document's first token is not a target.
  bool neat_packing = false;

  int64_t seed = 42;
  // Step intervals as HF's floats: a count, or below 1 a share of the run's optimizer steps
  // resolved when the total is known (resolve_steps); above 1 a whole number.
  double logging_steps = 10;
  double save_steps = 500;       // 0 = save only at the end
  int64_t save_total_limit = 0;  // 0 = keep every checkpoint
  double eval_steps = 0;         // 0 = evaluate only at the end (under HF's rules: every logging_steps)
  // HF's evaluation switches, read from LLaMA-Factory's keys (hf/run_outputs.h, eval_schedule):
  // do_eval -1 (not written), 0 or 1; eval_strategy "" (not written), "steps" or "no".
  int64_t do_eval = -1;
  std::string eval_strategy;
  std::string output_dir = "output";
  // HF's overwrite_output_dir: checkpoints in output_dir later than the run's starting step (an
  // abandoned run's) are deleted at start; when false they are moved to output_dir/abandoned-<time>/.
  bool overwrite_output_dir = false;
  std::string resume_from_checkpoint;  // "", "true" (latest in output_dir) or a checkpoint path

  // Outputs for LLaMA-Factory's and HF's tools (docs/training.md, "Outputs"). plot_loss: the loss
  // figures output_dir/training_loss.png (and training_eval_loss.png) at the end, as
  // LLaMA-Factory. report_to: "none" or "tensorboard" (HF's integrations kiln does not have are
  // dropped with a warning when the YAML is read). logging_dir: TensorBoard's folder ("" = HF's
  // default, $TENSORBOARD_LOGGING_DIR or output_dir/runs/<time>_<hostname>).
  bool plot_loss = false;
  std::string report_to = "none";
  std::string logging_dir;

  // Data parallelism (docs/distributed.md), active when launched by torchrun or srun.
  int64_t ddp_timeout = 1800;      // seconds every collective may take (HF's key and default)
  int64_t ddp_bucket_cap_mb = 25;  // gradient bucket size (HF's key and default)
  int64_t zero_stage = 0;          // 0 (DDP), 1 (optimizer state sharded), 2 (and gradients)
  // LLaMA-Factory's deepspeed: a DeepSpeed JSON (ds_z0/z1/z2_config.json); kiln reads its
  // zero_optimization.stage (and refuses stage 3 and offloading).
  std::string deepspeed;

  std::string source = "<defaults>";  // file the settings came from, for messages

  // Throws config::ConfigError naming the source and key.
  void validate() const;
  // report_to names tensorboard.
  bool report_to_tensorboard() const;
  // zero_stage, or the stage of the `deepspeed` file when one is given (errors name the file and key).
  int resolved_zero_stage() const;
};

// A step interval as transformers 5.6 resolves it once the run's total optimizer steps are known
// (TrainerState.compute_steps, trainer_callback.py:156-167; get_warmup_steps likewise): a value
// below 1 is ceil(total_steps x value), 1 and above its integer part.
KILN_API int64_t resolve_steps(double value, int64_t total_steps);

// Reads `path` (a YAML file, or the name of a configs/pretrain preset such as "quickstart";
// empty = defaults only), then applies command-line overrides given as
// (key, value) pairs; validates the result.
KILN_API PretrainConfig load_pretrain_config(const std::string& path,
                                             const std::vector<std::pair<std::string, std::string>>& overrides = {});

// Splits kiln-pretrain's command-line arguments into (key, value) pairs: "--key value",
// "--key=value", a '-' in a key read as '_' (--cutoff-len is cutoff_len) and a boolean key alone
// meaning true (--bf16); throws naming a dangling "--key" or a stray positional argument.
KILN_API std::vector<std::pair<std::string, std::string>> parse_overrides(const std::vector<std::string>& args);

// Reads YAML text (the same keys and checks as a file); `source` names it in errors.
KILN_API PretrainConfig pretrain_config_from_yaml_text(const std::string& text, const std::string& source);

// Every setting as one JSON object (each key of pretrain_config_keys() with its value, plus
// do_eval and eval_strategy when written), keys sorted, indent 2: output_dir/training_args.json,
// what HF's pickled training_args.bin holds for a reader.
KILN_API std::string pretrain_config_json(const PretrainConfig& config);

// The keys a PretrainConfig accepts, in documentation order (for --help).
KILN_API const std::vector<std::string>& pretrain_config_keys();

}  // namespace kiln::train
