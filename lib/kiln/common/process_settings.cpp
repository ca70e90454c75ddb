#include "kiln/common/process_settings.h"

#include <cstdlib>

#include <ATen/Parallel.h>

namespace kiln {

std::string pin_cpu_math_threads(int threads) {
  const char* user = std::getenv("MKL_DYNAMIC");
  if (user != nullptr && *user != '\0') return {};
  if (threads <= 0) threads = at::get_num_threads();
  at::set_num_threads(threads);
  return "CPU math threads pinned at " + std::to_string(threads) + " (MKL dynamic threads off)";
}

std::string set_cublas_deterministic_workspace() {
  const char* user = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  if (user != nullptr && *user != '\0') return {};
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  return "CUBLAS_WORKSPACE_CONFIG=:4096:8";
}

}  // namespace kiln
