// SwiGLU op: validation, dispatch, and the autograd Function.
#include "kiln/ops/swiglu.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kiln/kernels/cpu_loops.h"
#include "kiln/ops/dispatch.h"

namespace kiln::ops {

#ifdef KILN_WITH_CUDA
// ops/swiglu_cuda.cpp; contiguous inputs of one supported dtype.
at::Tensor swiglu_cuda_forward(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_cuda_backward(const at::Tensor& gate, const at::Tensor& up,
                                                       const at::Tensor& dy);
bool swiglu_cuda_applies(const at::Tensor& gate);
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

[[maybe_unused]] bool use_cuda(const at::Tensor& gate) {
#ifdef KILN_WITH_CUDA
  return swiglu_cuda_applies(gate);
#else
  (void)gate;
  return false;
#endif
}

// fp32 CPU tensors take the fused loops of kernels/cpu_loops.h: the forward in one pass instead
// of silu then mul, the backward in one pass instead of four.
bool use_cpu_loops(const at::Tensor& gate) {
  return gate.is_cpu() && gate.scalar_type() == at::kFloat;
}

// bf16 CPU tensors take the loops' bf16 form: fp32 arithmetic per element, nothing widened as a
// tensor (the chunked ATen path below held about 1.5 MB of fp32 chunk copies at its peak).
bool use_cpu_loops_bf16(const at::Tensor& gate) {
  return gate.is_cpu() && gate.scalar_type() == at::kBFloat16;
}

const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}
uint16_t* bits_out(at::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>());
}

struct SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
#ifdef KILN_WITH_CUDA
    if (use_cuda(gate)) return swiglu_cuda_forward(gate, up);
#endif
    if (use_cpu_loops(gate)) {
      at::Tensor y = at::empty_like(gate);
      const float *g = gate.const_data_ptr<float>(), *u = up.const_data_ptr<float>();
      float* yp = y.mutable_data_ptr<float>();
      kernels::cpu::swiglu_forward(g, u, yp, gate.numel());
      return y;
    }
    if (use_cpu_loops_bf16(gate)) {
      at::Tensor y = at::empty_like(gate);
      kernels::cpu::swiglu_forward_bf16(bits(gate), bits(up), bits_out(y), gate.numel());
      return y;
    }
    return at::silu(gate) * up;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor& gate = s[0];
    const at::Tensor& up = s[1];
    const at::Tensor dy = grads[0].contiguous();
#ifdef KILN_WITH_CUDA
    if (use_cuda(gate)) {
      auto [dg, du] = swiglu_cuda_backward(gate, up, dy);
      return {dg, du};
    }
#endif
    // The same formulas as the kernel: d_gate = dy up s (1 + gate (1 - s)) (ATen's fused
    // silu_backward) and d_up = dy silu(gate). What no fused loop above took: fp32/fp64 as four
    // whole-tensor ops written straight into the outputs, no temporaries at all; bf16/fp16 in fp32
    // over chunks of 64K elements, so the fp32 copies stay bounded (the kernel keeps them in
    // registers) and the step's memory peak on the CPU is the one the memory model describes for
    // the GPU. (Smaller chunks, ten ops per 16K elements, are 1.3-3.3x slower than autograd
    // through silu * up on the CPU: dispatch and a parallel region per op.)
    const at::ScalarType acc = at::promote_types(gate.scalar_type(), at::kFloat);
    at::Tensor dgate = at::empty_like(gate), dup = at::empty_like(up);
    if (use_cpu_loops(gate)) {  // one pass: read gate, up, dy; write both gradients
      const float *g = gate.const_data_ptr<float>(), *u = up.const_data_ptr<float>(), *d = dy.const_data_ptr<float>();
      float *dg = dgate.mutable_data_ptr<float>(), *du = dup.mutable_data_ptr<float>();
      kernels::cpu::swiglu_backward(g, u, d, dg, du, gate.numel());
      return {dgate, dup};
    }
    if (use_cpu_loops_bf16(gate) && dy.scalar_type() == at::kBFloat16) {
      kernels::cpu::swiglu_backward_bf16(bits(gate), bits(up), bits(dy), bits_out(dgate), bits_out(dup), gate.numel());
      return {dgate, dup};
    }
    if (acc == gate.scalar_type()) {
      at::mul_out(dgate, dy, up);
      at::silu_backward_out(dgate, dgate, gate);
      at::silu_out(dup, gate);
      dup.mul_(dy);
      return {dgate, dup};
    }
    const at::Tensor gf = gate.view(-1), uf = up.view(-1), df = dy.view(-1);
    at::Tensor dgf = dgate.view(-1), duf = dup.view(-1);
    constexpr int64_t kChunk = int64_t{1} << 16;
    for (int64_t start = 0; start < gf.numel(); start += kChunk) {
      const int64_t n = std::min(kChunk, gf.numel() - start);
      const at::Tensor g = gf.narrow(0, start, n).to(acc), u = uf.narrow(0, start, n).to(acc),
                       d = df.narrow(0, start, n).to(acc);
      at::Tensor dg = d * u;
      at::silu_backward_out(dg, dg, g);
      dgf.narrow(0, start, n).copy_(dg);
      duf.narrow(0, start, n).copy_(d * at::silu(g));
    }
    return {dgate, dup};
  }
};

}  // namespace

at::Tensor swiglu_reference(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(), "swiglu: gate ", gate.sizes(), " ",
              gate.scalar_type(), " and up ", up.sizes(), " ", up.scalar_type(), " must have one shape and dtype");
  TORCH_CHECK(at::isFloatingType(gate.scalar_type()), "swiglu: gate must be floating point, got ", gate.scalar_type());
  if (backend(Op::kSwiGlu) == Backend::kAten) return swiglu_reference(gate, up);
  return SwiGluFunction::apply(gate.contiguous(), up.contiguous());
}

}  // namespace kiln::ops
