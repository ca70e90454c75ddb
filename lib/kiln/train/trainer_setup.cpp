// The trainer's set-up: device and process group, the model, auto-fit, the data (rank 0 first),
// the optimizer and loss scaler.
#include <cstdlib>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "kiln/common/device.h"
#include "kiln/common/logger.h"
#include "kiln/common/runtime_info.h"
#include "kiln/config/yaml.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/plan.h"
#include "kiln/data/default_corpus.h"
#include "kiln/data/lf_examples.h"
#include "kiln/data/shards.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/dist/env.h"
#include "kiln/model/hf.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/train/activation_checkpoint.h"
#include "kiln/train/kernel_choices.h"
#include "kiln/train/run_description.h"
#include "kiln/train/stop_request.h"
#include "kiln/train/trainer_internal.h"
#include "kiln/train/training_data.h"

namespace kiln::train {

void check_dtype_for_gpu(const PretrainConfig& config, const std::string& gpu_name, int major, int minor) {
  if (config.bf16 && major < 8) {
    throw config::ConfigError(config::config_message(
        config.source, "bf16",
        fmt::format("true, but {} (compute capability {}.{}) has no bf16 arithmetic (it needs 8.0, an A100 or "
                    "later): use fp16: true, which trains with a dynamic loss scaler as Hugging Face's fp16 runs do",
                    gpu_name, major, minor)));
  }
}

void Trainer::init() {
  config_.validate();
  if (source_ && config_.max_steps <= 0) {
    throw config::ConfigError(config::config_message(
        config_.source, "max_steps", "must be > 0 when the host supplies the batches (there is no epoch to count)"));
  }  // config_.kernels applies inside train() and evaluate() only (ops::BackendScope)
  // auto, cpu or cuda: the one resolver (common/device.h); the GPU is LOCAL_RANK's, below.
  at::Device resolved(at::kCPU);
  try {
    resolved = device::resolve(config_.device);
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(config::config_message(config_.source, "device", e.what()));
  }
  if (config_.full_determinism) {
    // cuBLAS needs CUBLAS_WORKSPACE_CONFIG before its first handle: a process setting, which the
    // program sets (kiln::set_cublas_deterministic_workspace), never the library.
    const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
    if ((ws == nullptr || *ws == '\0') && resolved.is_cuda()) {
      logger()->warn(
          "kiln-pretrain: warning: full_determinism without CUBLAS_WORKSPACE_CONFIG in the environment: cuBLAS "
          "may not be deterministic (kiln::set_cublas_deterministic_workspace() sets it before the first tensor)");
    }
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    if (const std::string k = trainer_kernels(config_.kernels, true); k != config_.kernels) {
      logger()->info(
          "kiln-pretrain: full_determinism: kernels {} instead of the default {}: kiln's flash-attention kernels "
          "have a deterministic backward, SDPA's fused ones do not under warn-only determinism",
          k, config_.kernels);
      config_.kernels = k;
    }
  }
  zero_stage_ = config_.resolved_zero_stage();
  // Launched by torchrun or srun: one process per device, LOCAL_RANK picks it (docs/distributed.md).
  const dist::DistEnv env = dist::read_dist_env();
  device_ = at::Device(at::kCPU);
  if (resolved.is_cuda()) {
    const int64_t devices = static_cast<int64_t>(torch::cuda::device_count());
    if (env.local_rank >= devices) {
      throw std::runtime_error(fmt::format("local rank {} ({}) has no GPU of its own: this node has {}", env.local_rank,
                                           env.launcher, devices));
    }
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    at::accelerator::setDeviceIndex(device_.index());
    const GpuInfo gpu = gpu_info(device_.index());
    check_dtype_for_gpu(config_, gpu.name, gpu.major, gpu.minor);
  }
  if (plan_only_) {
    env_rank_ = env.rank;  // the job's shape, without joining it
    env_world_ = env.world_size;
    env_launcher_ = env.launcher;
  } else if (env.distributed()) {
    comm_ = dist::connect(env, {.timeout = std::chrono::seconds(config_.ddp_timeout),
                                .cuda_device = device_.is_cuda() ? device_.index() : -1});
  }
  if (zero_stage_ > 0 && world_size() == 1 && rank() == 0) {
    logger()->warn(
        "kiln-pretrain: warning: ZeRO stage {} has no effect in a single process (it shards across the "
        "ranks of torchrun or srun; docs/distributed.md)",
        zero_stage_);
  }
  if (config_.bf16) autocast_dtype_ = at::kBFloat16;
  if (config_.fp16) autocast_dtype_ = at::kHalf;
  at::manual_seed(static_cast<uint64_t>(config_.seed));

  // Model: fp32 master parameters on the device (a plan: on the meta device, nothing allocated).
  if (plan_only_) {
    const model::LlamaConfig mc =
        config_.model_name_or_path.empty()
            ? model::load_llama_config(config_.model)
            : model::read_hf_config((fs::path(config_.model_name_or_path) / "config.json").string()).config;
    model_ = model::LlamaForCausalLM(mc, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  } else if (!config_.model_name_or_path.empty()) {
    model_ = model::load_pretrained(config_.model_name_or_path, {.dtype = at::kFloat, .device = device_});
  } else {
    model_ = fresh_model(model::load_llama_config(config_.model), device_, static_cast<uint64_t>(config_.seed));
  }
  model_->fused_lm_loss = true;  // the trainer needs only the loss: never hold all logits
  if (config_.cutoff_len > model_->config().max_position_embeddings && is_main()) {
    // As LLaMA-Factory, a warning: it runs, but positions past the limit were never trained.
    logger()->warn(
        "kiln-pretrain: warning: {}: cutoff_len {} is beyond the model's max_position_embeddings {} ({}); "
        "positions past it were not trained",
        config_.source, config_.cutoff_len, model_->config().max_position_embeddings, model_->config().source);
  }

  if (config_.auto_fit) apply_auto_fit();
  if (source_) {
    // The host's batches: as many examples as max_steps consumes (for the banner's arithmetic).
    plan_ = plan_steps(
        config_.max_steps * config_.gradient_accumulation_steps * config_.per_device_train_batch_size * world_size(),
        config_.per_device_train_batch_size, world_size(), config_.gradient_accumulation_steps,
        config_.num_train_epochs, config_.max_steps);
  } else {
    setup_shard_data();
  }
  if (!plan_only_) setup_optimizer();
}

RunTarget Trainer::run_target() const {
  RunTarget t;
  t.cuda = device_.is_cuda();
  if (t.cuda) t.hardware = cost::hardware_for_device_name(device::name(device_), device::device_memory_bytes(device_));
  t.world_size = world_size();
  // A plan under a launcher describes the job it would join.
  t.data_parallel = data_parallel() != nullptr || (plan_only_ && env_launcher_ != "none");
  return t;
}

void Trainer::apply_auto_fit() {
  cost::PlanConfig p;
  p.source = config_.source;
  p.model_config = model_->config();
  p.cutoff_lens = {config_.cutoff_len};
  p.kernels = config_.kernels;
  p.run = describe_run(config_, model_->config(), run_target());
  const std::string& m = config_.auto_fit_memory;
  try {
    if (m.empty()) {
      p.device_memory_bytes = device::device_memory_bytes(device_);
    } else if (const auto spec = cost::hardware_spec(m)) {
      p.device_memory_bytes = spec->memory_bytes;
      p.device_name = spec->name;
    } else {
      p.device_memory_bytes = cost::parse_bytes(m, "auto_fit_memory");
    }
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(config::config_message(config_.source, "auto_fit_memory", e.what()));
  }
  p.target_sequences = config_.per_device_train_batch_size * config_.gradient_accumulation_steps * world_size();
  const cost::PlanReport plan = cost::make_plan(p);
  const cost::PlanRow* best = plan.recommended(config_.cutoff_len);
  if (!best) {
    throw config::ConfigError(config::config_message(
        config_.source, "auto_fit",
        fmt::format("nothing fits {} GB at cutoff_len {}, not even micro-batch 1 with full recomputation",
                    p.device_memory_bytes / 1e9, config_.cutoff_len)));
  }
  config_.per_device_train_batch_size = best->micro_batch;
  config_.gradient_accumulation_steps = best->grad_accum;
  const bool selective = best->policy == "selective";
  config_.gradient_checkpointing = best->every > 0 || selective;
  const bool every_n = config_.gradient_checkpointing && !selective && best->every > 1;
  config_.gradient_checkpointing_policy = !config_.gradient_checkpointing ? ""
                                          : selective                     ? "selective"
                                          : every_n                       ? "every_n"
                                                                          : "full";
  config_.gradient_checkpointing_every = every_n ? best->every : 0;
  state_->auto_fit = fmt::format(
      "micro-batch {} x accumulation {} x {} rank{} = {} sequences (target {}), recomputation {}; predicted {:.2f} GB "
      "of "
      "{:.2f} GB",
      best->micro_batch, best->grad_accum, world_size(), world_size() == 1 ? "" : "s", best->global_sequences,
      p.target_sequences, best->policy, best->needed_bytes / 1e9, p.device_memory_bytes / 1e9);
}

namespace {

// LLaMA-Factory 0.9.5's examples (data/lf_examples.h): the merged datasets' documents split into
// train and eval before packing, each packed per preprocessing_batch_size documents.
std::pair<std::shared_ptr<const data::PackedDataset>, std::shared_ptr<const data::PackedDataset>> llamafactory_examples(
    const PretrainConfig& config_, const std::shared_ptr<const data::TokenSplit>& documents) {
  const auto fail = [&](const char* key, const std::string& problem) {
    throw config::ConfigError(config::config_message(config_.source, key, problem));
  };
  data::DocumentSplit split;
  try {
    split = data::split_documents(documents->num_documents(), config_.val_size, config_.val_size_is_count,
                                  static_cast<uint64_t>(config_.seed));
  } catch (const std::invalid_argument& e) {
    fail("val_size", fmt::format("{} ({} documents in {})", e.what(), documents->num_documents(), config_.dataset));
  }
  const data::PackOptions po{.block_len = config_.block_len(),
                             .packing = config_.packing != "false",
                             .batch_documents = config_.preprocessing_batch_size,
                             .workers = config_.preprocessing_num_workers};
  const auto examples = [&](std::vector<int64_t> docs, const char* what) {
    const int64_t n = static_cast<int64_t>(docs.size());
    auto table = data::ExampleTable::build(std::move(docs), documents->document_starts(), po);
    if (table->num_examples() == 0) {
      fail("cutoff_len",
           fmt::format("Cannot find sufficient samples, consider increasing dataset size. (LLaMA-Factory's words: the "
                       "{} {} documents of {} pack into no block of {} tokens within one preprocessing_batch_size "
                       "batch of {})",
                       n, what, config_.dataset, po.block_len, po.batch_documents));
    }
    return std::make_shared<data::PackedDataset>(documents, table);
  };
  auto train = examples(std::move(split.train), "train");
  return {train, split.eval.empty() ? nullptr : examples(std::move(split.eval), "eval")};
}

// kiln's shard folders: the train split packed into cutoff_len blocks in order; val_size holds
// out random blocks, else the folder's val split is the evaluation data.
std::pair<std::shared_ptr<const data::PackedDataset>, std::shared_ptr<const data::PackedDataset>> packed_blocks(
    const PretrainConfig& config_, const data::TokenShards& shards,
    const std::shared_ptr<const data::TokenSplit>& train_split) {
  const int64_t blocks = train_split->num_tokens() / config_.cutoff_len;
  std::shared_ptr<const data::PackedDataset> train_set_, val_set_;
  // Evaluation data: val_size > 0 holds out blocks of the train split chosen at random by the
  // run's seed (a fraction, or a count; as LLaMA-Factory's split of its packed examples);
  // otherwise the shard set's own val split, when it has one block or more.
  int64_t held_out = 0;
  if (config_.val_size > 0) {
    held_out = config_.val_size < 1 ? static_cast<int64_t>(std::ceil(config_.val_size * static_cast<double>(blocks)))
                                    : static_cast<int64_t>(config_.val_size);
    if (held_out >= blocks) {
      throw config::ConfigError(config::config_message(
          config_.source, "val_size",
          fmt::format("holds out {} of the {} blocks of cutoff_len {}; nothing is left to train on", held_out, blocks,
                      config_.cutoff_len)));
    }
    const auto [train_blocks, val_blocks] = data::random_split(blocks, held_out, static_cast<uint64_t>(config_.seed));
    val_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len, val_blocks);
    train_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len, train_blocks);
  } else if (shards.has_split("val")) {
    const auto val_split = shards.split("val");
    if (val_split->num_tokens() >= config_.cutoff_len) {
      val_set_ = std::make_shared<data::PackedDataset>(val_split, config_.cutoff_len);
    }
  }
  if (!train_set_) train_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len);
  return {train_set_, val_set_};
}

}  // namespace

// Tokenizing (named datasets, the embedded corpus on first use) happens on rank 0 while the other
// ranks wait, as LLaMA-Factory's main_process_first: then they open what it wrote and never
// tokenize themselves. The wait is a collective that also carries rank 0's failure, so a bad
// dataset stops every rank with the error instead of leaving them waiting; like LLaMA-Factory's,
// it is bounded by ddp_timeout (which its configs set to 180000000 s for this reason).
std::string Trainer::prepare_data_main_first() {
  if (!comm_ || world_size() == 1) return training_shard_dir(config_, is_main());
  std::string dir;
  std::exception_ptr error;
  int64_t status = 0;  // 1: rank 0 failed; 2: rank 0 stopped on a stop request
  if (is_main()) {
    try {
      dir = training_shard_dir(config_, true);
    } catch (const StopRequested&) {
      error = std::current_exception();
      status = 2;
    } catch (...) {
      error = std::current_exception();
      status = 1;
    }
  }
  const int64_t worst = comm_->host_max({status})[0];
  if (error) std::rethrow_exception(error);
  if (worst == 2) throw StopRequested(fmt::format("rank {}: rank 0 stopped while preparing the data", rank()));
  if (worst > 0) {
    throw std::runtime_error(
        fmt::format("rank {}: rank 0 could not prepare the training data (its error is above)", rank()));
  }
  if (is_main()) return dir;
  return training_shard_dir(config_, false, /*reuse_only=*/true, rank());
}

void Trainer::setup_shard_data() {
  // Data: packed blocks of the shard set's train split; its val split for evaluation.
  state_->data_dir = prepare_data_main_first();
  state_->shards = data::TokenShards::open(state_->data_dir);
  const auto& meta = state_->shards->meta();
  state_->shards->check_ids_below(model_->config().vocab_size,
                                  fmt::format("the model's vocab_size ({})", model_->config().source));
  if (meta.vocab_size > model_->config().vocab_size) {
    throw config::ConfigError(config::config_message(
        config_.source, "dataset_dir",
        fmt::format("{}: tokenizer vocabulary {} is larger than the model's vocab_size {} ({})", state_->data_dir,
                    meta.vocab_size, model_->config().vocab_size, model_->config().source)));
  }
  const auto train_split = state_->shards->split("train");
  data::LoaderOptions lo;
  lo.batch_size = config_.per_device_train_batch_size;
  // The sampler's seed is HF Trainer's: data_seed, else seed (for shard folders too; the held-out
  // split keeps seed, as LLaMA-Factory's train_test_split does).
  lo.seed = static_cast<uint64_t>(config_.data_seed >= 0 ? config_.data_seed : config_.seed);
  lo.segment_ids = config_.neat_packing;
  lo.rank = rank();
  lo.world_size = world_size();
  if (config_.llamafactory_data()) {
    state_->ignored_label_id = llamafactory_pad_id(config_, meta.eos_id);
    std::tie(train_set_, val_set_) = llamafactory_examples(config_, train_split);
    // HF Trainer's sampler (torch.randperm) and transformers' collator with pad = EOS.
    lo.order = data::LoaderOptions::Order::kTorchRandperm;
    lo.ignore_label_id = lo.pad_id = state_->ignored_label_id;
  } else {
    const int64_t blocks = train_split->num_tokens() / config_.cutoff_len;
    if (blocks == 0) {
      throw config::ConfigError(
          config::config_message(config_.source, "cutoff_len",
                                 fmt::format("{} is longer than the whole train split of {} ({} tokens)",
                                             config_.cutoff_len, state_->data_dir, train_split->num_tokens())));
    }
    std::tie(train_set_, val_set_) = packed_blocks(config_, *state_->shards, train_split);
  }
  state_->loader_options = lo;
  if (!plan_only_) loader_ = std::make_unique<data::DataLoader>(train_set_, lo);

  plan_ = plan_steps(train_set_->num_blocks(), config_.per_device_train_batch_size, world_size(),
                     config_.gradient_accumulation_steps, config_.num_train_epochs, config_.max_steps);
}

void Trainer::setup_optimizer() {
  stack_ = std::make_unique<TrainingStack>(model_, device_, stack_options(config_, comm_, zero_stage_));
  state_->flops = cost::flops_per_token(model_->config(), config_.cutoff_len);

  if (!config_.resume_from_checkpoint.empty()) {
    std::string dir = config_.resume_from_checkpoint;
    if (dir == "true" || dir == "True") {
      // A kill during a re-save can leave the newest checkpoint renamed aside (.checkpoint-N.old
      // on file systems without an atomic exchange): recover first, then choose.
      if (is_main()) clean_incomplete_on_main();
      if (comm_) comm_->barrier();
      dir = latest_checkpoint(config_.output_dir);
      if (dir.empty()) {
        throw config::ConfigError(
            config::config_message(config_.source, "resume_from_checkpoint",
                                   fmt::format("'true' but {} holds no checkpoint-N folder", config_.output_dir)));
      }
    }
    resume(dir);
  }
}

}  // namespace kiln::train
