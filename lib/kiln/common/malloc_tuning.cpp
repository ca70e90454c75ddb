#include "kiln/common/malloc_tuning.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kiln {

std::string tune_malloc_for_training() {
#if defined(__GLIBC__)
  auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if ((tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) || set("MALLOC_MMAP_THRESHOLD_") ||
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
