// The names of the files in a checkpoint-N folder and an output folder, and what tells a checkpoint
// of transformers' Trainer (LLaMA-Factory's) from kiln's. docs/training.md ("Outputs",
// "Checkpoints") says what each file holds.
//
// A kiln checkpoint is HF's layout (the model folder, trainer_state.json, optimizer.pt,
// scheduler.pt, scaler.pt) with kiln's own files beside it (optimizer.safetensors or its shards,
// loader_state.json, kiln_state.json, rng_state.safetensors); its training_args.json stands for
// HF's pickled training_args.bin. A checkpoint without kiln's files is read as transformers'.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kiln::train {

// ---- HF's model folder (save_pretrained) ---------------------------------------------------------
inline constexpr const char* kModelConfigFile = "config.json";
inline constexpr const char* kModelWeightsFile = "model.safetensors";
inline constexpr const char* kModelWeightsIndexFile = "model.safetensors.index.json";  // sharded weights
inline constexpr const char* kTorchWeightsFile = "pytorch_model.bin";  // torch.save weights, which kiln does not read

// ---- transformers' Trainer checkpoint ------------------------------------------------------------
// checkpoint-N: HF's PREFIX_CHECKPOINT_DIR and the step.
inline constexpr const char* kCheckpointPrefix = "checkpoint-";
std::string checkpoint_folder_name(int64_t step);
inline constexpr const char* kTrainerStateFile = "trainer_state.json";  // TrainerState.save_to_json
inline constexpr const char* kHfOptimizerFile = "optimizer.pt";         // AdamW.state_dict() (hf_optimizer_files.h)
inline constexpr const char* kHfSchedulerFile = "scheduler.pt";         // LambdaLR.state_dict()
inline constexpr const char* kHfScalerFile = "scaler.pt";               // GradScaler.state_dict() (fp16)
inline constexpr const char* kHfRngStateFile = "rng_state.pth";  // Python, numpy and torch random states (one process)
// kiln's stand-in for HF's pickled training_args.bin: the run's keys (pretrain_config_json).
inline constexpr const char* kTrainingArgsFile = "training_args.json";

// ---- LLaMA-Factory's output folder ---------------------------------------------------------------
inline constexpr const char* kTrainerLogFile = "trainer_log.jsonl";  // LogCallback's one line per log entry
inline constexpr const char* kModelCardFile = "README.md";           // create_model_card

// ---- kiln's files beside HF's --------------------------------------------------------------------
inline constexpr const char* kKilnStateFile = "kiln_state.json";      // what a resume must match (world size, stage)
inline constexpr const char* kLoaderStateFile = "loader_state.json";  // the data loader's position
inline constexpr const char* kKilnOptimizerFile = "optimizer.safetensors";  // AdamW's state, one process or stage 0
inline constexpr const char* kMetricsFile = "metrics.jsonl";  // output folder: each training window and evaluation
// Per-rank files of a data-parallel checkpoint: AdamW shards (ZeRO 1, 2) and random states (as
// HF's rng_state_{rank}; rng_state.safetensors with one process).
std::string optimizer_shard_file(int rank, int world);
std::string rng_state_file(int rank, int world);

// ---- Which checkpoint a folder holds -------------------------------------------------------------
// A checkpoint of transformers' Trainer (LLaMA-Factory's): HF's optimizer.pt and none of kiln's own
// files (kiln_state.json, loader_state.json, optimizer.safetensors).
bool is_hf_trainer_checkpoint(const std::filesystem::path& dir);

// The files a resume checks for before it reads any, in that order: config.json,
// trainer_state.json and scheduler.pt for transformers' checkpoint; config.json, loader_state.json
// and trainer_state.json for kiln's, without loader_state.json when the host supplies the batches
// (`host_batches`: it restores its own data).
std::vector<const char*> resume_required_files(bool hf_trainer, bool host_batches);

// DeepSpeed's partitioned optimizer state, which kiln does not read: the name of `dir`'s
// global_step<N>/ folder, if it has one (nullopt also when `dir` is not a folder).
std::optional<std::string> deepspeed_state_folder(const std::filesystem::path& dir);

}  // namespace kiln::train
