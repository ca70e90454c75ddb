// The CUDA side of common/device.cpp: the device's marketing name (for the peak-rate table) and the
// caching allocator's peak counters.
#include <algorithm>
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

namespace kiln::device {

std::string cuda_device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "unknown CUDA device";
  return prop.name;
}

int64_t cuda_total_memory_bytes(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return 0;
  return static_cast<int64_t>(prop.totalGlobalMem);
}

int64_t cuda_peak_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void cuda_reset_peak(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

void cuda_synchronize(int index) {
  const int previous = [] {
    int d = 0;
    cudaGetDevice(&d);
    return d;
  }();
  cudaSetDevice(index);
  cudaDeviceSynchronize();
  cudaSetDevice(previous);
}

int64_t cuda_peak_reserved_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void cuda_empty_cache() {
  c10::cuda::CUDACachingAllocator::emptyCache();
}

// The caching allocator enforces a fraction of the device's total memory and raises
// c10::OutOfMemoryError past it, which is what an artificial cap needs.
void cuda_set_memory_cap(int index, int64_t bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  cudaSetDevice(index);
  cudaMemGetInfo(&free_bytes, &total_bytes);
  const double fraction = bytes <= 0 || total_bytes == 0
                              ? 1.0
                              : std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_bytes));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(index));
}

}  // namespace kiln::device
