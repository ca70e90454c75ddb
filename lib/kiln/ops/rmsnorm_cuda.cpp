// Torch-facing side of kernels/rmsnorm.cu: layout, dtype and stream, then the launchers.
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/rmsnorm.cuh"
#include "kiln/ops/cuda_arch.h"
#include "kiln/ops/cuda_util.h"

namespace kiln::ops {

bool rmsnorm_cuda_applies(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.is_cuda() || !weight.is_cuda() || !kernel_supports(x.scalar_type())) return false;
  const KernelTarget& t = kernel_target(x.device());
  return t.image && t.arch >= 70 && kernels::rmsnorm_bwd_fits(x.size(-1), t.smem_optin);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rmsnorm_cuda_forward(const at::Tensor& x2, const at::Tensor& residual2,
                                                                    const at::Tensor& weight, double eps) {
  const c10::cuda::CUDAGuard guard(x2.device());
  const at::Tensor x = x2.contiguous(), w = weight.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor rstd = at::empty({x.size(0)}, x.options().dtype(at::kFloat));
  at::Tensor h = x;
  kernels::RmsNormFwdParams p;
  at::Tensor res;
  if (residual2.defined()) {
    res = residual2.contiguous();
    h = at::empty(x.sizes(), x.options());
    p.residual = res.data_ptr();
    p.h = h.data_ptr();
  }
  p.x = x.data_ptr();
  p.weight = w.data_ptr();
  p.y = y.data_ptr();
  p.rstd = rstd.data_ptr<float>();
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.x_row_stride = x.stride(0);
  p.eps = static_cast<float>(eps);
  p.dtype = kernel_dtype(x.scalar_type());
  kernels::launch_rmsnorm_fwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, h, rstd};
}

std::pair<at::Tensor, at::Tensor> rmsnorm_cuda_backward(const at::Tensor& h2, const at::Tensor& weight,
                                                        const at::Tensor& rstd, const at::Tensor& dy2,
                                                        const at::Tensor& dh2) {
  const c10::cuda::CUDAGuard guard(h2.device());
  const at::Tensor h = h2.contiguous(), w = weight.contiguous(), dy = dy2.to(h.scalar_type()).contiguous();
  const at::Tensor dh = dh2.defined() ? dh2.to(h.scalar_type()).contiguous() : at::Tensor();
  const int64_t rows = h.size(0), cols = h.size(1);
  at::Tensor dx = at::empty_like(h);
  kernels::RmsNormBwdParams p;
  p.x = h.data_ptr();
  p.weight = w.data_ptr();
  p.dy = dy.data_ptr();
  p.dh = dh.defined() ? dh.data_ptr() : nullptr;
  p.rstd = rstd.data_ptr<float>();
  p.dx = dx.data_ptr();
  p.rows = rows;
  p.cols = cols;
  p.dtype = kernel_dtype(h.scalar_type());
  // The kernel's resident blocks per SM times the SMs (kernels/rmsnorm.cu): each block writes one
  // fp32 row of dweight partials, summed here in a fixed order.
  p.blocks = kernels::rmsnorm_bwd_blocks(p, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  at::Tensor partial = at::empty({p.blocks, cols}, h.options().dtype(at::kFloat));
  p.dweight_partial = partial.data_ptr<float>();
  if (rows == 0) return {dx, at::zeros_like(w)};
  kernels::launch_rmsnorm_bwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dx, partial.sum(0).to(w.scalar_type())};
}

}  // namespace kiln::ops
