// Recomputation ("gradient_checkpointing" in HF): parts of each decoder layer keep only their
// inputs for backward and run again when the gradient arrives, trading compute for activations.
//
// The policies wrap the model's parts from outside, as torchtitan's apply_ac wraps its blocks: the
// decoder layer is written once, as a sequence of named sub-blocks (model/llama.h,
// LlamaDecoderLayerImpl), and a policy installs a runner on whole layers (full, every_n) or on the
// layer's ProjectionBlocks (selective). Nothing here computes a part of the layer itself: a
// recomputation calls the layer's, or the block's, own code again.
//
// LibTorch has no torch.utils.checkpoint, so each wrapper is a custom autograd Function (the
// reentrant variant): the part runs without grad in forward; backward runs it again with grad
// under the autocast state and kernel choice the forward saw (ForwardState, train/gradient_accumulation.h) and
// back-propagates through the rerun. kiln's layers have no dropout, so no RNG state needs
// restoring.
#pragma once

#include "kiln/model/llama.h"

namespace kiln::train {

// Installs (or with enable = false removes) checkpointing on decoder layers 0, every, 2 x every, ...
// of `model` (every = 1: all of them, HF's gradient_checkpointing; every = n: kiln's
// gradient_checkpointing_policy every_n, ceil(L / n) layers recomputed, the others keep their
// activations). The layer's forward runs again in backward, which accumulates its parameters'
// gradients. Replaces any recomputation installed before.
void set_layer_recomputation(model::LlamaForCausalLM& model, bool enable, int every = 1);

// gradient_checkpointing_policy selective: every decoder layer keeps the outputs of its matmuls
// and recomputes only the element-wise parts that feed them. Each of the layer's four
// ProjectionBlocks (a prologue without matmuls feeding projections) runs as one autograd Function
// that saves the prologue's inputs instead of its output:
//   NormLinears   RMSNorm + q/k/v projections, RMSNorm + gate/up   saves x (fp32), not norm(x) and its casts;
//   SwiGluLinear  SwiGLU + down_proj                               saves gate and up, not silu(gate) * up;
//   HeadsLinear   merge of the heads + o_proj                      saves the attention output (which the
//                                                                  attention keeps anyway), not its [B, T, q] copy.
// Backward runs the block's prologue again (with grad, under the forward's autocast state and
// kernel choice), forms dW and dp with each projection's Linear::gradients from the saved
// low-precision weight (no matmul runs twice) and back-propagates dp through the prologue. The
// attention core (flash/SDPA keeps only q, k, v, its output and the log-sum-exp) is not
// recomputed: its inputs are the projections' outputs, kept either way. Exact gradients (the same
// arithmetic as without recomputation). docs/performance.md: memory; benchmarks.md: time. Replaces
// any recomputation installed before; enable = false removes it.
void set_selective_recomputation(model::LlamaForCausalLM& model, bool enable);

}  // namespace kiln::train
