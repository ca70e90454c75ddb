// The CUDA side of device.cpp: the device's marketing name (for the peak-rate table) and the
// caching allocator's peak counters.
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

namespace kiln::profile {

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "unknown CUDA device";
  return prop.name;
}

int64_t cuda_peak_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void cuda_reset_peak(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

}  // namespace kiln::profile
