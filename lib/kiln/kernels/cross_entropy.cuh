// Cross-entropy over one chunk of logits rows, forward and backward in one pass pair per row:
// pass 1 reads the row once (online max and sum of exp, the target logit), pass 2 overwrites the
// row in place with d(loss)/d(logits) = softmax * (1 + 2 z lse) - one_hot(target), zero for an
// ignored row. Torch-free: validation and the chunk loop live in ops/linear_cross_entropy.cpp.
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
  DType dtype = DType::kFloat32;  // of logits
};

void launch_cross_entropy_fwd_bwd(const CrossEntropyParams& params, Stream stream);

}  // namespace kiln::kernels
