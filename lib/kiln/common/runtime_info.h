// The software and GPUs a run has: LibTorch's version and CUDA build, the CUDA runtime and the
// driver, and each GPU's name, compute capability and memory. kiln-pretrain logs them at start
// (a V100 on a CUDA 12 driver and an H100 on CUDA 13 take different LibTorch builds, README.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct GpuInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int64_t memory_bytes = 0;
};

struct RuntimeInfo {
  std::string torch_version;  // LibTorch's, e.g. "2.11.0"
  std::string cuda_runtime;   // the CUDA runtime kiln's kernels use ("12.4"), or "" without CUDA
  std::string driver_cuda;    // the newest CUDA the driver supports ("12.2"), or "" without a driver
  std::vector<GpuInfo> gpus;
  std::string summary() const;  // one line
};

RuntimeInfo runtime_info();
// One GPU's facts (index < runtime_info().gpus.size()).
GpuInfo gpu_info(int index);

}  // namespace kiln
