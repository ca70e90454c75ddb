// kiln::tune_malloc_for_training: asked for by KILN_MALLOC_TUNING=1 only, skipped when the user tunes malloc;
// otherwise a buffer between glibc's default mmap threshold and 64 MiB comes from the heap
// (glibc's own accounting, mallinfo2) instead of a fresh mapping.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "kiln/common/malloc_tuning.h"

TEST_CASE("tune_malloc_for_training leaves a user's malloc settings alone and keeps big buffers in the heap",
          "[api][malloc]") {
#if defined(__GLIBC__)
  const char* saved = std::getenv("GLIBC_TUNABLES");
  const std::string saved_tunables = saved ? saved : "";
  const char* saved_switch = std::getenv("KILN_MALLOC_TUNING");
  const std::string saved_switch_value = saved_switch ? saved_switch : "";
  setenv("KILN_MALLOC_TUNING", "1", 1);
  CHECK(kiln::malloc_tuning_requested());
  setenv("KILN_MALLOC_TUNING", "0", 1);
  CHECK_FALSE(kiln::malloc_tuning_requested());
  unsetenv("KILN_MALLOC_TUNING");
  CHECK_FALSE(kiln::malloc_tuning_requested());  // opt-in
  if (saved_switch) setenv("KILN_MALLOC_TUNING", saved_switch_value.c_str(), 1);
  setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576", 1);
  CHECK(kiln::tune_malloc_for_training().empty());
  if (saved) {
    setenv("GLIBC_TUNABLES", saved_tunables.c_str(), 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
  if (saved && saved_tunables.find("glibc.malloc.") != std::string::npos) return;  // the user's settings rule
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's allocator replaces glibc's: mallopt refuses, and nothing is claimed.
  CHECK(kiln::tune_malloc_for_training().empty());
  return;
#endif
  const std::string note = kiln::tune_malloc_for_training();
  CHECK_THAT(note, Catch::Matchers::Contains("mmap threshold 64 MiB"));
  const size_t mapped_before = mallinfo2().hblkhd;
  void* p = std::malloc(size_t{40} << 20);  // above glibc's largest dynamic threshold (32 MiB)
  REQUIRE(p != nullptr);
  CHECK(mallinfo2().hblkhd == mapped_before);  // not a mapping of its own
  std::free(p);
#else
  CHECK(kiln::tune_malloc_for_training().empty());
#endif
}
