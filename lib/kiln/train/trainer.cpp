// The training loop. Host/device discipline: between logging, evaluation and checkpoint points
// nothing here reads a device value; the loss sum, the non-finite check (which also makes the
// optimizer skip the update, inside its fused kernel) and the fp16 loss scale stay on the device.
//
// Micro-batches are drawn continuously from the loader (epochs roll over inside it), so every
// optimizer step has exactly gradient_accumulation_steps micro-batches and a checkpoint's loader
// state (epoch, position) alone restores the exact next batch.
#include "kiln/train/trainer.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <nlohmann/json.hpp>

#include "kiln/common/device.h"
#include "kiln/common/format.h"
#include "kiln/common/logger.h"
#include "kiln/common/runtime_info.h"
#include "kiln/config/yaml.h"
#include "kiln/cost/flops.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/plan.h"
#include "kiln/data/default_corpus.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/dist/env.h"
#include "kiln/io/safetensors.h"
#include "kiln/model/hf.h"
#include "kiln/ops/dispatch.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/optim/schedule.h"
#include "kiln/train/activation_checkpoint.h"
#include "kiln/train/checkpoint_dir.h"
#include "kiln/train/evaluate.h"
#include "kiln/train/kernel_choices.h"
#include "kiln/train/loss_plot.h"
#include "kiln/train/progress.h"
#include "kiln/train/run_outputs.h"
#include "kiln/train/step.h"
#include "kiln/train/stop_request.h"
#include "kiln/train/tensorboard.h"
#include "kiln/train/training_data.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open", path.string()));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A host batch is checked before it reaches the model, so that a bad one is one clear line.
void check_host_batch(const MicroBatch& b, int64_t vocab_size) {
  if (!b.input_ids.defined() || !b.labels.defined())
    throw std::invalid_argument("host batch: input_ids and labels are required");
  if (b.input_ids.dim() != 2 || b.labels.sizes() != b.input_ids.sizes()) {
    throw std::invalid_argument(fmt::format("host batch: input_ids {} and labels {} must both be [batch, seq]",
                                            c10::str(b.input_ids.sizes()), c10::str(b.labels.sizes())));
  }
  if (b.input_ids.scalar_type() != at::kLong || b.labels.scalar_type() != at::kLong) {
    throw std::invalid_argument("host batch: input_ids and labels must be int64");
  }
  if (b.input_ids.size(1) < 2) throw std::invalid_argument("host batch: sequences need at least 2 tokens");
  const int64_t lo = b.input_ids.min().item<int64_t>(), hi = b.input_ids.max().item<int64_t>();
  if (lo < 0 || hi >= vocab_size) {
    throw std::invalid_argument(
        fmt::format("host batch: token id {} is outside the model's vocab_size {}", lo < 0 ? lo : hi, vocab_size));
  }
  // A label is a target id or -100 (ignored): the loss head indexes a row of logits by it.
  const at::Tensor scored = b.labels.ne(-100);
  const at::Tensor bad = scored.logical_and(b.labels.lt(0).logical_or(b.labels.ge(vocab_size)));
  if (bad.any().item<bool>()) {
    const int64_t first = bad.flatten().nonzero().min().item<int64_t>();
    throw std::invalid_argument(fmt::format("host batch: label {} is neither -100 nor inside the model's vocab_size {}",
                                            b.labels.flatten()[first].item<int64_t>(), vocab_size));
  }
  if (b.segment_ids.defined() && b.segment_ids.sizes() != b.input_ids.sizes()) {
    throw std::invalid_argument(fmt::format("host batch: segment_ids {} must match input_ids {}",
                                            c10::str(b.segment_ids.sizes()), c10::str(b.input_ids.sizes())));
  }
}

// The default CPU generator's state, read and set with the generator's mutex held (ATen's rule for
// random generators) through the public at::globalContext().defaultGenerator.
at::Tensor cpu_rng_state() {
  at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
  const std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(at::kCPU);
  const std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

void check_dtype_for_gpu(const PretrainConfig& config, const std::string& gpu_name, int major, int minor) {
  if (config.bf16 && major < 8) {
    throw config::ConfigError(config::config_message(
        config.source, "bf16",
        fmt::format("true, but {} (compute capability {}.{}) has no bf16 arithmetic (it needs 8.0, an A100 or "
                    "later): use fp16: true, which trains with a dynamic loss scaler as Hugging Face's fp16 runs do",
                    gpu_name, major, minor)));
  }
}

std::string latest_checkpoint(const std::string& output_dir) {
  const auto all = list_checkpoints(output_dir);
  return all.empty() ? std::string() : all.back().string();
}

struct Trainer::State {
  int64_t global_step = 0;
  json log_history = json::array();
  cost::FlopsPerToken flops;
  std::optional<cost::DevicePeak> peak;
  std::shared_ptr<data::TokenShards> shards;
  std::string data_dir;
  // Device-side accumulators of the current logging window.
  at::Tensor window_loss_sum, window_good_targets, first_bad_step;
  int64_t window_steps = 0, window_tokens = 0;  // tokens of every rank
  double window_comm_seconds = 0;               // the host waited on collectives
  std::chrono::steady_clock::time_point window_start;
  std::optional<EvalResult> last_eval;
  std::string resumed_from;                  // the checkpoint this run started from (never rotated away)
  std::string auto_fit;                      // what --auto-fit chose, for the banner
  int64_t last_saved_step = -1;              // a stop request right after a save does not save again
  double total_flos = 0;                     // model FLOPs of every step trained (HF's total_flos), kept across resumes
  std::unique_ptr<EventWriter> tensorboard;  // report_to: tensorboard, rank 0
};

bool Trainer::stop_requested() const {
  const bool local = pending_stop_signal().load() != 0 || (stop_check_ && stop_check_());
  if (!comm_) return local;
  return comm_->host_max({local ? 1 : 0})[0] > 0;
}

int Trainer::rank() const {
  return comm_ ? comm_->rank() : env_rank_;
}

int Trainer::world_size() const {
  return comm_ ? comm_->world_size() : env_world_;
}

int64_t Trainer::optimizer_state_bytes() const {
  return optimizer_->state_bytes();
}

std::atomic<int>& Trainer::pending_signal() {
  return pending_stop_signal();
}

void Trainer::install_signal_handlers() {
  install_stop_signal_handlers();
}

Trainer::Trainer(PretrainConfig config) : Trainer(std::move(config), BatchSource()) {}

Trainer::Trainer(PretrainConfig config, BatchSource source)
    : config_(std::move(config)), state_(std::make_unique<State>()), source_(std::move(source)) {
  init();
}

Trainer::Trainer(PretrainConfig config, BatchSource source, PlanOnly)
    : config_(std::move(config)), state_(std::make_unique<State>()), source_(std::move(source)), plan_only_(true) {
  init();
}

std::unique_ptr<Trainer> Trainer::plan_only(PretrainConfig config) {
  return std::unique_ptr<Trainer>(new Trainer(std::move(config), BatchSource(), PlanOnly{}));
}

void Trainer::init() {
  config_.validate();
  if (source_ && config_.max_steps <= 0) {
    throw config::ConfigError(config::config_message(
        config_.source, "max_steps", "must be > 0 when the host supplies the batches (there is no epoch to count)"));
  }  // config_.kernels applies inside train() and evaluate() only (ops::BackendScope)
  if (config_.full_determinism) {
    // cuBLAS needs CUBLAS_WORKSPACE_CONFIG before its first handle: a process setting, which the
    // program sets (kiln::set_cublas_deterministic_workspace), never the library.
    const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
    if ((ws == nullptr || *ws == '\0') && torch::cuda::is_available() && config_.device != "cpu") {
      logger()->warn(
          "kiln-pretrain: warning: full_determinism without CUBLAS_WORKSPACE_CONFIG in the environment: cuBLAS "
          "may not be deterministic (kiln::set_cublas_deterministic_workspace() sets it before the first tensor)");
    }
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  if (config_.device == "cuda" && !torch::cuda::is_available()) {
    throw config::ConfigError(config::config_message(config_.source, "device", "'cuda' but no CUDA device is present"));
  }
  zero_stage_ = config_.resolved_zero_stage();
  // Launched by torchrun or srun: one process per device, LOCAL_RANK picks it (docs/distributed.md).
  const dist::DistEnv env = dist::read_dist_env();
  const bool cuda = config_.device == "cuda" || (config_.device == "auto" && torch::cuda::is_available());
  device_ = at::Device(at::kCPU);
  if (cuda) {
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
    comm_ = dist::connect(env, {.timeout = std::chrono::seconds(config_.ddp_timeout), .cuda = device_.is_cuda()});
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
    model_ = model::LlamaForCausalLM(model::load_llama_config(config_.model),
                                     at::TensorOptions().device(device_).dtype(at::kFloat));
    model_->init_weights(static_cast<uint64_t>(config_.seed));
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

void Trainer::apply_auto_fit() {
  cost::PlanConfig p;
  p.source = config_.source;
  p.model_config = model_->config();
  p.cutoff_lens = {config_.cutoff_len};
  p.dtype = config_.bf16 ? "bf16" : config_.fp16 ? "fp16" : "fp32";
  p.kernels = config_.kernels;
  p.cuda = device_.is_cuda();
  p.kernel_choices = kernel_choices(config_.kernels, config_.bf16 || config_.fp16 ? 2 : 4, p.cuda);
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
  p.world_size = world_size();
  p.zero_stage = world_size() > 1 ? zero_stage_ : 0;
  p.ddp_bucket_cap_mb = config_.ddp_bucket_cap_mb;
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
  config_.gradient_checkpointing_policy = selective ? "selective" : best->every > 1 ? "every_n" : "full";
  config_.gradient_checkpointing_every = std::max(best->every, 1);
  state_->auto_fit = fmt::format(
      "micro-batch {} x accumulation {} x {} rank{} = {} sequences (target {}), recomputation {}; predicted {:.2f} GB "
      "of "
      "{:.2f} GB",
      best->micro_batch, best->grad_accum, world_size(), world_size() == 1 ? "" : "s", best->global_sequences,
      p.target_sequences, best->policy, best->needed_bytes / 1e9, p.device_memory_bytes / 1e9);
}

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
  const int64_t blocks = train_split->num_tokens() / config_.cutoff_len;
  if (blocks == 0) {
    throw config::ConfigError(
        config::config_message(config_.source, "cutoff_len",
                               fmt::format("{} is longer than the whole train split of {} ({} tokens)",
                                           config_.cutoff_len, state_->data_dir, train_split->num_tokens())));
  }
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
  } else if (state_->shards->has_split("val")) {
    const auto val_split = state_->shards->split("val");
    if (val_split->num_tokens() >= config_.cutoff_len) {
      val_set_ = std::make_shared<data::PackedDataset>(val_split, config_.cutoff_len);
    }
  }
  if (!train_set_) train_set_ = std::make_shared<data::PackedDataset>(train_split, config_.cutoff_len);
  data::LoaderOptions lo;
  lo.batch_size = config_.per_device_train_batch_size;
  lo.seed = static_cast<uint64_t>(config_.seed);
  lo.segment_ids = config_.neat_packing;
  lo.rank = rank();
  lo.world_size = world_size();
  if (!plan_only_) loader_ = std::make_unique<data::DataLoader>(train_set_, lo);

  plan_ = plan_steps(train_set_->num_blocks(), config_.per_device_train_batch_size, world_size(),
                     config_.gradient_accumulation_steps, config_.num_train_epochs, config_.max_steps);
}

void Trainer::setup_optimizer() {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
  const optim::AdamWConfig adamw{.beta1 = config_.adam_beta1,
                                 .beta2 = config_.adam_beta2,
                                 .eps = config_.adam_epsilon,
                                 .weight_decay = config_.weight_decay};
  if (comm_) {
    // Every rank starts from rank 0's weights (a model from a checkpoint is the same everywhere
    // anyway; a fresh init could differ with a platform's random numbers).
    dp_ = std::make_unique<dist::DataParallel>(
        comm_, named,
        dist::DataParallelOptions{.bucket_cap_bytes = config_.ddp_bucket_cap_mb << 20, .zero_stage = zero_stage_});
    dp_->broadcast_parameters();
    optimizer_ = std::make_unique<optim::AdamW>(dp_->optimizer_params(), adamw);
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(named, adamw);
  }
  if (config_.fp16) scaler_ = std::make_unique<optim::GradScaler>(device_);

  if (config_.selective_recomputation()) {
    set_selective_recomputation(model_, true);
  } else {
    set_activation_checkpointing(model_, config_.gradient_checkpointing, std::max(config_.checkpoint_every(), 1));
  }
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

Trainer::~Trainer() = default;

std::string Trainer::banner() const {
  const auto memory = cost::estimate_training_memory(
      model_->config(), config_.per_device_train_batch_size, config_.cutoff_len,
      cost::MemoryOptions{.compute_bytes = autocast_dtype_ ? 2 : 4,
                          .activation_checkpointing = config_.gradient_checkpointing,
                          .checkpoint_every = std::max(config_.checkpoint_every(), 1),
                          .selective = config_.selective_recomputation(),
                          .cuda = device_.is_cuda(),
                          .kernels = kernel_choices(config_.kernels, autocast_dtype_ ? 2 : 4, device_.is_cuda()),
                          .data_parallel = dp_ != nullptr || (plan_only_ && env_launcher_ != "none"),
                          .world_size = world_size(),
                          .zero_stage = zero_stage_,
                          .bucket_cap_bytes = config_.ddp_bucket_cap_mb << 20});
  std::string out = training_banner(plan_, model_->num_parameters());
  out += fmt::format("\n  Device = {}, compute dtype = {}, kernels = {}", device_.str(),
                     autocast_dtype_ ? (config_.bf16 ? "bf16 (autocast)" : "fp16 (autocast, loss scaling)") : "fp32",
                     config_.kernels);
  if (comm_) {
    out += fmt::format("\n  Distributed = {} processes ({}, {}; this is rank {}), ZeRO stage {}, buckets of {} MB",
                       world_size(), comm_->env().launcher, comm_->backend(), rank(), zero_stage_,
                       config_.ddp_bucket_cap_mb);
  } else if (plan_only_ && env_launcher_ != "none") {
    out += fmt::format(
        "\n  Distributed = {} processes ({}; planned, not joined; this is rank {}), ZeRO stage {}, "
        "buckets of {} MB",
        env_world_, env_launcher_, env_rank_, zero_stage_, config_.ddp_bucket_cap_mb);
  }
  const bool per_rank = comm_ || (plan_only_ && env_launcher_ != "none");
  if (source_) {
    out += "\n  Data = batches supplied by the host program";
  } else {
    out += fmt::format("\n  Data = {} ({} train tokens in {} blocks of {}, {} dropped; {})", state_->data_dir,
                       with_commas(state_->shards->split("train")->num_tokens()), with_commas(train_set_->num_blocks()),
                       config_.cutoff_len, with_commas(train_set_->dropped_tokens()),
                       val_set_ ? fmt::format("val {} blocks{}", with_commas(val_set_->num_blocks()),
                                              config_.val_size > 0 ? " held out by val_size" : "")
                                : "no val split");
  }
  out += fmt::format("\n  Predicted peak memory{} = {} (at the {}:", per_rank ? " per rank" : "",
                     human_bytes(memory.total()), memory.peak_phase);
  for (const auto& [name, bytes] : memory.components) {
    if (bytes > 0) out += fmt::format(" {} {};", name, human_bytes(bytes));
  }
  out.back() = ')';
  if (!state_->auto_fit.empty()) out += "\n  Auto-fit = " + state_->auto_fit;
  if (state_->global_step > 0) out += fmt::format("\n  Resuming at step {}", with_commas(state_->global_step));
  return out;
}

EvalOptions Trainer::eval_options() {
  EvalOptions o{.batch_size = config_.per_device_eval_batch_size,
                .device = device_,
                .autocast_dtype = autocast_dtype_,
                .neat_packing = config_.neat_packing,
                .should_stop = [this] { return stop_requested(); },
                .rank = rank(),
                .world_size = world_size()};
  if (comm_) {
    o.host_sum = [this](std::vector<double> v) { return comm_->host_sum(std::move(v)); };
    o.host_max = [this](std::vector<int64_t> v) { return comm_->host_max(std::move(v)); };
  }
  return o;
}

EvalResult Trainer::evaluate() {
  if (plan_only_) throw std::logic_error("Trainer::evaluate: this trainer only plans (Trainer::plan_only)");
  if (!val_set_) {
    throw std::runtime_error(source_ ? "evaluate: this trainer's batches come from the host; pass an evaluation source"
                                     : "evaluate: the dataset has no 'val' split");
  }
  const ops::BackendScope kernels(config_.kernels);
  const bool training = model_->is_training();
  EvalResult r = evaluate_dataset(model_, val_set_, eval_options());
  model_->train(training);
  return r;
}

EvalResult Trainer::evaluate(const BatchSource& source) {
  if (plan_only_) throw std::logic_error("Trainer::evaluate: this trainer only plans (Trainer::plan_only)");
  const ops::BackendScope kernels(config_.kernels);
  const bool training = model_->is_training();
  EvalResult r = evaluate_batches(
      model_,
      [&]() -> std::optional<MicroBatch> {
        std::optional<MicroBatch> b = source();
        if (b) check_host_batch(*b, model_->config().vocab_size);
        return b;
      },
      eval_options());
  model_->train(training);
  return r;
}

void Trainer::log_metrics(const std::string& json_line) {
  if (callbacks_.on_log) callbacks_.on_log(json_line);
  if (!is_main()) return;
  const fs::path path = fs::path(config_.output_dir) / "metrics.jsonl";
  std::ofstream out(path, std::ios::app);
  out << json_line << "\n";
  if (!out) throw std::runtime_error(fmt::format("{}: cannot write", path.string()));
}

void Trainer::prepare_output_dir() {
  // Rank 0 alone tidies the (shared) output folder; the others wait for it.
  if (is_main()) prepare_output_dir_on_main();
  if (comm_) comm_->barrier();
}

void Trainer::clean_incomplete_on_main() {
  const fs::path out(config_.output_dir);
  const auto cleaned = clean_incomplete_checkpoints(out);
  if (!cleaned.empty()) {
    logger()->info("kiln-pretrain: {}: cleaned up {} incomplete checkpoint folder{} of an interrupted save ({})",
                   out.string(), cleaned.size(), cleaned.size() == 1 ? "" : "s", fmt::join(cleaned, "; "));
  }
}

void Trainer::prepare_output_dir_on_main() {
  const fs::path out(config_.output_dir);
  fs::create_directories(out);
  clean_incomplete_on_main();
  const SetAside aside =
      set_aside_later_checkpoints(out, state_->global_step, state_->resumed_from, config_.overwrite_output_dir);
  if (!aside.checkpoints.empty()) {
    std::vector<std::string> names;
    for (const auto& p : aside.checkpoints) names.push_back(p.filename().string());
    logger()->info(
        "kiln-pretrain: {}: {} ({}) of an earlier run, past this run's start at step {}: {}", out.string(),
        aside.checkpoints.size() == 1 ? "a checkpoint" : "checkpoints", fmt::join(names, ", "), state_->global_step,
        aside.folder ? fmt::format("moved to {}", aside.folder->string()) : "deleted (overwrite_output_dir)");
  }
}

TrainResult Trainer::train() {
  if (plan_only_) throw std::logic_error("Trainer::train: this trainer only plans (Trainer::plan_only)");
  const ops::BackendScope kernels(config_.kernels);  // this trainer's kernels, on this thread only
  prepare_output_dir();
  State& st = *state_;
  if (!st.peak) st.peak = cost::device_peak(device_, autocast_dtype_.value_or(at::kFloat));
  std::vector<at::Tensor> params = model_->parameters();
  const auto fopts = at::TensorOptions().device(device_).dtype(at::kFloat);
  auto reset_window = [&] {
    st.window_loss_sum = at::zeros({}, fopts);
    st.window_good_targets = at::zeros({}, fopts);
    st.window_steps = 0;
    st.window_tokens = 0;
    st.window_comm_seconds = 0;
    st.window_start = std::chrono::steady_clock::now();
  };
  reset_window();
  st.first_bad_step = at::full({}, -1.0, fopts);
  optim::ScheduleConfig sched{
      .type = config_.lr_scheduler_type,
      .total_steps = plan_.total_steps,
      .warmup_steps = optim::resolve_warmup_steps(config_.warmup_steps, config_.warmup_ratio, plan_.total_steps),
      .min_lr_ratio = config_.min_lr_ratio,
      .decay_ratio = config_.decay_ratio};
  TrainResult result;
  ProgressBar bar(plan_.total_steps, st.global_step, is_main() && progress_bar_ ? stderr : nullptr);
  model_->train();
  double last_lr = 0;
  std::optional<at::Tensor> last_norm;
  // This call's share, for the summary entry (HF's speed metrics and train_loss).
  const auto train_start = std::chrono::steady_clock::now();
  const int64_t start_step = st.global_step;
  double session_loss_sum = 0;  // sum over logged windows of loss x steps
  int64_t session_loss_steps = 0;
  std::optional<EvalResult> session_eval;
  json last_eval_entry;
  if (is_main() && config_.report_to_tensorboard()) {
    const std::string dir = config_.logging_dir.empty() ? default_logging_dir(config_.output_dir) : config_.logging_dir;
    st.tensorboard = std::make_unique<EventWriter>(dir);
    logger()->info("kiln-pretrain: TensorBoard event file {}", st.tensorboard->path());
  }
  const auto epoch_at = [this](int64_t step) { return epoch_of(step); };
  // A log_history entry: into trainer_state.json's history and TensorBoard, and (a training window
  // or an evaluation, not the closing summary) metrics.jsonl and on_log.
  const auto record = [&](const json& entry, bool to_metrics = true) {
    st.log_history.push_back(entry);
    if (to_metrics) log_metrics(entry.dump());
    if (st.tensorboard) st.tensorboard->add_scalars(entry.at("step").get<int64_t>(), tensorboard_scalars(entry));
  };

  auto log_window = [&](int64_t step) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.window_start).count();
    const double first_bad = st.first_bad_step.item<double>();  // the one host sync of the window
    if (first_bad >= 0 && config_.nan_policy == "stop") {
      throw NonFiniteLossError(
          fmt::format("non-finite loss or gradient at step {} (nan_policy: stop; the update of that step was skipped). "
                      "Lower learning_rate, use bf16 instead of fp16, or set nan_policy: skip",
                      static_cast<int64_t>(first_bad)));
    }
    const double good = st.window_good_targets.item<double>();
    const double loss = good > 0 ? st.window_loss_sum.item<double>() / good : NAN;
    const double tokens_per_s = static_cast<double>(st.window_tokens) / seconds;
    json entry = {{"loss", loss},
                  {"grad_norm", last_norm ? last_norm->item<double>() : 0.0},
                  {"learning_rate", last_lr},
                  {"epoch", epoch_at(step)},
                  {"step", step},
                  {"tokens_per_second", tokens_per_s},
                  {"peak_memory_bytes", device::peak_memory_bytes(device_)}};
    if (st.peak) {
      // Per device: the job's tokens/s over its world size.
      const double per_device = tokens_per_s / world_size();
      entry["tflops"] = st.flops.train() * per_device / 1e12;
      entry["mfu"] = st.flops.train() * per_device / (st.peak->tflops * 1e12);
    }
    // Host waits measure exposed communication on the CPU (Gloo); NCCL's waits only order streams.
    if (dp_ && device_.is_cpu()) entry["comm_wait_share"] = st.window_comm_seconds / seconds;
    if (first_bad >= 0) entry["skipped_nonfinite_since_step"] = static_cast<int64_t>(first_bad);
    record(entry);
    if (std::isfinite(loss)) {
      session_loss_sum += loss * static_cast<double>(st.window_steps);
      session_loss_steps += st.window_steps;
    }
    result.final_loss = loss;
    st.first_bad_step.fill_(-1.0);
    reset_window();
    if (!is_main()) return;
    bar.clear();
    logger()->info("{{'loss': {:.4f}, 'grad_norm': {:.4f}, 'learning_rate': {:.3e}, 'epoch': {:.2f}}}  {}/s{}, peak {}",
                   loss, entry["grad_norm"].get<double>(), last_lr, entry["epoch"].get<double>(),
                   with_commas(static_cast<int64_t>(tokens_per_s)) + " tokens",
                   st.peak ? fmt::format(", MFU {:.1f}% of {:.3g} TFLOP/s ({})", entry["mfu"].get<double>() * 100,
                                         st.peak->tflops, st.peak->name)
                           : "",
                   human_bytes(entry["peak_memory_bytes"].get<double>()));
    bar.print_line();
  };

  // False when a stop request cut the evaluation short (nothing is recorded then).
  auto run_eval = [&](int64_t step) {
    if (!val_set_) return true;
    const auto eval_start = std::chrono::steady_clock::now();
    const EvalResult ev = evaluate();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
    model_->train();
    if (ev.interrupted) return false;
    st.last_eval = ev;
    session_eval = ev;
    if (callbacks_.on_evaluate) callbacks_.on_evaluate(step, ev);
    // HF's evaluation entry (speed_metrics("eval"), rounded as there) plus kiln's perplexity and tokens.
    const double samples = static_cast<double>(val_set_->num_blocks());
    const double batches = std::ceil(samples / static_cast<double>(config_.per_device_eval_batch_size * world_size()));
    json entry = {{"eval_loss", ev.loss},
                  {"eval_perplexity", ev.perplexity},
                  {"eval_tokens", ev.tokens},
                  {"eval_runtime", std::round(seconds * 1e4) / 1e4},
                  {"eval_samples_per_second", std::round(samples / seconds * 1e3) / 1e3},
                  {"eval_steps_per_second", std::round(batches / seconds * 1e3) / 1e3},
                  {"epoch", epoch_at(step)},
                  {"step", step}};
    record(entry);
    last_eval_entry = entry;
    if (is_main()) {
      bar.clear();
      logger()->info("{{'eval_loss': {:.4f}, 'eval_perplexity': {:.3f}, 'step': {}}}", ev.loss, ev.perplexity, step);
    }
    st.window_start = std::chrono::steady_clock::now();  // evaluation time is not training speed
    return true;
  };

  const auto stop_pending = [this] { return stop_requested(); };
  // Acts on a pending SIGINT/SIGTERM: one line, a checkpoint of the last completed step. When this
  // run has completed no step (a stop during set-up or the first step), the state to resume from
  // is the one it started from (the checkpoint it resumed, or a fresh start), so nothing is
  // written: a preempted job's grace period is not spent saving what is already on disk.
  const auto stop_now = [&](const std::string& where) {
    const int sig = pending_stop_signal().exchange(0);
    const char* who = sig == 0 && comm_ ? "a stop request (of another rank)" : stop_signal_name(sig);
    result.interrupted = true;
    if (st.global_step == start_step) {
      if (is_main()) {
        bar.clear();
        logger()->info("kiln-pretrain: {} received {}; no step trained since the start (step {}), nothing to save{}",
                       who, where, st.global_step,
                       st.resumed_from.empty() ? "" : fmt::format(" (resume from {})", st.resumed_from));
      }
      result.last_checkpoint = st.resumed_from;
      return;
    }
    if (is_main()) {
      bar.clear();
      logger()->info("kiln-pretrain: {} received {}; saving a checkpoint at step {}", who, where, st.global_step);
    }
    result.last_checkpoint = save_checkpoint(st.global_step);
  };

  while (st.global_step < plan_.total_steps) {
    if (stop_pending()) {
      stop_now(fmt::format("at step {}", st.global_step));
      break;
    }
    // Where the step starts: an interrupted step is undone to exactly here, so the checkpoint
    // saved for it resumes with the same batches and random numbers.
    const std::optional<data::LoaderState> loader_at_step =
        loader_ ? std::optional<data::LoaderState>(loader_->state()) : std::nullopt;
    const at::Tensor rng_at_step = cpu_rng_state();
    std::vector<MicroBatch> micro;
    int64_t targets = 0, tokens = 0, exhausted = 0;
    for (int64_t i = 0; i < config_.gradient_accumulation_steps; ++i) {
      if (source_) {
        std::optional<MicroBatch> b = source_();
        if (!b) {
          exhausted = 1;
          break;
        }
        check_host_batch(*b, model_->config().vocab_size);
        micro.push_back(std::move(*b));
      } else {
        data::Batch b = loader_->next();
        micro.push_back({std::move(b.input_ids), std::move(b.labels), std::move(b.segment_ids)});
      }
      targets += count_targets(micro.back().labels.cpu());
      tokens += micro.back().input_ids.numel();
    }
    if (comm_) {
      // The step's loss is normalised by every rank's target tokens (host values: no device sync);
      // a rank whose source ran out ends the run for all of them.
      const auto sums =
          comm_->host_sum({static_cast<double>(targets), static_cast<double>(tokens), static_cast<double>(exhausted)});
      targets = static_cast<int64_t>(sums[0]);
      tokens = static_cast<int64_t>(sums[1]);
      exhausted = static_cast<int64_t>(sums[2]);
    }
    if (exhausted > 0) {
      if (is_main()) {
        bar.clear();
        logger()->info(
            "kiln-pretrain: the host's batches ran out during step {} (dropped); saving a checkpoint at step {}",
            st.global_step + 1, st.global_step);
      }
      result.last_checkpoint = save_checkpoint(st.global_step);
      result.data_exhausted = true;
      break;
    }
    AccumulateOptions acc_opts;
    acc_opts.autocast_dtype = autocast_dtype_;
    acc_opts.total_targets = targets;
    acc_opts.device = device_;
    acc_opts.should_stop = stop_pending;
    if (scaler_) acc_opts.loss_scale = scaler_->scale();
    if (dp_) {
      acc_opts.before_backward = [this](bool last) { dp_->begin_backward(last); };
      acc_opts.after_backward = [this] { dp_->end_backward(); };
    }
    AccumulateResult acc = accumulate_gradients(model_, micro, acc_opts);
    const auto zero_grad = [&] { dp_ ? dp_->zero_grad() : optimizer_->zero_grad(); };
    if (acc.interrupted) {
      zero_grad();
      if (loader_at_step) loader_->restore(*loader_at_step);
      set_cpu_rng_state(rng_at_step);
      stop_now(fmt::format("during step {} (its partial gradients are dropped)", st.global_step + 1));
      break;
    }
    st.window_tokens += tokens;
    st.total_flos += st.flops.train() * static_cast<double>(tokens);
    if (dp_) {
      at::Tensor sum = acc.loss_sum.reshape({1}).clone();  // the step's loss over every rank
      dp_->all_reduce(sum);
      acc.loss_sum = sum.squeeze();
    }
    if (scaler_) {
      if (dp_ && zero_stage_ == 2) {
        scaler_->unscale_grads(dp_->local_grads());
        dp_->all_reduce(scaler_->found_inf());  // an overflow in any shard skips the step everywhere
      } else {
        scaler_->unscale(params);
      }
    }
    const at::Tensor norm =
        dp_ ? dp_->clip_grad_norm(config_.max_grad_norm) : optim::clip_grad_norm(params, config_.max_grad_norm);
    const at::Tensor bad = acc.loss_sum.isfinite().logical_and(norm.to(device_).isfinite()).logical_not();
    at::Tensor skip = bad.to(at::kFloat).reshape({1});
    if (scaler_) skip = at::maximum(skip, scaler_->found_inf());
    last_lr = config_.learning_rate * optim::lr_multiplier(sched, st.global_step);
    optimizer_->step(last_lr, std::nullopt, skip);
    if (dp_) dp_->after_step();
    if (scaler_) scaler_->update();
    if (dp_) st.window_comm_seconds += dp_->stats().exposed_seconds;
    zero_grad();
    ++st.global_step;
    // Book-keeping on the device: a skipped step contributes no loss, and the first bad step is kept.
    st.window_loss_sum.add_(at::where(bad, at::zeros_like(acc.loss_sum), acc.loss_sum));
    st.window_good_targets.add_(bad.logical_not().to(at::kFloat) * static_cast<double>(targets));
    st.first_bad_step.copy_(at::where(bad.logical_and(st.first_bad_step < 0),
                                      at::full({}, static_cast<double>(st.global_step), fopts), st.first_bad_step));
    last_norm = norm;
    ++st.window_steps;
    bar.update(st.global_step);
    if (callbacks_.on_step) callbacks_.on_step(st.global_step);

    const int64_t step = st.global_step;
    if (step % config_.logging_steps == 0 || step == plan_.total_steps) log_window(step);
    if (config_.eval_steps > 0 && step % config_.eval_steps == 0 && step != plan_.total_steps && !run_eval(step)) {
      stop_now(fmt::format("during the evaluation at step {} (the partial evaluation is dropped)", step));
      break;
    }
    if (config_.save_steps > 0 && step % config_.save_steps == 0 && step != plan_.total_steps) {
      result.last_checkpoint = save_checkpoint(step);
    }
  }
  if (!result.interrupted && !result.data_exhausted) {
    if (st.window_steps > 0) log_window(st.global_step);
    if (!run_eval(st.global_step)) {
      stop_now(
          fmt::format("during the final evaluation at step {} (the partial evaluation is dropped)", st.global_step));
    } else {
      result.last_checkpoint = save_checkpoint(st.global_step);
    }
  }
  bar.finish();

  // HF's closing summary entry, then what Trainer.save_state / save_metrics and LLaMA-Factory's
  // plot_loss write into output_dir (rank 0).
  const double runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
  const int64_t steps_trained = st.global_step - start_step;
  const double samples = static_cast<double>(steps_trained * plan_.total_batch_size());
  json summary = {{"train_runtime", std::round(runtime * 1e4) / 1e4},
                  {"train_samples_per_second", runtime > 0 ? std::round(samples / runtime * 1e3) / 1e3 : 0.0},
                  {"train_steps_per_second", runtime > 0 ? std::round(steps_trained / runtime * 1e3) / 1e3 : 0.0},
                  {"total_flos", st.total_flos},
                  {"train_loss", session_loss_steps > 0 ? session_loss_sum / static_cast<double>(session_loss_steps)
                                                        : static_cast<double>(NAN)},
                  {"epoch", epoch_at(st.global_step)},
                  {"step", st.global_step}};
  record(summary, /*to_metrics=*/false);
  if (is_main()) {
    summary.erase("step");
    io::write_file_atomic((fs::path(config_.output_dir) / "trainer_state.json").string(),
                          trainer_state_text(hf_trainer_state(st.global_step)));
    save_metrics(config_.output_dir, "train", summary);
    if (session_eval) {
      // LLaMA-Factory's do_eval metrics: the evaluation's entry and its perplexity.
      json metrics = last_eval_entry;
      metrics.erase("step");
      metrics["perplexity"] = session_eval->perplexity;
      save_metrics(config_.output_dir, "eval", metrics);
    }
    if (config_.plot_loss) {
      std::vector<std::string> keys = {"loss"};
      if (val_set_) keys.push_back("eval_loss");
      plot_loss(config_.output_dir, st.log_history, keys);
    }
  }
  st.tensorboard.reset();
  result.global_step = st.global_step;
  result.final_eval = st.last_eval;
  return result;
}

double Trainer::epoch_of(int64_t step) const {
  return static_cast<double>(step * config_.gradient_accumulation_steps) /
         static_cast<double>(std::max<int64_t>(plan_.batches_per_epoch, 1));
}

HfTrainerState Trainer::hf_trainer_state(int64_t step) const {
  HfTrainerState s;
  s.global_step = step;
  s.epoch = epoch_of(step);
  s.max_steps = plan_.total_steps;
  s.logging_steps = config_.logging_steps;
  s.eval_steps = config_.eval_steps > 0 ? config_.eval_steps : config_.logging_steps;
  s.save_steps = config_.save_steps;
  s.train_batch_size = config_.per_device_train_batch_size;
  const int64_t per_epoch = std::max<int64_t>(plan_.updates_per_epoch, 1);
  s.num_train_epochs = (plan_.total_steps + per_epoch - 1) / per_epoch;
  s.total_flos = state_->total_flos;
  s.log_history = state_->log_history;
  return s;
}

namespace {

// Per-rank files of a data-parallel checkpoint: AdamW shards (ZeRO 1, 2) and random states (as HF's
// rng_state_{rank}).
std::string optimizer_shard_file(int rank, int world) {
  return fmt::format("optimizer.rank-{:05d}-of-{:05d}.safetensors", rank, world);
}
std::string rng_state_file(int rank, int world) {
  return world > 1 ? fmt::format("rng_state_{}.safetensors", rank) : "rng_state.safetensors";
}
// What a resume must match that HF's trainer_state.json has no field for.
constexpr const char* kKilnStateFile = "kiln_state.json";

}  // namespace

std::string Trainer::save_checkpoint(int64_t step) {
  // Data parallel: rank 0 prepares the folder; every rank writes its part into it; once all have
  // (a barrier), rank 0 renames it into place, so a checkpoint-N folder is whole or absent.
  State& st = *state_;
  const fs::path final_dir = fs::path(config_.output_dir) / fmt::format("checkpoint-{}", step);
  if (st.last_saved_step == step && fs::is_directory(final_dir)) return final_dir.string();
  const fs::path tmp = fs::path(config_.output_dir) / fmt::format(".checkpoint-{}.tmp", step);
  if (is_main()) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  if (comm_) comm_->barrier();
  const bool sharded = dp_ && zero_stage_ > 0;
  if (is_main() || sharded) {
    io::NamedTensors opt;
    for (const auto& [name, t] : optimizer_->state_dict()) opt.emplace_back(name, t);
    if (scaler_) {
      opt.emplace_back("grad_scaler.scale", scaler_->scale());
      opt.emplace_back("grad_scaler.growth_tracker", scaler_->growth_tracker());
    }
    const std::string file = sharded ? optimizer_shard_file(rank(), world_size()) : "optimizer.safetensors";
    io::save_safetensors((tmp / file).string(), opt);
  }
  const at::Tensor cpu_rng = cpu_rng_state();
  io::save_safetensors((tmp / rng_state_file(rank(), world_size())).string(), {{"cpu", cpu_rng}});
  if (is_main()) {
    model::save_pretrained(model_, tmp.string());
    if (loader_) {  // a host's batches have no position kiln could restore
      io::write_file_atomic((tmp / "loader_state.json").string(), loader_->state().to_json());
      io::write_file_atomic((tmp / data::DataRecord::kFile).string(),
                            data::DataRecord::of(state_->data_dir, state_->shards->meta()).to_json());
    }
    // HF's trainer_state.json (TrainerState.load_from_json reads it); kiln's own facts beside it.
    io::write_file_atomic((tmp / "trainer_state.json").string(), trainer_state_text(hf_trainer_state(step)));
    const json kiln_state = {{"world_size", world_size()}, {"zero_stage", dp_ ? zero_stage_ : 0}};
    io::write_file_atomic((tmp / kKilnStateFile).string(), kiln_state.dump(2) + "\n");
  }
  if (comm_) comm_->barrier();  // every rank's part is on disk
  if (is_main()) {
    replace_folder_atomically(tmp, final_dir);
    rotate_checkpoints(config_.output_dir, config_.save_total_limit, {final_dir, fs::path(st.resumed_from)});
  }
  if (comm_) comm_->barrier();
  st.last_saved_step = step;
  if (callbacks_.on_save) callbacks_.on_save(step, final_dir.string());
  return final_dir.string();
}

void Trainer::resume(const std::string& dir) {
  const fs::path d(dir);
  state_->resumed_from = dir;
  for (const char* f : {"config.json", "loader_state.json", "trainer_state.json"}) {
    if (source_ && std::string(f) == "loader_state.json") continue;  // the host restores its own data
    if (!fs::exists(d / f)) {
      throw std::runtime_error(fmt::format("resume_from_checkpoint: {} is not a kiln checkpoint (no {})", dir, f));
    }
  }
  json ts;
  const char* key = "";
  try {
    ts = json::parse(read_text(d / "trainer_state.json"));
    key = "global_step";
    state_->global_step = ts.at(key).get<int64_t>();
    if (state_->global_step < 0) throw std::invalid_argument(fmt::format("must be >= 0, got {}", state_->global_step));
    key = "log_history";
    if (!ts.at(key).is_array()) throw std::invalid_argument("must be an array");
    state_->log_history = ts.at(key);
    key = "total_flos";
    state_->total_flos = ts.value(key, 0.0);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("{}: invalid trainer state{}: {}", (d / "trainer_state.json").string(),
                                         *key ? fmt::format(" (field {})", key) : "", e.what()));
  }
  // kiln_state.json; checkpoints of kiln 0.2 kept these keys in trainer_state.json.
  fs::path state_file = d / "trainer_state.json";
  if (fs::exists(d / kKilnStateFile)) {
    state_file = d / kKilnStateFile;
    try {
      ts = json::parse(read_text(state_file));
    } catch (const json::exception& e) {
      throw std::runtime_error(fmt::format("{}: invalid JSON: {}", state_file.string(), e.what()));
    }
  }
  // The data order and the optimizer shards depend on the world size: resume on the same one.
  const auto field = [&](const char* key, int64_t fallback, int64_t lo, int64_t hi) {
    const auto it = ts.find(key);
    if (it == ts.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
      throw std::runtime_error(
          fmt::format("{}: {} must be an integer in [{}, {}], got {}", state_file.string(), key, lo, hi, it->dump()));
    }
    return it->get<int64_t>();
  };
  if (!ts.is_object()) throw std::runtime_error(fmt::format("{}: expected a JSON object", state_file.string()));
  const int64_t saved_world = field("world_size", 1, 1, int64_t{1} << 20);
  const int64_t saved_stage = field("zero_stage", 0, 0, 2);
  const int64_t stage = dp_ ? zero_stage_ : 0;
  if (saved_world != world_size() || (saved_stage != stage && (saved_stage > 0 || stage > 0))) {
    throw std::runtime_error(
        fmt::format("resume_from_checkpoint: {} was written by {} process{} with zero_stage {} ({}); this run has {} "
                    "with zero_stage {}. Resume with the same world size and stage (docs/distributed.md)",
                    dir, saved_world, saved_world == 1 ? "" : "es", saved_stage, state_file.filename().string(),
                    world_size(), stage));
  }
  const bool sharded = stage > 0;
  const std::string opt_file = sharded ? optimizer_shard_file(rank(), world_size()) : "optimizer.safetensors";
  if (!fs::exists(d / opt_file)) {
    throw std::runtime_error(fmt::format("resume_from_checkpoint: {} is not a kiln checkpoint (no {})", dir, opt_file));
  }
  io::SafetensorsCheckpoint weights(dir);
  model::load_weights(*model_, weights, dir);

  io::SafetensorsFile opt((d / opt_file).string());
  std::map<std::string, at::Tensor> state;
  for (const auto& name : opt.names()) state[name] = opt.tensor(name);
  try {
    optimizer_->load_state_dict(state);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", opt.path(), e.what()));
  }
  if (scaler_ && opt.contains("grad_scaler.scale")) {
    const at::Tensor scale = opt.tensor("grad_scaler.scale"), tracker = opt.tensor("grad_scaler.growth_tracker");
    const auto one_number = [](const at::Tensor& t) { return t.numel() == 1 && !at::isComplexType(t.scalar_type()); };
    if (!one_number(scale) || !std::isfinite(scale.item<double>()) || scale.item<double>() <= 0 ||
        !one_number(tracker) || tracker.item<double>() < 0) {
      throw std::runtime_error(
          fmt::format("{}: grad_scaler.scale must be one finite number > 0 and "
                      "grad_scaler.growth_tracker one number >= 0",
                      opt.path()));
    }
    scaler_->mutable_scale().copy_(scale.reshape(scaler_->scale().sizes()));
    scaler_->growth_tracker().copy_(tracker.reshape(scaler_->growth_tracker().sizes()));
  }
  if (const fs::path rng_file = d / rng_state_file(rank(), world_size()); fs::exists(rng_file)) {
    io::SafetensorsFile rng(rng_file.string());
    try {
      set_cpu_rng_state(rng.tensor("cpu").clone());
    } catch (const c10::Error& e) {
      throw std::runtime_error(fmt::format("{}: tensor 'cpu' is not a CPU generator's state ({})", rng_file.string(),
                                           e.what_without_backtrace()));
    }
  }
  if (loader_ && state_->shards) {
    // The checkpoint's data position applies to the data it was written for: the same tokenizer
    // (a position in other tokens would silently train on a different stream).
    if (const auto record = data::DataRecord::read(dir)) {
      const auto& meta = state_->shards->meta();
      if (record->tokenizer_fingerprint != meta.tokenizer_fingerprint || record->vocab_size != meta.vocab_size) {
        throw std::runtime_error(fmt::format(
            "{}: the checkpoint was trained on data of tokenizer {} (vocab_size {}, fingerprint {:016x}); this run's "
            "data {} has tokenizer {} (vocab_size {}, fingerprint {:016x}): resume on the same data",
            (d / data::DataRecord::kFile).string(), record->tokenizer, record->vocab_size,
            record->tokenizer_fingerprint, state_->data_dir, meta.tokenizer, meta.vocab_size,
            meta.tokenizer_fingerprint));
      }
    }
  }
  if (loader_) {
    const fs::path file = d / "loader_state.json";
    try {
      data::LoaderState loader_state = data::LoaderState::from_json(read_text(file));
      loader_state.rank = rank();  // rank 0 wrote it; every rank is at the same position of its own share
      loader_->restore(loader_state);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(fmt::format("{}: {}", file.string(), e.what()));
    }
  }
  if (state_->global_step > plan_.total_steps) {
    throw std::runtime_error(fmt::format("{}: global_step {} is past this run's {} steps",
                                         (d / "trainer_state.json").string(), state_->global_step, plan_.total_steps));
  }
}

}  // namespace kiln::train
