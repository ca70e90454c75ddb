#include "kiln/common/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "kiln/common/env.h"

namespace kiln {

bool malloc_tuning_requested() {
  return env::flag("KILN_MALLOC_TUNING").value_or(false);
}

std::string tune_malloc_for_training() {
#if defined(__GLIBC__)
  // glibc's variables, as glibc reads them: set and not empty.
  auto set = [](const char* name) { return env::string(name).has_value(); };
  const auto tunables = env::raw("GLIBC_TUNABLES");
  if ((tunables && tunables->find("glibc.malloc.") != std::string::npos) || set("MALLOC_MMAP_THRESHOLD_") ||
      set("MALLOC_TRIM_THRESHOLD_") || set("MALLOC_TOP_PAD_")) {
    return {};
  }
  constexpr int kMmapThreshold = 64 << 20, kTrimThreshold = 256 << 20;
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 0 || mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 0) return {};
  return "malloc: mmap threshold 64 MiB, trim threshold 256 MiB";
#else
  return {};
#endif
}

}  // namespace kiln
