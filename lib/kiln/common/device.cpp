#include "kiln/common/device.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/cuda.h>

namespace kiln::device {

void check_spec(const std::string& spec) {
  if (spec != "auto" && spec != "cpu" && spec != "cuda") {
    throw std::invalid_argument(fmt::format("'{}' is not auto, cpu or cuda", spec));
  }
}

at::Device resolve(const std::string& spec) {
  check_spec(spec);
  const bool gpu = torch::cuda::is_available();
  if (spec == "cuda" && !gpu) throw std::invalid_argument("'cuda' but no CUDA device is present");
  if (spec == "cpu" || !gpu) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, 0);
}

double measure_cpu_gemm_tflops() {
  at::NoGradGuard no_grad;
  const int64_t n = 1024;
  const at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
  // at::mm: the GEMM kiln's fp32 linears run on the CPU (ops::linear), so that MFU is measured
  // against the peak of the library that does the work.
  at::Tensor c = at::mm(a, b);  // warm up the BLAS threads
  int iters = 0;
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  while (seconds < 0.5 || iters < 3) {
    c = at::mm(a, b);
    ++iters;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double flops = 2.0 * static_cast<double>(n * n * n) * iters;
  return flops / seconds / 1e12;
}

double measure_cpu_copy_bandwidth() {
  at::NoGradGuard no_grad;
  const int64_t n = int64_t{16} << 20;  // 16 Mi floats = 64 MiB
  const at::Tensor src = at::ones({n}), dst = at::empty({n});
  dst.copy_(src);  // warm-up: the destination's pages are mapped, the threads started
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    dst.copy_(src);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, 2.0 * static_cast<double>(n) * 4 / s);
  }
  return best;
}

#ifdef KILN_WITH_CUDA
// device_cuda.cpp
std::string cuda_device_name(int index);
int64_t cuda_total_memory_bytes(int index);
int64_t cuda_peak_allocated_bytes(int index);
void cuda_reset_peak(int index);
void cuda_synchronize(int index);
int64_t cuda_peak_reserved_bytes(int index);
void cuda_empty_cache();
void cuda_set_memory_cap(int index, int64_t bytes);
int cuda_sync_debug_mode();
void cuda_set_sync_debug_mode(int mode);
#endif

namespace {
[[maybe_unused]] int cuda_index(const at::Device& device) {  // unused without CUDA
  return device.has_index() ? device.index() : 0;
}
// A CUDA device handed to a kiln built without CUDA: an error, never a silent no-op or the host's figure.
[[maybe_unused]] void refuse_without_cuda(const at::Device& device, const char* what) {  // unused with CUDA
  if (device.is_cuda()) {
    throw std::runtime_error(std::string(what) + " on " + device.str() + ": this kiln was built without CUDA");
  }
}
}  // namespace

double device_memory_bytes(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) return static_cast<double>(cuda_total_memory_bytes(cuda_index(device)));
#else
  refuse_without_cuda(device, "device memory");
#endif
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::optional<RssSample> read_rss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  RssSample s;
  int found = 0;
  while (std::getline(in, line)) {
    for (auto [key, out] : {std::pair{"VmRSS:", &s.current_bytes}, std::pair{"VmHWM:", &s.peak_bytes}}) {
      if (line.rfind(key, 0) == 0) {
        *out = std::stoll(line.substr(std::strlen(key))) * 1024;  // "VmRSS:   123456 kB"
        ++found;
      }
    }
  }
  if (found != 2) return std::nullopt;
  return s;
}

bool reset_rss_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

double peak_memory_bytes(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) return static_cast<double>(cuda_peak_allocated_bytes(device.has_index() ? device.index() : 0));
#endif
  (void)device;
  return static_cast<double>(peak_rss_bytes());
}

void reset_peak_memory(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) cuda_reset_peak(device.has_index() ? device.index() : 0);
#endif
  (void)device;
}

void synchronize(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) cuda_synchronize(cuda_index(device));
#else
  refuse_without_cuda(device, "synchronize");
#endif
}

std::optional<double> peak_reserved_bytes(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) return static_cast<double>(cuda_peak_reserved_bytes(cuda_index(device)));
#endif
  (void)device;
  return std::nullopt;
}

void release_cached_memory(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) cuda_empty_cache();
#endif
  (void)device;
}

void set_device_memory_cap(const at::Device& device, int64_t bytes) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) cuda_set_memory_cap(cuda_index(device), bytes);
#else
  refuse_without_cuda(device, "a memory cap");
  (void)bytes;
#endif
}

std::string name(const at::Device& device) {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) return cuda_device_name(cuda_index(device));
#endif
  if (device.is_cpu()) return "CPU (" + std::to_string(at::get_num_threads()) + " threads)";
  return device.str();
}

SyncCheckScope::SyncCheckScope() {
#ifdef KILN_WITH_CUDA
  previous_ = cuda_sync_debug_mode();
  cuda_set_sync_debug_mode(2);  // c10::cuda::SyncDebugMode::L_ERROR
#endif
}

SyncCheckScope::~SyncCheckScope() {
#ifdef KILN_WITH_CUDA
  cuda_set_sync_debug_mode(previous_);
#endif
}

}  // namespace kiln::device
