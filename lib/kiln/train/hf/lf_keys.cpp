// The LLaMA-Factory / HF TrainingArguments key table: see lf_keys.h and docs/training.md.
#include "kiln/train/hf/lf_keys.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

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

// Shared reasons of the LLaMA-Factory 0.9.5 / transformers 5.6 argument fields below (the key
// audit, tests/python/test_lf_key_audit.py, checks that every field of hparams/parser.py's
// _TRAIN_ARGS is here or a PretrainConfig key). Two rules:
// - a setting of another program or mode (generation, inference engines, export, multimodal
//   processors, the Hub, profilers, log levels, Ray) cannot change a training run: any value is
//   accepted with its one line;
// - a switch for something kiln does not do, and a setting that only tunes such a thing (another
//   stage, LoRA, GaLore, quantization, fp8, ...), is accepted at LLaMA-Factory's default (inert,
//   or what kiln does anyway: silent) and refused at any other value, saying what kiln supports.
constexpr const char* kGeneration =
    "a generation setting (LLaMA-Factory's chat, api and predict_with_generate): stage pt generates nothing";
constexpr const char* kInference =
    "an inference engine setting (LLaMA-Factory's chat, api and webui): no effect on training";
constexpr const char* kExport = "a setting of llamafactory-cli export: no effect on training";
constexpr const char* kMultimodal =
    "a multimodal setting (images, videos, audio, vision towers): kiln trains text-only LLaMA models, for "
    "which LLaMA-Factory ignores it too";
constexpr const char* kNoDownload = "kiln downloads nothing";
constexpr const char* kNoUpload = "kiln does not upload (no network); push the output_dir yourself";
constexpr const char* kLossOnly =
    "kiln's evaluation computes the loss (and perplexity) only: no predictions are gathered for metrics";
constexpr const char* kProfiler =
    "kiln writes no torch profiler traces or module timings: profile with kiln-profile or NVTX ranges "
    "(docs/performance.md)";
constexpr const char* kLogLevel = "kiln's log lines do not follow Python's logging levels";
constexpr const char* kRay =
    "Ray (USE_RAY=1) launches LLaMA-Factory's workers; kiln runs under torchrun or srun (docs/distributed.md)";
constexpr const char* kOtherReporter = "an integration kiln does not report to (TensorBoard only, report_to)";
constexpr const char* kRecompute =
    "kiln's recomputation is its own (train/recompute_layers.h); the gradients are the same whichever way "
    "torch's checkpoint would run";
constexpr const char* kCompile = "kiln is compiled C++; there is nothing for torch.compile to do";
constexpr const char* kLiger = "kiln's own fused kernels are used (RMSNorm, RoPE, SwiGLU, linear + cross-entropy)";
constexpr const char* kOptimizer =
    "kiln's optimizer is AdamW (optim adamw_torch, adamw_torch_fused or adamw_hf); GaLore, APOLLO, BAdam, "
    "Adam-mini, Muon and LoRA+ are not supported";
constexpr const char* kQuantized = "kiln does not train quantized models";
constexpr const char* kNewTokens =
    "kiln does not add tokens: the model's vocab_size must cover the tokenizer (resize_vocab is not supported)";
constexpr const char* kFp8 = "kiln computes in bf16 or fp16 autocast over fp32 weights; fp8 training is not supported";
constexpr const char* kFsdp =
    "kiln's data parallelism is DDP with ZeRO stage 1 or 2 (zero_stage, deepspeed); FSDP and accelerate's "
    "parallelism settings are not supported";
constexpr const char* kKt = "KTransformers is not supported";
constexpr const char* kBestModel = "kiln keeps the last save_total_limit checkpoints and tracks no best metric";
constexpr const char* kSftLoss =
    "a stage sft loss (LLaMA-Factory's pt trainer does not use it); kiln's loss is transformers' cross-entropy";
constexpr const char* kEvalWhen = "kiln evaluates every eval_steps and after the last step (eval_strategy: steps)";

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
      {"quantization_bit", {"__never__"}, "", kQuantized},
      {"quantization_method", {"bnb"}, "", kQuantized},
      {"rope_scaling", {"__never__"}, "", "set rope_scaling in the model's config.json (or model YAML) instead"},
      {"lr_scheduler_kwargs", {}, "", "", C::kActed},  // a mapping or a JSON string: see read_schedule_kwargs
      {"adapter_name_or_path", {"__never__"}, "", kFullOnly},
      {"lora_rank", {"8"}, "", kFullOnly},
      {"lora_alpha", {"__never__"}, "", kFullOnly},
      {"lora_dropout", {"0"}, "", kFullOnly},
      {"lora_target", {"all"}, "", kFullOnly},
      {"use_dora", {"false"}, "", kFullOnly},
      {"use_rslora", {"false"}, "", kFullOnly},
      {"freeze_trainable_layers", {"2"}, "", kFullOnly},
      {"freeze_trainable_modules", {"all"}, "", kFullOnly},
      {"pref_beta", {"0.1"}, "", kPtOnly},
      {"pref_loss", {"sigmoid"}, "", kPtOnly},
      {"reward_model", {"__never__"}, "", kPtOnly},
      // Accepted without effect: they cannot change a kiln run.
      {"trust_remote_code",
       {},
       "kiln reads config.json, safetensors and tokenizer.json itself and never runs a model's Python code",
       ""},
      {"dataloader_pin_memory", {}, "kiln pins batch memory whenever CUDA is present", ""},
      {"dataloader_persistent_workers", {}, "kiln's loader has no worker processes", ""},
      {"dataloader_prefetch_factor", {}, "kiln's loader prefetches 2 batches", ""},
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
      // ---- The other fields of LLaMA-Factory 0.9.5's _TRAIN_ARGS (the key audit) ----
      // ModelArguments.
      {"adapter_folder", {"__never__"}, "", kFullOnly},
      {"split_special_tokens",
       {"false"},
       "",
       "not supported: kiln's tokenizer matches added and special tokens in the text (HF's "
       "split_special_tokens: false)"},
      {"add_tokens", {"__never__"}, "", kNewTokens},
      {"add_special_tokens", {"__never__"}, "", kNewTokens},
      {"new_special_tokens_config", {"__never__"}, "", kNewTokens},
      {"init_special_tokens", {"noise_init"}, "", kNewTokens},
      {"model_revision", {}, "kiln reads model_name_or_path as a local folder, where HF ignores the revision too", ""},
      {"shift_attn", {"false"}, "", "S^2-Attn (LongLoRA's shifted sparse attention) is not supported"},
      {"mixture_of_depths", {"__never__"}, "", "mixture of depths is not supported"},
      {"use_unsloth_gc",
       {"false"},
       "",
       "unsloth's offloaded checkpointing is not supported: kiln recomputes on the device "
       "(gradient_checkpointing_policy)"},
      {"moe_aux_loss_coef",
       {},
       "kiln's LLaMA models have no experts (LLaMA-Factory sets it on mixture-of-experts models only)",
       ""},
      {"use_reentrant_gc", {}, kRecompute, ""},
      {"upcast_layernorm",
       {},
       "kiln keeps every weight in fp32 (LLaMA-Factory's full tuning upcasts the trainable weights too, "
       "model/adapter.py:316-325)",
       ""},
      {"upcast_lmhead_output",
       {},
       "no effect on the loss: transformers' loss upcasts the logits to fp32 (loss/loss_utils.py), and kiln's "
       "linear + cross-entropy computes it in fp32",
       ""},
      {"infer_backend",
       {"huggingface"},
       "",
       "LLaMA-Factory refuses it for training: \"vLLM/SGLang backend is only available for API, CLI and Web.\" "
       "(hparams/parser.py:406-407)"},
      {"offload_folder", {}, kInference, ""},
      {"use_kv_cache", {}, kInference, ""},
      {"use_v1_kernels", {}, "kiln's kernels are its own (the kernels key, docs/kernels.md)", ""},
      {"infer_dtype", {}, kInference, ""},
      {"om_hub_token", {}, kNoDownload, ""},
      {"quantization_type", {"nf4"}, "", kQuantized},
      {"double_quantization", {"true"}, "", kQuantized},
      {"quantization_device_map", {"__never__"}, "", kQuantized},
      {"image_max_pixels", {}, kMultimodal, ""},
      {"image_min_pixels", {}, kMultimodal, ""},
      {"image_do_pan_and_scan", {}, kMultimodal, ""},
      {"crop_to_patches", {}, kMultimodal, ""},
      {"video_max_pixels", {}, kMultimodal, ""},
      {"video_min_pixels", {}, kMultimodal, ""},
      {"video_fps", {}, kMultimodal, ""},
      {"video_maxlen", {}, kMultimodal, ""},
      {"use_audio_in_video", {}, kMultimodal, ""},
      {"audio_sampling_rate", {}, kMultimodal, ""},
      {"export_dir", {}, kExport, ""},
      {"export_size", {}, kExport, ""},
      {"export_device", {}, kExport, ""},
      {"export_quantization_bit", {}, kExport, ""},
      {"export_quantization_dataset", {}, kExport, ""},
      {"export_quantization_nsamples", {}, kExport, ""},
      {"export_quantization_maxlen", {}, kExport, ""},
      {"export_legacy_format", {}, kExport, ""},
      {"export_hub_model_id", {}, kExport, ""},
      {"use_kt", {"false"}, "", kKt},
      {"kt_weight_path", {"__never__"}, "", kKt},
      {"kt_expert_checkpoint_path", {"__never__"}, "", kKt},
      {"kt_use_lora_experts", {"__never__"}, "", kKt},
      {"kt_lora_expert_num", {"__never__"}, "", kKt},
      {"kt_lora_expert_intermediate_size", {"__never__"}, "", kKt},
      {"vllm_maxlen", {}, kInference, ""},
      {"vllm_gpu_util", {}, kInference, ""},
      {"vllm_enforce_eager", {}, kInference, ""},
      {"vllm_max_lora_rank", {}, kInference, ""},
      {"vllm_config", {}, kInference, ""},
      {"sglang_maxlen", {}, kInference, ""},
      {"sglang_mem_fraction", {}, kInference, ""},
      {"sglang_tp_size", {}, kInference, ""},
      {"sglang_config", {}, kInference, ""},
      {"sglang_lora_backend", {}, kInference, ""},
      // DataArguments.
      {"media_dir", {}, kMultimodal, ""},
      {"train_on_prompt",
       {"false"},
       "",
       "LLaMA-Factory refuses it at stage pt: \"`train_on_prompt` or `mask_history` cannot be set as True except "
       "SFT.\" (hparams/parser.py:323-324)"},
      {"mask_history",
       {"false"},
       "",
       "LLaMA-Factory refuses it at stage pt: \"`train_on_prompt` or `mask_history` cannot be set as True except "
       "SFT.\" (hparams/parser.py:323-324)"},
      {"eval_num_beams", {}, kGeneration, ""},
      {"ignore_pad_token_for_loss",
       {},
       "stage pt's collator (DataCollatorForLanguageModeling) masks padding whatever its value; the other stages "
       "read it",
       ""},
      {"tool_format",
       {},
       "a chat template setting: stage pt encodes no conversation (LLaMA-Factory writes it into "
       "chat_template.jinja only, which kiln does not)",
       ""},
      {"default_system",
       {},
       "a chat template setting: stage pt encodes no conversation (LLaMA-Factory writes it into "
       "chat_template.jinja only, which kiln does not)",
       ""},
      {"enable_thinking", {}, "a chat template setting: stage pt encodes no conversation", ""},
      {"preserve_thinking", {}, "a chat template setting: stage pt encodes no conversation", ""},
      {"data_shared_file_system",
       {},
       "kiln's rank 0 prepares the datasets for every node (LLaMA-Factory's data_shared_file_system: true): a "
       "cache folder that all ranks see is assumed",
       ""},
      // TrainingArguments (transformers 5.6's Seq2SeqTrainingArguments and LLaMA-Factory's own).
      {"optim_args",
       {},
       "HF's AdamW (adamw_torch, adamw_torch_fused) does not read optim_args (trainer_optimizer.py:201-208)",
       ""},
      {"optim_target_modules", {"__never__"}, "", kOptimizer},
      {"average_tokens_across_devices",
       {"true"},
       "",
       "kiln divides the loss by the targets of every rank's accumulation window (HF's default true)"},
      {"label_smoothing_factor", {"0"}, "", "label smoothing is not supported: kiln's loss is the plain cross-entropy"},
      {"bf16_full_eval", {"false"}, "", "kiln evaluates under the training's autocast, with fp32 weights"},
      {"fp16_full_eval", {"false"}, "", "kiln evaluates under the training's autocast, with fp32 weights"},
      {"tf32", {"false"}, "", "kiln leaves TF32 matmuls off (torch's default)"},
      {"gradient_checkpointing_kwargs", {}, kRecompute, ""},
      {"torch_compile_backend", {}, kCompile, ""},
      {"torch_compile_mode", {}, kCompile, ""},
      {"use_liger_kernel", {}, kLiger, ""},
      {"liger_kernel_config", {}, kLiger, ""},
      {"use_cache",
       {},
       "kiln keeps no KV cache in training; its saved config.json says use_cache: true (docs/training.md, "
       "\"output_dir and checkpoints\")",
       ""},
      {"neftune_noise_alpha", {"__never__"}, "", "NEFTune (noise on the embeddings) is not supported"},
      {"torch_empty_cache_steps",
       {},
       "emptying the CUDA cache changes no result; kiln leaves its caching allocator alone",
       ""},
      {"auto_find_batch_size",
       {"false"},
       "",
       "use --auto-fit (auto_fit: true): kiln's memory planner picks micro-batch and accumulation and keeps the "
       "global batch"},
      {"logging_first_step", {"false"}, "", "not supported: kiln logs every logging_steps and the last step"},
      {"log_on_each_node", {}, kLogLevel, ""},
      {"logging_nan_inf_filter",
       {},
       "kiln stops at a non-finite loss, or skips that step (nan_policy), instead of filtering the logged loss",
       ""},
      {"log_level", {}, kLogLevel, ""},
      {"log_level_replica", {}, kLogLevel, ""},
      {"project", {}, kOtherReporter, ""},
      {"trackio_space_id", {}, kOtherReporter, ""},
      {"trackio_bucket_id", {}, kOtherReporter, ""},
      {"trackio_static_space_id", {}, kOtherReporter, ""},
      {"eval_delay", {"0"}, "", kEvalWhen},
      {"eval_on_start", {"false"}, "", kEvalWhen},
      {"eval_do_concat_batches", {}, kLossOnly, ""},
      {"eval_use_gather_object", {}, kLossOnly, ""},
      {"eval_accumulation_steps", {}, kLossOnly, ""},
      {"include_for_metrics", {}, kLossOnly, ""},
      {"batch_eval_metrics", {}, kLossOnly, ""},
      {"save_on_each_node", {"false"}, "", "kiln's rank 0 writes output_dir (a folder every rank sees)"},
      {"enable_jit_checkpoint",
       {},
       "kiln always saves a checkpoint on SIGTERM or SIGINT (docs/training.md, \"Stopping\")",
       ""},
      {"hub_token", {}, kNoUpload, ""},
      {"hub_private_repo", {}, kNoUpload, ""},
      {"hub_strategy", {}, kNoUpload, ""},
      {"hub_always_push", {}, kNoUpload, ""},
      {"hub_revision", {}, kNoUpload, ""},
      {"metric_for_best_model", {"__never__"}, "", kBestModel},
      {"greater_is_better", {"__never__"}, "", kBestModel},
      {"ignore_data_skip",
       {"false"},
       "",
       "a resume skips the batches already trained on, as HF's default; starting the data over is not supported"},
      {"restore_callback_states_from_checkpoint",
       {},
       "kiln has no Trainer callbacks; its checkpoints restore the whole run",
       ""},
      {"use_cpu", {}, "", "", C::kActed},  // true: device cpu
      {"accelerator_config", {"__never__"}, "", kFsdp},
      {"parallelism_config", {"__never__"}, "", kFsdp},
      {"dataloader_drop_last",
       {"false"},
       "",
       "kiln keeps each epoch's last, shorter batch, as HF's default; dropping it is not supported"},
      {"label_names", {"labels"}, "", "kiln's batches hold input_ids and labels (label_names: labels)"},
      {"train_sampling_strategy",
       {"random"},
       "",
       "kiln's sampler is HF's random one (a permutation per epoch by seed or data_seed)"},
      {"length_column_name",
       {"length"},
       "",
       "kiln's sampler is HF's random one (train_sampling_strategy: random); grouping by length is not supported"},
      {"ddp_static_graph", {}, "kiln's data parallelism is its own (no torch DDP graph)", ""},
      {"ddp_backend",
       {},
       "kiln chooses the process group's backend itself: NCCL on CUDA, gloo on the CPU (docs/distributed.md)",
       ""},
      {"fsdp", {"", "false"}, "", kFsdp},
      {"fsdp_config", {"__never__"}, "", kFsdp},
      {"debug", {""}, "", "HF's debug modes (underflow_overflow, tpu_metrics_debug) are not supported"},
      {"skip_memory_metrics",
       {"true"},
       "",
       "kiln writes no memory metrics into train_results.json (HF's default skip_memory_metrics: true)"},
      {"sortish_sampler", {}, "Seq2SeqTrainer's; transformers 5.6 reads it nowhere", ""},
      {"predict_with_generate",
       {"false"},
       "",
       "LLaMA-Factory refuses it at stage pt: \"`predict_with_generate` cannot be set as True except SFT.\" "
       "(hparams/parser.py:317-318)"},
      {"generation_max_length", {}, kGeneration, ""},
      {"generation_num_beams", {}, kGeneration, ""},
      {"generation_config", {}, kGeneration, ""},
      {"ray_num_workers", {}, kRay, ""},
      {"ray_init_kwargs", {}, kRay, ""},
      {"master_addr", {}, "kiln reads MASTER_ADDR from torchrun's or srun's environment (docs/distributed.md)", ""},
      {"master_port", {}, "kiln reads MASTER_PORT from torchrun's or srun's environment (docs/distributed.md)", ""},
      {"fp8", {"false"}, "", kFp8},
      {"fp8_backend", {"auto"}, "", kFp8},
      {"fp8_enable_fsdp_float8_all_gather", {"false"}, "", kFp8},
      {"enable_torch_profiler", {}, kProfiler, ""},
      {"profiler_output_dir", {}, kProfiler, ""},
      {"profiler_wait_steps", {}, kProfiler, ""},
      {"profiler_warmup_steps", {}, kProfiler, ""},
      {"profiler_active_steps", {}, kProfiler, ""},
      {"profiler_repeat", {}, kProfiler, ""},
      {"profiler_record_shapes", {}, kProfiler, ""},
      {"profiler_profile_memory", {}, kProfiler, ""},
      {"profiler_with_stack", {}, kProfiler, ""},
      {"profile_modules", {}, kProfiler, ""},
      // FinetuningArguments: other tuning methods and stages at their defaults.
      {"freeze_extra_modules", {"__never__"}, "", kFullOnly},
      {"additional_target", {"__never__"}, "", kFullOnly},
      {"module_dropout", {"0"}, "", kFullOnly},
      {"oft_rank", {"0"}, "", kFullOnly},
      {"oft_block_size", {"32"}, "", kFullOnly},
      {"oft_target", {"all"}, "", kFullOnly},
      {"create_new_adapter", {"false"}, "", kFullOnly},
      {"loraplus_lr_ratio",
       {"__never__"},
       "",
       "LLaMA-Factory refuses it with finetuning_type full: \"`loraplus_lr_ratio` is only valid for LoRA "
       "training.\" (hparams/finetuning_args.py:605-606)"},
      {"loraplus_lr_embedding", {"1e-06"}, "", kFullOnly},
      {"pissa_init",
       {"false"},
       "",
       "LLaMA-Factory refuses it with finetuning_type full: \"`pissa_init` is only valid for LoRA training.\" "
       "(hparams/finetuning_args.py:614-615)"},
      {"pissa_iter", {"16"}, "", kFullOnly},
      {"pissa_convert", {"false"}, "", kFullOnly},
      {"pref_ftx", {"0"}, "", kPtOnly},
      {"pref_bco_weight", {"0"}, "", kPtOnly},
      {"dpo_label_smoothing", {"0"}, "", kPtOnly},
      {"kto_chosen_weight", {"1"}, "", kPtOnly},
      {"kto_rejected_weight", {"1"}, "", kPtOnly},
      {"simpo_gamma", {"0.5"}, "", kPtOnly},
      {"ppo_buffer_size", {"1"}, "", kPtOnly},
      {"ppo_epochs", {"4"}, "", kPtOnly},
      {"ppo_score_norm", {"false"}, "", kPtOnly},
      {"ppo_target", {"6"}, "", kPtOnly},
      {"ppo_whiten_rewards", {"false"}, "", kPtOnly},
      {"ref_model", {"__never__"}, "", kPtOnly},
      {"ref_model_adapters", {"__never__"}, "", kPtOnly},
      {"ref_model_quantization_bit", {"__never__"}, "", kPtOnly},
      {"reward_model_adapters", {"__never__"}, "", kPtOnly},
      {"reward_model_quantization_bit", {"__never__"}, "", kPtOnly},
      {"reward_model_type", {"lora"}, "", kPtOnly},
      {"ld_alpha", {"__never__"}, "", kPtOnly},
      {"use_galore", {"false"}, "", kOptimizer},
      {"galore_target", {"all"}, "", kOptimizer},
      {"galore_rank", {"16"}, "", kOptimizer},
      {"galore_update_interval", {"200"}, "", kOptimizer},
      {"galore_scale", {"2"}, "", kOptimizer},
      {"galore_proj_type", {"std"}, "", kOptimizer},
      {"galore_layerwise", {"false"}, "", kOptimizer},
      {"use_apollo", {"false"}, "", kOptimizer},
      {"apollo_target", {"all"}, "", kOptimizer},
      {"apollo_rank", {"16"}, "", kOptimizer},
      {"apollo_update_interval", {"200"}, "", kOptimizer},
      {"apollo_scale", {"32"}, "", kOptimizer},
      {"apollo_proj", {"random"}, "", kOptimizer},
      {"apollo_proj_type", {"std"}, "", kOptimizer},
      {"apollo_scale_type", {"channel"}, "", kOptimizer},
      {"apollo_layerwise", {"false"}, "", kOptimizer},
      {"apollo_scale_front", {"false"}, "", kOptimizer},
      {"use_badam", {"false"}, "", kOptimizer},
      {"badam_mode", {"layer"}, "", kOptimizer},
      {"badam_start_block", {"__never__"}, "", kOptimizer},
      {"badam_switch_mode", {"ascending"}, "", kOptimizer},
      {"badam_switch_interval", {"50"}, "", kOptimizer},
      {"badam_update_ratio", {"0.05"}, "", kOptimizer},
      {"badam_mask_mode", {"adjacent"}, "", kOptimizer},
      {"badam_verbose", {"0"}, "", kOptimizer},
      {"use_adam_mini", {"false"}, "", kOptimizer},
      {"use_muon", {"false"}, "", kOptimizer},
      {"use_swanlab",
       {"false"},
       "",
       "kiln does not report to SwanLab (no network, no Python): report_to: tensorboard writes TensorBoard files"},
      {"swanlab_project", {}, kOtherReporter, ""},
      {"swanlab_workspace", {}, kOtherReporter, ""},
      {"swanlab_run_name", {}, kOtherReporter, ""},
      {"swanlab_mode", {}, kOtherReporter, ""},
      {"swanlab_api_key", {}, kOtherReporter, ""},
      {"swanlab_logdir", {}, kOtherReporter, ""},
      {"swanlab_lark_webhook_url", {}, kOtherReporter, ""},
      {"swanlab_lark_secret", {}, kOtherReporter, ""},
      {"use_llama_pro",
       {"false"},
       "",
       "LLaMA-Factory refuses it with finetuning_type full: \"`use_llama_pro` is only valid for Freeze or LoRA "
       "training.\" (hparams/finetuning_args.py:592-593)"},
      {"use_mca",
       {},
       "LLaMA-Factory sets it from the environment (USE_MCA=1, Megatron-Core) and overwrites the key "
       "(hparams/parser.py:309)",
       ""},
      {"use_hyper_parallel", {"false"}, "", kFsdp},
      {"hyper_parallel_args", {"__never__"}, "", kFsdp},
      {"use_dft_loss", {"false"}, "", kSftLoss},
      {"use_asft_loss", {"false"}, "", kSftLoss},
      {"asft_alpha", {"0.1"}, "", kSftLoss},
      {"use_eaft_loss", {"false"}, "", kSftLoss},
      {"eaft_alpha", {"1"}, "", kSftLoss},
      {"freeze_vision_tower", {}, kMultimodal, ""},
      {"freeze_multi_modal_projector", {}, kMultimodal, ""},
      {"freeze_language_model", {}, kMultimodal, ""},
      {"compute_accuracy", {"false"}, "", "a stage sft metric: kiln's evaluation computes the loss and perplexity"},
      {"disable_shuffling",
       {"false"},
       "",
       "kiln's sampler shuffles every epoch as HF's (by seed or data_seed); a sequential order is not supported"},
      {"early_stopping_steps",
       {"__never__"},
       "",
       "early stopping is not supported: kiln trains max_steps or num_train_epochs"},
      {"include_effective_tokens_per_second",
       {},
       "a stage sft metric (LLaMA-Factory's pt workflow does not read it); kiln logs tokens/s at every logging step",
       ""},
      // GeneratingArguments: generation only.
      {"do_sample", {}, kGeneration, ""},
      {"temperature", {}, kGeneration, ""},
      {"top_p", {}, kGeneration, ""},
      {"top_k", {}, kGeneration, ""},
      {"num_beams", {}, kGeneration, ""},
      {"max_length", {}, kGeneration, ""},
      {"max_new_tokens", {}, kGeneration, ""},
      {"repetition_penalty", {}, kGeneration, ""},
      {"length_penalty", {}, kGeneration, ""},
      {"skip_special_tokens", {}, kGeneration, ""},
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

// An allowed value and a YAML value (lower case) are the same: as text, or as numbers ("0" and
// "0.0", "1e-06" and "1.0e-6").
bool same_value(const std::string& allowed, const std::string& value) {
  if (allowed == value) return true;
  auto number = [](const std::string& s, double& out) {
    if (s.empty()) return false;
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size();
  };
  double a = 0, b = 0;
  return number(allowed, a) && number(value, b) && a == b;
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
  const bool allowed = e->allowed.empty() || std::any_of(e->allowed.begin(), e->allowed.end(),
                                                         [&](const std::string& a) { return same_value(a, v); });
  if (!allowed) {
    return LfKeyVerdict{LfKeyClass::kRefused, fmt::format("'{}' is not supported: {}", value, e->refusal)};
  }
  if (key == "disable_gradient_checkpointing" || key == "use_cpu") {
    // disable_gradient_checkpointing: LLaMA-Factory's recomputation switch (PretrainConfig, and
    // the line load_pretrain_config logs when it turns recomputation on); use_cpu: device cpu.
    if (v == "true" || v == "false") return LfKeyVerdict{LfKeyClass::kActed, ""};
    return LfKeyVerdict{LfKeyClass::kRefused, fmt::format("expected true or false, got '{}'", value)};
  }
  return LfKeyVerdict{e->cls, e->info};
}

std::string key_classes_json() {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& key : pretrain_config_keys()) j[key] = "acted";
  for (const auto& e : table()) {
    const bool never = e.allowed.size() == 1 && e.allowed[0] == "__never__";
    j[e.key] = e.cls == LfKeyClass::kActed ? "acted" : never ? "refused" : "accepted";
  }
  return j.dump(2);
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
    if (key == "disable_gradient_checkpointing") c.disable_gradient_checkpointing = v == "true" ? 1 : 0;
    if (key == "use_cpu" && v == "true") {
      if (r.has("device") && c.device != "cpu") r.fail(e.key, fmt::format("true contradicts device: {}", c.device));
      c.device = "cpu";
    }
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
    for (const char* key : {"max_samples", "overwrite_cache", "packing", "preprocessing_batch_size",
                            "preprocessing_num_workers", "mix_strategy", "interleave_probs", "template"}) {
      note(key,
           "has no effect without dataset: (it shapes LLaMA-Factory's datasets; a shard folder is already "
           "tokenized and packed into cutoff_len blocks)");
    }
    if (!c.tokenized_path.empty()) note("dataset_dir", "ignored: without dataset:, tokenized_path names the shards");
  }
  if (c.streaming) {
    note("preprocessing_num_workers",
         "has no effect with streaming: true (LLaMA-Factory's streamed map has no num_proc: each DataLoader worker "
         "packs its own documents)");
    note("data_seed", "has no effect with streaming: true (the stream's order follows seed; there is no sampler)");
  } else {
    note("buffer_size", "has no effect without streaming: true (its shuffle buffer)");
    note("dataloader_num_workers",
         "has no effect without streaming: true (kiln's loader reads memory-mapped shards on one prefetch thread; "
         "streaming shards the stream into one part per DataLoader worker, as LLaMA-Factory)");
  }
  if (c.eval_dataset.empty()) {
    note("eval_on_each_dataset",
         "has no effect without eval_dataset (val_size's held-out documents are one evaluation set)");
  }
  if (c.llamafactory_data() && c.dataset.find(',') == std::string::npos &&
      c.eval_dataset.find(',') == std::string::npos) {
    // LLaMA-Factory's merge_dataset returns a single dataset as it is (data_utils.py).
    note("mix_strategy", "has no effect with one dataset (LLaMA-Factory merges nothing)");
    note("interleave_probs", "has no effect with one dataset (LLaMA-Factory merges nothing)");
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
  } else if (c.warmup_ratio_given || c.warmup_ratio > 0) {
    // transformers 5.6: a warmup_ratio that is not None replaces warmup_steps (training_args.py:1511-1513).
    note("warmup_steps", fmt::format("ignored: warmup_ratio {} replaces it, as in transformers 5.6", c.warmup_ratio));
  }
  return out;
}

}  // namespace kiln::train
