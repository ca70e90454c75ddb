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
  int blocks = 1;  // grid size (rmsnorm_bwd_blocks); dweight_partial has this many rows
  DType dtype = DType::kFloat32;
};

// The backward's grid for these parameters (pointers, sizes and dtype set; blocks ignored) on a
// device with `sms` SMs: the blocks the chosen kernel keeps resident per SM times the SMs, fewer
// when there are not enough rows. The caller sizes dweight_partial [blocks, cols] by it.
int rmsnorm_bwd_blocks(const RmsNormBwdParams& params, int64_t sms);
// True when the backward runs a register variant (16-byte aligned pointers, cols a multiple of the
// 128-bit pack and at most 1024 packs); false: the generic kernel and its shared memory below.
bool rmsnorm_bwd_uses_registers(const RmsNormBwdParams& params);

// The generic backward's dynamic shared memory (one fp32 dweight accumulator per column), the
// static shared memory its kernel declares beside it, and the most it asks for on a device with
// this opt-in per block (sharedMemPerBlockOptin, static and dynamic together). The register
// variants need no dynamic memory and at most 8.25 KiB of static memory, and take only widths the
// generic kernel also fits; a misaligned tensor of any width takes the generic kernel, so
// rmsnorm_bwd_fits is the op's rule: it falls back to ATen where the generic kernel does not fit.
int64_t rmsnorm_bwd_smem_bytes(int64_t cols);
int64_t rmsnorm_bwd_static_smem_bytes();
int64_t rmsnorm_bwd_max_smem(int64_t device_optin);
bool rmsnorm_bwd_fits(int64_t cols, int64_t device_optin);
void launch_rmsnorm_bwd(const RmsNormBwdParams& params, Stream stream);

}  // namespace kiln::kernels
