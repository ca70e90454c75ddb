// HF-layout output files: see run_outputs.h.
#include "kiln/train/run_outputs.h"

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <fmt/format.h>

#include "kiln/io/safetensors.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string trainer_state_text(const HfTrainerState& s) {
  // nlohmann's objects keep their keys sorted, as json.dumps(sort_keys=True).
  const json j = {{"best_global_step", nullptr},
                  {"best_metric", nullptr},
                  {"best_model_checkpoint", nullptr},
                  {"epoch", s.epoch},
                  {"eval_steps", s.eval_steps},
                  {"global_step", s.global_step},
                  {"is_hyper_param_search", false},
                  {"is_local_process_zero", true},
                  {"is_world_process_zero", true},
                  {"log_history", s.log_history},
                  {"logging_steps", s.logging_steps},
                  {"max_steps", s.max_steps},
                  {"num_input_tokens_seen", 0},
                  {"num_train_epochs", s.num_train_epochs},
                  {"save_steps", s.save_steps},
                  {"stateful_callbacks", json::object()},
                  {"total_flos", s.total_flos},
                  {"train_batch_size", s.train_batch_size},
                  {"trial_name", nullptr},
                  {"trial_params", nullptr}};
  return j.dump(2) + "\n";
}

void save_metrics(const std::string& output_dir, const std::string& split, const json& metrics) {
  const fs::path dir(output_dir);
  io::write_file_atomic((dir / fmt::format("{}_results.json", split)).string(), metrics.dump(4));
  const fs::path all = dir / "all_results.json";
  json merged = json::object();
  if (std::ifstream in(all); in) {
    try {
      merged = json::parse(in);
    } catch (const json::exception&) {
      merged = json::object();  // an unreadable earlier file is replaced, as HF would fail to
    }
    if (!merged.is_object()) merged = json::object();
  }
  merged.update(metrics);
  io::write_file_atomic(all.string(), merged.dump(4));
}

std::string default_logging_dir(const std::string& output_dir) {
  if (const char* env = std::getenv("TENSORBOARD_LOGGING_DIR"); env && *env) {
    std::string dir = env;
    if (dir.rfind("~/", 0) == 0) {
      if (const char* home = std::getenv("HOME")) dir = std::string(home) + dir.substr(1);
    }
    return dir;
  }
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  return (fs::path(output_dir) / "runs" / fmt::format("{}_{}", stamp, host)).string();
}

std::vector<std::pair<std::string, float>> tensorboard_scalars(const json& entry) {
  std::vector<std::pair<std::string, float>> out;
  for (const auto& [key, value] : entry.items()) {
    if (key == "step" || !value.is_number()) continue;
    const std::string tag = key.rfind("eval_", 0) == 0 ? "eval/" + key.substr(5) : "train/" + key;
    out.emplace_back(tag, value.get<float>());
  }
  return out;
}

}  // namespace kiln::train
