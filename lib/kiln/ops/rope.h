// ops::apply_rope: rotary position embedding in the "rotate half" layout of Hugging Face's
// LLaMA (pairs (i, i + D/2)), so that weights load without permutation.
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln::ops {

// x: [B, H, T, D]; cos, sin: [B, T, D] (from model::rope_cos_sin). Returns x's shape and dtype:
//   x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace kiln::ops
