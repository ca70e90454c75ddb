#include "kiln/ops/cuda_arch.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

#include "kiln/common/env.h"
#include "kiln/common/logger.h"
#include "kiln/kernels/common.cuh"
#include "kiln/version.h"

namespace kiln::ops {

int kernel_arch_override() {
  const auto arch =
      env::integer("KILN_KERNEL_ARCH", 70, 200, "a compute capability times ten; 70: the V100's code paths");
  return static_cast<int>(arch.value_or(0));
}

int64_t planned_smem_optin(int arch, int64_t device_optin) {
  constexpr int64_t kVoltaOptin = 96 * 1024;
  return arch < 80 ? std::min(device_optin, kVoltaOptin) : device_optin;
}

const KernelTarget& kernel_target(const c10::Device& device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<KernelTarget>> cache;
  const int index = device.has_index() ? device.index() : at::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[index];
  if (slot) return *slot;
  auto t = std::make_unique<KernelTarget>();
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);
  t->name = prop->name;
  t->device_arch = prop->major * 10 + prop->minor;
  const int forced = kernel_arch_override();
  t->arch = forced > 0 ? std::min(forced, t->device_arch) : t->device_arch;
  t->smem_optin = planned_smem_optin(t->arch, static_cast<int64_t>(prop->sharedMemPerBlockOptin));
  {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    t->image = kernels::kernel_image_for_current_device();
  }
  if (!t->image) {
    logger()->warn(
        "kiln: this build has no kernel code for {} (compute capability {}.{}; CMAKE_CUDA_ARCHITECTURES is {}): "
        "kiln's ops run their ATen references on it",
        t->name, prop->major, prop->minor, KILN_CUDA_ARCHITECTURES);
  } else if (forced > 0 && forced < t->device_arch) {
    logger()->info(
        "kiln: KILN_KERNEL_ARCH={}: the kernels take their sm_{} code paths on {} (compute capability {}.{})", forced,
        t->arch, t->name, prop->major, prop->minor);
  }
  slot = std::move(t);
  return *slot;
}

}  // namespace kiln::ops
