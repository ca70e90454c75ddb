// Rotary position embedding in place, "rotate half" layout (pairs (i, i + D/2)), forward and
// backward. cos/sin tables come from model::rope_cos_sin, so default and llama3 scaling are both
// just tables here. Torch-free; validation lives in ops/rope.cpp.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct RopeParams {
  void* x = nullptr;          // [B, H, T, D] strided (unit stride on D), rotated in place
  const void* cos = nullptr;  // [Bc, T, D] contiguous, Bc = B or 1
  const void* sin = nullptr;  // [Bc, T, D]
  int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  int64_t stride_b = 0, stride_h = 0, stride_t = 0;  // of x, in elements
  bool table_batched = false;                        // Bc == B (else the table is shared)
  bool backward = false;                             // apply the transpose: dx = dy * cos + rotate_half^T(dy * sin)
  DType dtype = DType::kFloat32;
};

void launch_rope(const RopeParams& params, Stream stream);

}  // namespace kiln::kernels
