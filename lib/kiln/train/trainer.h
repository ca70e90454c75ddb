// The pretraining loop behind kiln-pretrain (docs/training.md).
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
#include "kiln/train/pretrain_config.h"
#include "kiln/train/step_math.h"

namespace kiln::data {
class DataLoader;
class PackedDataset;
}  // namespace kiln::data

namespace kiln::optim {
class AdamW;
class GradScaler;
}  // namespace kiln::optim

namespace kiln::dist {
class Comm;
class DataParallel;
}  // namespace kiln::dist

namespace kiln::train {

struct EvalResult {
  double loss = 0;           // mean token loss over the whole split
  double perplexity = 0;     // exp(loss)
  int64_t tokens = 0;        // target tokens scored
  bool interrupted = false;  // abandoned on a stop request: loss and perplexity are NaN
};

struct TrainResult {
  int64_t global_step = 0;
  bool interrupted = false;          // stopped by SIGINT/SIGTERM (a checkpoint was saved)
  std::string last_checkpoint;       // path, or empty
  std::optional<double> final_loss;  // training loss of the last logging window
  std::optional<EvalResult> final_eval;
};

// Raised for a non-finite loss under nan_policy: stop; names the step.
class NonFiniteLossError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Trainer {
 public:
  explicit Trainer(PretrainConfig config);
  ~Trainer();

  const StepPlan& plan() const { return plan_; }
  const model::LlamaForCausalLM& model() const { return model_; }
  // The HF-style banner plus kiln's run facts (device, dtype, data, predicted memory).
  std::string banner() const;

  // Trains until the planned step count, a signal, or an error.
  TrainResult train();
  // Mean loss over the validation split (or any loader over a split, in order).
  EvalResult evaluate();

  // A stop request besides SIGINT/SIGTERM: `check` is asked wherever the run can stop (before
  // every micro-batch and every evaluation batch); true makes train() act as on a signal: drop the
  // partial step or evaluation, save a checkpoint of the last completed step and return.
  void set_stop_check(std::function<bool()> check) { stop_check_ = std::move(check); }
  // Called after every optimizer step with the new global step (on every rank).
  void set_step_callback(std::function<void(int64_t step)> callback) { step_callback_ = std::move(callback); }

  // Data parallelism: this process's rank and the job's world size (0 and 1 without a launcher),
  // and the communicator (nullptr without a launcher). Only rank 0 prints and writes shared files.
  int rank() const;
  int world_size() const;
  dist::Comm* comm() const { return comm_.get(); }
  const dist::DataParallel* data_parallel() const { return dp_.get(); }
  // Bytes of AdamW state this rank holds (1/world of all with zero_stage 1 and 2).
  int64_t optimizer_state_bytes() const;

  // Installs SIGINT/SIGTERM handlers that make train() save a checkpoint and return.
  static void install_signal_handlers();
  // What the handlers set; exposed so tests can simulate a signal.
  static std::atomic<int>& pending_signal();

 private:
  struct State;
  std::string save_checkpoint(int64_t step);  // returns the checkpoint's folder
  void prepare_output_dir();                  // recovery after a kill; sets an abandoned run's checkpoints aside
  void prepare_output_dir_on_main();
  void resume(const std::string& checkpoint_dir);
  void log_metrics(const std::string& json_line);  // appends a line to output_dir/metrics.jsonl

  PretrainConfig config_;
  at::Device device_ = at::kCPU;
  std::optional<at::ScalarType> autocast_dtype_;
  model::LlamaForCausalLM model_{nullptr};
  std::shared_ptr<const data::PackedDataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> loader_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::unique_ptr<optim::GradScaler> scaler_;
  StepPlan plan_;
  std::unique_ptr<State> state_;
  std::function<bool()> stop_check_;
  std::function<void(int64_t)> step_callback_;
  std::shared_ptr<dist::Comm> comm_;
  std::unique_ptr<dist::DataParallel> dp_;
  int zero_stage_ = 0;
  bool is_main() const { return rank() == 0; }
  // On several ranks a collective: true on every rank when any rank has a stop request, so all
  // of them stop at the same point.
  bool stop_requested() const;
};

// "output/checkpoint-1200" for the highest N in `output_dir`, or "" when there is none.
std::string latest_checkpoint(const std::string& output_dir);

}  // namespace kiln::train
