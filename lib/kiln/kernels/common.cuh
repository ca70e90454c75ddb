// Shared pieces of kiln's raw CUDA kernels: the dtype tag that crosses the torch-free launcher
// boundary, and the one static-switch helper that turns it into a template parameter.
#pragma once

#include <cmath>
#include <cstdint>

struct CUstream_st;  // cudaStream_t without <cuda_runtime.h>, so torch-side headers stay CUDA-free

namespace kiln::kernels {

using Stream = CUstream_st*;

enum class DType : int { kFloat32, kBFloat16, kFloat16 };

// True when this build holds machine code or PTX the current CUDA device can run (arch_probe.cu).
bool kernel_image_for_current_device();

}  // namespace kiln::kernels

// Kernel sources are also compiled as host C++ against kernels/emulation.h (tests without a GPU):
// their entry points then live in kiln::kernels::emulated, and these two macros stand for the
// dynamic shared memory declaration and the <<<...>>> launch.
// KILN_STATIC_SMEM(T, name, count) declares a static shared array (`__shared__ T name[count]`);
// the emulation gives each block a fresh, poisoned one and counts its bytes.
#ifdef KILN_CUDA_EMULATION
#define KILN_KERNELS_NS kiln::kernels::emulated
#define KILN_DYNAMIC_SMEM(name) unsigned char* name = ::kiln::emu::current_block()->dynamic_shared
#define KILN_STATIC_SMEM(T, name, count)                                                            \
  T* const name = [] {                                                                              \
    static const char kiln_static_smem_key = 0;                                                     \
    return static_cast<T*>(::kiln::emu::static_shared(&kiln_static_smem_key, sizeof(T) * (count))); \
  }()
#define KILN_LAUNCH(kernel, grid, block, smem, stream, ...) ::kiln::emu::launch(kernel, grid, block, smem, __VA_ARGS__)
#else
#define KILN_KERNELS_NS kiln::kernels
#define KILN_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#define KILN_STATIC_SMEM(T, name, count) __shared__ T name[count]
#define KILN_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<grid, block, smem, stream>>>(__VA_ARGS__)
#endif

#if defined(__CUDACC__) || defined(KILN_CUDA_EMULATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// KILN_DTYPE_SWITCH(dtype, T, body): runs `body` with T = float, __nv_bfloat16 or __half.
#define KILN_DTYPE_SWITCH(DTYPE, T, ...)        \
  [&] {                                         \
    switch (DTYPE) {                            \
      case ::kiln::kernels::DType::kBFloat16: { \
        using T = __nv_bfloat16;                \
        return __VA_ARGS__();                   \
      }                                         \
      case ::kiln::kernels::DType::kFloat16: {  \
        using T = __half;                       \
        return __VA_ARGS__();                   \
      }                                         \
      default: {                                \
        using T = float;                        \
        return __VA_ARGS__();                   \
      }                                         \
    }                                           \
  }()

namespace kiln::kernels {

// 128-bit packs: a row is read and written 16 bytes at a time when its length and base allow.
template <typename T>
constexpr int kPack = 16 / static_cast<int>(sizeof(T));
template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

template <typename T>
__host__ __device__ __forceinline__ bool aligned16(const T* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

// Block-wide reductions for a block of kThreads (a multiple of 32, at most 1024). Safe to call
// repeatedly in one kernel: the leading barrier keeps a second call from overwriting the slots
// the first one is still reading. Each reduction op's instantiation holds kBlockReduceSmemBytes
// of static shared memory, which launchers that plan dynamic shared memory must count.
constexpr int kBlockReduceSmemBytes = 32 * static_cast<int>(sizeof(float));
template <int kThreads, typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op) {
  KILN_STATIC_SMEM(float, slots, 32);
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? slots[lane] : Op::kIdentity;  // lanes past the last warp must not count
    for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) slots[0] = v;
  }
  __syncthreads();
  return slots[0];
}

struct SumOp {
  static constexpr float kIdentity = 0.f;
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  static constexpr float kIdentity = -INFINITY;
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <int kThreads>
__device__ __forceinline__ float block_sum(float v) {
  return block_reduce<kThreads>(v, SumOp{});
}
template <int kThreads>
__device__ __forceinline__ float block_max(float v) {
  return block_reduce<kThreads>(v, MaxOp{});
}

}  // namespace kiln::kernels
#endif
