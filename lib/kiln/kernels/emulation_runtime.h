// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): the CUDA
// surface the kernel sources use, as host C++: the qualifier macros, threadIdx and friends, the
// barrier and shuffle intrinsics, the math intrinsics, atomicAdd, and the runtime calls the
// launchers make. Last, so that its macros reach only the kernel sources that follow.
#pragma once

#include "kiln/kernels/emulation_sync.h"

// ---- the CUDA surface the kernels use
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
// Static shared arrays are declared with KILN_STATIC_SMEM (common.cuh), which poisons them per block.
#define __shared__ KILN_EMULATION_declare_static_shared_memory_with_KILN_STATIC_SMEM
#define __launch_bounds__(...)

#define threadIdx (::kiln::emu::current_fiber().thread_idx)
#define blockIdx (::kiln::emu::current_block()->block_idx)
#define blockDim (::kiln::emu::current_block()->block_dim)
#define gridDim (::kiln::emu::current_block()->grid_dim)

inline void __syncthreads() {
  ::kiln::emu::wait(::kiln::emu::current_block()->block_barrier);
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::kiln::emu::sync_warp();
}
inline float __shfl_xor_sync(unsigned, float value, int mask) {
  return ::kiln::emu::shuffle_xor(value, mask);
}
inline int __shfl_xor_sync(unsigned, int value, int mask) {
  return ::kiln::emu::shuffle_xor(value, mask);
}
[[noreturn]] inline void __trap() {  // a variant the launcher never selects was launched
  ::kiln::emu::fail("__trap(): a kernel variant this architecture does not have was launched");
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}

inline float rsqrtf(float x) {
  return 1.f / std::sqrt(x);
}
// Rounded on their own, never contracted into an FMA (volatile keeps the host compiler from it).
inline float __fmul_rn(float a, float b) {
  volatile float p = a * b;
  return p;
}
inline float __fadd_rn(float a, float b) {
  volatile float s = a + b;
  return s;
}
// An atomic read-modify-write (ThreadSanitizer sees an atomic, not a race).
inline float atomicAdd(float* address, float value) {
  auto* bits = reinterpret_cast<uint32_t*>(address);
  uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), next;
  float was;
  do {
    std::memcpy(&was, &old, 4);
    const float sum = was + value;
    std::memcpy(&next, &sum, 4);
  } while (!__atomic_compare_exchange_n(bits, &old, next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return was;
}
inline int atomicAdd(int* address, int value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
using std::max;
using std::min;

// The runtime calls the launchers make: a kernel's opt-in to more dynamic shared memory.
template <typename Kernel>
inline cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  const void* key = reinterpret_cast<const void*>(kernel);
  const auto known = ::kiln::emu::known_static_smem().find(key);
  const size_t static_bytes = known != ::kiln::emu::known_static_smem().end() ? known->second : 0;
  if (value < 0 ||
      static_cast<size_t>(value) + static_bytes > ::kiln::emu::smem_block_limit(::kiln::emu::config().arch)) {
    return cudaErrorInvalidValue;
  }
  ::kiln::emu::dynamic_smem_opt_in()[key] = static_cast<size_t>(value);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorInvalidValue ? "invalid argument" : "emulated CUDA error";
}
