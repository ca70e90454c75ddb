// The CUDA kernel currently covers the forward pass only, so it serves calls that need no
// gradient (evaluation, generation); training takes the ATen path until the fused backward lands.
#include "kiln/ops/rmsnorm.h"

#include <ATen/ATen.h>

#include "kiln/ops/dispatch.h"

namespace kiln::ops {

#ifdef KILN_WITH_CUDA
// ops/rmsnorm_cuda.cpp
at::Tensor rmsnorm_cuda_forward(const at::Tensor& x, const at::Tensor& weight, double eps);
#endif

at::Tensor rmsnorm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(at::promote_types(x.scalar_type(), at::kFloat));  // fp32, or fp64 for fp64
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0), "rmsnorm: weight ", weight.sizes(),
              " does not match the last dimension of x ", x.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rmsnorm: x is ", x.scalar_type(), " but weight is ",
              weight.scalar_type());
#ifdef KILN_WITH_CUDA
  const bool needs_grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  const bool kernel_dtype =
      x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  if (backend() == Backend::kKiln && x.is_cuda() && weight.is_cuda() && !needs_grad && kernel_dtype) {
    return rmsnorm_cuda_forward(x, weight, eps);
  }
#endif
  return rmsnorm_reference(x, weight, eps);
}

}  // namespace kiln::ops
