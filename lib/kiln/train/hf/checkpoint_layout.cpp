#include "kiln/train/hf/checkpoint_layout.h"

#include <regex>

#include <fmt/format.h>

namespace kiln::train {

namespace fs = std::filesystem;

std::string checkpoint_folder_name(int64_t step) {
  return fmt::format("{}{}", kCheckpointPrefix, step);
}

std::string optimizer_shard_file(int rank, int world) {
  return fmt::format("optimizer.rank-{:05d}-of-{:05d}.safetensors", rank, world);
}

std::string rng_state_file(int rank, int world) {
  return world > 1 ? fmt::format("rng_state_{}.safetensors", rank) : "rng_state.safetensors";
}

bool is_hf_trainer_checkpoint(const fs::path& dir) {
  return !fs::exists(dir / kKilnStateFile) && !fs::exists(dir / kLoaderStateFile) &&
         !fs::exists(dir / kKilnOptimizerFile) && fs::exists(dir / kHfOptimizerFile);
}

std::vector<const char*> resume_required_files(bool hf_trainer, bool host_batches) {
  if (hf_trainer) return {kModelConfigFile, kTrainerStateFile, kHfSchedulerFile};
  if (host_batches) return {kModelConfigFile, kTrainerStateFile};
  return {kModelConfigFile, kLoaderStateFile, kTrainerStateFile};
}

std::optional<std::string> deepspeed_state_folder(const fs::path& dir) {
  if (!fs::is_directory(dir)) return std::nullopt;
  static const std::regex ds("global_step[0-9]+");
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && std::regex_match(e.path().filename().string(), ds)) return e.path().filename().string();
  }
  return std::nullopt;
}

}  // namespace kiln::train
