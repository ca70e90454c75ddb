// Memory model of a training step, per component, so a run (kiln-pretrain --dry-run) and the
// profile report can say where the bytes go before anything is allocated. Calibrated against
// the counting CPU allocator (kiln-profile, tests/profile/test_memory.cpp); docs/performance.md
// derives every coefficient from what autograd saves per op.
//
// The step's peak is the larger of two moments, on top of the fp32 parameters (4 N) and AdamW
// moments (8 N) that live throughout:
//   forward/backward boundary  every saved activation, the LM head's logits and loss tensors,
//                              and autocast's low-precision weight copies (bf16/fp16)
//   end of backward            all fp32 gradients (4 N), plus the tied embedding's second
//                              gradient while its two contributions are summed
// Per token, per decoder layer (c = compute bytes: 2 under bf16/fp16 autocast, 4 in fp32):
//   16 H                  fp32 residual input, normalised values of both RMSNorms, the residual sum
//   c (2H + 3q + 2kv)     the norms' outputs cast for the projections, q/k/v as SDPA keeps them,
//                         its output and the o_proj input
//   4 c F                 gate, silu(gate), up and their product (SwiGLU)
// Selective recomputation (activation_checkpointing with selective) keeps per layer only the
// fp32 residual input and the residual after attention (8 H), q/k/v and the attention output as
// the attention keeps them (c (2q + 2kv)) and gate and up (2 c F), whatever the kernels; plus
// c F once (the top layer's backward).
// Head per token: the final norm (4H + 4H + c H) and, per vocabulary entry, 10 bytes (fp32) or
// 16 bytes (bf16/fp16: logits, fp32 upcast, log-softmax, their gradients).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/model/llama_config.h"

namespace kiln::cost {

struct MemoryEstimate {
  std::vector<std::pair<std::string, double>> components;  // (name, bytes) at the peak
  std::string peak_phase;                                  // "forward/backward boundary" | "end of backward"
  // Extra the CUDA caching allocator reserves beyond allocated bytes (block rounding, cached
  // free blocks): a first-order allowance, not part of total(); 0 on the CPU.
  double allocator_overhead = 0;
  double total() const;
  double component(const std::string& name) const;  // 0 when absent
};

// Which implementations a step's ops run, as the memory model needs them (kiln's fused ops save
// other tensors than the ATen compositions autograd differentiates). The cost layer takes them as
// data: train/kernel_choices.h fills them from ops' own rules for a kernels spec, a compute
// dtype and a device. The default is ATen's ops throughout.
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
};

// Bytes per element of a compute dtype ("fp32": 4; "bf16", "fp16": 2, autocast over fp32 master
// weights): the one size every model of a run's memory and traffic takes. Throws
// std::invalid_argument naming the dtype for another name.
int compute_dtype_bytes(std::string_view dtype);

struct MemoryOptions {
  int compute_bytes = 4;                  // 2 for bf16/fp16 autocast (fp32 master weights), 4 for fp32
  bool activation_checkpointing = false;  // each layer keeps only its input; one layer recomputed at a time
  int checkpoint_every = 1;               // with it: layers 0, n, 2n, ... are recomputed (every_n), the rest keep all
  bool selective = false;                 // with it: policy selective instead (matmul outputs kept)
  std::string attention = "sdpa";         // sdpa (flash/memory-efficient: no T x T); math (keeps T x T probs)
  bool cuda = false;                      // adds the caching allocator's allowance
  KernelChoices kernels;                  // what the ops run (default: ATen's throughout)
  // Data parallelism (kiln/dist/data_parallel.h), per rank. Stages 0 and 1 keep every gradient in
  // one flat buffer for the whole step (the buckets' all-reduce works on it); stage 1 holds 1/world
  // of the AdamW state, stage 2 also 1/world of the gradients plus the buckets being reduced.
  bool data_parallel = false;
  int world_size = 1;
  int zero_stage = 0;
  int64_t bucket_cap_bytes = 25ll << 20;
  int max_in_flight = 2;  // stage 2: buckets in flight (DataParallelOptions::max_in_flight)
};

MemoryEstimate estimate_training_memory(const model::LlamaConfig& config, int64_t batch, int64_t seq_len,
                                        const MemoryOptions& options);

// The earlier signature (kiln-pretrain's banner): compute_bytes 2 or 4.
MemoryEstimate estimate_training_memory(const model::LlamaConfig& config, int64_t batch, int64_t seq_len,
                                        int compute_bytes, bool activation_checkpointing = false);

}  // namespace kiln::cost
