// ops::linear: dispatch and the fp32-GEMM autograd Function for low-precision CPU linears.
// Every GEMM here is ATen's (at::mm_out / addmm_): kiln calls LibTorch only through its public API.
#include "kiln/ops/linear.h"

#include <algorithm>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "kiln/common/env.h"
#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/autocast_off.h"
#include "kiln/ops/dispatch.h"

namespace kiln::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// dst (fp32, contiguous) = src rounded to `compute` and widened back: the values a `compute`
// GEMM reads. An fp32 source is rounded in one pass; a `compute` one is widened exactly.
void round_into(const at::Tensor& src, at::Tensor& dst, at::ScalarType compute) {
  if (src.scalar_type() != at::kFloat) {
    dst.view(src.sizes()).copy_(src.scalar_type() == compute ? src : src.to(compute));
    return;
  }
  const at::Tensor in = src.contiguous();
  // The loops below write numel floats from dst's first element.
  TORCH_CHECK(dst.is_contiguous() && dst.scalar_type() == at::kFloat && dst.numel() == in.numel(), "round_into: dst ",
              dst.sizes(), " must be a contiguous fp32 tensor of ", in.numel(), " elements");
  if (compute == at::kBFloat16) {
    kernels::cpu::round_to_bf16(in.const_data_ptr<float>(), dst.mutable_data_ptr<float>(), in.numel());
  } else {
    kernels::cpu::round_to_fp16(in.const_data_ptr<float>(), dst.mutable_data_ptr<float>(), in.numel());
  }
}

// An fp32 result (consumed) rounded to `compute` (as a `compute` GEMM writes it), then given
// `dtype`; an fp32 `dtype` is rounded in place.
at::Tensor rounded_as(at::Tensor t32, at::ScalarType compute, at::ScalarType dtype) {
  if (dtype != at::kFloat || !t32.is_contiguous()) return t32.to(compute).to(dtype);
  round_into(t32, t32, compute);
  return t32;
}

// x cast to `compute`, shared by consecutive linears of one input. q, k and v (gate and up) read
// the same fp32 norm output; autocast casts it once per projection, and each linear saves its
// copy for backward. This keeps the latest cast through weak references (nothing is held
// alive), so the three (two) linears save one copy. A changed version of x misses the cache.
at::Tensor cast_input(const at::Tensor& x, at::ScalarType compute) {
  if (x.scalar_type() == compute) return x;
  struct Cache {
    c10::weak_intrusive_ptr<c10::TensorImpl> source{c10::intrusive_ptr<c10::TensorImpl>()};
    c10::weak_intrusive_ptr<c10::TensorImpl> cast{c10::intrusive_ptr<c10::TensorImpl>()};
    uint32_t version = 0;
    at::ScalarType dtype = at::ScalarType::Undefined;
  };
  thread_local Cache cache;
  if (cache.dtype == compute && cache.version == x._version()) {
    const c10::intrusive_ptr<c10::TensorImpl> source = cache.source.lock();
    if (source && source.get() == x.unsafeGetTensorImpl()) {
      c10::intrusive_ptr<c10::TensorImpl> cast = cache.cast.lock();
      if (cast) return at::Tensor(std::move(cast));
    }
  }
  at::Tensor xc = x.to(compute);
  cache.source = c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr());
  cache.cast = c10::weak_intrusive_ptr<c10::TensorImpl>(xc.getIntrusivePtr());
  cache.version = x._version();
  cache.dtype = compute;
  return xc;
}

// y = round(round(x) round(W)^T + round(b)) in `compute`; x [..., in].
at::Tensor forward_fp32_gemm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             at::ScalarType compute) {
  const int64_t out = weight.size(0), in = weight.size(1), rows = x.numel() / std::max<int64_t>(in, 1);
  at::Tensor w32 = at::empty({out, in}, at::kFloat), x32 = at::empty({rows, in}, at::kFloat),
             y32 = at::empty({rows, out}, at::kFloat);
  round_into(weight, w32, compute);
  round_into(x, x32, compute);
  mm_into(y32, x32, w32.t());
  if (bias.defined()) y32.add_(bias.to(compute).to(at::kFloat));
  // Written into a tensor of the output's shape: a Function's output must not be a view (RoPE
  // rotates q and k in place).
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = out;
  at::Tensor y = at::empty(sizes, y32.options().dtype(compute));
  y.view({rows, out}).copy_(y32);
  return y;
}

struct LinearFp32GemmFunction : public torch::autograd::Function<LinearFp32GemmFunction> {
  // bias: an optional, since a Function's tensor inputs must be defined.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_in, at::ScalarType compute) {
    // The input as the GEMM reads it (what autocast's linear saves); the fp32 master weight, whose
    // rounding backward redoes instead of keeping a low-precision copy.
    const at::Tensor bias = bias_in.value_or(at::Tensor());
    const at::Tensor xc = cast_input(x, compute);
    ctx->save_for_backward({xc, weight, bias});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["compute"] = static_cast<int64_t>(compute);
    return forward_fp32_gemm(xc, weight, bias, compute);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const AutocastOff no_autocast;
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor& xc = s[0];
    const at::Tensor& weight = s[1];
    const at::Tensor& bias = s[2];
    const auto compute = static_cast<at::ScalarType>(ctx->saved_data["compute"].toInt());
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const int64_t out = weight.size(0), in = weight.size(1), rows = xc.numel() / std::max<int64_t>(in, 1);
    // dy arrives in `compute` (the forward's output dtype): widening it is exact.
    at::Tensor dy = at::empty({rows, out}, at::kFloat);
    round_into(grads[0], dy, compute);
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      at::Tensor w32 = at::empty({out, in}, at::kFloat), dx32 = at::empty({rows, in}, at::kFloat);
      round_into(weight, w32, compute);
      mm_into(dx32, dy, w32);
      dx = (x_dtype == at::kFloat ? rounded_as(dx32.clone(), compute, at::kFloat) : dx32.to(compute).to(x_dtype))
               .view(xc.sizes());
    }
    if (ctx->needs_input_grad(1)) {
      at::Tensor x32 = at::empty({rows, in}, at::kFloat);
      round_into(xc, x32, compute);
      at::Tensor dw32 = at::empty({out, in}, at::kFloat);
      mm_into(dw32, dy.t(), x32);
      dw = rounded_as(std::move(dw32), compute, weight.scalar_type());
    }
    if (bias.defined() && ctx->needs_input_grad(2)) db = rounded_as(dy.sum(0), compute, bias.scalar_type());
    return {dx, dw, db, at::Tensor()};
  }
};

// The dtype at::linear would compute in: autocast's for floating, non-double operands when
// autocast covers the device, else the operands' own when they agree; kUndefined otherwise.
at::ScalarType compute_dtype(const at::Tensor& x, const at::Tensor& weight) {
  auto eligible = [](const at::Tensor& t) {
    return at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kDouble;
  };
  const at::DeviceType dev = x.device().type();
  if (at::autocast::is_autocast_enabled(dev) && eligible(x) && eligible(weight))
    return at::autocast::get_autocast_dtype(dev);
  return x.scalar_type() == weight.scalar_type() ? x.scalar_type() : at::ScalarType::Undefined;
}

}  // namespace

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType c = a.scalar_type();
  if (!a.is_cpu() || !b.is_cpu() || b.scalar_type() != c || backend(Op::kLinear) == Backend::kAten ||
      !cpu_linear_uses_fp32_gemm(c)) {
    return a.mm(b);
  }
  const AutocastOff no_autocast;
  const at::Tensor a32 = a.to(at::kFloat), b32 = b.to(at::kFloat);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a32.options());
  mm_into(out, a32, b32);
  return out.to(c);
}

void mm_into(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  at::Tensor o = out;  // a handle: the ATen out= functions take a non-const reference
  if (accumulate) {
    o.addmm_(a, b);
  } else {
    at::mm_out(o, a, b);
  }
}

bool cpu_has_amx_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && ((d >> 22) & 1u) != 0;
#else
  return true;
#endif
}

void testing::force_cpu_linear_fp32(int mode) {
  if (mode < 0) return env::clear_override("KILN_CPU_LINEAR_FP32");
  env::set_override("KILN_CPU_LINEAR_FP32", mode != 0 ? "1" : "0");
}

void testing::force_cpu_native_low_precision_gemm(int mode) {
  if (mode < 0) return env::clear_override("KILN_CPU_LOW_PRECISION_GEMM");
  env::set_override("KILN_CPU_LOW_PRECISION_GEMM", mode != 0 ? "native" : "fp32");
}

bool cpu_is_amd_with_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
  if (!amd || a < 7) return false;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && ((a >> 5) & 1u) != 0;
#else
  return false;
#endif
}

bool cpu_native_low_precision_gemm(at::ScalarType compute) {
  if (const auto rule = env::choice("KILN_CPU_LOW_PRECISION_GEMM", {"native", "fp32"})) return *rule == "native";
  static const bool amx = cpu_has_amx_bf16(), amd_bf16 = cpu_is_amd_with_avx512_bf16();
  if (compute == at::kBFloat16) return amx || amd_bf16;
  return amx;
}

bool cpu_linear_uses_fp32_gemm(at::ScalarType compute) {
  if (compute != at::kBFloat16 && compute != at::kHalf) return false;
  if (const auto fp32 = env::flag("KILN_CPU_LINEAR_FP32")) return *fp32;
  return !cpu_native_low_precision_gemm(compute);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!x.is_cpu() || !weight.is_cpu() || (bias.defined() && !bias.is_cpu())) return at::linear(x, weight, bias);
  const at::ScalarType compute = compute_dtype(x, weight);
  if (backend(Op::kLinear) == Backend::kAten || compute == at::ScalarType::Undefined ||
      (bias.defined() && !at::isFloatingType(bias.scalar_type()))) {
    return at::linear(x, weight, bias);
  }
  if (!cpu_linear_uses_fp32_gemm(compute)) return at::linear(x, weight, bias);
  TORCH_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.sizes(),
              " does not match weight ", weight.sizes());
  // The body calls ATen ops that autocast would re-cast; the Function casts its operands itself.
  const AutocastOff no_autocast;
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!needs_grad) return forward_fp32_gemm(x, weight, bias, compute);
  return LinearFp32GemmFunction::apply(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt,
                                       compute);
}

}  // namespace kiln::ops
