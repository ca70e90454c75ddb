// Torch-facing side of kernels/flash_attention.cu: applicability, layout and stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/flash_attention.cuh"
#include "kiln/ops/flash_attention.h"

namespace kiln::ops {

namespace {
kernels::FlashFwdParams params_for(const at::Tensor& q, const at::Tensor& k, double scale, bool causal) {
  kernels::FlashFwdParams p;
  p.batch = static_cast<int>(q.size(0));
  p.heads_q = static_cast<int>(q.size(1));
  p.heads_kv = static_cast<int>(k.size(1));
  p.seq_q = static_cast<int>(q.size(2));
  p.seq_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.dtype = q.scalar_type() == at::kBFloat16 ? kernels::DType::kBFloat16
            : q.scalar_type() == at::kHalf   ? kernels::DType::kFloat16
                                             : kernels::DType::kFloat32;
  return p;
}
}  // namespace

bool flash_forward_cuda_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const FlashAttentionParams& params, double scale) {
  if (!q.is_cuda() || params.segment_ids.defined()) return false;
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return false;
  if (q.size(2) > INT32_MAX || k.size(2) > INT32_MAX) return false;
  return kernels::flash_fwd_supported(params_for(q, k, scale, params.causal));
}

FlashForward flash_forward_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const FlashAttentionParams& params, double scale) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  at::Tensor out = at::empty_like(qc);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  kernels::FlashFwdParams p = params_for(qc, kc, scale, params.causal);
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  kernels::launch_flash_fwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, lse};
}

}  // namespace kiln::ops
