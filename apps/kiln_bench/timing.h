// kiln-bench's measuring instruments, shared by every benchmark: wall-clock timing that waits
// for the device, peak extra memory, and the device's copy bandwidth that the fused ops'
// achieved bandwidth is compared with.
#pragma once

#include <cstdint>
#include <functional>

#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include "kiln/profile/counters/cpu_allocator.h"

namespace kiln::bench {

// Peak memory, measured above what the inputs already hold: the CUDA caching allocator's peak,
// or on CPU that of the counting wrapper around the CPU allocator, which main() installs before
// any tensor exists.
struct Memory {
  at::Device device;
  kiln::profile::CountingCpuAllocatorGuard* cpu_counter = nullptr;
  int64_t base = 0;
  void reset();
  int64_t peak_extra() const;
};

// Waits for the device's queued work (nothing to wait for on CPU).
void sync(const at::Device& d);

// Median seconds of fn over iters runs after warmup runs.
double time_it(const at::Device& d, int iters, const std::function<void()>& fn);

// Seconds per call of forward and of forward+backward: the fastest of `iters` samples (noise on
// a shared machine only ever adds time), the two interleaved so that a slow phase hits both
// alike. Each sample repeats its call often enough to last about kMinSample seconds, so that
// microsecond cases (small CPU shapes, T = 512 on a GPU) are not lost in timer and
// synchronisation overhead; the repeat count comes from the fastest of a few probe calls (one
// probe slowed by the machine would otherwise shrink it). One warm-up call each first
// (allocator, cuDNN plan).
struct FwdBwdSeconds {
  double fwd = 0, fwd_bwd = 0;
};
FwdBwdSeconds time_fwd_bwd(const at::Device& d, int iters, const std::function<void()>& fwd,
                           const std::function<void()>& fwd_bwd);

// Device copy bandwidth in GB/s: read + write of a buffer larger than the caches (1 GiB on CUDA,
// 128 MiB on CPU), timed by time_it.
double copy_bandwidth_gbps(const at::TensorOptions& opt, int iters);

}  // namespace kiln::bench
