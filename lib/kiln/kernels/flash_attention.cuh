// Flash-attention launchers (FlashAttention-2 algorithm, ops/flash_attention.h documents it):
// tensor-core tiles (WMMA bf16/fp16 -> fp32, i.e. mma.sync), online softmax, no T x S matrix in
// memory. The forward writes the output and the log-sum-exp; the backward recomputes the
// probabilities from it. Torch-free.
#pragma once

#include <cstddef>

#include "kiln/kernels/common.cuh"

namespace kiln::kernels {

struct FlashShape {
  int batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 0;
  bool causal = true;                // bottom-right aligned: query i sees keys <= seq_k - seq_q + i
  const int* segment_ids = nullptr;  // [B, T] int32, optional (needs seq_q == seq_k): same id or masked
  DType dtype = DType::kBFloat16;    // bf16 or fp16 (fp32 is not supported by the tensor-core path)
  // The compute capability (major * 10 + minor) the launch plans for: 80 and up, the cp.async
  // kernels (bf16 or fp16); 70 to 79, the Volta kernels (plain loads, fp16 only); below, none.
  // The caller may plan for a lower one than the device's (KILN_KERNEL_ARCH, ops/cuda_arch.h).
  int arch = 80;
  // Packed documents on the sm_80 kernels: a [B, ceil(seq_k / 64), 2] int32 workspace (size:
  // flash_doc_ranges_ints) that the launchers fill with each 64-key tile's min and max segment
  // id; a (query tile, key tile) pair whose ranges cannot meet is then skipped, not masked.
  // Optional: without it every tile is computed and masked.
  int* doc_ranges = nullptr;
  // Optional (tests): the forward adds the number of (query tile, key tile) pairs it computes.
  int* tiles_done = nullptr;
};

struct FlashFwdParams : FlashShape {
  const void* q = nullptr;  // [B, Hq, T, D] contiguous
  const void* k = nullptr;  // [B, Hkv, S, D] contiguous
  const void* v = nullptr;  // [B, Hkv, S, D] contiguous
  void* out = nullptr;      // [B, Hq, T, D] contiguous
  float* lse = nullptr;     // [B, Hq, T]; +inf for a row that sees no key (its output is 0)
};

struct FlashBwdParams : FlashShape {
  const void *q = nullptr, *k = nullptr, *v = nullptr;  // as in the forward
  const void* out = nullptr;                            // [B, Hq, T, D], the forward's output
  const void* dout = nullptr;                           // [B, Hq, T, D] contiguous
  const float* lse = nullptr;                           // [B, Hq, T], the forward's
  float* delta = nullptr;                               // [B, Hq, T] workspace: rowsum(dout * out)
  float* dq_accum = nullptr;  // [B, Hq, T, D] fp32 workspace, zeroed by the caller (unused if deterministic)
  void* dq = nullptr;         // [B, Hq, T, D]
  void* dk = nullptr;         // [B, Hkv, S, D]: summed over the query heads of each group
  void* dv = nullptr;         // [B, Hkv, S, D]
  // false: dq is accumulated with fp32 atomics by the dk/dv kernel (fast; the summation order
  // varies run to run). true: a second kernel recomputes the tiles per query block and writes dq
  // in a fixed order (bit-reproducible, ~1.4x the backward's matmuls).
  bool deterministic = false;
};

// True when the kernels handle this shape (bf16/fp16 from arch 80, fp16 from 70, head_dim 64 or
// 128, Hkv dividing Hq, seq_k >= seq_q when causal, seq_q == seq_k with segment ids).
bool flash_supported(const FlashShape& shape);

// Dynamic shared memory per block the kernels for this head_dim (64 or 128) and compute
// capability need, forward or backward, whichever is more. The Volta kernels (arch < 80) need
// 88 KiB at 64 and 144 KiB at 128, so on a V100 (96 KiB) head_dim 128 runs the ATen path.
size_t flash_smem_bytes(int head_dim, int arch);

// The int32 count of FlashShape::doc_ranges for this batch and key length.
size_t flash_doc_ranges_ints(int batch, int seq_k);

void launch_flash_fwd(const FlashFwdParams& params, Stream stream);
void launch_flash_bwd(const FlashBwdParams& params, Stream stream);

}  // namespace kiln::kernels
