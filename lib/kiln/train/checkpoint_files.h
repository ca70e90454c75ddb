// The JSON state files a resume reads from a checkpoint folder, read as io/input_file.h reads
// files someone else wrote: bounded, depth-limited, every number checked for type and range, each
// refusal "<file>: <field>: expected ..., found ..." (docs/formats.md, "Hostile files").
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::train {

// HF's trainer_state.json (TrainerState.save_to_json): what a resume takes from it.
struct TrainerStateFile {
  int64_t global_step = 0;     // an integer in [0, 2^53]
  nlohmann::json log_history;  // an array of objects
  double total_flos = 0;       // finite, >= 0 (0 when absent or null)
  int64_t max_steps = -1;      // -1 when absent or null
};
TrainerStateFile read_trainer_state_file(const std::string& path);

// kiln_state.json: what a kiln checkpoint must be resumed with (absent keys: 1 process, stage 0).
struct KilnStateFile {
  int64_t world_size = 1;  // [1, 2^20]
  int64_t zero_stage = 0;  // 0, 1 or 2
};
KilnStateFile read_kiln_state_file(const std::string& path);

}  // namespace kiln::train
