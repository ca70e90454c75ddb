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
  // Pairs (B H T D/2) below this (and 2^30) are indexed in 32 bits; tests set 0 to run the 64-bit path.
  int64_t narrow_index_limit = int64_t{1} << 30;
};

void launch_rope(const RopeParams& params, Stream stream);

// Autocast's mixed form (bf16/fp16 projections, fp32 tables), out of place, as ATen's type
// promotion and autograd compute the reference (ops/rope.cpp, kernels/cpu_loops.h):
//   forward   y (fp32) = x * cos + rotate_half(x) * sin, each product rounded to fp32, then the sum;
//   backward  dx (dtype) from an fp32 dy: each term's product rounded to dtype (autograd casts a
//             term's gradient to x's dtype), then their sum rounded to dtype.
struct RopeMixedParams {
  const void* src = nullptr;   // forward: x (dtype); backward: dy (fp32). [B, H, T, D], unit stride on D
  void* dst = nullptr;         // forward: y (fp32); backward: dx (dtype). [B, H, T, D], unit stride on D
  const float* cos = nullptr;  // [Bc, T, D] contiguous, Bc = B or 1
  const float* sin = nullptr;
  int64_t batch = 0, heads = 0, seq = 0, dim = 0;
  int64_t src_stride[3] = {0, 0, 0};  // b, h, t, in elements
  int64_t dst_stride[3] = {0, 0, 0};
  bool table_batched = false;
  bool backward = false;
  DType dtype = DType::kBFloat16;                 // x's and dx's: kBFloat16 or kFloat16
  int64_t narrow_index_limit = int64_t{1} << 30;  // as RopeParams'
};

void launch_rope_mixed(const RopeMixedParams& params, Stream stream);

}  // namespace kiln::kernels
