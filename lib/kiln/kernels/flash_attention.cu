// Flash attention (FlashAttention-2's algorithm; docs/attention.md): the launchers, and two
// generations of kernels, chosen at launch from FlashShape::arch:
//   sm_80 and later, bf16/fp16: flash_attention_fwd.cuh and flash_attention_bwd.cuh, in
//     ldmatrix and mma.sync.m16n8k16 (kernels/mma.cuh) with the softmax in registers;
//   sm_70 (Volta), fp16: the first generation, below, on WMMA tiles (the C++ face of Volta's
//     16x16x16 fp16 tensor-core op, fp32 accumulate), which Volta can run: it has no ldmatrix,
//     no m16n8k16, no bf16 and no cp.async. At head_dim 64 its blocks need 88 KiB of shared
//     memory, within the 96 KiB a V100 block may opt in to; at 128 they need 144 KiB, so there
//     the ATen path runs.
// A kernel that does not exist on the architecture being compiled (the sm_80 ones, or bf16,
// below sm_80) compiles to a trap, and the launcher never selects it there.
//
// The Volta kernels. Forward: one CTA = 64 query rows of one (batch, query head); 4 warps of 16
//   rows each. Per key tile of 64 (double-buffered: tile j + 1 is loaded before tile j is used):
//   S = Q K^T (fp32, shared memory), per-row online softmax by the warp (running max m,
//   denominator l, rescale alpha), P in the input dtype, O = alpha * O + P V with O in fp32 shared
//   memory (a fragment's element-to-row mapping is unspecified, and rows must be rescaled).
//   Writes O / l and lse = m + log l.
// Backward: D = rowsum(dO * O) first (one warp per row; both generations). Then one CTA per 64
//   keys of one (batch, KV head), warp w owning keys 16w..16w+15, loops over every query head of
//   its group and every query tile that can see its keys: S^T = K Q^T, dP^T = V dO^T,
//   P^T = exp(S^T - lse), dS^T = P^T (dP^T - D); dV += P^T dO and dK += dS^T Q stay in registers
//   (WMMA accumulators) for the whole loop, so GQA's sum over the group needs no atomics and K/V
//   are never repeated. dQ += dS K is either added to an fp32 buffer with atomics (default) or,
//   deterministic, computed by a second kernel per 64 queries that recomputes the tiles over the
//   keys in order.
// GQA: query head hq reads KV head hq / (Hq / Hkv). Causal tiles entirely past the diagonal are
// skipped in all three loops. Segment ids (packed documents) mask pairs whose ids differ.
// 16-bit tiles are stored with 8 elements of padding per row against shared-memory bank
// conflicts (WMMA wants ld % 8 == 0 and 32-byte aligned tile starts: both hold).
#include "kiln/kernels/flash_attention.cuh"

#ifndef KILN_CUDA_EMULATION
#include <cuda_runtime.h>
#include <mma.h>
#endif

#include <algorithm>
#include <cfloat>
#include <climits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kiln/kernels/mma.cuh"

namespace KILN_KERNELS_NS {
namespace {

using namespace nvcuda;

constexpr int kBlock = 64;  // query and key tile
constexpr int kWarps = 4, kThreads = kWarps * 32, kRows = 16;
constexpr int kLdP = kBlock + 8;  // 16-bit [rows x 64] tiles (P, dS)

template <int D>
constexpr int kLd = D + 8;  // 16-bit [64 x D] tiles (Q, K, V, dO)

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Whether this compilation pass has the Volta kernels for T: an sm_70 pass only fp16 (Volta's
// tensor cores have no bf16); later passes both (KILN_KERNEL_ARCH=70 runs them on an A100/H100).
template <typename T>
__host__ __device__ constexpr bool volta_variant_compiled() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return std::is_same_v<T, __half>;
#else
  return true;
#endif
}

// 16 bytes of a tile: a plain load and store (Volta has no cp.async), zero past the end.
__device__ __forceinline__ void copy16(void* smem, const void* gmem, bool valid) {
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
}

// Starts copying rows [row0, row0 + 64) of a [rows, D] matrix into a [64 x kLd<D>] tile; rows
// past `rows` become zero.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int row0, int rows) {
  constexpr int kVec = 8, kChunks = D / kVec;  // 16 bytes of 16-bit values
  for (int i = threadIdx.x; i < kBlock * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks * kVec;
    const bool valid = row0 + r < rows;
    copy16(dst + r * kLd<D> + c, valid ? src + size_t(row0 + r) * D + c : src, valid);
  }
}

// Segment ids of rows [row0, row0 + 64) into shared memory; `pad` past the end.
__device__ __forceinline__ void load_segments(int* dst, const int* seg, int row0, int rows, int pad) {
  if (seg != nullptr && threadIdx.x < kBlock) {
    const int r = row0 + threadIdx.x;
    dst[threadIdx.x] = r < rows ? seg[r] : pad;
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// out[16 x 64] (fp32, ld 64) = A[16 x D] * B[64 x D]^T; A and B 16-bit row-major tiles.
template <typename T, int D>
__device__ __forceinline__ void mma_abt(float* out, const T* a, int lda, const T* b, int ldb) {
#pragma unroll 1
  for (int n = 0; n < kBlock / 16; ++n) {
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;  // B^T: B row-major is B^T column-major
      wmma::load_matrix_sync(fa, a + kk * 16, lda);
      wmma::load_matrix_sync(fb, b + n * 16 * ldb + kk * 16, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kBlock, wmma::mem_row_major);
  }
}

// acc[n] += A[16 x 64] * B[64 x D] (B a 16-bit row-major tile). A is 16-bit, row-major
// (A(r, c) = a[r * lda + c]) or column-major (A(r, c) = a[r + c * lda]).
template <typename T, int D, typename ALayout>
__device__ __forceinline__ void mma_acc(Acc (&acc)[D / 16], const T* a, int lda, const T* b, int ldb) {
#pragma unroll 1
  for (int kk = 0; kk < kBlock / 16; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, ALayout> fa;
    wmma::load_matrix_sync(fa, std::is_same_v<ALayout, wmma::row_major> ? a + kk * 16 : a + kk * 16 * lda, lda);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's [16 x D] accumulator rows row0.. (those < rows) to dst [rows, D] as T,
// times `scale`, through the warp's fp32 scratch (16 * D floats).
template <typename T, int D>
__device__ __forceinline__ void store_rows(const Acc (&acc)[D / 16], float* scratch, float scale, T* dst, int row0,
                                           int rows) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::store_matrix_sync(scratch + n * 16, acc[n], D, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < kRows * D; i += 32) {
    const int r = row0 + i / D;
    if (r < rows) dst[size_t(r) * D + i % D] = static_cast<T>(scratch[i] * scale);
  }
  __syncwarp();
}

// Bump allocator over dynamic shared memory; every region starts 128-byte aligned.
struct SmemCursor {
  unsigned char* at;
  template <typename U>
  __device__ U* take(size_t count) {
    U* p = reinterpret_cast<U*>(at);
    at += (count * sizeof(U) + 127) / 128 * 128;
    return p;
  }
};
__host__ __device__ constexpr size_t rounded(size_t bytes) {
  return (bytes + 127) / 128 * 128;
}

// ------------------------------------------------------------------------------------------------
// Forward

template <int D>
constexpr size_t fwd_smem_bytes() {
  return 5 * rounded(size_t(kBlock) * kLd<D> * 2)        // Q, K x2, V x2
         + rounded(size_t(kWarps) * kRows * kBlock * 4)  // S (fp32) per warp
         + rounded(size_t(kWarps) * kRows * kLdP * 2)    // P per warp
         + rounded(size_t(kWarps) * kRows * D * 4)       // O (fp32) per warp
         + rounded(size_t(kWarps) * kRows * 3 * 4)       // m, l, alpha per row
         + 3 * rounded(kBlock * 4);                      // segment ids: queries, keys x2
}

template <typename T, int D>
__device__ __forceinline__ void flash_fwd_body(const FlashFwdParams& p) {
  KILN_DYNAMIC_SMEM(smem);
  constexpr int kLdT = kLd<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  SmemCursor cur{smem};
  T* q_s = cur.take<T>(kBlock * kLdT);
  // Two buffers each, adjacent (rounded() is a no-op for these 32-byte-multiple sizes), picked
  // by offset rather than through a pointer array, which would live in local memory.
  T* k_s2 = cur.take<T>(2 * kBlock * kLdT);
  T* v_s2 = cur.take<T>(2 * kBlock * kLdT);
  float* s_w = cur.take<float>(kWarps * kRows * kBlock) + warp * kRows * kBlock;
  T* p_w = cur.take<T>(kWarps * kRows * kLdP) + warp * kRows * kLdP;
  float* o_w = cur.take<float>(kWarps * kRows * D) + warp * kRows * D;
  float* m_row = cur.take<float>(kWarps * kRows * 3) + warp * kRows * 3;
  float* l_row = m_row + kRows;
  float* alpha_row = m_row + 2 * kRows;
  int* qseg_s = cur.take<int>(kBlock);
  int* kseg_s2 = cur.take<int>(2 * kBlock);

  const int bh = blockIdx.y, b = bh / p.heads_q, hq = bh % p.heads_q;
  const int hkv = hq / (p.heads_q / p.heads_kv);
  const int q0 = blockIdx.x * kBlock;
  const T* q = static_cast<const T*>(p.q) + size_t(bh) * p.seq_q * D;
  const T* k = static_cast<const T*>(p.k) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const T* v = static_cast<const T*>(p.v) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const int* seg = p.segment_ids != nullptr ? p.segment_ids + size_t(b) * p.seq_k : nullptr;
  const int offset = p.seq_k - p.seq_q;  // causal alignment: query i sees keys <= i + offset
  const int k_end = p.causal ? min(p.seq_k, q0 + kBlock + offset) : p.seq_k;

  load_tile<T, D>(q_s, q, q0, p.seq_q);
  load_tile<T, D>(k_s2, k, 0, p.seq_k);
  load_tile<T, D>(v_s2, v, 0, p.seq_k);
  load_segments(qseg_s, seg, q0, p.seq_q, -1);
  load_segments(kseg_s2, seg, 0, p.seq_k, -2);
  for (int i = lane; i < kRows * D; i += 32) o_w[i] = 0.f;
  if (lane < kRows) {
    m_row[lane] = -FLT_MAX;
    l_row[lane] = 0.f;
  }

  for (int k0 = 0, it = 0; k0 < k_end; k0 += kBlock, ++it) {
    const int buf = it & 1, next = buf ^ 1;
    T* k_s = k_s2 + buf * kBlock * kLdT;
    T* v_s = v_s2 + buf * kBlock * kLdT;
    const int* kseg_s = kseg_s2 + buf * kBlock;
    if (k0 + kBlock < k_end) {  // prefetch the next tile into the other buffer
      load_tile<T, D>(k_s2 + next * kBlock * kLdT, k, k0 + kBlock, p.seq_k);
      load_tile<T, D>(v_s2 + next * kBlock * kLdT, v, k0 + kBlock, p.seq_k);
      load_segments(kseg_s2 + next * kBlock, seg, k0 + kBlock, p.seq_k, -2);
    }
    __syncthreads();

    mma_abt<T, D>(s_w, q_s + warp * kRows * kLdT, kLdT, k_s, kLdT);  // S = Q_w K^T
    __syncwarp();

    // Online softmax, one row at a time; lane covers columns lane and lane + 32.
    for (int r = 0; r < kRows; ++r) {
      const int row = warp * kRows + r, qi = q0 + row;
      float s[2];
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j, ki = k0 + c;
        const bool masked =
            ki >= p.seq_k || (p.causal && ki > qi + offset) || (seg != nullptr && qseg_s[row] != kseg_s[c]);
        s[j] = masked ? -INFINITY : s_w[r * kBlock + c] * p.scale;
      }
      const float m_old = m_row[r];
      // m starts at -FLT_MAX, not -inf, so a row whose keys are all masked so far gives
      // exp(-inf - m) = 0 rather than exp(-inf + inf) = NaN.
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s[0], s[1])));
      const float p0 = __expf(s[0] - m_new), p1 = __expf(s[1] - m_new);
      const float sum = warp_sum(p0 + p1);
      p_w[r * kLdP + lane] = static_cast<T>(p0);
      p_w[r * kLdP + lane + 32] = static_cast<T>(p1);
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_old == -FLT_MAX ? 0.f : __expf(m_old - m_new);
        alpha_row[r] = alpha;
        l_row[r] = l_row[r] * alpha + sum;
        m_row[r] = m_new;
      }
      __syncwarp();
    }
    for (int i = lane; i < kRows * D; i += 32) o_w[i] *= alpha_row[i / D];
    __syncwarp();

    // O_w += P V: [16 x 64] x [64 x D], accumulators loaded from and stored back to o_w.
    for (int n = 0; n < D / 16; ++n) {
      Acc acc;
      wmma::load_matrix_sync(acc, o_w + n * 16, D, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBlock / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, p_w + kk * 16, kLdP);
        wmma::load_matrix_sync(fb, v_s + kk * 16 * kLdT + n * 16, kLdT);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o_w + n * 16, acc, D, wmma::mem_row_major);
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  // out = O / l, lse = m + log(l), for the rows that exist; a row that saw no key gets out = 0
  // and lse = +inf (so the backward's exp(s - lse) is 0 there).
  T* out = static_cast<T*>(p.out) + size_t(bh) * p.seq_q * D;
  for (int r = 0; r < kRows; ++r) {
    const int qi = q0 + warp * kRows + r;
    if (qi >= p.seq_q) break;
    const float l = l_row[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int c = lane; c < D; c += 32) out[size_t(qi) * D + c] = static_cast<T>(o_w[r * D + c] * inv);
    if (lane == 0) p.lse[size_t(bh) * p.seq_q + qi] = l > 0.f ? m_row[r] + __logf(l) : INFINITY;
  }
}

// ------------------------------------------------------------------------------------------------
// Backward

// delta[row] = sum_d dout[row, d] * out[row, d] in fp32; one warp per row.
template <typename T, int D>
__global__ void __launch_bounds__(256) flash_bwd_delta_kernel(const T* out, const T* dout, float* delta, size_t rows) {
  const size_t row = size_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float acc = 0.f;
  for (int c = lane; c < D; c += 32) {
    acc += static_cast<float>(out[row * D + c]) * static_cast<float>(dout[row * D + c]);
  }
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

// dq = dq_accum * scale in T.
template <typename T>
__global__ void flash_bwd_dq_convert_kernel(const float* acc, T* dq, float scale, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dq[i] = static_cast<T>(acc[i] * scale);
  }
}

template <int D>
constexpr size_t bwd_smem_bytes() {
  return 4 * rounded(size_t(kBlock) * kLd<D> * 2)             // K, V, Q, dO tiles
         + 4 * rounded(kBlock * 4)                            // lse, delta, segment ids (q, k)
         + rounded(size_t(kBlock) * kLdP * 2)                 // dS^T (CTA-wide; dK/dV kernel)
         + rounded(size_t(kWarps) * kRows * kLdP * 2)         // P or dS per warp
         + rounded(size_t(kWarps) * 2 * kRows * kBlock * 4);  // fp32 scratch per warp (>= 16 * D)
}

// The backward kernels' shared memory, one carve-up for both (bwd_smem_bytes sizes it).
template <typename T, int D>
struct BwdSmem {
  T *k_s, *v_s, *q_s, *do_s;
  float *lse_s, *delta_s;
  int *qseg_s, *kseg_s;
  T* ds_s;     // [64 keys x kLdP] dS^T, CTA-wide
  T* tile_w;   // [16 x kLdP] this warp's P (dK/dV kernel) or dS (dQ kernel)
  float* f_w;  // [2 x 16 x 64] this warp's fp32 scratch
  __device__ BwdSmem(unsigned char* smem, int warp) {
    static_assert(2 * kBlock >= D, "the per-warp fp32 scratch must hold 16 x D");
    SmemCursor cur{smem};
    k_s = cur.take<T>(kBlock * kLd<D>);
    v_s = cur.take<T>(kBlock * kLd<D>);
    q_s = cur.take<T>(kBlock * kLd<D>);
    do_s = cur.take<T>(kBlock * kLd<D>);
    lse_s = cur.take<float>(kBlock);
    delta_s = cur.take<float>(kBlock);
    qseg_s = cur.take<int>(kBlock);
    kseg_s = cur.take<int>(kBlock);
    ds_s = cur.take<T>(kBlock * kLdP);
    tile_w = cur.take<T>(kWarps * kRows * kLdP) + warp * kRows * kLdP;
    f_w = cur.take<float>(kWarps * 2 * kRows * kBlock) + warp * 2 * kRows * kBlock;
  }
};

template <typename T, int D, bool kAtomicDQ>
__device__ __forceinline__ void flash_bwd_dkdv_body(const FlashBwdParams& p) {
  KILN_DYNAMIC_SMEM(smem);
  constexpr int kLdT = kLd<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BwdSmem<T, D> sm(smem, warp);
  T *k_s = sm.k_s, *v_s = sm.v_s, *q_s = sm.q_s, *do_s = sm.do_s;
  float *lse_s = sm.lse_s, *delta_s = sm.delta_s;
  int *qseg_s = sm.qseg_s, *kseg_s = sm.kseg_s;
  T* ds_s = sm.ds_s;  // dS^T: row = key, column = query
  T* p_w = sm.tile_w;
  float* f_w = sm.f_w;
  float* st_w = f_w;                    // S^T [16 x 64]
  float* dpt_w = f_w + kRows * kBlock;  // dP^T [16 x 64]

  const int bh = blockIdx.y, b = bh / p.heads_kv, hkv = bh % p.heads_kv;
  const int group = p.heads_q / p.heads_kv;
  const int k0 = blockIdx.x * kBlock;
  const size_t kv_off = (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const int* seg = p.segment_ids != nullptr ? p.segment_ids + size_t(b) * p.seq_k : nullptr;
  const int offset = p.seq_k - p.seq_q;

  load_tile<T, D>(k_s, static_cast<const T*>(p.k) + kv_off, k0, p.seq_k);
  load_tile<T, D>(v_s, static_cast<const T*>(p.v) + kv_off, k0, p.seq_k);
  load_segments(kseg_s, seg, k0, p.seq_k, -2);

  Acc dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.f);
    wmma::fill_fragment(dv[n], 0.f);
  }
  // Causal: key j is seen by queries i >= j - offset; earlier query tiles are skipped.
  const int q_begin = p.causal ? max(0, k0 - offset) / kBlock * kBlock : 0;

  for (int h = 0; h < group; ++h) {
    const size_t bhq = size_t(b) * p.heads_q + size_t(hkv) * group + h;
    const T* q = static_cast<const T*>(p.q) + bhq * p.seq_q * D;
    const T* dout = static_cast<const T*>(p.dout) + bhq * p.seq_q * D;
    const float* lse = p.lse + bhq * p.seq_q;
    const float* delta = p.delta + bhq * p.seq_q;
    for (int q0 = q_begin; q0 < p.seq_q; q0 += kBlock) {
      __syncthreads();  // the previous tile's Q, dO and dS are no longer read
      load_tile<T, D>(q_s, q, q0, p.seq_q);
      load_tile<T, D>(do_s, dout, q0, p.seq_q);
      if (threadIdx.x < kBlock) {
        const int qi = q0 + threadIdx.x;
        lse_s[threadIdx.x] = qi < p.seq_q ? lse[qi] : 0.f;
        delta_s[threadIdx.x] = qi < p.seq_q ? delta[qi] : 0.f;
      }
      load_segments(qseg_s, seg, q0, p.seq_q, -1);
      __syncthreads();

      mma_abt<T, D>(st_w, k_s + warp * kRows * kLdT, kLdT, q_s, kLdT);    // S^T = K_w Q^T
      mma_abt<T, D>(dpt_w, v_s + warp * kRows * kLdT, kLdT, do_s, kLdT);  // dP^T = V_w dO^T
      __syncwarp();
      for (int i = lane; i < kRows * kBlock; i += 32) {
        const int j = i / kBlock, c = i % kBlock;  // key row j of the warp, query column c
        const int kj = k0 + warp * kRows + j, qi = q0 + c;
        const bool masked = kj >= p.seq_k || qi >= p.seq_q || (p.causal && kj > qi + offset) ||
                            (seg != nullptr && qseg_s[c] != kseg_s[warp * kRows + j]);
        const float pr = masked ? 0.f : __expf(st_w[i] * p.scale - lse_s[c]);
        p_w[j * kLdP + c] = static_cast<T>(pr);
        ds_s[(warp * kRows + j) * kLdP + c] = static_cast<T>(pr * (dpt_w[i] - delta_s[c]));
      }
      __syncwarp();
      mma_acc<T, D, wmma::row_major>(dv, p_w, kLdP, do_s, kLdT);                        // dV_w += P^T dO
      mma_acc<T, D, wmma::row_major>(dk, ds_s + warp * kRows * kLdP, kLdP, q_s, kLdT);  // dK_w += dS^T Q
      if constexpr (kAtomicDQ) {
        __syncthreads();  // every warp's dS^T rows are written
        // dQ rows 16w.. of this tile = dS[16w.., all 64 keys] K; dS = (dS^T)^T is column-major.
        float* scratch = f_w;  // S^T and dP^T are consumed
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
          Acc acc;
          wmma::fill_fragment(acc, 0.f);
#pragma unroll
          for (int kk = 0; kk < kBlock / 16; ++kk) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, ds_s + kk * 16 * kLdP + warp * kRows, kLdP);
            wmma::load_matrix_sync(fb, k_s + kk * 16 * kLdT + n * 16, kLdT);
            wmma::mma_sync(acc, fa, fb, acc);
          }
          wmma::store_matrix_sync(scratch + n * 16, acc, D, wmma::mem_row_major);
        }
        __syncwarp();
        float* dq_acc = p.dq_accum + bhq * p.seq_q * D;
        for (int i = lane; i < kRows * D; i += 32) {
          const int qi = q0 + warp * kRows + i / D;
          if (qi < p.seq_q) atomicAdd(dq_acc + size_t(qi) * D + i % D, scratch[i]);
        }
        __syncwarp();
      }
    }
  }

  store_rows<T, D>(dk, f_w, p.scale, static_cast<T*>(p.dk) + kv_off, k0 + warp * kRows, p.seq_k);
  store_rows<T, D>(dv, f_w, 1.f, static_cast<T*>(p.dv) + kv_off, k0 + warp * kRows, p.seq_k);
}

// Deterministic dQ: one CTA per 64 queries of one (batch, query head), over the key tiles in order.
template <typename T, int D>
__device__ __forceinline__ void flash_bwd_dq_body(const FlashBwdParams& p) {
  KILN_DYNAMIC_SMEM(smem);
  constexpr int kLdT = kLd<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BwdSmem<T, D> sm(smem, warp);
  T *k_s = sm.k_s, *v_s = sm.v_s, *q_s = sm.q_s, *do_s = sm.do_s;
  float *lse_s = sm.lse_s, *delta_s = sm.delta_s;
  int *qseg_s = sm.qseg_s, *kseg_s = sm.kseg_s;
  T* ds_w = sm.tile_w;
  float* f_w = sm.f_w;
  float* s_w = f_w;
  float* dp_w = f_w + kRows * kBlock;

  const int bh = blockIdx.y, b = bh / p.heads_q, hq = bh % p.heads_q;
  const int hkv = hq / (p.heads_q / p.heads_kv);
  const int q0 = blockIdx.x * kBlock;
  const size_t q_off = size_t(bh) * p.seq_q * D;
  const size_t kv_off = (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const T* k = static_cast<const T*>(p.k) + kv_off;
  const T* v = static_cast<const T*>(p.v) + kv_off;
  const int* seg = p.segment_ids != nullptr ? p.segment_ids + size_t(b) * p.seq_k : nullptr;
  const int offset = p.seq_k - p.seq_q;
  const int k_end = p.causal ? min(p.seq_k, q0 + kBlock + offset) : p.seq_k;

  load_tile<T, D>(q_s, static_cast<const T*>(p.q) + q_off, q0, p.seq_q);
  load_tile<T, D>(do_s, static_cast<const T*>(p.dout) + q_off, q0, p.seq_q);
  if (threadIdx.x < kBlock) {
    const int qi = q0 + threadIdx.x;
    lse_s[threadIdx.x] = qi < p.seq_q ? p.lse[size_t(bh) * p.seq_q + qi] : 0.f;
    delta_s[threadIdx.x] = qi < p.seq_q ? p.delta[size_t(bh) * p.seq_q + qi] : 0.f;
  }
  load_segments(qseg_s, seg, q0, p.seq_q, -1);

  Acc dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.f);

  for (int k0 = 0; k0 < k_end; k0 += kBlock) {
    __syncthreads();  // the previous K, V tiles are no longer read
    load_tile<T, D>(k_s, k, k0, p.seq_k);
    load_tile<T, D>(v_s, v, k0, p.seq_k);
    load_segments(kseg_s, seg, k0, p.seq_k, -2);
    __syncthreads();

    mma_abt<T, D>(s_w, q_s + warp * kRows * kLdT, kLdT, k_s, kLdT);    // S = Q_w K^T
    mma_abt<T, D>(dp_w, do_s + warp * kRows * kLdT, kLdT, v_s, kLdT);  // dP = dO_w V^T
    __syncwarp();
    for (int i = lane; i < kRows * kBlock; i += 32) {
      const int r = i / kBlock, c = i % kBlock;
      const int row = warp * kRows + r, qi = q0 + row, kj = k0 + c;
      const bool masked = kj >= p.seq_k || qi >= p.seq_q || (p.causal && kj > qi + offset) ||
                          (seg != nullptr && qseg_s[row] != kseg_s[c]);
      const float pr = masked ? 0.f : __expf(s_w[i] * p.scale - lse_s[row]);
      ds_w[r * kLdP + c] = static_cast<T>(pr * (dp_w[i] - delta_s[row]));
    }
    __syncwarp();
    mma_acc<T, D, wmma::row_major>(dq, ds_w, kLdP, k_s, kLdT);  // dQ_w += dS K
  }
  store_rows<T, D>(dq, f_w, p.scale, static_cast<T*>(p.dq) + q_off, q0 + warp * kRows, p.seq_q);
}

// ------------------------------------------------------------------------------------------------
// Kernels: each variant that exists on the architecture compiled for, else a trap.

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(FlashFwdParams p) {
  if constexpr (volta_variant_compiled<T>()) {
    flash_fwd_body<T, D>(p);
  } else {
    __trap();
  }
}

template <typename T, int D, bool kAtomicDQ>
__global__ void __launch_bounds__(kThreads, 1) flash_bwd_dkdv_kernel(FlashBwdParams p) {
  if constexpr (volta_variant_compiled<T>()) {
    flash_bwd_dkdv_body<T, D, kAtomicDQ>(p);
  } else {
    __trap();
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_bwd_dq_kernel(FlashBwdParams p) {
  if constexpr (volta_variant_compiled<T>()) {
    flash_bwd_dq_body<T, D>(p);
  } else {
    __trap();
  }
}

// ------------------------------------------------------------------------------------------------
// Launchers

// (The emulation has its own cudaFuncSetAttribute, which holds a launch to what it allowed.)
template <typename K>
void allow_smem(K kernel, size_t bytes) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it, and say what failed
    throw std::runtime_error(std::string("flash attention: cannot allow ") + std::to_string(bytes) +
                             " bytes of shared memory per block: " + cudaGetErrorString(e));
  }
}

template <typename T, int D>
void launch_fwd(const FlashFwdParams& p, Stream stream) {
  constexpr size_t bytes = fwd_smem_bytes<D>();
  const auto kernel = flash_fwd_kernel<T, D>;
  allow_smem(kernel, bytes);
  const dim3 grid((p.seq_q + kBlock - 1) / kBlock, p.batch * p.heads_q);
  KILN_LAUNCH(kernel, grid, kThreads, bytes, stream, p);
}

template <typename T, int D>
void launch_bwd(const FlashBwdParams& p, Stream stream) {
  const size_t rows = size_t(p.batch) * p.heads_q * p.seq_q;
  const auto delta_kernel = flash_bwd_delta_kernel<T, D>;
  KILN_LAUNCH(delta_kernel, static_cast<unsigned>((rows + 7) / 8), 256, 0, stream, static_cast<const T*>(p.out),
              static_cast<const T*>(p.dout), p.delta, rows);
  constexpr size_t bytes = bwd_smem_bytes<D>();
  const dim3 kv_grid((p.seq_k + kBlock - 1) / kBlock, p.batch * p.heads_kv);
  if (p.deterministic) {
    const auto dkdv = flash_bwd_dkdv_kernel<T, D, false>;
    allow_smem(dkdv, bytes);
    KILN_LAUNCH(dkdv, kv_grid, kThreads, bytes, stream, p);
    const auto dq = flash_bwd_dq_kernel<T, D>;
    allow_smem(dq, bytes);
    const dim3 q_grid((p.seq_q + kBlock - 1) / kBlock, p.batch * p.heads_q);
    KILN_LAUNCH(dq, q_grid, kThreads, bytes, stream, p);
  } else {
    const auto dkdv = flash_bwd_dkdv_kernel<T, D, true>;
    allow_smem(dkdv, bytes);
    KILN_LAUNCH(dkdv, kv_grid, kThreads, bytes, stream, p);
    const size_t n = rows * D;
    const auto convert = flash_bwd_dq_convert_kernel<T>;
    KILN_LAUNCH(convert, static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65535)), 256, 0, stream, p.dq_accum,
                static_cast<T*>(p.dq), p.scale, n);
  }
}

// Each 64-key tile's min and max segment id: one warp per tile.
__global__ void flash_doc_ranges_kernel(const int* seg, int* ranges, int seq, int tiles, int total) {
  const int tile = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (tile >= total) return;
  const int b = tile / tiles, k0 = tile % tiles * 64;
  const int* s = seg + size_t(b) * seq;
  int lo = INT_MAX, hi = INT_MIN;
  for (int i = k0 + lane; i < min(k0 + 64, seq); i += 32) {
    lo = min(lo, s[i]);
    hi = max(hi, s[i]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if (lane == 0) {
    ranges[2 * size_t(tile)] = lo;
    ranges[2 * size_t(tile) + 1] = hi;
  }
}

void launch_doc_ranges(const FlashShape& p, Stream stream) {
  if (p.segment_ids == nullptr || p.doc_ranges == nullptr) return;
  const int tiles = (p.seq_k + 63) / 64, total = p.batch * tiles;
  KILN_LAUNCH(flash_doc_ranges_kernel, static_cast<unsigned>((total + 7) / 8), 256, 0, stream, p.segment_ids,
              p.doc_ranges, p.seq_k, tiles, total);
}

}  // namespace
}  // namespace KILN_KERNELS_NS

#include "kiln/kernels/flash_attention_bwd.cuh"
#include "kiln/kernels/flash_attention_fwd.cuh"

namespace KILN_KERNELS_NS {

size_t flash_smem_bytes(int head_dim, int arch) {
  if (arch >= 80) {
    return head_dim == 64 ? std::max(FwdTile<64>::kSmemBytes, bwd_sm80_smem_bytes<64>())
                          : std::max(FwdTile<128>::kSmemBytes, bwd_sm80_smem_bytes<128>());
  }
  return head_dim == 64 ? std::max(fwd_smem_bytes<64>(), bwd_smem_bytes<64>())
                        : std::max(fwd_smem_bytes<128>(), bwd_smem_bytes<128>());
}

size_t flash_doc_ranges_ints(int batch, int seq_k) {
  return size_t(batch) * ((seq_k + 63) / 64) * 2;
}

bool flash_supported(const FlashShape& p) {
  const bool dtype_ok = p.arch >= 80 ? (p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat16)
                                     : p.arch >= 70 && p.dtype == DType::kFloat16;
  return dtype_ok && (p.head_dim == 64 || p.head_dim == 128) && p.batch > 0 && p.heads_q > 0 && p.heads_kv > 0 &&
         p.heads_q % p.heads_kv == 0 && p.seq_q > 0 && p.seq_k >= (p.causal ? p.seq_q : 1) &&
         (p.segment_ids == nullptr || p.seq_q == p.seq_k) && int64_t(p.batch) * p.heads_q <= 65535;  // gridDim.y
}

namespace {
// T from the dtype, D from the head dim, the generation from the architecture (sm_80: the
// second; below, the Volta kernels, fp16 only): six instantiations.
template <typename Params, typename Fn>
void dispatch(const Params& p, Fn&& fn) {
  const bool sm80 = p.arch >= 80;
  auto by_d = [&](auto t, auto a) {
    using T = decltype(t);
    if (p.head_dim == 64) {
      fn(T{}, std::integral_constant<int, 64>{}, a);
    } else {
      fn(T{}, std::integral_constant<int, 128>{}, a);
    }
  };
  if (p.dtype == DType::kBFloat16) {
    if (!sm80) throw std::invalid_argument("flash attention: bf16 needs compute capability 8.0 (arch < 80 given)");
    by_d(__nv_bfloat16{}, std::true_type{});
  } else if (sm80) {
    by_d(__half{}, std::true_type{});
  } else {
    by_d(__half{}, std::false_type{});
  }
}
}  // namespace

namespace {
template <typename T, int D>
void launch_fwd_sm80(const FlashFwdParams& p, Stream stream) {
  using Tile = FwdTile<D>;
  launch_doc_ranges(p, stream);
  const auto kernel = flash_fwd_sm80_kernel<T, D>;
  allow_smem(kernel, Tile::kSmemBytes);
  const dim3 grid((p.seq_q + Tile::kBlockM - 1) / Tile::kBlockM, p.batch * p.heads_q);
  KILN_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, stream, p);
}
}  // namespace

void launch_flash_fwd(const FlashFwdParams& p, Stream stream) {
  dispatch(p, [&](auto t, auto d, auto sm80) {
    if constexpr (decltype(sm80)::value) {
      launch_fwd_sm80<decltype(t), decltype(d)::value>(p, stream);
    } else {
      launch_fwd<decltype(t), decltype(d)::value>(p, stream);
    }
  });
}

void launch_flash_bwd(const FlashBwdParams& p, Stream stream) {
  dispatch(p, [&](auto t, auto d, auto sm80) {
    if constexpr (decltype(sm80)::value) {
      launch_bwd_sm80<decltype(t), decltype(d)::value>(p, stream);
    } else {
      launch_bwd<decltype(t), decltype(d)::value>(p, stream);
    }
  });
}

}  // namespace KILN_KERNELS_NS
