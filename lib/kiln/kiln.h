// kiln's public C++ API: what a LibTorch program links kiln for (docs/embedding.md).
//
//   find_package(kiln 0.2 REQUIRED)
//   target_link_libraries(app PRIVATE kiln::kiln)
//   #include <kiln/kiln.h>
//
// Everything here is declared in this header and the installed headers it includes
// (kiln/train/pretrain_config.h: the settings struct; kiln/common/log.h: the log's controls;
// kiln/common/process_settings.h); every other header of the source tree is internal, not installed, and its symbols
// are not exported from libkiln.so. kiln behaves as a library inside someone else's process: it installs no signal
// handlers, never exits, never writes to stdout, logs through the spdlog logger named "kiln" (replace or silence it, or
// use set_log_handler), and reports every error as an exception whose message names the file, key or tensor. Several
// models and trainers may live in one process, each with its own kernel settings (ops run under a per-thread scope).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "kiln/common/log.h"
#include "kiln/common/process_settings.h"
#include "kiln/export.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/version.h"

namespace kiln {

namespace model {
class LlamaForCausalLMImpl;
}
namespace train {
class Trainer;
}

// "0.2.0": the library's version (the header's is KILN_VERSION_STRING).
KILN_API std::string version();

// ---- Logging: kiln/common/log.h (LogLevel, LogHandler, set_log_handler, set_log_level) -----

// ---- Process --------------------------------------------------------------------------------
// kiln/common/process_settings.h: what kiln-pretrain sets for its whole process and the library
// never sets on its own: pin_cpu_math_threads() (exact resume on the CPU),
// set_cublas_deterministic_workspace() (full_determinism on CUDA) and, with KILN_MALLOC_TUNING=1,
// tune_malloc_for_training() (glibc malloc thresholds that keep a CPU step's buffers out of page
// faults). A host calls the ones it wants, before its first tensor.

// ---- Models ---------------------------------------------------------------------------------
struct ModelOptions {
  c10::Device device = c10::kCPU;
  std::optional<c10::ScalarType> dtype;  // parameters; default fp32 (from_pretrained: the checkpoint's)
  uint64_t seed = 42;                    // weight initialisation of create()
};

// A LLaMA causal LM. Copies share the same weights (as torch modules do).
class KILN_API Model {
 public:
  // From a preset name (tiny, llama-100m, llama-3.2-1b) or a model YAML file, freshly initialised.
  static Model create(const std::string& preset_or_yaml, const ModelOptions& options = {});
  // From a Hugging Face directory (config.json + model.safetensors or shards).
  static Model from_pretrained(const std::string& dir, const ModelOptions& options = {});
  // Writes config.json + model.safetensors (fp32 or bf16 as the weights are); loads in
  // transformers' AutoModelForCausalLM.from_pretrained.
  void save_pretrained(const std::string& dir) const;

  int64_t num_parameters() const;
  int64_t vocab_size() const;
  int64_t max_position_embeddings() const;
  c10::Device device() const;
  // Next-token logits [B, T, V] for input_ids [B, T] (int64), without gradients.
  at::Tensor logits(const at::Tensor& input_ids) const;

  // The underlying torch module, for hosts that go beyond this API (internal: no stability promise).
  const std::shared_ptr<model::LlamaForCausalLMImpl>& impl() const { return impl_; }
  explicit Model(std::shared_ptr<model::LlamaForCausalLMImpl> impl);

 private:
  std::shared_ptr<model::LlamaForCausalLMImpl> impl_;
};

// ---- Data the host supplies -----------------------------------------------------------------
struct Batch {
  at::Tensor input_ids;  // [B, T] int64
  at::Tensor labels;     // [B, T] int64: input_ids, or -100 where no loss is wanted (the model shifts)
};
// One batch per call; nullopt = no more data.
using BatchSource = std::function<std::optional<Batch>()>;

// ---- Evaluation and generation --------------------------------------------------------------
struct EvalResult {
  double loss = 0;        // mean next-token loss over every target token
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // target tokens scored
  bool interrupted = false;
};
struct EvalOptions {
  bool bf16 = false;  // autocast to bf16 (parameters stay as they are)
};
// Mean token loss of `model` over the batches of `source`.
KILN_API EvalResult evaluate(const Model& model, const BatchSource& source, const EvalOptions& options = {});

struct GenerateOptions {
  int64_t max_new_tokens = 64;  // >= 0
  bool greedy = false;          // argmax; the sampling settings below are ignored
  double temperature = 1.0;
  int64_t top_k = 0;   // 0 = off
  double top_p = 1.0;  // 1 = off
  int64_t eos_token_id = -1;
  uint64_t seed = 0;
  int64_t vocab_limit = 0;  // only ids below it are produced (a tokenizer smaller than the embedding); 0 = all
};
// New tokens after `prompt` (ids below the model's vocab_size), with a KV cache; HF's sampling rules.
KILN_API std::vector<int64_t> generate(const Model& model, const std::vector<int64_t>& prompt,
                                       const GenerateOptions& options = {});

// ---- Training -------------------------------------------------------------------------------
using TrainConfig = train::PretrainConfig;
// Settings from YAML text (LLaMA-Factory's keys, docs/training.md); `source` names it in errors.
KILN_API TrainConfig train_config_from_yaml(const std::string& yaml_text, const std::string& source = "<yaml>");

// A cooperative stop request: the host flips it from any thread; the trainer stops within one
// micro-batch or evaluation batch, saves a checkpoint of the last completed step and returns.
class KILN_API StopToken {
 public:
  StopToken();
  void request_stop() const;
  bool stop_requested() const;

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

struct TrainResult {
  int64_t global_step = 0;
  bool interrupted = false;     // a stop request (or, in kiln-pretrain, a signal)
  bool data_exhausted = false;  // the host's source ended before max_steps
  std::string last_checkpoint;  // the folder written last, or ""
  std::optional<double> final_loss;
  std::optional<EvalResult> final_eval;
};

// Callbacks run on the training thread (on every rank of a data-parallel job).
struct TrainCallbacks {
  std::function<void(int64_t step)> on_step;
  std::function<void(const std::string& json_line)> on_log;  // the metrics.jsonl line of a log window or an evaluation
  std::function<void(int64_t step, const EvalResult& result)> on_evaluate;
  std::function<void(int64_t step, const std::string& checkpoint_dir)> on_save;
};

class KILN_API Trainer {
 public:
  // Trains on token shards (config.dataset_dir; empty = kiln's embedded corpus).
  explicit Trainer(const TrainConfig& config);
  // Trains on the host's batches: config.max_steps > 0 (micro-batches per step =
  // gradient_accumulation_steps); checkpoints hold no data position.
  Trainer(const TrainConfig& config, BatchSource source);
  ~Trainer();
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;

  void set_callbacks(TrainCallbacks callbacks);
  void set_stop_token(StopToken token);

  // HF Trainer's "Running training" banner plus kiln's run facts.
  std::string banner() const;
  int64_t total_steps() const;
  TrainResult train();
  // The shards' validation split, or the host's evaluation batches.
  EvalResult evaluate();
  EvalResult evaluate(const BatchSource& source);
  // The model being trained (shares its weights).
  Model model() const;

 private:
  std::unique_ptr<train::Trainer> impl_;
  StopToken stop_;
};

}  // namespace kiln
