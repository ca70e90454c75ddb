// Torch-facing side of kernels/flash_attention.cu: applicability, layout, workspaces and stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "kiln/kernels/flash_attention.cuh"
#include "kiln/ops/cuda_arch.h"
#include "kiln/ops/cuda_util.h"
#include "kiln/ops/flash_attention.h"

namespace kiln::ops {

namespace {

template <typename P>
P params_for(const at::Tensor& q, const at::Tensor& k, const FlashAttentionParams& params, double scale) {
  P p;
  p.batch = static_cast<int>(q.size(0));
  p.heads_q = static_cast<int>(q.size(1));
  p.heads_kv = static_cast<int>(k.size(1));
  p.seq_q = static_cast<int>(q.size(2));
  p.seq_k = static_cast<int>(k.size(2));
  p.head_dim = static_cast<int>(q.size(3));
  p.scale = static_cast<float>(scale);
  p.causal = params.causal;
  p.dtype = kernel_dtype(q.scalar_type());
  p.arch = kernel_target(q.device()).arch;
  return p;
}

// The segment ids as the kernels read them: int32 (document indices within a row, far below
// 2^31), contiguous, on q's device.
at::Tensor segments_for(const at::Tensor& q, const FlashAttentionParams& params) {
  if (!params.segment_ids.defined()) return {};
  return params.segment_ids.to(q.device(), at::kInt).contiguous();
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

bool flash_cuda_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const FlashAttentionParams& params) {
  if (!q.is_cuda() || k.device() != q.device() || v.device() != q.device()) return false;
  if (q.scalar_type() != at::kBFloat16 && q.scalar_type() != at::kHalf) return false;
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return false;
  if (q.size(0) > INT32_MAX || q.size(1) > INT32_MAX || q.size(2) > INT32_MAX || k.size(2) > INT32_MAX) return false;
  if (q.size(3) != 64 && q.size(3) != 128) return false;
  // sm_80+: the cp.async kernels; sm_70: the Volta kernels (fp16); the blocks' shared memory
  // within what the device (or, planning for Volta, a V100) lets a block opt in to.
  const KernelTarget& target = kernel_target(q.device());
  if (!target.image) return false;
  if (target.smem_optin < static_cast<int64_t>(kernels::flash_smem_bytes(static_cast<int>(q.size(3)), target.arch)))
    return false;
  // 16-byte rows for cp.async (the glue makes inputs contiguous; a storage offset may still misalign)
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->is_contiguous() && !aligned16(*t)) return false;
  }
  kernels::FlashShape shape = params_for<kernels::FlashShape>(q, k, params, 1.0);
  shape.arch = target.arch;
  static const int kDummy = 0;
  shape.segment_ids = params.segment_ids.defined() ? &kDummy : nullptr;
  return kernels::flash_supported(shape);
}

namespace {
// The launchers' workspace for skipping (query tile, key tile) pairs of different documents.
at::Tensor doc_ranges_for(const at::Tensor& seg, const at::Tensor& k) {
  if (!seg.defined()) return {};
  const size_t n = kernels::flash_doc_ranges_ints(static_cast<int>(k.size(0)), static_cast<int>(k.size(2)));
  return at::empty({static_cast<int64_t>(n)}, seg.options().dtype(at::kInt));
}
}  // namespace

FlashForward flash_forward_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const FlashAttentionParams& params, double scale) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor seg = segments_for(q, params);
  TORCH_CHECK(aligned16(qc) && aligned16(kc) && aligned16(vc), "flash_attention: q, k, v must be 16-byte aligned");
  at::Tensor out = at::empty_like(qc);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  auto p = params_for<kernels::FlashFwdParams>(qc, kc, params, scale);
  p.segment_ids = seg.defined() ? seg.data_ptr<int>() : nullptr;
  const at::Tensor ranges = doc_ranges_for(seg, kc);
  p.doc_ranges = ranges.defined() ? ranges.data_ptr<int>() : nullptr;
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  kernels::launch_flash_fwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, lse};
}

FlashGrads flash_backward_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashForward& fwd,
                               const at::Tensor& dout, const FlashAttentionParams& params, double scale,
                               bool deterministic) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor oc = fwd.out.contiguous(), lse = fwd.lse.to(at::kFloat).contiguous();
  const at::Tensor doc = dout.to(q.scalar_type()).contiguous();
  const at::Tensor seg = segments_for(q, params);
  TORCH_CHECK(aligned16(qc) && aligned16(kc) && aligned16(vc) && aligned16(doc),
              "flash_attention: q, k, v, dout must be 16-byte aligned");
  at::Tensor dq = at::empty_like(qc), dk = at::empty_like(kc), dv = at::empty_like(vc);
  at::Tensor delta = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  at::Tensor dq_accum;
  if (!deterministic) dq_accum = at::zeros(qc.sizes(), q.options().dtype(at::kFloat));
  auto p = params_for<kernels::FlashBwdParams>(qc, kc, params, scale);
  p.segment_ids = seg.defined() ? seg.data_ptr<int>() : nullptr;
  const at::Tensor ranges = doc_ranges_for(seg, kc);
  p.doc_ranges = ranges.defined() ? ranges.data_ptr<int>() : nullptr;
  p.q = qc.data_ptr();
  p.k = kc.data_ptr();
  p.v = vc.data_ptr();
  p.out = oc.data_ptr();
  p.dout = doc.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  p.dq_accum = deterministic ? nullptr : dq_accum.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.deterministic = deterministic;
  kernels::launch_flash_bwd(p, at::cuda::getCurrentCUDAStream().stream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dq, dk, dv};
}

}  // namespace kiln::ops
