// ops::swiglu: silu(gate) * up, the LLaMA MLP's gating. With the kiln backend one autograd
// Function with a hand-written backward (CUDA kernel for fp32/bf16/fp16 CUDA tensors, the same
// formula in ATen elsewhere); it saves only gate and up. The aten backend is at::silu(gate) * up.
#pragma once

#include <ATen/core/Tensor.h>

namespace kiln::ops {

// gate, up: [..., I], same shape and dtype. Returns [..., I].
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// The ATen composition, differentiated by autograd: the reference.
at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up);

}  // namespace kiln::ops
