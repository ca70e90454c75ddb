// Whether this library holds code its current GPU can run: CMAKE_CUDA_ARCHITECTURES decides which
// machine code (and PTX) is built in, and a GPU outside it (a V100 under a build for 80;90, say)
// fails every launch with "no kernel image". The ops ask before using the kernels and fall back
// to ATen's reference ops instead (ops/cuda_arch.cpp).
#include <cuda_runtime.h>

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {
namespace {
__global__ void arch_probe_kernel(int* x) {
  if (x != nullptr) *x = 0;
}
}  // namespace

bool kernel_image_for_current_device() {
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, arch_probe_kernel);
  if (e != cudaSuccess) (void)cudaGetLastError();  // not sticky; clear it
  return e == cudaSuccess;
}

}  // namespace kiln::kernels
