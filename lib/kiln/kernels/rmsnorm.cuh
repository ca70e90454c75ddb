// RMSNorm forward launcher: y = weight * (x * rsqrt(mean(x^2) + eps)), one row per block.
// Torch-free: raw pointers, sizes and a stream; validation lives in ops/rmsnorm.cpp.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct RmsNormFwdParams {
  const void* x = nullptr;       // [rows, cols], row stride x_row_stride elements, unit column stride
  const void* weight = nullptr;  // [cols]
  void* y = nullptr;             // [rows, cols], contiguous
  float* rstd = nullptr;         // [rows] 1/rms per row for the backward pass, or nullptr
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_row_stride = 0;
  float eps = 1e-6f;
  DType dtype = DType::kFloat32;  // of x, weight and y
};

void launch_rmsnorm_fwd(const RmsNormFwdParams& params, Stream stream);

}  // namespace kiln::kernels
