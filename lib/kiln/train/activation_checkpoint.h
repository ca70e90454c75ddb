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

}  // namespace kiln::train
