// ops::apply_rope: rotary position embedding in the "rotate half" layout of Hugging Face's
// LLaMA (pairs (i, i + D/2)), so that weights load without permutation. The tables carry the
// scaling (default or llama3, model/rope.h); the op only rotates.
//
// With the kiln backend the rotation is an autograd Function with a hand-written backward (the
// transposed rotation): a CUDA kernel for fp32/bf16/fp16 CUDA tensors, the same formula in ATen
// elsewhere. The aten backend is the composition below, differentiated by autograd.
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace kiln::ops {

// x: [B, H, T, D]; cos, sin: [B or 1, T, D] (from model::rope_cos_sin). Returns x's shape and dtype:
//   x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The same, written into x (a fresh activation such as a projection's output viewed as heads;
// x may be a strided view with unit stride on D). Returns x. With the aten backend this is
// x.copy_(apply_rope(x)), which autograd records as an in-place op as well. When cos/sin have
// another dtype than x (autocast: bf16 projections, fp32 tables), the reference promotes the
// result, so a new tensor of the promoted dtype is returned and x is left as it was.
at::Tensor apply_rope_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin);

// apply_rope_ on q and on k (a token's q and k share the tables; k may have fewer heads, GQA),
// returning both. With the kiln backend on CUDA (same-dtype tables, unit stride on D) one kernel
// launch rotates both in place, forward and backward; elsewhere (CPU, the aten backend, autocast's
// mixed dtypes) it is exactly two apply_rope_ calls.
std::pair<at::Tensor, at::Tensor> apply_rope_qk_(at::Tensor q, at::Tensor k, const at::Tensor& cos,
                                                 const at::Tensor& sin);

// The ATen composition: the reference.
at::Tensor apply_rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace kiln::ops
