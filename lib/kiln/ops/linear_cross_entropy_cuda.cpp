// Torch-facing side of kernels/cross_entropy.cu: one chunk of logits, in place.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/cross_entropy.cuh"
#include "kiln/ops/cuda_arch.h"
#include "kiln/ops/cuda_util.h"

namespace kiln::ops {

bool cross_entropy_cuda_applies(const at::Tensor& logits) {
  if (!logits.is_cuda() || !kernel_supports(logits.scalar_type())) return false;
  const KernelTarget& t = kernel_target(logits.device());
  return t.image && t.arch >= 70;
}

int cuda_planned_arch(const c10::Device& device) {
  return kernel_target(device).arch;
}

void cross_entropy_chunk_cuda(at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index, double z_loss,
                              bool write_grad, const at::Tensor& grad_scale, at::Tensor& loss, at::Tensor& lse) {
  TORCH_CHECK(logits.is_contiguous() && logits.dim() == 2,
              "cross_entropy_chunk_cuda: logits must be contiguous [n, V]");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor y = labels.to(at::kLong).contiguous();
  loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  lse = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  kernels::CrossEntropyParams p;
  p.logits = logits.data_ptr();
  p.labels = y.data_ptr<int64_t>();
  p.loss = loss.data_ptr<float>();
  p.lse = lse.data_ptr<float>();
  p.rows = logits.size(0);
  p.vocab = logits.size(1);
  p.ignore_index = ignore_index;
  p.z_loss = static_cast<float>(z_loss);
  p.write_grad = write_grad;
  if (grad_scale.defined()) {
    TORCH_CHECK(
        grad_scale.device() == logits.device() && grad_scale.scalar_type() == at::kFloat && grad_scale.numel() == 1,
        "cross_entropy_chunk_cuda: grad_scale must be one fp32 value on the logits' device");
    p.grad_scale = grad_scale.const_data_ptr<float>();
  }
  p.dtype = kernel_dtype(logits.scalar_type());
  kernels::launch_cross_entropy_fwd_bwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace kiln::ops
