// glibc malloc settings for a CPU training process (opt-in: kiln-pretrain and kiln-profile call
// this first when KILN_MALLOC_TUNING=1).
//
// LibTorch's CPU allocator is glibc's posix_memalign. With glibc's defaults a step's tensors of
// 128 KiB .. 32 MiB come and go through mmap/munmap or through a heap that is trimmed back to
// the OS, and each reuse pays a page fault per 4 KiB (in this project's VMs about 2 us each: a
// fused SwiGLU backward over 393K elements took 0.4 ms in warm memory and 2.0 ms in fresh pages).
// Raising the mmap threshold to 64 MiB and the trim threshold to 256 MiB keeps that memory in
// the heap for the next step: measured on this 2-core VM, the tiny preset +20-40% tokens/s and
// the 56M model's peak RSS 891-1022 MB instead of 1027-1091 MB (docs/benchmarks.md).
//
// Not the default: with it, the exact-resume test (kill -9, resume, compare losses bit for bit)
// once failed 3 times in 8 runs on one VM, a cause never found (docs/training.md).
//
// A library linked into someone's service must not change their process's allocator, so lib/
// never calls this on its own; a host may (kiln/kiln.h exports it), before its first tensor.
// Skipped (returns an empty string) when the user already tunes malloc (GLIBC_TUNABLES naming
// glibc.malloc, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or MALLOC_TOP_PAD_) or off glibc;
// otherwise returns what it set, for a host's log (kiln's programs say nothing: an error stays
// one line).
#pragma once

#include <string>

#include "kiln/export.h"

namespace kiln {

KILN_API std::string tune_malloc_for_training();

// KILN_MALLOC_TUNING, a flag (1, true, yes, on / 0, false, no, off; unset: off): what kiln's
// programs ask before calling the function above. Throws std::invalid_argument naming the variable
// for another value.
KILN_API bool malloc_tuning_requested();

}  // namespace kiln
