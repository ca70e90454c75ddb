// RMSNorm op: validation, dispatch, and the autograd Functions whose forward/backward run either
// the CUDA kernels (ops/rmsnorm_cuda.cpp) or the same formulas in ATen.
#include "kiln/ops/rmsnorm.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/dispatch.h"

namespace kiln::ops {

#ifdef KILN_WITH_CUDA
// ops/rmsnorm_cuda.cpp. x2, residual2: [rows, H] (residual2 may be undefined); returns {y, h, rstd}.
std::tuple<at::Tensor, at::Tensor, at::Tensor> rmsnorm_cuda_forward(const at::Tensor& x2, const at::Tensor& residual2,
                                                                    const at::Tensor& weight, double eps);
// h2, dy2, dh2 (may be undefined): [rows, H]; returns {dx, dweight}.
std::pair<at::Tensor, at::Tensor> rmsnorm_cuda_backward(const at::Tensor& h2, const at::Tensor& weight,
                                                        const at::Tensor& rstd, const at::Tensor& dy2,
                                                        const at::Tensor& dh2);
bool rmsnorm_cuda_applies(const at::Tensor& x, const at::Tensor& weight);
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType acc_type(const at::Tensor& x) {
  return at::promote_types(x.scalar_type(), at::kFloat);  // fp32, or fp64 for fp64
}

[[maybe_unused]] bool use_cuda(const at::Tensor& x, const at::Tensor& weight) {
#ifdef KILN_WITH_CUDA
  return rmsnorm_cuda_applies(x, weight);
#else
  (void)x;
  (void)weight;
  return false;
#endif
}

// fp32 CPU tensors take the fused loops of kernels/cpu_loops.h (one pass each way instead of a
// dozen ATen ops); other dtypes the ATen formulas below.
bool use_cpu_loops(const at::Tensor& x, const at::Tensor& weight) {
  return x.is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat;
}

// Forward on [rows, H] rows; residual may be undefined. Returns {y, h, rstd [rows] fp32/fp64}.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_rows(const at::Tensor& x, const at::Tensor& residual,
                                                            const at::Tensor& weight, double eps) {
#ifdef KILN_WITH_CUDA
  if (use_cuda(x, weight)) return rmsnorm_cuda_forward(x, residual, weight, eps);
#endif
  if (use_cpu_loops(x, weight)) {
    const int64_t rows = x.size(0), cols = x.size(1);
    at::Tensor y = at::empty_like(x), rstd = at::empty({rows}, x.options());
    at::Tensor h = residual.defined() ? at::empty_like(x) : x;
    const float *xp = x.const_data_ptr<float>(), *wp = weight.const_data_ptr<float>();
    const float* rp = residual.defined() ? residual.const_data_ptr<float>() : nullptr;
    float *yp = y.mutable_data_ptr<float>(), *sp = rstd.mutable_data_ptr<float>();
    float* hp = residual.defined() ? h.mutable_data_ptr<float>() : nullptr;
    kernels::cpu::rmsnorm_forward(xp, rp, wp, yp, hp, sp, rows, cols, static_cast<float>(eps));
    return {y, h, rstd};
  }
  const at::Tensor h = residual.defined() ? x + residual : x;
  const at::Tensor hf = h.to(acc_type(h));
  const at::Tensor rstd = at::rsqrt(hf.pow(2).mean(-1) + eps);
  const at::Tensor y = weight * (hf * rstd.unsqueeze(-1)).to(h.scalar_type());
  return {y, h, rstd};
}

// dx = rstd * (g - n * mean(g * n)) + dh, g = dy * w, n = h * rstd; dweight = sum dy * T(n).
std::pair<at::Tensor, at::Tensor> backward_rows(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& rstd,
                                                const at::Tensor& dy, const at::Tensor& dh) {
#ifdef KILN_WITH_CUDA
  if (use_cuda(h, weight)) return rmsnorm_cuda_backward(h, weight, rstd, dy, dh);
#endif
  if (use_cpu_loops(h, weight)) {
    const int64_t rows = h.size(0), cols = h.size(1);
    at::Tensor dx = at::empty_like(h), dweight = at::zeros({cols}, h.options());
    kernels::cpu::rmsnorm_backward(h.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                                   rstd.const_data_ptr<float>(), dy.const_data_ptr<float>(),
                                   dh.defined() ? dh.const_data_ptr<float>() : nullptr, dx.mutable_data_ptr<float>(),
                                   dweight.mutable_data_ptr<float>(), rows, cols);
    return {dx, dweight};
  }
  // The kernel's formulas in fp32 over blocks of rows (about 64K elements each), so that the
  // temporaries stay bounded as in the kernel and the CPU's memory peak is the modelled one.
  const at::ScalarType acc = acc_type(h);
  const int64_t rows = h.size(0), cols = h.size(1);
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1));
  const at::Tensor wf = weight.to(acc);
  at::Tensor dx = at::empty_like(h);
  at::Tensor dweight = at::zeros({cols}, weight.options().dtype(acc));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t nr = std::min(block, rows - r0);
    const at::Tensor rs = rstd.narrow(0, r0, nr).unsqueeze(-1);
    const at::Tensor n = h.narrow(0, r0, nr).to(acc) * rs;
    const at::Tensor dyf = dy.narrow(0, r0, nr).to(acc);
    const at::Tensor g = dyf * wf;
    at::Tensor dxb = rs * (g - n * (g * n).mean(-1, /*keepdim=*/true));
    if (dh.defined()) dxb.add_(dh.narrow(0, r0, nr).to(acc));
    dx.narrow(0, r0, nr).copy_(dxb);
    dweight.add_((dyf * n.to(h.scalar_type()).to(acc)).sum(0));
  }
  return {dx, dweight.to(weight.scalar_type())};
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    auto [y, h, rstd] = forward_rows(x, at::Tensor(), weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dw] = backward_rows(s[0], s[1], s[2], grads[0].contiguous(), at::Tensor());
    return {dx, dw, at::Tensor()};
  }
};

struct AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const at::Tensor& weight, double eps) {
    auto [y, h, rstd] = forward_rows(x, residual, weight, eps);
    ctx->save_for_backward({h, weight, rstd});
    return {y, h};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(s[0]);
    const at::Tensor dh = grads[1].defined() ? grads[1].contiguous() : at::Tensor();
    auto [dx, dw] = backward_rows(s[0], s[1], s[2], dy, dh);
    return {dx, dx, dw, at::Tensor()};
  }
};

void check(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0), "rmsnorm: weight ", weight.sizes(),
              " does not match the last dimension of x ", x.sizes());
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rmsnorm: x is ", x.scalar_type(), " but weight is ",
              weight.scalar_type());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "rmsnorm: x must be floating point, got ", x.scalar_type());
}

}  // namespace

at::Tensor rmsnorm_reference(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor xf = x.to(acc_type(x));
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check(x, weight);
  if (backend(Op::kRmsNorm) == Backend::kAten) return rmsnorm_reference(x, weight, eps);
  const int64_t cols = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, cols}).contiguous();
  return RmsNormFunction::apply(x2, weight.contiguous(), eps).view(x.sizes());
}

std::pair<at::Tensor, at::Tensor> add_rmsnorm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                              double eps) {
  check(x, weight);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(), "add_rmsnorm: residual ",
              residual.sizes(), " ", residual.scalar_type(), " does not match x ", x.sizes(), " ", x.scalar_type());
  if (backend(Op::kRmsNorm) == Backend::kAten) {
    const at::Tensor h = x + residual;
    return {rmsnorm_reference(h, weight, eps), h};
  }
  const int64_t cols = x.size(-1);
  const variable_list out = AddRmsNormFunction::apply(
      x.reshape({-1, cols}).contiguous(), residual.reshape({-1, cols}).contiguous(), weight.contiguous(), eps);
  return {out[0].view(x.sizes()), out[1].view(x.sizes())};
}

}  // namespace kiln::ops
