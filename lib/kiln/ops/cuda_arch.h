// What kiln's CUDA kernels may assume about a device: the architecture to plan for and the shared
// memory a block may opt in to. Compiled only with KILN_WITH_CUDA.
//
// `arch` is the device's compute capability (major * 10 + minor), or lower when KILN_KERNEL_ARCH
// asks: KILN_KERNEL_ARCH=70 makes an A100 or H100 take the kernels' sm_70 (Volta) code paths and
// plan for a V100's 96 KiB of shared memory per block, so the Volta path is tested on whatever
// GPU is at hand (scripts/device_check.sh runs the [cuda] tests and benchmarks both ways).
// A device this build holds no code for (CMAKE_CUDA_ARCHITECTURES) gets `image = false`: every
// op then runs its ATen reference, with one warning, instead of failing with "no kernel image".
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace kiln::ops {

struct KernelTarget {
  int arch = 0;            // what the kernels plan for (<= the device's own)
  int device_arch = 0;     // the device's compute capability x 10
  int64_t smem_optin = 0;  // dynamic shared memory a block may use, bytes (96 KiB when arch < 80)
  bool image = false;      // this build has code for the device
  std::string name;        // the device's name
};

// Cached per device index; the first call per device may log the warning above.
const KernelTarget& kernel_target(const c10::Device& device);

// KILN_KERNEL_ARCH as a compute capability x 10 (0 when unset): an integer from 70 to 200
// (common/env.h); another value throws naming the variable. kernel_target reads it once per device.
int kernel_arch_override();

// The smaller of the device's opt-in shared memory and, below arch 80, a V100's 96 KiB.
int64_t planned_smem_optin(int arch, int64_t device_optin);

}  // namespace kiln::ops
