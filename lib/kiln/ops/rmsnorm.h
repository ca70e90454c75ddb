// ops::rmsnorm: y = weight * (x / sqrt(mean(x^2, -1) + eps)), computed in fp32 and rounded the
// way Hugging Face's LlamaRMSNorm does (normalise in fp32, round to x's dtype, then scale).
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln::ops {

// x: [..., H]; weight: [H], same dtype as x. Returns x's shape and dtype.
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The ATen composition, on any device; the reference every RMSNorm kernel is tested against.
at::Tensor rmsnorm_reference(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace kiln::ops
