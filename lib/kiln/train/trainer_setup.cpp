// The trainer's set-up: device and process group, then the plan (train/run_plan.h: settings,
// auto-fit, the data with rank 0 first, the step arithmetic), the model, the optimizer and loss scaler.
#include <cstdlib>
#include <filesystem>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include "kiln/common/device.h"
#include "kiln/common/env.h"
#include "kiln/common/logger.h"
#include "kiln/common/runtime_info.h"
#include "kiln/config/yaml.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/plan.h"
#include "kiln/data/default_corpus.h"
#include "kiln/data/lf_examples.h"
#include "kiln/data/shards.h"
#include "kiln/data/stream_dataset.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/dist/env.h"
#include "kiln/model/hf.h"
#include "kiln/optim/adamw.h"
#include "kiln/optim/grad.h"
#include "kiln/train/hf/checkpoint_layout.h"
#include "kiln/train/kernel_choices.h"
#include "kiln/train/recompute_layers.h"
#include "kiln/train/run_description.h"
#include "kiln/train/stop_request.h"
#include "kiln/train/trainer_internal.h"
#include "kiln/train/training_data.h"

namespace kiln::train {

namespace {

// model_name_or_path must hold weights unless the run starts from scratch: refused before the data
// is tokenized. A folder that is not there is read_hf_config's error (naming config.json).
void check_model_weights(const PretrainConfig& c) {
  if (c.model_name_or_path.empty() || c.train_from_scratch) return;
  const std::filesystem::path dir(c.model_name_or_path);
  if (!std::filesystem::is_directory(dir)) return;
  // io::SafetensorsCheckpoint's two layouts: one file, or shards and their index.
  const std::filesystem::path single = dir / kModelWeightsFile, index = dir / kModelWeightsIndexFile;
  if (std::filesystem::exists(single) || std::filesystem::exists(index)) return;
  const bool torch_bin = std::filesystem::exists(dir / kTorchWeightsFile);
  throw config::ConfigError(config::config_message(
      c.source, "model_name_or_path",
      fmt::format("{}: no weights to load: {} not found (nor {}){}. To initialise the model at random from {} and "
                  "train it with the folder's tokenizer, as LLaMA-Factory does, set train_from_scratch: true",
                  dir.string(), single.string(), index.filename().string(),
                  torch_bin ? " (pytorch_model.bin is there: kiln reads safetensors only; save the model with "
                              "transformers' save_pretrained, which writes safetensors)"
                            : "",
                  (dir / kModelConfigFile).string())));
}

}  // namespace

void Trainer::init() {
  config_.validate();
  check_model_weights(config_);
  // This rank's device and its job: joined before the plan, whose data rank 0 prepares first.
  const dist::DistEnv env = dist::read_dist_env();
  device_ = run_device(config_, env);
  if (config_.full_determinism) {
    // cuBLAS needs CUBLAS_WORKSPACE_CONFIG before its first handle: a process setting, which the
    // program sets (kiln::set_cublas_deterministic_workspace), never the library.
    if (!kiln::env::string("CUBLAS_WORKSPACE_CONFIG") && device_.is_cuda()) {
      logger()->warn(
          "kiln-pretrain: warning: full_determinism without CUBLAS_WORKSPACE_CONFIG in the environment: cuBLAS "
          "may not be deterministic (kiln::set_cublas_deterministic_workspace() sets it before the first tensor)");
    }
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  if (device_.is_cuda()) at::accelerator::setDeviceIndex(device_.index());
  if (env.distributed()) {
    comm_ = dist::connect(env, {.timeout = std::chrono::seconds(config_.ddp_timeout),
                                .cuda_device = device_.is_cuda() ? device_.index() : -1});
  }
  // The plan (train/run_plan.h): the settings as the run uses them (full_determinism's kernels,
  // auto_fit's choices), the data, the step arithmetic, the predicted memory.
  plan_ = plan_run(config_, {.host_batches = static_cast<bool>(source_),
                             .prepare_data = [this] { return prepare_data_main_first(); }});
  config_ = plan_.config;  // config_.kernels applies inside train() and evaluate() only (ops::BackendScope)
  zero_stage_ = config_.resolved_zero_stage();
  if (config_.bf16) autocast_dtype_ = at::kBFloat16;
  if (config_.fp16) autocast_dtype_ = at::kHalf;
  at::manual_seed(static_cast<uint64_t>(config_.seed));

  // Model: fp32 master parameters on the device. A preset, or model_name_or_path's config.json
  // with train_from_scratch (LLaMA-Factory's AutoModelForCausalLM.from_config after set_seed), is
  // initialised at random by the seed: the distribution of transformers' _init_weights, not its
  // numbers (docs/training.md, "Training from scratch"); a resume then loads the checkpoint's.
  if (!config_.model_name_or_path.empty() && !config_.train_from_scratch) {
    model_ = model::load_pretrained(config_.model_name_or_path, {.dtype = at::kFloat, .device = device_});
  } else {
    model_ = fresh_model(plan_.model, device_, static_cast<uint64_t>(config_.seed));
  }
  model_->fused_lm_loss = true;  // the trainer needs only the loss: never hold all logits
  if (!source_ && plan_.data.train_stream) {
    stream_ = std::make_unique<data::StreamLoader>(*plan_.data.train_stream);
  } else if (!source_) {
    loader_ = std::make_unique<data::DataLoader>(plan_.data.train, plan_.data.loader);
  }
  setup_optimizer();
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
