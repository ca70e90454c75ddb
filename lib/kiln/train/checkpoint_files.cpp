#include "kiln/train/checkpoint_files.h"

#include "kiln/io/input_file.h"

namespace kiln::train {

using nlohmann::json;

TrainerStateFile read_trainer_state_file(const std::string& path) {
  constexpr int64_t kMaxStep = int64_t{1} << 53;
  const json ts = io::read_json_file(path);
  TrainerStateFile out;
  out.global_step = io::json_integer(io::json_field(ts, "global_step", path), path, "global_step", 0, kMaxStep);
  const json& history = io::json_field(ts, "log_history", path);
  if (!history.is_array()) io::refuse(path, "log_history", "an array of log entries", io::describe_json(history));
  for (size_t i = 0; i < history.size(); ++i) {
    if (!history[i].is_object()) {
      io::refuse(path, io::field_path("log_history", static_cast<int64_t>(i)), "an object (one log entry)",
                 io::describe_json(history[i]));
    }
  }
  out.log_history = history;
  const auto present = [&](const char* key) { return ts.contains(key) && !ts.at(key).is_null(); };
  if (present("total_flos")) out.total_flos = io::json_number(ts.at("total_flos"), path, "total_flos", 0.0, 1e300);
  if (present("max_steps")) out.max_steps = io::json_integer(ts.at("max_steps"), path, "max_steps", 0, kMaxStep);
  return out;
}

KilnStateFile read_kiln_state_file(const std::string& path) {
  const json ks = io::read_json_file(path);
  if (!ks.is_object()) io::refuse(path, "", "a JSON object", io::describe_json(ks));
  KilnStateFile out;
  if (ks.contains("world_size"))
    out.world_size = io::json_integer(ks.at("world_size"), path, "world_size", 1, int64_t{1} << 20);
  if (ks.contains("zero_stage")) out.zero_stage = io::json_integer(ks.at("zero_stage"), path, "zero_stage", 0, 2);
  return out;
}

}  // namespace kiln::train
