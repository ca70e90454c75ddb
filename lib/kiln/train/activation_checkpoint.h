// Activation checkpointing ("gradient_checkpointing" in HF): each decoder layer keeps only its
// input for backward and runs its forward again when the gradient arrives, trading one extra
// forward (training FLOPs x4/3) for activations of one layer instead of all of them.
//
// LibTorch has no torch.utils.checkpoint, so this is the reentrant variant written as a custom
// autograd Function: the layer runs without grad in forward; backward reruns it with grad under
// the autocast state the forward saw and back-propagates through the rerun, which accumulates
// the layer's parameter gradients directly. kiln's layers have no dropout, so no RNG state needs
// restoring.
#pragma once

#include "kiln/model/llama.h"

namespace kiln::train {

// Installs (or with enable = false removes) checkpointing on decoder layers 0, every, 2 x every, ...
// of `model` (every = 1: all of them, HF's gradient_checkpointing; every = n: kiln's
// gradient_checkpointing_policy every_n, ceil(L / n) layers recomputed, the others keep their
// activations).
void set_activation_checkpointing(model::LlamaForCausalLM& model, bool enable, int every = 1);

// gradient_checkpointing_policy selective: every decoder layer keeps the outputs of its matmuls
// and recomputes only the element-wise parts that feed them. Three autograd Functions fuse an
// element-wise prologue with the matmuls that consume it and save the prologue's input instead
// of its output:
//   RMSNorm + q/k/v projections, RMSNorm + gate/up  save x (fp32), not norm(x) and its casts;
//   SwiGLU + down_proj                              saves gate and up, not silu(gate) * up;
//   head transpose + o_proj                         saves the attention output (which the
//                                                   attention keeps anyway), not its [B, T, q] copy.
// Backward recomputes the prologue (ops::rmsnorm / ops::swiglu with grad, under the autocast state
// and kernel choice of the forward), forms dW = dY^T p and dp = dY W directly from the saved
// low-precision weight (no matmul runs twice) and back-propagates dp through the prologue. The
// attention core (flash/SDPA keeps only q, k, v, its output and the log-sum-exp) is not
// recomputed: its inputs are the projections' outputs, kept either way. Exact gradients (the same
// arithmetic as without recomputation). docs/performance.md gives the memory and time.
void set_selective_recomputation(model::LlamaForCausalLM& model, bool enable);

}  // namespace kiln::train
