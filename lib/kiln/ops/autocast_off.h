// AutocastOff: autocast disabled on the CPU and CUDA for the current thread while it lives.
//
// The bodies of kiln's autograd Functions call ATen ops on operands they have already cast; autocast
// would cast them again. This is the public-API form of excluding autocast's dispatch keys:
// at::autocast::set_autocast_enabled(device, false) puts the device's autocast key into this
// thread's excluded set, which is what c10's impl-namespace ExcludeDispatchKeyGuard did before
// (docs/architecture.md, "LibTorch's public API"). The autocast dtype and weight cache are untouched.
#pragma once

#include <ATen/autocast_mode.h>

namespace kiln::ops {

class AutocastOff {
 public:
  AutocastOff()
      : cpu_(at::autocast::is_autocast_enabled(at::kCPU)), cuda_(at::autocast::is_autocast_enabled(at::kCUDA)) {
    if (cpu_) at::autocast::set_autocast_enabled(at::kCPU, false);
    if (cuda_) at::autocast::set_autocast_enabled(at::kCUDA, false);
  }
  ~AutocastOff() {
    if (cpu_) at::autocast::set_autocast_enabled(at::kCPU, true);
    if (cuda_) at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  bool cpu_, cuda_;
};

}  // namespace kiln::ops
