// One training run as kiln's cost models see it: its shapes, compute dtype, recomputation, kernel
// choices and parallelism, in one value. The memory model (memory.h), the traffic and FLOP model
// (traffic.h) and the planner (plan.h) all take it, and every program derives it the same way
// (train/run_description.h, from kiln-pretrain's config keys: the trainer's banner and auto-fit,
// kiln-pretrain --dry-run, each kiln-profile sweep point, kiln-profile explain and plan), so a run
// is described once and every model prices the same run.
//
// The cost layer takes the description as data: it never asks ops/ which kernels run. The
// description of a kernels spec on a device comes from train/kernel_choices.h, which asks ops'
// own rules (docs/architecture.md, "Layers").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace kiln::cost {

// Bytes per element of a compute dtype ("fp32": 4; "bf16", "fp16": 2, autocast over fp32 master
// weights): the one size every model of a run's memory and traffic takes. Throws
// std::invalid_argument naming the dtype for another name.
int compute_dtype_bytes(std::string_view dtype);

// Which implementations a step's ops run (kiln's fused ops save and move other tensors than the
// ATen compositions autograd differentiates). The default is ATen's ops throughout, with SDPA's
// fused attention.
struct KernelChoices {
  bool fused_rmsnorm = false, fused_swiglu = false;
  bool fused_loss_head = false;          // chunked linear + cross-entropy
  bool loss_head_low_precision = false;  // its matmuls in the autocast dtype (else fp32 copies)
  // The fused CPU cross-entropy loop writes the gradient over the chunk's logits in place: over
  // fp32 logits, over low-precision (bf16) ones.
  bool cpu_loss_loop = false, cpu_loss_loop_low_precision = false;
  // The decoder's projections run fp32 GEMMs from the fp32 master weights under autocast (a CPU
  // without AMX): no low-precision weight copies for them.
  bool projections_fp32 = false;
  // Rows of the fused loss head's chunk for a step of `tokens` rows over a [vocab, hidden] head
  // (needed with fused_loss_head).
  std::function<int64_t(int64_t tokens, int64_t vocab, int64_t hidden)> loss_chunk_tokens;
  // RoPE with kiln's kernel. It rotates in place when activations and tables share a dtype, i.e.
  // in fp32. Under autocast (bf16/fp16 projections, fp32 tables) the result is fp32: with
  // mixed_rope_fused kiln's mixed Function (ops/rope.cpp: the CUDA kernel in bf16 and fp16, the
  // CPU loop in bf16) writes it in one pass, else ATen's composition.
  bool fused_rope = false;
  bool mixed_rope_fused = false;
  // "flash": kiln's flash-attention kernels (kiln_attention_path, traffic.h); "sdpa": ATen's SDPA
  // with a fused backend (flash or memory-efficient: no T x T tensor); "math": SDPA's math backend
  // (scores and probabilities materialised in the compute dtype).
  std::string attention = "sdpa";
};

// Data parallelism (kiln/dist/data_parallel.h), per rank.
struct Parallelism {
  // The step runs under dist::DataParallel (a launcher's process group, also of one rank): stages
  // 0 and 1 keep every gradient in one flat buffer for the whole step.
  bool data_parallel = false;
  int world_size = 1;
  // Stage 1 holds 1/world of the AdamW state, stage 2 also 1/world of the gradients plus the
  // buckets being reduced; the collectives' traffic counts only with world_size > 1.
  int zero_stage = 0;
  int64_t bucket_cap_bytes = 25ll << 20;
  int max_in_flight = 2;  // stage 2: buckets in flight (DataParallelOptions::max_in_flight)
};

struct RunDescription {
  // Shapes, per rank.
  int64_t batch = 1;       // micro-batch, sequences
  int64_t cutoff_len = 1;  // cutoff_len
  int64_t gradient_accumulation_steps = 1;
  std::string dtype = "bf16";  // compute: bf16 | fp16 (autocast over fp32 parameters) | fp32
  // Recomputation (train/recomputation.h): none | full | every_n (layers 0, n, 2n, ... with
  // n = every) | selective (per layer the RMSNorms, SwiGLU and the merged attention output).
  std::string recompute = "none";
  int every = 1;
  KernelChoices kernels;
  bool cuda = false;  // runs on a GPU (the caching allocator's allowance; the CPU-only rules off)
  Parallelism parallel;
  bool clip_grad_norm = true;  // max_grad_norm > 0 (HF's default 1.0)

  int compute_bytes() const { return compute_dtype_bytes(dtype); }
  // Whole layers recomputed (full, every_n): their stride, else 0.
  int recomputed_stride() const;
  void validate() const;  // throws std::invalid_argument naming the field
};

}  // namespace kiln::cost
