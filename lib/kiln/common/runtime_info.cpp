#include "kiln/common/runtime_info.h"

#include "kiln/version.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#ifdef KILN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#endif

namespace kiln {

namespace {
[[maybe_unused]] std::string cuda_version_text(int v) {  // 12040 -> "12.4"; unused without CUDA
  return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : "";
}
}  // namespace

GpuInfo gpu_info(int index) {
  GpuInfo g;
  g.index = index;
#ifdef KILN_WITH_CUDA
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);
  g.name = prop->name;
  g.major = prop->major;
  g.minor = prop->minor;
  g.memory_bytes = static_cast<int64_t>(prop->totalGlobalMem);
#else
  g.name = "a CUDA device (this kiln was built without CUDA)";
#endif
  return g;
}

RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.torch_version = KILN_TORCH_VERSION_STRING;  // the LibTorch this kiln was built against (its package checks)
#ifdef KILN_WITH_CUDA
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) r.cuda_runtime = cuda_version_text(v);
  v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess) r.driver_cuda = cuda_version_text(v);
  (void)cudaGetLastError();
#endif
  const int n = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  for (int i = 0; i < n; ++i) r.gpus.push_back(gpu_info(i));
  return r;
}

std::string RuntimeInfo::summary() const {
  std::string out = fmt::format("LibTorch {}", torch_version);
  if (!cuda_runtime.empty()) out += fmt::format(", CUDA runtime {}", cuda_runtime);
  out += driver_cuda.empty() ? ", no CUDA driver" : fmt::format(", driver for CUDA {}", driver_cuda);
  if (gpus.empty()) return out + ", no GPU";
  for (const GpuInfo& g : gpus) {
    out += fmt::format("; GPU {}: {} (compute capability {}.{}, {:.1f} GiB)", g.index, g.name, g.major, g.minor,
                       static_cast<double>(g.memory_bytes) / (1 << 30));
  }
  return out;
}

}  // namespace kiln
