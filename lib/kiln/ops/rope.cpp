// RoPE op: validation, dispatch and the in-place autograd Function.
#include "kiln/ops/rope.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/dispatch.h"

namespace kiln::ops {

#ifdef KILN_WITH_CUDA
// ops/rope_cuda.cpp: q_src into q_dst and (when defined) k_src into k_dst in one launch; a dst
// may be its src (backward = the transposed rotation).
void rope_cuda(const at::Tensor& q_src, const at::Tensor& q_dst, const at::Tensor& k_src, const at::Tensor& k_dst,
               const at::Tensor& cos, const at::Tensor& sin, bool backward);
bool rope_cuda_applies(const at::Tensor& x);
// Autocast's mixed form (bf16/fp16 x, fp32 tables): src into dst, x's dtype `dtype`.
bool rope_mixed_cuda_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
void rope_mixed_cuda(const at::Tensor& src, at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin,
                     at::ScalarType dtype, bool backward);
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// No two elements of x share memory (an expanded view would): the loop writes x in place through
// its strides, row by row. Dimensions of size 1 place nothing.
bool non_overlapping(const at::Tensor& x) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.size(d) > 1) dims.emplace_back(x.stride(d), x.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the dimensions so far
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * size;
  }
  return true;
}

// CPU fp32/bf16 with unit stride on D, no overlap, and tables of x's dtype: the fused loop of
// kernels/cpu_loops.h (one pass; ATen's composition makes six, each into a fresh tensor).
bool use_cpu_loop(const at::Tensor& x, const at::Tensor& cos) {
  return x.is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         cos.scalar_type() == x.scalar_type() && x.stride(3) == 1 && x.size(3) % 2 == 0 && non_overlapping(x);
}

// The loops' view of src and dst [B, H, T, D] (unit stride on D) and of contiguous [B or 1, T, D] tables.
kernels::cpu::RopeShape shape_of(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& cos) {
  return {.batch = src.size(0),
          .heads = src.size(1),
          .seq = src.size(2),
          .dim = src.size(3),
          .src_stride = {src.stride(0), src.stride(1), src.stride(2)},
          .dst_stride = {dst.stride(0), dst.stride(1), dst.stride(2)},
          .cs_batch_stride = cos.size(0) == 1 ? 0 : cos.size(1) * cos.size(2)};
}

// src [B, H, T, D] rotated into dst (which may be src) by the CPU loop; cos, sin contiguous.
void rope_cpu_loop(const at::Tensor& src, at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin,
                   bool backward) {
  const kernels::cpu::RopeShape shape = shape_of(src, dst, cos);
  if (src.scalar_type() == at::kFloat) {
    kernels::cpu::rope(src.const_data_ptr<float>(), dst.mutable_data_ptr<float>(), cos.const_data_ptr<float>(),
                       sin.const_data_ptr<float>(), shape, backward);
    return;
  }
  auto bits = [](const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>()); };
  kernels::cpu::rope_bf16(bits(src), reinterpret_cast<uint16_t*>(dst.mutable_data_ptr<at::BFloat16>()), bits(cos),
                          bits(sin), shape, backward);
}

// src [B, H, T, D] rotated into dst: src itself (in place) or a fresh tensor of its shape and
// dtype; the transposed rotation when backward. One pass on CUDA and in the CPU loop.
void rotate(const at::Tensor& src, at::Tensor& dst, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
#ifdef KILN_WITH_CUDA
  if (rope_cuda_applies(src) && rope_cuda_applies(dst)) {
    rope_cuda(src, dst, at::Tensor(), at::Tensor(), cos, sin, backward);
    return;
  }
#endif
  if (use_cpu_loop(src, cos) && use_cpu_loop(dst, cos)) {
    rope_cpu_loop(src, dst, cos, sin, backward);
    return;
  }
  const int64_t half = src.size(-1) / 2;
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  const at::Tensor x1 = src.narrow(-1, 0, half), x2 = src.narrow(-1, half, half);
  // forward: rotate_half(x) = cat(-x2, x1); backward: rotate_half^T(v) = cat(v2, -v1)
  const at::Tensor rotated =
      backward ? at::cat({x2 * s.narrow(-1, half, half), -x1 * s.narrow(-1, 0, half)}, -1) : at::cat({-x2, x1}, -1) * s;
  dst.copy_(src * c + rotated);
}

// dx for an incoming gradient dy: a fresh tensor written in one pass from dy (never a clone of dy
// rotated in place, which reads and writes it twice more).
at::Tensor rotate_grad(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor dx = at::empty(dy.sizes(), dy.options());
  rotate(dy, dx, cos, sin, /*backward=*/true);
  return dx;
}

// The same-dtype rotation: x rotated in place (apply_rope_) or into a fresh y (apply_rope, one
// pass from x, no clone).
struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, const at::Tensor& cos, const at::Tensor& sin,
                            bool in_place) {
    ctx->save_for_backward({cos, sin});
    if (in_place) {
      rotate(x, x, cos, sin, false);
      ctx->mark_dirty({x});
      return x;
    }
    at::Tensor y = at::empty_like(x);  // x's layout where x is dense, as clone would make it
    if (y.stride(3) != 1) y = at::empty(x.sizes(), x.options());
    rotate(x, y, cos, sin, false);
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    return {rotate_grad(grads[0], s[0], s[1]), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

#ifdef KILN_WITH_CUDA
// q and k rotated in place by one launch, forward and backward (both gradients by one launch
// too, when both are defined and the kernel takes them).
struct RopeQkFunction : public torch::autograd::Function<RopeQkFunction> {
  static variable_list forward(AutogradContext* ctx, at::Tensor q, at::Tensor k, const at::Tensor& cos,
                               const at::Tensor& sin) {
    rope_cuda(q, q, k, k, cos, sin, /*backward=*/false);
    ctx->mark_dirty({q, k});
    ctx->save_for_backward({cos, sin});
    return {q, k};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &gq = grads[0], &gk = grads[1];
    at::Tensor dq, dk;
    if (gq.defined() && gk.defined() && rope_cuda_applies(gq) && rope_cuda_applies(gk)) {
      dq = at::empty(gq.sizes(), gq.options());
      dk = at::empty(gk.sizes(), gk.options());
      rope_cuda(gq, dq, gk, dk, s[0], s[1], /*backward=*/true);
    } else {
      if (gq.defined()) dq = rotate_grad(gq, s[0], s[1]);
      if (gk.defined()) dk = rotate_grad(gk, s[0], s[1]);
    }
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};
#endif

// Autocast's mixed case (bf16/fp16 projections, fp32 tables): the reference promotes the result
// to fp32, so this is not in place: a fresh fp32 y, and a dx in x's dtype with each term rounded
// as autograd's casts round it. On the CPU the loop of kernels/cpu_loops.h (bf16; the same bits
// as the reference), on CUDA the kernel of kernels/rope.cu (bf16 and fp16).
bool use_cpu_mixed_loop(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x.is_cpu() && x.scalar_type() == at::kBFloat16 && cos.scalar_type() == at::kFloat &&
         sin.scalar_type() == at::kFloat && x.stride(3) == 1 && x.size(3) % 2 == 0;  // reads x only
}
bool use_mixed_function(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
#ifdef KILN_WITH_CUDA
  if (rope_mixed_cuda_applies(x, cos, sin)) return true;
#endif
  return use_cpu_mixed_loop(x, cos, sin);
}

struct RopeMixedFunction : public torch::autograd::Function<RopeMixedFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    at::Tensor y = at::empty_like(x, x.options().dtype(at::kFloat));  // x's layout, as the reference's
    if (y.stride(3) != 1) y = at::empty(x.sizes(), x.options().dtype(at::kFloat));
    ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->save_for_backward({cos, sin});
#ifdef KILN_WITH_CUDA
    if (x.is_cuda()) {
      rope_mixed_cuda(x, y, cos, sin, x.scalar_type(), /*backward=*/false);
      return y;
    }
#endif
    kernels::cpu::rope_bf16_to_fp32(reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>()),
                                    y.mutable_data_ptr<float>(), cos.const_data_ptr<float>(),
                                    sin.const_data_ptr<float>(), shape_of(x, y, cos));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    at::Tensor dy = grads[0].to(at::kFloat);
    if (dy.stride(3) != 1) dy = dy.contiguous();
    at::Tensor dx = at::empty(dy.sizes(), dy.options().dtype(dtype));
#ifdef KILN_WITH_CUDA
    if (dy.is_cuda()) {
      rope_mixed_cuda(dy, dx, s[0], s[1], dtype, /*backward=*/true);
      return {dx, at::Tensor(), at::Tensor()};
    }
#endif
    kernels::cpu::rope_backward_fp32_to_bf16(
        dy.const_data_ptr<float>(), reinterpret_cast<uint16_t*>(dx.mutable_data_ptr<at::BFloat16>()),
        s[0].const_data_ptr<float>(), s[1].const_data_ptr<float>(), shape_of(dy, dx, s[0]));
    return {dx, at::Tensor(), at::Tensor()};
  }
};

void check(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4, "apply_rope: x must be [B, H, T, D], got ", x.sizes());
  TORCH_CHECK(x.size(3) % 2 == 0, "apply_rope: head dim must be even, got ", x.size(3));
  TORCH_CHECK(cos.dim() == 3 && cos.sizes() == sin.sizes(), "apply_rope: cos/sin must be [B, T, D], got ", cos.sizes(),
              " and ", sin.sizes());
  TORCH_CHECK(cos.size(1) == x.size(2) && cos.size(2) == x.size(3) && (cos.size(0) == x.size(0) || cos.size(0) == 1),
              "apply_rope: cos/sin ", cos.sizes(), " do not fit x ", x.sizes());
}

}  // namespace

at::Tensor apply_rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // [B, 1, T, D] broadcast over heads
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * c + rotated * s;
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check(x, cos, sin);
  if (backend(Op::kRope) == Backend::kAten) return apply_rope_reference(x, cos, sin);
  if (use_mixed_function(x, cos, sin)) return RopeMixedFunction::apply(x, cos.contiguous(), sin.contiguous());
  if (cos.scalar_type() != x.scalar_type()) return apply_rope_reference(x, cos, sin);
  return RopeFunction::apply(x, cos.contiguous(), sin.contiguous(), /*in_place=*/false);
}

at::Tensor apply_rope_(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
  check(x, cos, sin);
  // Tables of another dtype (fp32 tables with bf16/fp16 activations under autocast) promote the
  // result in the reference, which an in-place rotation cannot do: a fresh fp32 result then
  // (the mixed Function: the CPU's loop or the CUDA kernel; else the reference).
  if (cos.scalar_type() != x.scalar_type()) {
    if (backend(Op::kRope) != Backend::kAten && use_mixed_function(x, cos, sin)) {
      return RopeMixedFunction::apply(x, cos.contiguous(), sin.contiguous());
    }
    return apply_rope_reference(x, cos, sin);
  }
  if (backend(Op::kRope) == Backend::kAten) return x.copy_(apply_rope_reference(x, cos, sin));
  return RopeFunction::apply(x, cos.contiguous(), sin.contiguous(), /*in_place=*/true);
}

std::pair<at::Tensor, at::Tensor> apply_rope_qk_(at::Tensor q, at::Tensor k, const at::Tensor& cos,
                                                 const at::Tensor& sin) {
  check(q, cos, sin);
  check(k, cos, sin);
#ifdef KILN_WITH_CUDA
  if (backend(Op::kRope) != Backend::kAten && cos.scalar_type() == q.scalar_type() &&
      k.scalar_type() == q.scalar_type() && q.size(0) == k.size(0) && rope_cuda_applies(q) && rope_cuda_applies(k)) {
    const variable_list r = RopeQkFunction::apply(q, k, cos.contiguous(), sin.contiguous());
    return {r[0], r[1]};
  }
#endif
  at::Tensor rq = apply_rope_(q, cos, sin);
  return {rq, apply_rope_(k, cos, sin)};
}

}  // namespace kiln::ops
