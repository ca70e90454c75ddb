#include "kiln/train/kernel_choices.h"

#include "kiln/common/dtype_names.h"
#include "kiln/cost/traffic.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear.h"
#include "kiln/ops/linear_cross_entropy.h"

namespace kiln::train {

std::string trainer_kernels(const std::string& kernels, bool full_determinism) {
  return full_determinism && kernels == ops::kDefaultKernels ? "kiln" : kernels;
}

cost::KernelChoices kernel_choices(const std::string& kernels, const std::string& dtype, bool cuda,
                                   const cost::HardwareSpec* hardware, int64_t head_dim) {
  auto kiln_op = [&](ops::Op op) { return ops::backend_in_spec(kernels, op) == ops::Backend::kKiln; };
  cost::compute_dtype_bytes(dtype);  // throws naming a dtype that is none of the three
  const at::ScalarType compute = dtype_from_name(dtype);
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
  k.fused_rope = kiln_op(ops::Op::kRope);
  // Under autocast the mixed Function: CUDA's kernel (bf16, fp16), the CPU's loop (bf16 only).
  k.mixed_rope_fused = cuda || dtype == "bf16";
  // kiln's flash kernels are CUDA kernels; on the CPU (and on a GPU the table does not know)
  // attention is ATen's SDPA with a fused backend: no T x T tensor.
  k.attention = cuda && hardware != nullptr
                    ? cost::kiln_attention_path(kiln_op(ops::Op::kAttention), *hardware, dtype, head_dim)
                    : "sdpa";
  return k;
}

}  // namespace kiln::train
