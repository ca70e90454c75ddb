// glibc malloc settings for a training process: what kiln-pretrain and kiln-profile call first.
//
// LibTorch's CPU allocator is glibc's posix_memalign. With glibc's defaults a step's tensors of
// 128 KiB .. 32 MiB come and go through mmap/munmap or through a heap that is trimmed back to
// the OS, and each reuse pays a page fault per 4 KiB (in this project's VMs about 2 us each: a
// fused SwiGLU backward over 393K elements took 0.4 ms in warm memory and 2.0 ms in fresh pages).
// Raising the mmap threshold to 64 MiB and the trim threshold to 256 MiB keeps that memory in
// the heap for the next step: measured on this 2-core VM, the tiny preset +20-40% tokens/s and
// the 56M model's peak RSS 891-1022 MB instead of 1027-1091 MB (docs/performance.md).
//
// A library linked into someone's service must not change their process's allocator, so this is
// never called from lib/ on its own; a host that trains on the CPU may call it (kiln/kiln.h
// exports it), before its first tensor. Skipped (returns
// an empty string) when KILN_MALLOC_TUNING=0, when the user already tunes malloc
// (GLIBC_TUNABLES naming glibc.malloc, MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or
// MALLOC_TOP_PAD_), or off glibc; otherwise returns what it set, for a host's log (kiln's programs say nothing: an
// error stays one line).
#pragma once

#include <string>

#include "kiln/export.h"

namespace kiln {

KILN_API std::string tune_malloc_for_training();

}  // namespace kiln
