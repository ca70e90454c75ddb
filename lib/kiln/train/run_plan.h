// A run before anything is allocated: what kiln-pretrain --dry-run prints, and the first part of
// every Trainer's set-up (the same function, so what a dry run says is what the trainer runs).
//
// plan_run(config) reads the config, the launcher's environment (the job's shape, never joined
// here), the model's config (no weights), and the data: the shard folder (tokenizing it first when
// needed, as a run does), its packed examples and the loader's options; then the step
// arithmetic, auto_fit's choice, the run's description for the cost models and the predicted
// memory. It allocates no parameter, no optimizer state and no process group, and changes no
// process setting. A Trainer calls it too, after joining its job, with a hook that prepares the
// data on rank 0 first.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "kiln/cost/hardware.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/run.h"
#include "kiln/data/loader.h"
#include "kiln/dist/env.h"
#include "kiln/model/llama_config.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/run_description.h"
#include "kiln/train/step_plan.h"

namespace kiln::data {
class TokenShards;
struct StreamSpec;
}  // namespace kiln::data
namespace kiln::dist {
class Comm;
}

namespace kiln::train {

// One evaluation set: packed examples, or (streaming) a stream read afresh at every evaluation.
struct EvalSet {
  std::string prefix;  // its metrics' prefix as HF's Trainer names them: "eval" or "eval_<name>"
  std::shared_ptr<const data::PackedDataset> set;
  std::shared_ptr<const data::StreamSpec> stream;  // set null: epoch 0 of this stream (data/stream_dataset.h)
};

// The data a run trains and evaluates on (empty for the host's batches).
struct RunData {
  std::string dir;  // the shard folder
  std::shared_ptr<data::TokenShards> shards;
  std::shared_ptr<const data::PackedDataset> train, val;  // val: null without evaluation data
  // streaming: true: the train stream (train is then null) and the evaluation stream (val_size's
  // take, or eval_dataset's; val is then null), read as the run goes (data/stream_dataset.h).
  std::shared_ptr<const data::StreamSpec> train_stream, eval_stream;
  std::shared_ptr<data::TokenShards> eval_shards;  // eval_dataset's folder (null without)
  // eval_on_each_dataset: each eval dataset alone, by name (val is then null).
  std::vector<std::pair<std::string, std::shared_ptr<const data::PackedDataset>>> named_evals;
  // What an evaluation evaluates: {"eval", val or eval_stream}, or {"eval_<name>", set} per
  // named set; empty without evaluation data.
  std::vector<EvalSet> eval_sets() const;
  data::LoaderOptions loader;  // the train loader's (this rank's)
  // LLaMA-Factory datasets: the id whose labels are -100 (the pad token, which its tokenizer
  // fix-up makes EOS when the tokenizer has none); -1 for kiln's shard folders.
  int64_t ignored_label_id = -1;
};

struct RunPlan {
  // The config as the run trains it: full_determinism's kernels and auto_fit's micro-batch,
  // accumulation and recomputation applied.
  PretrainConfig config;
  dist::DistEnv env;               // the launcher's job: rank, world size (read, not joined)
  c10::Device device = c10::kCPU;  // this rank's (LOCAL_RANK's GPU)
  model::LlamaConfig model;        // from the preset, model YAML or model_name_or_path's config.json
  bool host_batches = false;       // the host program supplies the batches (no data below)
  RunData data;
  StepPlan steps;               // the banner's arithmetic
  cost::RunDescription run;     // for the cost models (train/run_description.h)
  cost::MemoryEstimate memory;  // predicted peak per rank
  std::string auto_fit;         // what auto_fit chose ("" without it)
};

struct PlanOptions {
  // The host supplies the batches: config.max_steps must be > 0; no data is read.
  bool host_batches = false;
  // The shard folder, prepared: a trainer that joined its job passes its rank-0-first preparation.
  // Default: this process prepares it as its rank would (rank 0 tokenizes, the others reuse).
  std::function<std::string()> prepare_data;
};

RunPlan plan_run(const PretrainConfig& config, const PlanOptions& options = {});

// This rank's device for `config` in the launcher's job `env`: the `device` key through the one
// resolver (common/device.h), LOCAL_RANK's GPU, the GPU's bf16 check (check_dtype_for_gpu).
// Errors are config::ConfigError naming the key, or std::runtime_error for a rank without a GPU.
c10::Device run_device(const PretrainConfig& config, const dist::DistEnv& env);

// Where a run of `config` executes, for every program that runs or prices one (kiln-pretrain's
// plan, kiln-profile's sweep, plan and explain): one rule for each of device, rank, dtype and
// cutoff_len.
struct RunEnvironment {
  dist::DistEnv dist;  // the launcher's ranks (dist::read_dist_env()); a described job sets world_size
  // Price the run without opening a device (kiln-profile plan and explain): `gpu` is the GPU's
  // row of cost/hardware.h; without it `device` decides (cuda, or auto on a machine with a GPU:
  // a GPU the table may not know; else the CPU). The job is data-parallel when world_size > 1.
  bool described = false;
  std::optional<cost::HardwareSpec> gpu;
};
struct PlacedRun {
  c10::Device device{c10::kCPU};  // this rank's device (run_device); the CPU when described
  RunTarget target;               // what the cost models price (run_description.h)
};
// run_device's device (unless described), the GPU's row of the hardware table, the job's ranks;
// and the cutoff_len rule: beyond the model's max_position_embeddings it runs (as LLaMA-Factory),
// with a warning on rank 0's log, since positions past it were never trained.
PlacedRun run_target(const PretrainConfig& config, const model::LlamaConfig& model, const RunEnvironment& env);

// The config's compute dtype on a GPU of compute capability major.minor: bf16 needs 8.0 (Ampere);
// a V100 (7.0) or a Turing card (7.5) has no bf16 arithmetic, so `bf16: true` there is refused when
// the config is read, naming the GPU and pointing at fp16 with loss scaling. Throws ConfigError.
void check_dtype_for_gpu(const PretrainConfig& config, const std::string& gpu_name, int major, int minor);

// The HF-style banner plus kiln's run facts (device, dtype, data, predicted memory, auto_fit).
// `comm`: the process group a trainer joined (its backend and rank in the line), or null for a
// plan (a launcher's job is then "planned, not joined").
std::string run_banner(const RunPlan& plan, const dist::Comm* comm = nullptr);

// The examples the run trains and evaluates on, as JSON (kiln-pretrain --dry-run --dump-data): per
// split the number of examples, their tokens and lengths, and the first `limit` examples'
// input_ids and labels (-1: all); the banner's figures; the first epochs' sample order. The
// layout is tests/python/llamafactory_reference.py's, so the two compare key by key.
std::string examples_json(const RunPlan& plan, int64_t limit = -1);

}  // namespace kiln::train
