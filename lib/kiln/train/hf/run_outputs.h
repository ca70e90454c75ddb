// The files of an output folder that HF Trainer's and LLaMA-Factory's tools read, in their
// layout: trainer_state.json (transformers.TrainerState), <split>_results.json and
// all_results.json (Trainer.save_metrics), the TensorBoard tags of a log entry (HF's
// TensorBoardCallback), LLaMA-Factory 0.9.5's trainer_log.jsonl and README.md model card, and the
// tokenizer and generation files it saves beside every model. docs/training.md ("Outputs") lists
// what is written when; docs/llamafactory.md (section 7) gives the sources followed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/train/pretrain_config.h"

namespace kiln::train {

// The fields of transformers.TrainerState that kiln fills; the others are written at HF's
// defaults, so TrainerState.load_from_json reads the file (it refuses unknown top-level keys:
// kiln's own state goes to kiln_state.json).
struct HfTrainerState {
  double epoch = 0;
  int64_t global_step = 0;
  int64_t max_steps = 0;
  int64_t logging_steps = 0;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
  int64_t train_batch_size = 0;
  int64_t num_train_epochs = 0;
  double total_flos = 0;
  nlohmann::json log_history = nlohmann::json::array();
};

// TrainerState.save_to_json's text: every field, keys sorted, indent 2, a final newline.
std::string trainer_state_text(const HfTrainerState& state);

// Trainer.save_metrics(split, metrics): output_dir/<split>_results.json, and the metrics merged
// into output_dir/all_results.json (indent 4, keys sorted); each written atomically.
void save_metrics(const std::string& output_dir, const std::string& split, const nlohmann::json& metrics);

// When a run evaluates. kiln's own configs: every eval_steps (> 0) and once after the last step,
// that last evaluation being the one of eval_results.json. HF's rules (TrainingArguments,
// DefaultFlowCallback, LLaMA-Factory's run_pt) when the YAML names LLaMA-Factory datasets
// (`dataset`) or writes do_eval or eval_strategy: periodic evaluations only with eval_strategy:
// steps (every eval_steps, and after the last step when that is not a multiple), and do_eval
// (implied by eval_strategy: steps) evaluates once more after training, for eval_results.json only.
struct EvalSchedule {
  int64_t every = 0;            // periodic evaluations every this many steps (0: none)
  bool at_train_end = false;    // an evaluation after the last step, logged like the periodic ones
  bool after_training = false;  // do_eval: the evaluation of eval_results.json, not logged (reuses
                                // an evaluation of the last step when there was one)
  bool required = false;        // do_eval was asked for: a run without evaluation data is an error
};
// `total_steps`: the run's optimizer steps, against which a fractional eval_steps (or
// logging_steps) resolves (resolve_steps).
EvalSchedule eval_schedule(const PretrainConfig& config, int64_t total_steps);
// Whether HF's rules above apply (the config names `dataset` or writes do_eval or eval_strategy):
// eval_schedule's and keys_without_effect's (lf_keys.h) one test.
bool hf_evaluation_rules(const PretrainConfig& config);

// ---- LLaMA-Factory's model folder --------------------------------------------------------------

// What LLaMA-Factory's Trainer.save_model and each checkpoint write beside config.json and the
// weights, made once per run:
// - the training data's tokenizer (tokenizer.json, and special_tokens_map.json when there is one,
//   copied byte for byte), tokenizer_config.json after LLaMA-Factory's fix-up as transformers
//   saves it (pad_token = eos_token when the tokenizer has none, padding_side "right",
//   split_special_tokens false; its other keys, tokenizer_class included, kept);
// - chat_template.jinja: the tokenizer's own chat template, else LLaMA-Factory's `empty`
//   template (what it writes when no `template` is given);
// - generation_config.json: the model folder's (or one made from the model config, as
//   transformers' from_model_config) after transformers' align_special_tokens (eos_token_id a
//   list holding the tokenizer's EOS, bos and pad the tokenizer's), keys sorted, indent 2;
// - the special token ids align_special_tokens gives config.json.
// Without a tokenizer.json (kiln's byte tokenizer) there is no tokenizer to save: only
// generation_config.json, with the data's BOS/EOS and pad = EOS.
struct ModelFolderFiles {
  std::vector<std::pair<std::string, std::string>> files;           // file name, content
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;  // config.json's (-1: null)
  std::string tokenizer_dir;                                        // where the tokenizer files come from; "" = none
};

// `tokenizer_json`: the tokenizer.json the training data was made with ("" or "byte": none);
// `data_bos`/`data_eos`: the data's special ids (-1: none), used without a tokenizer.json;
// `model_dir`: the model's HF folder ("" for a preset or model YAML) whose generation_config.json
// is the starting point; `model_bos`/`model_eos`: the model config's ids. Errors name the file.
ModelFolderFiles model_folder_files(const std::string& tokenizer_json, int64_t data_bos, int64_t data_eos,
                                    const std::string& model_dir, int64_t model_bos, int64_t model_eos);
// Writes the files into `dir`, each atomically.
void write_model_folder_files(const ModelFolderFiles& files, const std::string& dir);

// LLaMA-Factory's chat template for `template: empty` (its default when none is given), as its
// fix_jinja_template writes it into chat_template.jinja.
const std::string& empty_chat_template();

// ---- trainer_log.jsonl (LLaMA-Factory's LogCallback.on_log) ----------------------------------

// One line for a log_history entry: the keys current_steps, total_steps, loss, eval_loss, lr,
// epoch, percentage (round(current / total x 100, 2)), elapsed_time, remaining_time in this
// order, absent values left out, as Python's json.dumps writes them (", ", ": ", repr of floats,
// NaN); times as str(timedelta(seconds=int(s))), the remaining time being (total - current) x
// elapsed / current. No newline.
std::string trainer_log_line(const nlohmann::json& entry, int64_t current_steps, int64_t total_steps,
                             double elapsed_seconds);
// Appends `line` and a newline to `path` with one write(2) on an O_APPEND descriptor (as
// LLaMA-Factory, which appends one line per log); errors name the file.
void append_line(const std::string& path, const std::string& line);

// Python's repr of a float as json.dumps writes it (shortest round trip, "1e-05", "2.0", NaN,
// Infinity).
std::string python_float(double value);
// Python's str(datetime.timedelta(seconds=s)) for whole seconds: "0:00:07", "1 day, 2:03:04".
std::string python_timedelta(int64_t seconds);

// ---- README.md (transformers' Trainer.create_model_card, as LLaMA-Factory calls it) ------------

struct ModelCard {
  std::string model_name;      // output_dir's last component
  std::string finetuned_from;  // model_name_or_path; "" = trained from scratch
  std::vector<std::string> datasets;
  nlohmann::json log_history;  // HF's entries in order (kiln's extra keys are ignored)
  std::vector<std::pair<std::string, std::string>> hyperparameters;  // name, value as printed
  std::vector<std::string> framework_versions;                       // "kiln 0.2.0", ...
};
// transformers' modelcard.py (TrainingSummary.from_trainer + to_model_card): YAML front matter
// (library_name, license, base_model, tags, model-index), the card's sections, the evaluation
// results of the last evaluation, the hyperparameters, the "Training results" table (one row per
// evaluation before the closing summary entry) and the framework versions.
std::string model_card_text(const ModelCard& card);
// extract_hyperparameters_from_trainer's list for this run (world_size processes).
std::vector<std::pair<std::string, std::string>> card_hyperparameters(const PretrainConfig& config, int world_size);

// HF's TensorBoard folder when logging_dir is not given: $TENSORBOARD_LOGGING_DIR, else
// output_dir/runs/<Mon DD_HH-MM-SS>_<hostname> (transformers' default_logdir, local time).
std::string default_logging_dir(const std::string& output_dir);

// The scalars HF's TensorBoardCallback writes for a log entry (rewrite_logs): every number but
// "step", named eval/<name> for eval_<name> and train/<name> otherwise.
std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& entry);

}  // namespace kiln::train
