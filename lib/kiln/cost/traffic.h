// Traffic and FLOP model of a training step, per component (kiln-profile explain;
// docs/performance.md, "Memory traffic per component"): for each part of one optimizer step, forward
// and backward separately, the FLOPs it executes and the bytes that must cross device memory, in
// two variants side by side:
//   kiln   what kiln's step runs on a GPU for the given kernel choices: its fused RMSNorm, SwiGLU,
//          flash-attention and chunked linear + cross-entropy where chosen, and ATen's ops (as
//          autograd differentiates them) elsewhere, with the casts autocast makes around them;
//   eager  an unfused Hugging Face transformers-style step (modeling_llama.py, eager attention):
//          every element-wise op reads and writes whole tensors, RMSNorm as its six ATen ops, the
//          T x T scores and probabilities materialised, the full logits upcast to fp32 for the
//          loss, torch.optim.AdamW's multi-tensor (foreach) update.
// Both train fp32 master weights under autocast for bf16/fp16 (autocast casts each fp32 weight to
// the compute dtype once per micro-batch, and every fp32 activation before each GEMM), or fp32
// throughout. The residual stream is fp32 either way: the embedding's output is fp32 and adding
// a bf16 branch to it promotes (as in HF under autocast), so the RMSNorms run on fp32 tensors and
// the RoPE tables are fp32 (model/llama.cpp, model/rope.cpp).
//
// Bytes are compulsory traffic: every tensor an op (kernel) reads is counted once, every tensor it
// writes once, at its dtype's size. Re-reads that a kernel's tiles or rows serve from L2 (a GEMM's
// operand tiles, flash attention's K/V tiles per query tile, the loss kernel's second pass over a
// row) are not counted, so the figures are a lower bound of what a DRAM counter measures; the
// GEMMs' operand re-reads past a given L2 can be added on request (GemmDram below). FLOPs:
// 2 per multiply-add for matmuls ("GEMM", tensor cores under bf16/fp16); one per arithmetic
// operation for everything else ("other", the FP32 units), exp, rsqrt and division counted as one.
// Each component's derivation is written beside it in traffic.cpp.
//
// Matmul FLOPs agree with cost/flops.h: each row's `model_flops` is its share of
// flops_per_token() x tokens (forward) and twice that (backward); what a kernel recomputes
// (flash attention's QK^T in backward, recomputation rows) is executed work beyond it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/cost/hardware.h"
#include "kiln/cost/run.h"
#include "kiln/model/llama_config.h"

namespace kiln::cost {

// When a row's work happens: forward or backward of a micro-batch, the recomputation of forward
// parts during backward, or once per optimizer step.
enum class Pass { kForward, kBackward, kRecompute, kStep };
std::string pass_name(Pass pass);  // "fwd", "bwd", "recompute", "step"

struct Cost {
  double gemm_flops = 0;   // matmuls
  double other_flops = 0;  // element-wise ops, reductions, exp
  double bytes = 0;        // compulsory device-memory traffic
  double flops() const { return gemm_flops + other_flops; }
  double intensity() const;  // FLOP per byte (0 when no bytes move)
  Cost& operator+=(const Cost& o);
  Cost scaled(double times) const;
};

struct TrafficRow {
  std::string component;  // "q_proj", "attention core", "AdamW", ...
  Pass pass = Pass::kForward;
  double repeats = 1;      // instances per optimizer step: layers x micro-batches, micro-batches, 1
  Cost kiln, eager;        // one instance
  double model_flops = 0;  // one instance: its share of cost/flops.h's count (0 for recomputation)
  bool layer = false;      // once per decoder layer
  Cost kiln_step() const { return kiln.scaled(repeats); }
  Cost eager_step() const { return eager.scaled(repeats); }
};

// The fused loss head's fp32 weight-gradient accumulator, grad_W [V, H] (ops/linear_cross_entropy.cpp,
// chunked_pass): each chunk of the micro-batch's N tokens adds its g^T h into it, and that GEMM
// reads and writes all of it whatever the chunk's size, so its traffic is 8 V H bytes per chunk:
// the loss head's term that the chunk rule sets. Where the sum starts from a zero fill (bf16/fp16
// through addmm's fp32 output) that fill writes 4 V H more; where the first chunk's product is
// written into it (fp32 matmuls) that chunk writes 4 V H and reads nothing.
struct LossHeadAccumulator {
  int64_t chunk_tokens = 0;    // rows per chunk: KernelChoices::loss_chunk_tokens, the op's own rule
  int64_t chunks = 0;          // ceil(N / chunk_tokens)
  double bytes_per_chunk = 0;  // R + W of the fp32 [V, H]: 8 V H
  double bytes = 0;            // per micro-batch: 4 V H + 8 V H x (chunks, or chunks - 1 when written first)
};
// `zero_filled`: the sum starts from zeros (the low-precision head's fp32-output GEMM).
LossHeadAccumulator loss_head_accumulator(int64_t tokens, int64_t vocab, int64_t hidden, int64_t chunk_tokens,
                                          bool zero_filled);

struct TrafficReport {
  model::LlamaConfig model;
  RunDescription run;
  int64_t num_parameters = 0;
  double tokens_per_step = 0;  // batch x cutoff_len x gradient_accumulation_steps (per rank)
  std::vector<TrafficRow> rows;
  // kiln's fused loss head, per micro-batch (its bytes are part of the "LM head + loss" backward
  // row); all zero when the head is ATen's full-logits chain. Per step: bytes x gradient_accumulation_steps.
  LossHeadAccumulator loss_head_accumulator;
  Cost kiln_step() const;
  Cost eager_step() const;
  double model_flops_step() const;
  // The rows of a component ("q_proj") and pass, summed per step.
  Cost kiln_step(const std::string& component, Pass pass) const;
  const TrafficRow* find(const std::string& component, Pass pass) const;
};

// What the eager column models (the `eager` Cost of every row). The default is modeling_llama.py
// with attn_implementation="eager" (the T x T scores materialised). The reference stack
// (cost/reference.h: LLaMA-Factory 0.9 on transformers 4.45, what the reference runs ran) takes
// transformers' SDPA path instead: K and V repeated to every head (repeat_kv's copies), then
// ATen's fused SDPA on the projections' dtype (no casts: autocast's SDPA inputs already are), and
// its loss upcasts the logits and copies the shifted ones (`shift_logits.contiguous()`) before
// cross_entropy.
struct EagerStack {
  bool sdpa_attention = false;
  bool shifted_logits_copy = false;
};

// GEMM operand re-reads past the L2 (0 = compulsory traffic only, the default).
// A tiled GEMM C [M, N] = A [M, K] B [K, N] computes C in tm x tn output tiles, each reading a
// tm x K slice of A and a K x tn slice of B (NVIDIA, Deep Learning Performance documentation,
// "Matrix Multiplication Background User's Guide"). The SMs run one tile each at a time, a wave of
// `sms` tiles that the kernel's raster keeps together as a block of about sqrt(sms) x sqrt(sms)
// tiles sharing their slices through the L2 (sms 0: one tile at a time). A is read once per column
// of such blocks and B once per row of them unless the L2 keeps one operand. With e-byte elements,
// bytes_A = e M K and bytes_B = e K N, w = ceil(sqrt(sms)) (1 without sms):
//   - min(bytes_A, bytes_B) <= l2_bytes / 2: no re-reads (the smaller operand stays resident while
//     the other streams through once);
//   - else min(bytes_A (ceil(N / (w tn)) - 1), bytes_B (ceil(M / (w tm)) - 1)): the cheaper of
//     re-reading A for every further block column or B for every further block row.
// A step function of the L2's size, so a smaller L2 never gives fewer bytes. Set l2_bytes and sms
// to HardwareSpec's (cost/hardware.h) to model a device. It applies to every projection GEMM
// (forward and its two backward GEMMs) and to the full-logits LM head (the eager column's, and
// kiln's under linear_ce=aten); kiln's chunked loss head and attention keep compulsory bytes.
// With l2_bytes and sms, the full-logits head's log_softmax also repeats its passes over rows in
// DRAM when a row per SM exceeds the L2 (traffic.cpp, "LM head + loss").
struct GemmDram {
  double l2_bytes = 0;
  double tile_m = 128, tile_n = 128;
  double sms = 0;
};

// The re-read bytes of one GEMM C [m, n] = A [m, k] B [k, n] of e-byte elements under `dram`'s
// rule (0 when dram.l2_bytes is 0). Throws std::invalid_argument for a negative L2 or a tile
// dimension under 1.
double gemm_reread_bytes(double m, double k, double n, double e, const GemmDram& dram);

// One optimizer step of `run` (cost/run.h): per micro-batch its shapes, dtype, recomputation and
// kernels; per step its accumulation, clipping and data parallelism. `dram` adds the GEMMs'
// re-reads past an L2 (GemmDram); the default keeps the compulsory bytes.
TrafficReport traffic_model(const model::LlamaConfig& config, const RunDescription& run, const EagerStack& eager = {},
                            const GemmDram& dram = {});

// The roofline of a device for a compute dtype.
struct Roofline {
  std::string device;
  double gemm_flops_per_s = 0;   // matmuls: the dtype's peak (tensor cores for bf16/fp16)
  double other_flops_per_s = 0;  // everything else: the FP32 units
  double bandwidth = 0;          // bytes/s
  bool tensor_cores = false;     // the GEMMs run on tensor cores (not fp32, not bf16 on a V100; AMX on a CPU)
  // FLOP per byte where a pure GEMM turns from memory- to compute-bound: peak / bandwidth.
  double ridge() const { return gemm_flops_per_s / bandwidth; }
  double compute_seconds(const Cost& c) const;
  double memory_seconds(const Cost& c) const { return c.bytes / bandwidth; }
  // max(compute, memory): each kernel is either bound, none overlaps another.
  double seconds(const Cost& c) const;
  bool memory_bound(const Cost& c) const { return memory_seconds(c) > compute_seconds(c); }
};

Roofline roofline(const HardwareSpec& hardware, const std::string& dtype);

// The step's modelled time: every row at its roofline time, summed.
double modelled_step_seconds(const TrafficReport& report, const Roofline& roof, bool eager = false);

// The three counter columns of a user's resource table (memory bandwidth, tensor core, fp engine), modelled for a step
// that took `seconds_per_step` (measured): fractions of the peaks, from kiln's rows (or the eager step's, to read a
// transformers run's counters against).
struct ModelledUtilisation {
  double memory_bandwidth = 0;  // bytes per step / seconds / bandwidth
  double tensor_core = 0;       // GEMM FLOPs at the tensor-core peak / seconds (0 without tensor cores)
  double fp_engine = 0;  // non-GEMM FLOPs at the FP32 peak (+ GEMMs at the dtype's peak without tensor cores) / seconds
};
ModelledUtilisation modelled_utilisation(const TrafficReport& report, const Roofline& roof, double seconds_per_step,
                                         bool eager = false);

// "flash" when kiln's flash-attention kernels run for this head_dim and dtype on `hardware`
// (kernels/flash_attention.cu, flash_supported, and its shared memory within the device's
// opt-in: sm_80+ bf16/fp16 at head_dim 64 and 128; a V100 fp16 at 64 only), else "sdpa".
std::string kiln_attention_path(bool kiln_kernel_chosen, const HardwareSpec& hardware, const std::string& dtype,
                                int64_t head_dim);

}  // namespace kiln::cost
