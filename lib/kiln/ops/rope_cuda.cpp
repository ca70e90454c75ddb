// Torch-facing side of kernels/rope.cu.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/rope.cuh"
#include "kiln/ops/cuda_arch.h"
#include "kiln/ops/cuda_util.h"

namespace kiln::ops {

bool rope_cuda_applies(const at::Tensor& x) {
  if (!x.is_cuda() || !kernel_supports(x.scalar_type()) || x.stride(3) != 1) return false;
  const KernelTarget& t = kernel_target(x.device());
  return t.image && t.arch >= 70;
}

void rope_cuda_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor c = cos.to(x.scalar_type()).contiguous(), s = sin.to(x.scalar_type()).contiguous();
  kernels::RopeParams p;
  p.x = x.data_ptr();
  p.cos = c.data_ptr();
  p.sin = s.data_ptr();
  p.batch = x.size(0);
  p.heads = x.size(1);
  p.seq = x.size(2);
  p.dim = x.size(3);
  p.stride_b = x.stride(0);
  p.stride_h = x.stride(1);
  p.stride_t = x.stride(2);
  p.table_batched = c.size(0) == x.size(0) && x.size(0) > 1;
  p.backward = backward;
  p.dtype = kernel_dtype(x.scalar_type());
  kernels::launch_rope(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kiln::ops
