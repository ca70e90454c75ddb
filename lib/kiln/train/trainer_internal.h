// The trainer's internals shared by its files (trainer.cpp: the loop and its step;
// trainer_setup.cpp: device, model, data, optimizer; trainer_outputs.cpp: banner, evaluation,
// logs, end-of-run files; trainer_checkpoint.cpp: save and resume with HF's state). Not installed.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "kiln/cost/flops.h"
#include "kiln/cost/hardware.h"
#include "kiln/data/loader.h"
#include "kiln/data/stream_dataset.h"
#include "kiln/model/hf.h"
#include "kiln/optim/schedule.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/hf/tensorboard.h"
#include "kiln/train/progress.h"
#include "kiln/train/trainer.h"

namespace kiln::data {
class TokenShards;
}

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A host batch is checked before it reaches the model, so that a bad one is one clear line.
void check_host_batch(const MicroBatch& b, int64_t vocab_size);
// The default CPU generator's state, read and set with the generator's mutex held (ATen's rule for
// random generators) through the public at::globalContext().defaultGenerator.
at::Tensor cpu_rng_state();
void set_cpu_rng_state(const at::Tensor& state);

// What a run keeps across train() calls and checkpoints.
struct Trainer::State {
  int64_t global_step = 0;
  json log_history = json::array();
  cost::FlopsPerToken flops;
  std::optional<cost::DevicePeak> peak;
  // Device-side accumulators of the current logging window.
  at::Tensor window_loss_sum, window_good_targets, first_bad_step;
  int64_t window_steps = 0, window_tokens = 0;  // tokens of every rank
  double window_comm_seconds = 0;               // the host waited on collectives
  std::chrono::steady_clock::time_point window_start;
  std::optional<EvalResult> last_eval;
  std::string resumed_from;                  // the checkpoint this run started from (never rotated away)
  int64_t last_saved_step = -1;              // a stop request right after a save does not save again
  double total_flos = 0;                     // model FLOPs of every step trained (HF's total_flos), kept across resumes
  std::unique_ptr<EventWriter> tensorboard;  // report_to: tensorboard, rank 0
  // What is saved beside every model of the run (tokenizer, chat template, generation config)
  // and config.json's aligned special tokens (hf/run_outputs.h); made on first use, rank 0.
  std::shared_ptr<const ModelFolderFiles> model_files;
  // `shards`: the run's training data (its tokenizer and special tokens), or null.
  const ModelFolderFiles& folder_files(const PretrainConfig& config, const model::LlamaConfig& model_config,
                                       const data::TokenShards* shards);
};

// save_pretrained's options for a model saved with `files` beside it (the aligned special tokens).
model::SaveOptions save_options_for(const ModelFolderFiles& files);

// One train() call: its progress bar, schedule, the metrics window's host-side values and the
// closing summary's sums. Nested in Trainer, so it works on the trainer's members.
struct Trainer::Run {
  explicit Run(Trainer& trainer);

  // Where a step starts: an interrupted step is undone to exactly here, so the checkpoint saved for
  // it resumes with the same batches and random numbers.
  struct StepStart {
    std::optional<data::LoaderState> loader;
    at::Tensor cpu_rng;
  };
  using StepBatches = StepWindow;  // training_stack.h
  StepStart mark_step_start() const;
  void undo_step(const StepStart& start);
  StepBatches draw_batches();
  // Forward, backward, clipping, the optimizer step and the window's device-side book-keeping;
  // false when a stop request cut the step short (its partial gradients are dropped).
  bool train_step(StepBatches& batches);
  // Acts on a pending stop request: one line, a checkpoint of the last completed step (none when
  // this call completed no step). `where` says what was cut.
  void stop(const std::string& where);

  // trainer_outputs.cpp
  void reset_window();
  void log_window(int64_t step);   // the logging window's entry and line; nan_policy: stop throws here
  bool evaluate_at(int64_t step);  // false when a stop request cut the evaluation short
  void record(const json& entry, bool to_metrics = true);
  TrainResult finish();           // the closing summary and the files HF and LLaMA-Factory write
  EvalSchedule schedule() const;  // eval_schedule(config); an error when do_eval has no data
  // HF's entry for the evaluation of `set` under its prefix ("eval", "eval_<name>"), plus kiln's keys.
  json eval_entry(const EvalSet& set, const EvalResult& ev, double seconds, int64_t step) const;
  // Evaluates every eval set (RunData::eval_sets), each logged as HF logs it; the entries, or
  // nullopt when a stop request cut an evaluation short.
  std::optional<std::vector<json>> evaluate_sets(int64_t step);
  void save_final_model();  // output_dir: the model, its tokenizer files, training_args.json (rank 0)

  Trainer& t;
  State& st;
  TrainResult result;
  at::TensorOptions fopts;
  optim::ScheduleConfig sched;
  std::optional<ProgressBar> bar;
  double last_lr = 0;
  std::optional<at::Tensor> last_norm;
  std::chrono::steady_clock::time_point train_start;
  int64_t start_step = 0;
  double session_loss_sum = 0;  // over logged windows: loss x steps (HF's train_loss of this call)
  int64_t session_loss_steps = 0;
  std::optional<EvalResult> session_eval;
  std::vector<json> last_eval_entries;
  int64_t last_eval_step = -1;
  const EvalSchedule evals = schedule();  // after t and st, which it reads
};

}  // namespace kiln::train
