// RMSNorm forward. One block per row; fp32 accumulation of the sum of squares through warp
// shuffles, then the rounding order of the Hugging Face reference:
//   y = T( float(weight) * float( T(x * rstd) ) )
// i.e. the normalised value is rounded to the input dtype before the weight multiply, so the
// kernel agrees with the ATen reference bit for bit in fp32 and to one rounding in bf16/fp16.
// The vectorised and backward versions come with the fused-kernel work (docs/kernels.md).
#include "kiln/kernels/rmsnorm.cuh"

#include <cuda_runtime.h>

namespace kiln::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) warp_sums[0] = v;
  }
  __syncthreads();
  return warp_sums[0];
}

template <typename T>
__global__ void rmsnorm_fwd_kernel(RmsNormFwdParams p) {
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  const T* w = static_cast<const T*>(p.weight);
  T* y = static_cast<T*>(p.y) + row * p.cols;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    const float v = static_cast<float>(x[i]);
    sum_sq += v * v;
  }
  const float rstd = rsqrtf(block_sum(sum_sq) / static_cast<float>(p.cols) + p.eps);
  if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = rstd;
  for (int64_t i = threadIdx.x; i < p.cols; i += kThreads) {
    const T normed = static_cast<T>(static_cast<float>(x[i]) * rstd);
    y[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
  }
}

}  // namespace

void launch_rmsnorm_fwd(const RmsNormFwdParams& params, Stream stream) {
  if (params.rows == 0) return;
  KILN_DTYPE_SWITCH(params.dtype, T, [&] {
    rmsnorm_fwd_kernel<T><<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(params);
  });
}

}  // namespace kiln::kernels
