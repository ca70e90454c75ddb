// kiln-bench's measuring instruments (timing.h): timing, peak extra memory, copy bandwidth.
#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#ifdef KILN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace kiln::bench {

void Memory::reset() {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
    base = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
    return;
  }
#endif
  cpu_counter->reset_peak();
  base = cpu_counter->stats().current_bytes;
}

int64_t Memory::peak_extra() const {
#ifdef KILN_WITH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak - base;
  }
#endif
  return cpu_counter->stats().peak_bytes - base;
}

void sync(const at::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

double time_it(const at::Device& d, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  sync(d);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync(d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

FwdBwdSeconds time_fwd_bwd(const at::Device& d, int iters, const std::function<void()>& fwd,
                           const std::function<void()>& fwd_bwd) {
  constexpr double kMinSample = 0.01;
  auto timed = [&](const std::function<void()>& fn, int reps) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    sync(d);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto repeats = [&](const std::function<void()>& fn) {
    timed(fn, 1);
    double once = timed(fn, 1);
    if (once >= kMinSample) return 1;
    for (int i = 0; i < 2; ++i) once = std::min(once, timed(fn, 1));
    return static_cast<int>(std::clamp(std::ceil(kMinSample / once), 1.0, 1000.0));
  };
  const int reps_fwd = repeats(fwd), reps_fwd_bwd = repeats(fwd_bwd);
  std::vector<double> tf, tb;
  for (int i = 0; i < iters; ++i) {
    tf.push_back(timed(fwd, reps_fwd) / reps_fwd);
    tb.push_back(timed(fwd_bwd, reps_fwd_bwd) / reps_fwd_bwd);
  }
  return {*std::min_element(tf.begin(), tf.end()), *std::min_element(tb.begin(), tb.end())};
}

double copy_bandwidth_gbps(const at::TensorOptions& opt, int iters) {
  const at::Device device = opt.device();
  const int64_t copy_bytes = device.is_cuda() ? (int64_t{1} << 30) : (int64_t{1} << 27);
  const at::Tensor src = at::empty({copy_bytes}, opt.dtype(at::kByte)).fill_(1);
  at::Tensor dst = at::empty_like(src);
  const double s = time_it(device, iters, [&] { dst.copy_(src); });
  return 2.0 * static_cast<double>(copy_bytes) / s / 1e9;
}

}  // namespace kiln::bench
