// Helpers shared by the torch-facing glue of the CUDA kernels (ops/*_cuda.cpp), which is
// compiled only with KILN_WITH_CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include "kiln/kernels/common.cuh"

namespace kiln::ops {

// The kernels' dtype tag of a tensor dtype (fp32, bf16, fp16; callers have checked the dtype).
inline kernels::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return kernels::DType::kBFloat16;
    case at::kHalf:
      return kernels::DType::kFloat16;
    default:
      return kernels::DType::kFloat32;
  }
}

// True for the dtypes the kernels are instantiated for.
inline bool kernel_supports(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

}  // namespace kiln::ops
