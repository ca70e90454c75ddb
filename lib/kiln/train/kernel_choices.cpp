#include "kiln/train/kernel_choices.h"

#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"

namespace kiln::train {

std::string trainer_kernels(const std::string& kernels, bool full_determinism) {
  return full_determinism && kernels == ops::kDefaultKernels ? "kiln" : kernels;
}

cost::KernelChoices kernel_choices(const std::string& kernels, int compute_bytes, bool cuda) {
  auto kiln_op = [&](ops::Op op) { return ops::backend_in_spec(kernels, op) == ops::Backend::kKiln; };
  // compute_bytes 2 is taken as bf16 (the rules differ between bf16 and fp16 only on the CPU,
  // where fp16 autocast is not offered).
  const at::ScalarType compute = compute_bytes == 2 ? at::kBFloat16 : at::kFloat;
  cost::KernelChoices k;
  k.fused_rmsnorm = kiln_op(ops::Op::kRmsNorm);
  k.fused_swiglu = kiln_op(ops::Op::kSwiGlu);
  k.fused_loss_head = kiln_op(ops::Op::kLinearCrossEntropy);
  k.loss_head_low_precision = ops::linear_cross_entropy_matmul_dtype(compute, !cuda) != at::kFloat;
  k.cpu_loss_loop = !cuda && ops::cpu_cross_entropy_uses_loop(at::kFloat);
  k.cpu_loss_loop_low_precision = !cuda && ops::cpu_cross_entropy_uses_loop(at::kBFloat16);
  k.projections_fp32 = !cuda && kiln_op(ops::Op::kLinear) && ops::cpu_linear_uses_fp32_gemm(compute);
  k.loss_chunk_tokens = [cuda](int64_t tokens, int64_t vocab, int64_t hidden) {
    return ops::auto_chunk_tokens(tokens, vocab, hidden, !cuda);
  };
  return k;
}

}  // namespace kiln::train
