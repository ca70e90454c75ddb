// ops::rmsnorm: y = weight * (x / sqrt(mean(x^2, -1) + eps)), computed in fp32 and rounded the
// way Hugging Face's LlamaRMSNorm does (normalise in fp32, round to x's dtype, then scale).
// ops::add_rmsnorm fuses the residual add in front: h = x + residual, y = rmsnorm(h).
//
// With the kiln backend both are one autograd Function with a hand-written backward (dx and
// dweight in one pass): CUDA kernels for fp32/bf16/fp16 CUDA tensors, the same formulas in ATen
// elsewhere (so CPU runs and tests the backward too). The aten backend is the plain composition
// differentiated by autograd.
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace kiln::ops {

// x: [..., H]; weight: [H], same dtype as x. Returns x's shape and dtype.
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x, residual: [..., H]; weight: [H]. Returns {y, h}: h = x + residual (the new residual
// stream), y = rmsnorm(h, weight).
std::pair<at::Tensor, at::Tensor> add_rmsnorm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                              double eps);

// The ATen composition, on any device; the reference every RMSNorm path is tested against.
at::Tensor rmsnorm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace kiln::ops
