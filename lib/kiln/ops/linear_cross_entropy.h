// ops::linear_cross_entropy: the LM head and its cross-entropy in one op that never holds all
// logits. Rows (tokens) are processed in chunks: logits of a chunk, their log-sum-exp and loss,
// and, when a gradient is wanted, the gradient of those logits (softmax - one_hot) turned at once
// into the chunk's rows of grad(hidden) and added into grad(weight); the chunk's logits are then
// freed. The gradients are computed in the forward pass (as Liger-Kernel does) and scaled by
// grad_output in backward. Memory falls from O(N x V) to O(chunk x V + V x H) on every device:
// the chunked algorithm is written in ATen and is the CPU path too; on CUDA the per-row softmax
// part is one kiln kernel (kernels/cross_entropy.cu) instead of a chain of ATen ops.
//
// Arithmetic: logits in the compute dtype (the autocast dtype when autocast is on, else the
// input dtype, as at::linear would), loss and softmax in fp32 (fp64 for fp64 inputs), grad(weight)
// accumulated in fp32 across chunks.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace kiln::ops {

enum class LossReduction { kSum, kMean };

struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  double z_loss = 0.0;       // adds z_loss * logsumexp(logits)^2 per target token (PaLM's z-loss)
  int64_t chunk_tokens = 0;  // rows per chunk; 0 = automatic (see auto_chunk_tokens)
  LossReduction reduction = LossReduction::kMean;
};

struct LinearCrossEntropyResult {
  at::Tensor loss;        // 0-d fp32 (fp64 for fp64 inputs): sum or mean over targets, z-loss included
  at::Tensor loss_sum;    // 0-d: the sum behind `loss` (differentiable too)
  at::Tensor num_tokens;  // 0-d int64: targets != ignore_index
  at::Tensor z_loss_sum;  // 0-d, detached: the z-loss part of loss_sum (0 when z_loss == 0)
};

// hidden: [..., H]; weight: [V, H] (the LM head, y = hidden W^T); labels: [...] integer, the
// target of each row of hidden (already shifted for next-token prediction). Uses the chunked
// algorithm unless backend(Op::kLinearCrossEntropy) is kAten.
LinearCrossEntropyResult linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& labels, const LinearCrossEntropyOptions& options = {});

// The plain ATen composition (full logits, upcast, at::cross_entropy_loss), on any device.
LinearCrossEntropyResult linear_cross_entropy_reference(const at::Tensor& hidden, const at::Tensor& weight,
                                                        const at::Tensor& labels,
                                                        const LinearCrossEntropyOptions& options = {});

// The default rows per chunk, per device.
// CUDA: Liger-Kernel's rule, about as many logits per chunk as hidden has elements, i.e.
// next_pow2(ceil(rows / ceil(V / H))), at least 64 rows (small matmuls are slow), at most rows.
// CPU: the largest power of two with rows x V <= 2^23 logits (32 MiB in fp32), at least 64 rows,
// at most rows. Each chunk adds its [V, H] product into the fp32 weight gradient (reading and
// writing all of it) and runs a dozen ops, each a parallel region; with 64-row chunks
// (Liger's rule for V 32000, H 512, 1024 rows) that cost the CPU 1.7x ATen's full-logits time on
// 2 threads, with 256 rows it is ATen's time (docs/performance.md). Memory stays far below the
// full logits (rows x V x 10+ bytes) either way; profile/memory.cpp follows the same rule.
int64_t auto_chunk_tokens(int64_t rows, int64_t vocab, int64_t hidden, bool cpu = false);

}  // namespace kiln::ops
