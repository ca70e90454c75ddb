// Shared pieces of kiln's raw CUDA kernels: the dtype tag that crosses the torch-free launcher
// boundary, and the one static-switch helper that turns it into a template parameter.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t without <cuda_runtime.h>, so torch-side headers stay CUDA-free

namespace kiln::kernels {

using Stream = CUstream_st*;

enum class DType : int { kFloat32, kBFloat16, kFloat16 };

}  // namespace kiln::kernels

#ifdef __CUDACC__
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
#endif
