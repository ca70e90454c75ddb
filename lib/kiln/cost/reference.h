// The reference stack and the step time (kiln-profile reference; docs/performance.md, "The
// reference runs, predicted"). The reference runs (configs/reference/llamafactory_runs.yaml) are
// LLaMA-Factory 0.9.0 (stage pt, finetuning_type full) on transformers 4.45's Trainer; this file
// says what that stack runs, component by component as the kiln variant is, and adds what a
// FLOP-and-byte roofline leaves out of a step's time and of nvidia-smi's memory:
//
//   - the reference stack's traffic: traffic.h's eager column with transformers' SDPA attention
//     (repeat_kv's copies, the fused backend the GPU gets: memory-efficient on a V100 or in fp32,
//     flash on sm_80+ in bf16/fp16), the fp32 upcast of the logits and the shifted copy before
//     cross_entropy, torch.optim.AdamW's foreach update, GradScaler's unscale under fp16, and
//     LLaMA-Factory's default gradient checkpointing (use_reentrant: every decoder layer's forward
//     run again in backward);
//   - a host term for both stacks: the ops one step launches (counted on a CPU step, host_costs.yaml)
//     times the host time per op (measured there), plus the trainer's own per-step cost; per
//     synchronisation the host and the device wait for each other, so a stretch between two
//     synchronisations takes the larger of the two times;
//   - memory as nvidia-smi shows it: the caching allocator's segments when the step's tensors are
//     replayed through a model of its rules (cost/caching_allocator.h), and the CUDA context.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/cost/hardware.h"
#include "kiln/cost/run.h"
#include "kiln/cost/traffic.h"
#include "kiln/model/llama_config.h"

namespace kiln::cost {

// The CUDA context of a PyTorch process with lazy module loading (PyTorch's default since 1.13):
// 287,047,680 bytes, measured by PyTorch's maintainers when they made lazy loading the default
// (pytorch/pytorch pull request 86509; 666,632,192 without it). Not measured by kiln: no GPU was
// available (scripts/device_check.sh's `context` step measures it on the next one).
inline constexpr double kCudaContextBytes = 287047680.0;

// The SDPA backend PyTorch picks for transformers' call (is_causal, no mask): flash on sm_80+ in
// bf16/fp16, memory-efficient on a V100 (no flash kernel for sm_70) or in fp32. Both are fused: no
// T x T tensor, the same traffic in the model.
std::string reference_sdpa_backend(const HardwareSpec& hardware, const std::string& dtype);

// The reference stack's run for `run`'s shapes and dtype: ATen's ops (no kiln kernel, no fused
// loss head), full recomputation of every layer (gradient checkpointing), gradient clipping on
// (max_grad_norm 1.0), no data parallelism beyond what `run` says.
RunDescription reference_run(const RunDescription& run);
// The eager column's options that make it the reference stack.
inline EagerStack reference_eager_stack() {
  return {true, true};
}

// Host-side inputs of one stack, for one dtype: counted ops and measured seconds
// (configs/reference/host_costs.yaml, written by scripts/measure_host_costs.py).
struct HostOps {
  double forward_fixed = 0, forward_per_layer = 0;         // per micro-batch
  double backward_fixed = 0, backward_per_layer = 0;       // per micro-batch (recomputation included)
  double step = 0;                                         // per optimizer step: clipping, AdamW, zero_grad
  double scaler_per_micro_batch = 0, scaler_per_step = 0;  // GradScaler's, fp16 only
};
struct HostModel {
  HostOps ops;
  double seconds_per_op = 0;         // host time per op (measured)
  double fixed_per_micro_batch = 0;  // the trainer's own host time (measured): data, callbacks
  double fixed_per_step = 0;
  // Whether each micro-batch ends in a device synchronisation (transformers' Trainer: its
  // isnan/isinf check of the loss, logging_nan_inf_filter); kiln's step synchronises once per
  // logging window, not per micro-batch or step (train/trainer_outputs.cpp).
  // Then the optimizer's part is its own stretch, max(host, device), whether or not it ends in a
  // synchronisation (GradScaler's found_inf under fp16) or overlaps the next micro-batch's issue.
  bool sync_per_micro_batch = false;
};

struct StepTime {
  double device_micro_batch = 0;  // the roofline's time of one micro-batch's forward + backward
  double device_step = 0;         // the per-step rows (clipping, optimizer, accumulation adds)
  double host_micro_batch = 0;    // ops x seconds_per_op + the trainer's per micro-batch cost
  double host_step = 0;           // ... per optimizer step
  double seconds = 0;             // the step
  bool host_bound = false;        // the host's time sets the step
  double ops_per_step = 0;
};

// The step's time: where each micro-batch ends in a synchronisation, each takes max(host, device)
// and the optimizer's part max(host, device) again; without synchronisations the host runs ahead
// of the device for the whole step, max(all host, all device). `eager` takes the traffic report's
// eager column (the reference stack's, when built with reference_eager_stack()).
StepTime step_time(const TrafficReport& report, const Roofline& roof, const HostModel& host, bool eager);

// Memory as nvidia-smi shows it for one stack's step: the caching allocator's reserved segments
// and the CUDA context.
struct SmiMemory {
  // The analytic breakdown of the moment with the most live bytes (for the reader; the allocated
  // and reserved figures below come from replaying the step's tensors).
  std::vector<std::pair<std::string, double>> components;
  std::string peak_phase;  // where the reserved segments last grew
  double allocated = 0;    // the peak of live bytes
  double reserved = 0;     // the allocator's segments at the end of the replayed steps
  double context = kCudaContextBytes;
  double cached_free() const { return reserved - allocated; }  // blocks the peak could not reuse
  double total() const { return reserved + context; }
};

// The reference stack's step (run: reference_run's), replayed tensor by tensor for three optimizer
// steps through the caching allocator's model (cost/caching_allocator.h): LLaMA-Factory's load (the
// weights in the compute dtype, each trainable one upcast to fp32), then per micro-batch the forward
// under reentrant checkpointing (each layer's fp32 input kept, its intermediates freed as it goes),
// autocast's weight copies until the forward ends, the loss chain of transformers 4.45 (the
// bf16/fp16 logits, their fp32 upcast held by the output, the shifted copy, log_softmax's output),
// the backward from the loss down (the loss chain's gradients, then each layer recomputed with its
// weights' casts and its saved tensors, its gradients cast to fp32 and accumulated into .grad),
// and per optimizer step AdamW's moments (first step), foreach sqrt(exp_avg_sq) temporaries and
// zero_grad(set_to_none). `components` gives the analytic view of the largest moment:
//   forward/backward boundary  parameters and moments (12 bytes per parameter), autocast's weight
//                              copies, the checkpointed inputs, the loss chain (12 bytes per
//                              logit: fp32 logits, shifted copy, log_softmax)
//   optimizer step             parameters, gradients, moments and the sqrt temporaries (20)
SmiMemory reference_memory(const model::LlamaConfig& config, const RunDescription& run);

// kiln's step on a GPU: cost/memory.h's peak (allocated), plus its caching-allocator allowance
// (reserved), and the context.
SmiMemory kiln_memory(const model::LlamaConfig& config, const RunDescription& run);

}  // namespace kiln::cost
