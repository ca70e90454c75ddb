// RMSNorm forward and backward. fp32 accumulation through warp shuffles, the rounding order of
// the Hugging Face reference in the forward pass:
//   y = T( float(weight) * float( T(h * rstd) ) )
// so the kernel agrees with the ATen reference bit for bit in fp32 and to one rounding in
// bf16/fp16. Rows move in 128-bit packs whenever cols, the row stride and the pointers allow.
//
// Backward (g = dy * w, n = h * rstd, both fp32):
//   dh = rstd * (g - n * mean(g * n)) (+ dh_direct),   dweight = sum_rows dy * T(n)
// dweight is accumulated per block in shared memory over a grid-stride loop of rows, written as
// one fp32 row per block, and summed over blocks by the caller: no atomics, deterministic.
#ifndef KILN_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kiln/kernels/rmsnorm.cuh"

namespace KILN_KERNELS_NS {
namespace {

constexpr int kFwdThreads = 256;
constexpr int kBwdThreads = 256;
// The most the backward asks for, within sm_80's opt-in (163 KB); a device's own opt-in (a V100's
// 96 KiB) lowers it (rmsnorm_bwd_max_smem).
constexpr int64_t kMaxSmem = 160 * 1024;

template <typename T>
__device__ __forceinline__ float f(T v) {
  return static_cast<float>(v);
}

// Loads pack i (kVec) or element i of a row into out[0..n), n = kPack<T> or 1.
template <typename T, bool kVec>
struct RowIo {
  static constexpr int kN = kVec ? kPack<T> : 1;
  __device__ __forceinline__ static void load(const T* row, int64_t i, float* out) {
    if constexpr (kVec) {
      const Pack<T> pk = reinterpret_cast<const Pack<T>*>(row)[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) out[j] = f(pk.v[j]);
    } else {
      out[0] = f(row[i]);
    }
  }
  __device__ __forceinline__ static void store(T* row, int64_t i, const float* in) {
    if constexpr (kVec) {
      Pack<T> pk;
#pragma unroll
      for (int j = 0; j < kN; ++j) pk.v[j] = static_cast<T>(in[j]);
      reinterpret_cast<Pack<T>*>(row)[i] = pk;
    } else {
      row[i] = static_cast<T>(in[0]);
    }
  }
};

template <typename T, bool kVec, bool kResidual>
__global__ void __launch_bounds__(kFwdThreads) rmsnorm_fwd_kernel(RmsNormFwdParams p) {
  using Io = RowIo<T, kVec>;
  constexpr int kN = Io::kN;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  const T* res = kResidual ? static_cast<const T*>(p.residual) + row * p.cols : nullptr;
  T* h = kResidual ? static_cast<T*>(p.h) + row * p.cols : nullptr;
  const T* w = static_cast<const T*>(p.weight);
  T* y = static_cast<T*>(p.y) + row * p.cols;
  const int64_t n_items = p.cols / kN;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < n_items; i += kFwdThreads) {
    float v[kN];
    Io::load(x, i, v);
    if constexpr (kResidual) {
      float r[kN];
      Io::load(res, i, r);
#pragma unroll
      for (int j = 0; j < kN; ++j) v[j] = f(static_cast<T>(v[j] + r[j]));  // the dtype's own add
      Io::store(h, i, v);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) sum_sq += v[j] * v[j];
  }
  const float rstd = rsqrtf(block_sum<kFwdThreads>(sum_sq) / static_cast<float>(p.cols) + p.eps);
  if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = rstd;
  // The second read comes from L1/L2 (this block just read it); with a residual, from h, which
  // this thread itself wrote.
  const T* src = kResidual ? h : x;
  for (int64_t i = threadIdx.x; i < n_items; i += kFwdThreads) {
    float v[kN], wv[kN];
    Io::load(src, i, v);
    Io::load(w, i, wv);
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = wv[j] * f(static_cast<T>(v[j] * rstd));
    Io::store(y, i, v);
  }
}

// The backward keeps its packs in the storage dtype and converts element by element: holding
// four packs as fp32 arrays cost enough registers to spill in the bf16/fp16 + dh variants.
template <typename T, int N>
struct alignas(sizeof(T) * N) Items {
  T v[N];
};

template <typename T, bool kVec, bool kDh>
__global__ void __launch_bounds__(kBwdThreads) rmsnorm_bwd_kernel(RmsNormBwdParams p) {
  constexpr int kN = kVec ? kPack<T> : 1;
  using It = Items<T, kN>;
  KILN_DYNAMIC_SMEM(dw_smem);
  float* dw_acc = reinterpret_cast<float*>(dw_smem);  // [cols]
  const int64_t n_items = p.cols / kN;
  for (int64_t c = threadIdx.x; c < p.cols; c += kBwdThreads) dw_acc[c] = 0.f;
  __syncthreads();
  // In the row loop each thread touches only its own columns of dw_acc: no barrier needed there.
  const It* w = static_cast<const It*>(p.weight);
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const It* x = static_cast<const It*>(p.x) + row * n_items;
    const It* dy = static_cast<const It*>(p.dy) + row * n_items;
    const float rstd = p.rstd[row];
    float dot = 0.f;  // sum g * n
    for (int64_t i = threadIdx.x; i < n_items; i += kBwdThreads) {
      const It xv = x[i], dv = dy[i], wv = w[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float n = f(xv.v[j]) * rstd, d = f(dv.v[j]);
        dot += d * f(wv.v[j]) * n;
        dw_acc[i * kN + j] += d * f(static_cast<T>(n));
      }
    }
    const float mean_dot = block_sum<kBwdThreads>(dot) * inv_cols;
    It* dx = static_cast<It*>(p.dx) + row * n_items;
    const It* dh = kDh ? static_cast<const It*>(p.dh) + row * n_items : nullptr;
    for (int64_t i = threadIdx.x; i < n_items; i += kBwdThreads) {
      const It xv = x[i], dv = dy[i], wv = w[i];
      It out;
      if constexpr (kDh) out = dh[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        float g = rstd * (f(dv.v[j]) * f(wv.v[j]) - f(xv.v[j]) * rstd * mean_dot);
        if constexpr (kDh) g += f(out.v[j]);
        out.v[j] = static_cast<T>(g);
      }
      dx[i] = out;
    }
  }
  __syncthreads();
  float* partial = p.dweight_partial + static_cast<int64_t>(blockIdx.x) * p.cols;
  for (int64_t c = threadIdx.x; c < p.cols; c += kBwdThreads) partial[c] = dw_acc[c];
}

template <typename T>
bool can_vectorise(int64_t cols, int64_t stride, std::initializer_list<const void*> ptrs) {
  if (cols % kPack<T> != 0 || stride % kPack<T> != 0) return false;
  for (const void* q : ptrs) {
    if (q != nullptr && (reinterpret_cast<uintptr_t>(q) & 15u) != 0) return false;
  }
  return true;
}

}  // namespace

void launch_rmsnorm_fwd(const RmsNormFwdParams& p, Stream stream) {
  if (p.rows == 0) return;
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    const bool vec = can_vectorise<T>(p.cols, p.x_row_stride, {p.x, p.residual, p.weight, p.y, p.h});
    const unsigned grid = static_cast<unsigned>(p.rows);
    if (p.residual != nullptr) {
      if (vec) {
        const auto kernel = rmsnorm_fwd_kernel<T, true, true>;
        KILN_LAUNCH(kernel, grid, kFwdThreads, 0, stream, p);
      } else {
        const auto kernel = rmsnorm_fwd_kernel<T, false, true>;
        KILN_LAUNCH(kernel, grid, kFwdThreads, 0, stream, p);
      }
    } else if (vec) {
      const auto kernel = rmsnorm_fwd_kernel<T, true, false>;
      KILN_LAUNCH(kernel, grid, kFwdThreads, 0, stream, p);
    } else {
      const auto kernel = rmsnorm_fwd_kernel<T, false, false>;
      KILN_LAUNCH(kernel, grid, kFwdThreads, 0, stream, p);
    }
  });
}

int64_t rmsnorm_bwd_smem_bytes(int64_t cols) {
  return cols * static_cast<int64_t>(sizeof(float));
}
int64_t rmsnorm_bwd_static_smem_bytes() {
  return kBlockReduceSmemBytes;  // block_sum's slots
}
int64_t rmsnorm_bwd_max_smem(int64_t device_optin) {
  return std::min(kMaxSmem, device_optin);
}
bool rmsnorm_bwd_fits(int64_t cols, int64_t device_optin) {
  return rmsnorm_bwd_smem_bytes(cols) + rmsnorm_bwd_static_smem_bytes() <= rmsnorm_bwd_max_smem(device_optin);
}

void launch_rmsnorm_bwd(const RmsNormBwdParams& p, Stream stream) {
  if (p.rows == 0) return;
  const int smem = static_cast<int>(rmsnorm_bwd_smem_bytes(p.cols));
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    const bool vec = can_vectorise<T>(p.cols, p.cols, {p.x, p.weight, p.dy, p.dh, p.dx});
    auto run = [&](auto kernel) {
      // Beyond 48 KiB, static and dynamic together, a block needs the kernel's opt-in (the
      // emulation has its own cudaFuncSetAttribute and holds the launch to it).
      if (smem + rmsnorm_bwd_static_smem_bytes() > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          throw std::runtime_error("rmsnorm backward: cannot allow " + std::to_string(smem) +
                                   " bytes of shared memory per block: " + cudaGetErrorString(e));
        }
      }
      KILN_LAUNCH(kernel, static_cast<unsigned>(p.blocks), kBwdThreads, smem, stream, p);
    };
    if (p.dh != nullptr) {
      vec ? run(rmsnorm_bwd_kernel<T, true, true>) : run(rmsnorm_bwd_kernel<T, false, true>);
    } else {
      vec ? run(rmsnorm_bwd_kernel<T, true, false>) : run(rmsnorm_bwd_kernel<T, false, false>);
    }
  });
}

}  // namespace KILN_KERNELS_NS
