// The pretraining loop behind kiln-pretrain (docs/training.md). Its files by responsibility:
// trainer.cpp (the loop and its step), trainer_setup.cpp (device, process group, the plan of
// run_plan.h, model, optimizer), trainer_outputs.cpp (banner, evaluation, logs, end-of-run
// files), trainer_checkpoint.cpp (save, resume, HF's trainer state); stop requests are
// stop_request.h; the HF and LLaMA-Factory files (trainer_state.json, trainer_log.jsonl, the loss
// plot, TensorBoard, LLaMA-Factory's keys) are written by hf/, below the loop.
//
// One Trainer owns a run: device, model (fp32 master parameters; bf16/fp16 compute through
// autocast), data (packed token shards, the embedded corpus by default), AdamW with HF's
// schedules, checkpoints in HF layout that resume exactly, logs and metrics. The loop never
// waits for the device except when it logs, evaluates or saves: loss, token counts, the
// non-finite check and the loss scale all stay on the device between those points.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/model/llama.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/run_plan.h"
#include "kiln/train/step_plan.h"
#include "kiln/train/training_stack.h"

namespace kiln::data {
class DataLoader;
class PackedDataset;
class StreamLoader;
}  // namespace kiln::data

namespace kiln::dist {
class Comm;
class DataParallel;
}  // namespace kiln::dist

namespace kiln::train {

struct EvalOptions;
struct HfTrainerState;

struct EvalResult {
  double loss = 0;           // mean token loss over the whole split
  double perplexity = 0;     // exp(loss)
  int64_t tokens = 0;        // target tokens scored
  int64_t examples = 0;      // rows evaluated (HF's observed_num_examples), over every rank
  bool interrupted = false;  // abandoned on a stop request: loss and perplexity are NaN
};

struct TrainResult {
  int64_t global_step = 0;
  bool interrupted = false;          // stopped by SIGINT/SIGTERM or a stop request (a checkpoint was saved)
  bool data_exhausted = false;       // the host's batch source ended before max_steps (a checkpoint was saved)
  std::string last_checkpoint;       // path, or empty
  std::optional<double> final_loss;  // training loss of the last logging window
  std::optional<EvalResult> final_eval;
};

// Raised for a non-finite loss under nan_policy: stop; names the step.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The host's batches (one micro-batch per call; nullopt = no more data). Labels are input_ids
// or -100 where no loss is wanted; the model shifts them.
using BatchSource = std::function<std::optional<MicroBatch>()>;

// Called on every rank: after each optimizer step, with each logged window or evaluation (as the
// JSON line metrics.jsonl receives), and after each checkpoint is in place.
struct TrainerCallbacks {
  std::function<void(int64_t step)> on_step;
  std::function<void(const std::string& json_line)> on_log;
  std::function<void(int64_t step, const EvalResult& result)> on_evaluate;
  std::function<void(int64_t step, const std::string& checkpoint_dir)> on_save;
};

class Trainer {
 public:
  // Trains on token shards (config.dataset_dir, or the embedded corpus).
  explicit Trainer(PretrainConfig config);
  // Trains on the host's batches; config.max_steps must be > 0, dataset_dir and val_size are not
  // used, and checkpoints hold no data position (the host keeps its own).
  Trainer(PretrainConfig config, BatchSource source);
  ~Trainer();

  const StepPlan& plan() const { return plan_.steps; }
  // The run as planned before set-up (train/run_plan.h: what kiln-pretrain --dry-run prints).
  const RunPlan& run_plan() const { return plan_; }
  const model::LlamaForCausalLM& model() const { return model_; }
  // The HF-style banner plus kiln's run facts (device, dtype, data, predicted memory).
  std::string banner() const;

  // Trains until the planned step count, a signal, or an error.
  TrainResult train();
  // Mean loss over the validation split of the shards.
  EvalResult evaluate();
  // Mean loss over the host's batches until `source` returns nullopt.
  EvalResult evaluate(const BatchSource& source);

  // A stop request besides SIGINT/SIGTERM: `check` is asked wherever the run can stop (before
  // every micro-batch and every evaluation batch); true makes train() act as on a signal: drop the
  // partial step or evaluation, save a checkpoint of the last completed step and return.
  void set_stop_check(std::function<bool()> check) { stop_check_ = std::move(check); }
  void set_callbacks(TrainerCallbacks callbacks) { callbacks_ = std::move(callbacks); }
  // Shorthand for callbacks.on_step.
  void set_step_callback(std::function<void(int64_t step)> callback) { callbacks_.on_step = std::move(callback); }
  // A tqdm-style progress bar on stderr (kiln-pretrain turns it on; a library user rarely wants it).
  void set_progress_bar(bool on) { progress_bar_ = on; }

  // Data parallelism: this process's rank and the job's world size (0 and 1 without a launcher),
  // and the communicator (nullptr without a launcher). Only rank 0 prints and writes shared files.
  int rank() const;
  int world_size() const;
  dist::Comm* comm() const { return comm_.get(); }
  const dist::DataParallel* data_parallel() const;
  // Bytes of AdamW state this rank holds (1/world of all with zero_stage 1 and 2).
  int64_t optimizer_state_bytes() const;

  // Installs SIGINT/SIGTERM handlers that make train() save a checkpoint and return.
  static void install_signal_handlers();
  // What the handlers set; exposed so tests can simulate a signal.
  static std::atomic<int>& pending_signal();

 private:
  struct State;  // what a run keeps across train() calls and checkpoints (trainer_internal.h)
  struct Run;    // one train() call: the loop's parts (trainer.cpp, trainer_outputs.cpp)
  std::string save_checkpoint(int64_t step);  // returns the checkpoint's folder
  void prepare_output_dir();                  // recovery after a kill; sets an abandoned run's checkpoints aside
  void prepare_output_dir_on_main();
  void clean_incomplete_on_main();  // what a kill during a save or rotation left
  void resume(const std::string& checkpoint_dir);
  // The rest of a resume from a checkpoint of transformers' Trainer (or LLaMA-Factory), after
  // trainer_state.json: weights, optimizer.pt, scheduler.pt, scaler.pt, HF's data position.
  void resume_from_hf(const std::string& checkpoint_dir, int64_t saved_max_steps);
  void log_metrics(const std::string& json_line);       // appends a line to output_dir/metrics.jsonl
  double epoch_of(int64_t step) const;                  // HF's fractional epoch after `step` optimizer steps
  HfTrainerState hf_trainer_state(int64_t step) const;  // trainer_state.json's content at `step`

  PretrainConfig config_;
  at::Device device_ = at::kCPU;
  std::optional<at::ScalarType> autocast_dtype_;
  model::LlamaForCausalLM model_{nullptr};
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<data::StreamLoader> stream_;  // streaming: true, instead of loader_ (data/stream_dataset.h)
  RunPlan plan_;                                // the settings, data and arithmetic (plan_run); config_ is plan_.config
  std::unique_ptr<State> state_;
  std::function<bool()> stop_check_;
  TrainerCallbacks callbacks_;
  BatchSource source_;
  bool progress_bar_ = false;
  void init();
  std::string prepare_data_main_first();  // the shard folder: rank 0 tokenizes, the others wait
  void setup_optimizer();
  EvalOptions eval_options();
  // The step's parts (training_stack.h) after comm_: data parallelism's hooks and collectives go
  // first, then the last reference to the groups, whose destructor aborts them during an
  // exception's unwinding and shuts them down otherwise.
  std::shared_ptr<dist::Comm> comm_;
  std::unique_ptr<TrainingStack> stack_;
  int zero_stage_ = 0;
  bool is_main() const { return rank() == 0; }
  // On several ranks a collective: true on every rank when any rank has a stop request, so all
  // of them stop at the same point.
  bool stop_requested() const;
};

// "output/checkpoint-1200" for the highest N in `output_dir`, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);

}  // namespace kiln::train
