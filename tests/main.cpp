// Catch2 runner. `--kiln-require-cuda` (used by the ctest entry that runs the [cuda] tests) exits
// with 77, which ctest reports as "skipped", when no CUDA device is present, so GPU tests are
// visibly skipped on CPU machines instead of passing vacuously.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <ATen/Context.h>
#include <torch/cuda.h>

#include "kiln/common/process_settings.h"

namespace {
// Every test case starts from the same LibTorch random state, so random inputs (at::randn,
// at::randint) are the same on every run and in any test order: no test can pass or fail by luck.
struct SeedEachTest : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const&) override { at::manual_seed(20261129); }
};
}  // namespace
CATCH_REGISTER_LISTENER(SeedEachTest)

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool require_cuda = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kiln-require-cuda") == 0) {
      require_cuda = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  // As kiln-pretrain: the CPU math libraries split work the same way throughout (the exact-resume
  // tests compare runs bit for bit).
  kiln::pin_cpu_math_threads();
  if (require_cuda && !torch::cuda::is_available()) {
    std::printf("no CUDA device: [cuda] tests skipped\n");
    return 77;
  }
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
