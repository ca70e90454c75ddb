// Tensor bytes on the CPU, counted exactly: a c10::Allocator that wraps LibTorch's CPU allocator,
// delegates every allocation to it and keeps the bytes currently held by tensors and their peak.
// The process's RSS cannot tell a step's peak (it never goes down, and it includes the heap of
// everything else); this counter can, and it is reset before each measured step.
//
// Every entry point of c10's allocator interface counts: allocate() and the DataPtr's deleter,
// raw_allocate()/raw_deallocate() (oneDNN's path), clone() and copy_data().
//
// An optional cap makes an allocation past it throw c10::OutOfMemoryError, as the CUDA caching
// allocator does when the GPU is full, so the sweep's OOM handling can be tested on a CPU.
#pragma once

#include <cstdint>

#include <c10/core/Allocator.h>

namespace kiln::profile {

struct CpuMemoryStats {
  int64_t current_bytes = 0;  // bytes held by live CPU tensors allocated while counting
  int64_t peak_bytes = 0;     // the most current_bytes reached since the last reset
};

// Installs the counting allocator as LibTorch's CPU allocator for its lifetime and restores the
// previous one afterwards. Tensors allocated while it is installed stay counted until freed,
// even after it is removed. One at a time (a second concurrent guard throws std::logic_error).
class CountingCpuAllocatorGuard {
 public:
  // `cap_bytes` > 0: an allocation that would take current_bytes past the cap throws
  // c10::OutOfMemoryError.
  explicit CountingCpuAllocatorGuard(int64_t cap_bytes = 0);
  ~CountingCpuAllocatorGuard();
  CountingCpuAllocatorGuard(const CountingCpuAllocatorGuard&) = delete;
  CountingCpuAllocatorGuard& operator=(const CountingCpuAllocatorGuard&) = delete;

  CpuMemoryStats stats() const;
  // Peak := current (the bytes already held, e.g. parameters and optimizer state, stay counted).
  void reset_peak();
  void set_cap(int64_t cap_bytes);
  // The counting allocator itself (what c10::GetCPUAllocator() returns while a guard is
  // installed), for calling its entry points directly.
  static c10::Allocator* allocator();
};

}  // namespace kiln::profile
