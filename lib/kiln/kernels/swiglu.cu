// SwiGLU forward and backward, elementwise in fp32 with 128-bit packs. The forward keeps the
// rounding of the unfused ATen pair (at::silu rounds to the dtype, then the product rounds):
//   y = T( float(T(silu(gate))) * up )
// so it matches the reference to rounding in fp32 and to one rounding in bf16/fp16.
#ifndef KILN_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>

#include "kiln/kernels/swiglu.cuh"

namespace KILN_KERNELS_NS {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ void swiglu_fwd_one(T g, T u, T& y) {
  const float gf = static_cast<float>(g);
  const float silu = gf / (1.f + expf(-gf));
  y = static_cast<T>(static_cast<float>(static_cast<T>(silu)) * static_cast<float>(u));
}

template <typename T>
__device__ __forceinline__ void swiglu_bwd_one(T g, T u, T dy, T& dg, T& du) {
  const float gf = static_cast<float>(g), uf = static_cast<float>(u), dyf = static_cast<float>(dy);
  const float s = 1.f / (1.f + expf(-gf));
  dg = static_cast<T>(dyf * uf * s * (1.f + gf * (1.f - s)));
  du = static_cast<T>(dyf * gf * s);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) swiglu_fwd_kernel(SwiGluParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if constexpr (kVec) {
    const auto* g = static_cast<const Pack<T>*>(p.gate);
    const auto* u = static_cast<const Pack<T>*>(p.up);
    auto* y = static_cast<Pack<T>*>(p.y);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < p.n / kPack<T>; i += stride) {
      const Pack<T> gp = g[i], up = u[i];
      Pack<T> yp;
#pragma unroll
      for (int j = 0; j < kPack<T>; ++j) swiglu_fwd_one(gp.v[j], up.v[j], yp.v[j]);
      y[i] = yp;
    }
  } else {
    const T* g = static_cast<const T*>(p.gate);
    const T* u = static_cast<const T*>(p.up);
    T* y = static_cast<T*>(p.y);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < p.n; i += stride) {
      swiglu_fwd_one(g[i], u[i], y[i]);
    }
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) swiglu_bwd_kernel(SwiGluParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  if constexpr (kVec) {
    const auto* g = static_cast<const Pack<T>*>(p.gate);
    const auto* u = static_cast<const Pack<T>*>(p.up);
    const auto* dy = static_cast<const Pack<T>*>(p.dy);
    auto* dg = static_cast<Pack<T>*>(p.d_gate);
    auto* du = static_cast<Pack<T>*>(p.d_up);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < p.n / kPack<T>; i += stride) {
      const Pack<T> gp = g[i], up = u[i], dp = dy[i];
      Pack<T> gout, uout;
#pragma unroll
      for (int j = 0; j < kPack<T>; ++j) swiglu_bwd_one(gp.v[j], up.v[j], dp.v[j], gout.v[j], uout.v[j]);
      dg[i] = gout;
      du[i] = uout;
    }
  } else {
    const T* g = static_cast<const T*>(p.gate);
    const T* u = static_cast<const T*>(p.up);
    const T* dy = static_cast<const T*>(p.dy);
    T* dg = static_cast<T*>(p.d_gate);
    T* du = static_cast<T*>(p.d_up);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < p.n; i += stride) {
      swiglu_bwd_one(g[i], u[i], dy[i], dg[i], du[i]);
    }
  }
}

bool aligned(std::initializer_list<const void*> ptrs) {
  for (const void* q : ptrs) {
    if (q != nullptr && (reinterpret_cast<uintptr_t>(q) & 15u) != 0) return false;
  }
  return true;
}

unsigned grid_for(int64_t items) {
  // Grid-stride loop; 65535 blocks of 256 threads cover 16M items per sweep.
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, 65535)));
}

}  // namespace

void launch_swiglu_fwd(const SwiGluParams& p, Stream stream) {
  if (p.n == 0) return;
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    if (p.n % kPack<T> == 0 && aligned({p.gate, p.up, p.y})) {
      const auto kernel = swiglu_fwd_kernel<T, true>;
      KILN_LAUNCH(kernel, grid_for(p.n / kPack<T>), kThreads, 0, stream, p);
    } else {
      const auto kernel = swiglu_fwd_kernel<T, false>;
      KILN_LAUNCH(kernel, grid_for(p.n), kThreads, 0, stream, p);
    }
  });
}

void launch_swiglu_bwd(const SwiGluParams& p, Stream stream) {
  if (p.n == 0) return;
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    if (p.n % kPack<T> == 0 && aligned({p.gate, p.up, p.dy, p.d_gate, p.d_up})) {
      const auto kernel = swiglu_bwd_kernel<T, true>;
      KILN_LAUNCH(kernel, grid_for(p.n / kPack<T>), kThreads, 0, stream, p);
    } else {
      const auto kernel = swiglu_bwd_kernel<T, false>;
      KILN_LAUNCH(kernel, grid_for(p.n), kThreads, 0, stream, p);
    }
  });
}

}  // namespace KILN_KERNELS_NS
