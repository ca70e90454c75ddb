// Rotary position embedding, "rotate half" layout (pairs (i, i + D/2)), forward and backward, for
// q and k of a token in one launch. cos/sin tables come from model::rope_cos_sin, so default and
// llama3 scaling are both just tables here. Torch-free; validation lives in ops/rope.cpp.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

// One tensor the kernel rotates: [B, H, T, D] strided (unit stride on D), read from src and
// written to dst. dst == src rotates in place (each pair is read before it is written); otherwise
// the two must not overlap.
struct RopeTensor {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t heads = 0;                  // 0: no tensor
  int64_t src_stride[3] = {0, 0, 0};  // b, h, t, in elements
  int64_t dst_stride[3] = {0, 0, 0};
};

// In place on x with strides (b, h, t).
inline RopeTensor rope_in_place(void* x, int64_t heads, int64_t stride_b, int64_t stride_h, int64_t stride_t) {
  return {x, x, heads, {stride_b, stride_h, stride_t}, {stride_b, stride_h, stride_t}};
}

// Same-dtype RoPE: x, cos, sin and the result all of `dtype`, each product and the sum rounded to
// it as the ATen reference rounds them. q and k (optional, k.heads == 0 for none) share B, T, D
// and the tables; each has its own heads and strides (GQA), and one launch rotates both.
struct RopeParams {
  RopeTensor q, k;
  const void* cos = nullptr;  // [Bc, T, D] contiguous, Bc = B or 1
  const void* sin = nullptr;  // [Bc, T, D]
  int64_t batch = 0, seq = 0, dim = 0;
  bool table_batched = false;  // Bc == B (else the table is shared)
  bool backward = false;       // apply the transpose: dx = dy * cos + rotate_half^T(dy * sin)
  DType dtype = DType::kFloat32;
  // The scalar fallback's pairs (B H T D/2) below this (and 2^30) are indexed in 32 bits; tests
  // set 0 to run its 64-bit path.
  int64_t narrow_index_limit = int64_t{1} << 30;
  // Tests set false to run the scalar fallback on a shape the 128-bit kernel would take.
  bool vectorized = true;
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
  bool vectorized = true;                         // as RopeParams'
};

void launch_rope_mixed(const RopeMixedParams& params, Stream stream);

}  // namespace kiln::kernels
