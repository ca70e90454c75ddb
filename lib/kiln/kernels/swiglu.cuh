// SwiGLU launchers: y = silu(gate) * up, and its backward
//   d_gate = dy * up * s * (1 + gate * (1 - s)),  d_up = dy * silu(gate),  s = sigmoid(gate).
// Elementwise over contiguous buffers. Torch-free; validation lives in ops/swiglu.cpp.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct SwiGluParams {
  const void* gate = nullptr;  // [n] contiguous
  const void* up = nullptr;    // [n]
  const void* dy = nullptr;    // [n] backward only
  void* y = nullptr;           // [n] forward out
  void* d_gate = nullptr;      // [n] backward out
  void* d_up = nullptr;        // [n] backward out
  int64_t n = 0;
  DType dtype = DType::kFloat32;
};

void launch_swiglu_fwd(const SwiGluParams& params, Stream stream);
void launch_swiglu_bwd(const SwiGluParams& params, Stream stream);

}  // namespace kiln::kernels
