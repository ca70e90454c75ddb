// The files of an output folder that HF Trainer's and LLaMA-Factory's tools read, in their
// layout: trainer_state.json (transformers.TrainerState), <split>_results.json and
// all_results.json (Trainer.save_metrics), and the TensorBoard tags of a log entry (HF's
// TensorBoardCallback). docs/training.md ("Outputs") lists what is written when.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

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

// HF's TensorBoard folder when logging_dir is not given: $TENSORBOARD_LOGGING_DIR, else
// output_dir/runs/<Mon DD_HH-MM-SS>_<hostname> (transformers' default_logdir, local time).
std::string default_logging_dir(const std::string& output_dir);

// The scalars HF's TensorBoardCallback writes for a log entry (rewrite_logs): every number but
// "step", named eval/<name> for eval_<name> and train/<name> otherwise.
std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& entry);

}  // namespace kiln::train
