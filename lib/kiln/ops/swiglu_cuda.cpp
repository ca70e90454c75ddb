// Torch-facing side of kernels/swiglu.cu.
#include <utility>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/swiglu.cuh"
#include "kiln/ops/cuda_arch.h"
#include "kiln/ops/cuda_util.h"

namespace kiln::ops {

bool swiglu_cuda_applies(const at::Tensor& gate) {
  if (!gate.is_cuda() || !kernel_supports(gate.scalar_type())) return false;
  const KernelTarget& t = kernel_target(gate.device());
  return t.image && t.arch >= 70;
}

at::Tensor swiglu_cuda_forward(const at::Tensor& gate, const at::Tensor& up) {
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor y = at::empty_like(g);
  kernels::SwiGluParams p;
  p.gate = g.data_ptr();
  p.up = u.data_ptr();
  p.y = y.data_ptr();
  p.n = g.numel();
  p.dtype = kernel_dtype(g.scalar_type());
  kernels::launch_swiglu_fwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

std::pair<at::Tensor, at::Tensor> swiglu_cuda_backward(const at::Tensor& gate, const at::Tensor& up,
                                                       const at::Tensor& dy) {
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor g = gate.contiguous(), u = up.contiguous(), d = dy.to(g.scalar_type()).contiguous();
  at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
  kernels::SwiGluParams p;
  p.gate = g.data_ptr();
  p.up = u.data_ptr();
  p.dy = d.data_ptr();
  p.d_gate = dg.data_ptr();
  p.d_up = du.data_ptr();
  p.n = g.numel();
  p.dtype = kernel_dtype(g.scalar_type());
  kernels::launch_swiglu_bwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dg, du};
}

}  // namespace kiln::ops
