// Cross-entropy over one chunk of logits rows, forward and backward in one pass pair per row:
// pass 1 reads the row once (online max and sum of exp, the target logit), pass 2 overwrites the
// row in place with d(loss)/d(logits) = (softmax * (1 + 2 z lse) - one_hot(target)) * grad_scale,
// zero for an ignored row. Torch-free: validation and the chunk loop live in ops/linear_cross_entropy.cpp.
#pragma once

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct CrossEntropyParams {
  void* logits = nullptr;           // [rows, vocab] contiguous; overwritten by the gradient if write_grad
  const int64_t* labels = nullptr;  // [rows]
  float* loss = nullptr;            // [rows] out: lse - logit[target] + z * lse^2, 0 for ignored rows
  float* lse = nullptr;             // [rows] out: log-sum-exp of the row (also for ignored rows)
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t ignore_index = -100;
  float z_loss = 0.f;
  bool write_grad = true;
  // [1] on the device, or null (1): the gradient is multiplied by *grad_scale in fp32 before it is
  // rounded to the logits' dtype (the loss scale and 1 / targets that backward would apply later:
  // fp16 would otherwise flush the small probabilities to zero first).
  const float* grad_scale = nullptr;
  DType dtype = DType::kFloat32;  // of logits
};

void launch_cross_entropy_fwd_bwd(const CrossEntropyParams& params, Stream stream);

}  // namespace kiln::kernels
