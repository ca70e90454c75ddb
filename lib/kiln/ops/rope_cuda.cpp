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

namespace {
kernels::RopeTensor rope_tensor(const at::Tensor& src, const at::Tensor& dst) {
  kernels::RopeTensor r;
  r.src = src.const_data_ptr();
  r.dst = dst.data_ptr();
  r.heads = src.size(1);
  for (int d = 0; d < 3; ++d) {
    r.src_stride[d] = src.stride(d);
    r.dst_stride[d] = dst.stride(d);
  }
  return r;
}
}  // namespace

// q_src into q_dst and, when k_src is defined, k_src into k_dst, in one launch (a dst may be its
// src: in place). [B, H, T, D] with unit stride on D; cos, sin [B or 1, T, D].
void rope_cuda(const at::Tensor& q_src, const at::Tensor& q_dst, const at::Tensor& k_src, const at::Tensor& k_dst,
               const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const c10::cuda::CUDAGuard guard(q_src.device());
  const at::Tensor c = cos.to(q_src.scalar_type()).contiguous(), s = sin.to(q_src.scalar_type()).contiguous();
  kernels::RopeParams p;
  p.q = rope_tensor(q_src, q_dst);
  if (k_src.defined()) p.k = rope_tensor(k_src, k_dst);
  p.cos = c.data_ptr();
  p.sin = s.data_ptr();
  p.batch = q_src.size(0);
  p.seq = q_src.size(2);
  p.dim = q_src.size(3);
  p.table_batched = c.size(0) == q_src.size(0) && q_src.size(0) > 1;
  p.backward = backward;
  p.dtype = kernel_dtype(q_src.scalar_type());
  kernels::launch_rope(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

bool rope_mixed_cuda_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!x.is_cuda() || (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kHalf) || x.stride(3) != 1) {
    return false;
  }
  if (cos.scalar_type() != at::kFloat || sin.scalar_type() != at::kFloat) return false;
  const KernelTarget& t = kernel_target(x.device());
  return t.image && t.arch >= 70;
}

// src [B, H, T, D] into dst (both unit stride on D); cos, sin contiguous fp32.
void rope_mixed_cuda(const at::Tensor& src, at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin,
                     at::ScalarType dtype, bool backward) {
  const c10::cuda::CUDAGuard guard(src.device());
  kernels::RopeMixedParams p;
  p.src = src.const_data_ptr();
  p.dst = dst.mutable_data_ptr();
  p.cos = cos.const_data_ptr<float>();
  p.sin = sin.const_data_ptr<float>();
  p.batch = src.size(0);
  p.heads = src.size(1);
  p.seq = src.size(2);
  p.dim = src.size(3);
  for (int d = 0; d < 3; ++d) {
    p.src_stride[d] = src.stride(d);
    p.dst_stride[d] = dst.stride(d);
  }
  p.table_batched = cos.size(0) == src.size(0) && src.size(0) > 1;
  p.backward = backward;
  p.dtype = kernel_dtype(dtype);
  kernels::launch_rope_mixed(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kiln::ops
