// RMSNorm launchers, forward and backward, with an optional fused residual add in front:
//   h = x + residual (rounded to the dtype, as the unfused add would be), y = weight * norm(h).
// Torch-free: raw pointers, sizes and a stream; validation lives in ops/rmsnorm.cpp.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct RmsNormFwdParams {
  const void* x = nullptr;         // [rows, cols], row stride x_row_stride elements, unit column stride
  const void* residual = nullptr;  // [rows, cols] contiguous, or nullptr (no residual add)
  const void* weight = nullptr;    // [cols]
  void* y = nullptr;               // [rows, cols], contiguous
  void* h = nullptr;               // [rows, cols] contiguous: x + residual (required with residual)
  float* rstd = nullptr;           // [rows] 1/rms per row for the backward pass, or nullptr
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_row_stride = 0;
  float eps = 1e-6f;
  DType dtype = DType::kFloat32;  // of x, residual, weight, y and h
};

void launch_rmsnorm_fwd(const RmsNormFwdParams& params, Stream stream);

struct RmsNormBwdParams {
  const void* x = nullptr;           // [rows, cols] contiguous: the normalised input (h when fused)
  const void* weight = nullptr;      // [cols]
  const void* dy = nullptr;          // [rows, cols] contiguous
  const void* dh = nullptr;          // [rows, cols] contiguous gradient reaching h directly, or nullptr
  const float* rstd = nullptr;       // [rows] from the forward pass
  void* dx = nullptr;                // [rows, cols] out (also the residual's gradient when fused)
  float* dweight_partial = nullptr;  // [blocks, cols] fp32 out: per-block sums, reduced by the caller
  int64_t rows = 0;
  int64_t cols = 0;
  int blocks = 1;  // grid size; blocks <= rows; dweight_partial has this many rows
  DType dtype = DType::kFloat32;
};

// Dynamic shared memory the backward needs (one fp32 dweight accumulator per column), the static
// shared memory its kernel declares beside it, and the most it asks for on a device with this
// opt-in per block (sharedMemPerBlockOptin, static and dynamic together). rmsnorm_bwd_fits is
// the op's rule: it falls back to ATen where the two do not fit.
int64_t rmsnorm_bwd_smem_bytes(int64_t cols);
int64_t rmsnorm_bwd_static_smem_bytes();
int64_t rmsnorm_bwd_max_smem(int64_t device_optin);
bool rmsnorm_bwd_fits(int64_t cols, int64_t device_optin);
void launch_rmsnorm_bwd(const RmsNormBwdParams& params, Stream stream);

}  // namespace kiln::kernels
