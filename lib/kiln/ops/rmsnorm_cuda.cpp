// Torch-facing side of kernels/rmsnorm.cu: layout, dtype and stream, then the launcher.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/rmsnorm.cuh"

namespace kiln::ops {

namespace {
kernels::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return kernels::DType::kBFloat16;
    case at::kHalf:
      return kernels::DType::kFloat16;
    default:
      return kernels::DType::kFloat32;
  }
}
}  // namespace

at::Tensor rmsnorm_cuda_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t cols = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, cols});
  const at::Tensor x_rows = x2.stride(-1) == 1 ? x2 : x2.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  kernels::RmsNormFwdParams p;
  p.x = x_rows.data_ptr();
  p.weight = w.data_ptr();
  p.y = y.data_ptr();
  p.rows = x_rows.size(0);
  p.cols = cols;
  p.x_row_stride = x_rows.stride(0);
  p.eps = static_cast<float>(eps);
  p.dtype = kernel_dtype(x.scalar_type());
  kernels::launch_rmsnorm_fwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace kiln::ops
