#include "kiln/common/process_settings.h"

#include <cstdlib>

#include <ATen/Parallel.h>

#include "kiln/common/env.h"

namespace kiln {

std::string pin_cpu_math_threads(int threads) {
  if (env::string("MKL_DYNAMIC")) return {};  // the user's (MKL's variable: set and not empty)
  if (threads <= 0) threads = at::get_num_threads();
  at::set_num_threads(threads);
  return "CPU math threads pinned at " + std::to_string(threads) + " (MKL dynamic threads off)";
}

std::string set_cublas_deterministic_workspace() {
  if (env::string("CUBLAS_WORKSPACE_CONFIG")) return {};  // the user's (cuBLAS's variable)
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  return "CUBLAS_WORKSPACE_CONFIG=:4096:8";
}

}  // namespace kiln
