// The CUDA side of common/device.cpp: the device's marketing name (for the peak-rate table) and the
// caching allocator's peak counters.
//
// Every CUDA runtime call's result is checked: a failure throws one line naming the call, the
// device and CUDA's error (a missing driver, an index past the device count, an error a kernel left
// behind), instead of a silent "unknown" or 0 that a report, the auto-fit planner or a timing would
// then take for a fact. Switching the current device goes through c10's CUDAGuard, which restores
// the previous device when the scope ends, also when the call in between throws.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace kiln::device {

namespace {

void check(cudaError_t e, const char* call, int index) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // the runtime records it as the last error too; a later check must not report it again
  throw std::runtime_error(
      fmt::format("{} on CUDA device {} failed: {} ({})", call, index, cudaGetErrorString(e), cudaGetErrorName(e)));
}

// `index` is the current device while this lives; c10's guard puts the previous one back.
class CurrentDevice {
 public:
  CurrentDevice(int index, const char* what) {
    try {
      guard_.emplace(static_cast<c10::DeviceIndex>(index));
    } catch (const c10::Error& e) {
      // c10's text is several lines of hints; its first line is CUDA's error.
      const std::string text = e.what_without_backtrace();
      throw std::runtime_error(
          fmt::format("{}: cannot make CUDA device {} current: {}", what, index, text.substr(0, text.find('\n'))));
    }
  }

 private:
  std::optional<c10::cuda::CUDAGuard> guard_;
};

cudaDeviceProp properties(int index) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties", index);
  return prop;
}

}  // namespace

std::string cuda_device_name(int index) {
  return properties(index).name;
}

int64_t cuda_total_memory_bytes(int index) {
  return static_cast<int64_t>(properties(index).totalGlobalMem);
}

int64_t cuda_peak_allocated_bytes(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void cuda_reset_peak(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

void cuda_synchronize(int index) {
  const CurrentDevice current(index, "cudaDeviceSynchronize");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", index);
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
  {
    const CurrentDevice current(index, "cudaMemGetInfo");
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", index);
  }
  const double fraction = bytes <= 0 || total_bytes == 0
                              ? 1.0
                              : std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_bytes));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(index));
}

int cuda_sync_debug_mode() {
  return static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
}

void cuda_set_sync_debug_mode(int mode) {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode));
}

}  // namespace kiln::device
