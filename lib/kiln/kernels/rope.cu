// RoPE in place: one thread per (b, h, t, i < D/2) pair, reading x[i], x[i + D/2] and the table
// entries once and writing both results (and, out of place, autocast's mixed form: rope.cuh).
// Forward keeps the reference's rounding
//   y = T( float(T(x * cos)) + float(T(rotate_half(x) * sin)) )
// and the backward applies the transposed rotation with the same rounding pattern. A pair's
// (b, h, t, i) comes from its flat index by three divisions, in 32 bits while the pairs fit (a
// GPU's 64-bit division is a long instruction sequence, and these kernels are memory-bound).
#ifndef KILN_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>

#include "kiln/kernels/rope.cuh"

namespace KILN_KERNELS_NS {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ T mul(T a, T b) {
  return static_cast<T>(static_cast<float>(a) * static_cast<float>(b));
}
template <typename T>
__device__ __forceinline__ T add(T a, T b) {
  return static_cast<T>(static_cast<float>(a) + static_cast<float>(b));
}

// A pair's coordinates from its flat index: idx = ((b * heads + h) * seq + t) * half + i.
struct Pair {
  int64_t b, h, t, i;
};
template <typename Index>
__device__ __forceinline__ Pair pair_of(Index idx, Index half, Index seq, Index heads) {
  const Index row = idx / half, bh = row / seq, b = bh / heads;
  return {static_cast<int64_t>(b), static_cast<int64_t>(bh - b * heads), static_cast<int64_t>(row - bh * seq),
          static_cast<int64_t>(idx - row * half)};
}

// Runs f(pair, table offset) for every pair of a [batch, heads, seq, dim] tensor this thread owns
// (a grid-stride loop over the flat pair index, in Index arithmetic). Both kernels' loop.
template <typename Index, typename F>
__device__ __forceinline__ void for_each_pair(int64_t batch, int64_t heads_, int64_t seq_, int64_t dim,
                                              bool table_batched, F f) {
  const Index half = static_cast<Index>(dim / 2), seq = static_cast<Index>(seq_), heads = static_cast<Index>(heads_);
  const Index total = static_cast<Index>(batch) * heads * seq * half;
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index idx = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += stride) {
    const Pair q = pair_of(idx, half, seq, heads);
    f(q, ((table_batched ? q.b : 0) * seq_ + q.t) * dim);
  }
}

// Whether `pairs` are indexed in 32 bits: below the limit, with room for a grid stride past it.
inline bool narrow_index(int64_t pairs, int64_t limit) {
  return pairs < std::min<int64_t>(limit, int64_t{1} << 30);
}

// One thread per pair, at most 8 x 65535 blocks (then grid-stride).
inline unsigned grid_for(int64_t pairs) {
  return static_cast<unsigned>(std::min<int64_t>((pairs + kThreads - 1) / kThreads, 65535 * 8));
}

template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeParams p) {
  const int64_t half = p.dim / 2;
  for_each_pair<Index>(p.batch, p.heads, p.seq, p.dim, p.table_batched, [&](const Pair& q, int64_t table) {
    const int64_t i = q.i;
    T* row = static_cast<T*>(p.x) + q.b * p.stride_b + q.h * p.stride_h + q.t * p.stride_t;
    const T* c = static_cast<const T*>(p.cos) + table;
    const T* s = static_cast<const T*>(p.sin) + table;
    const T x1 = row[i], x2 = row[i + half];
    const T neg_x1 = static_cast<T>(-static_cast<float>(x1)), neg_x2 = static_cast<T>(-static_cast<float>(x2));
    if (!p.backward) {
      // y1 = x1 c1 - x2 s1, y2 = x2 c2 + x1 s2
      row[i] = add(mul(x1, c[i]), mul(neg_x2, s[i]));
      row[i + half] = add(mul(x2, c[i + half]), mul(x1, s[i + half]));
    } else {
      // dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1
      row[i] = add(mul(x1, c[i]), mul(x2, s[i + half]));
      row[i + half] = add(mul(x2, c[i + half]), mul(neg_x1, s[i]));
    }
  });
}

// The mixed form: one thread per pair, as rope_kernel. __fmul_rn / __fadd_rn keep each fp32
// product and sum rounded on its own (no FMA contraction), as ATen's separate ops round them.
template <typename T, typename Index>
__global__ void __launch_bounds__(kThreads) rope_mixed_kernel(RopeMixedParams p) {
  const int64_t half = p.dim / 2;
  for_each_pair<Index>(p.batch, p.heads, p.seq, p.dim, p.table_batched, [&](const Pair& q, int64_t table) {
    const int64_t i = q.i;
    const int64_t src = q.b * p.src_stride[0] + q.h * p.src_stride[1] + q.t * p.src_stride[2];
    const int64_t dst = q.b * p.dst_stride[0] + q.h * p.dst_stride[1] + q.t * p.dst_stride[2];
    const float* c = p.cos + table;
    const float* s = p.sin + table;
    if (!p.backward) {
      // y1 = x1 c1 + (-x2) s1, y2 = x2 c2 + x1 s2, in fp32
      const T* x = static_cast<const T*>(p.src) + src;
      float* y = static_cast<float*>(p.dst) + dst;
      const float x1 = static_cast<float>(x[i]), x2 = static_cast<float>(x[i + half]);
      y[i] = __fadd_rn(__fmul_rn(x1, c[i]), __fmul_rn(-x2, s[i]));
      y[i + half] = __fadd_rn(__fmul_rn(x2, c[i + half]), __fmul_rn(x1, s[i + half]));
    } else {
      // dx1 = T(T(dy1 c1) + T(dy2 s2)), dx2 = T(T(dy2 c2) - T(dy1 s1))
      const float* dy = static_cast<const float*>(p.src) + src;
      T* dx = static_cast<T*>(p.dst) + dst;
      const float d1 = dy[i], d2 = dy[i + half];
      const float a1 = static_cast<float>(static_cast<T>(__fmul_rn(d1, c[i])));
      const float b1 = static_cast<float>(static_cast<T>(__fmul_rn(d2, s[i + half])));
      const float a2 = static_cast<float>(static_cast<T>(__fmul_rn(d2, c[i + half])));
      const float b2 = static_cast<float>(static_cast<T>(__fmul_rn(d1, s[i])));
      dx[i] = static_cast<T>(__fadd_rn(a1, b1));
      dx[i + half] = static_cast<T>(__fadd_rn(a2, -b2));
    }
  });
}

}  // namespace

void launch_rope_mixed(const RopeMixedParams& p, Stream stream) {
  const int64_t total = p.batch * p.heads * p.seq * (p.dim / 2);
  if (total == 0) return;
  const unsigned grid = grid_for(total);
  const bool narrow = narrow_index(total, p.narrow_index_limit);
  if (p.dtype == DType::kFloat16) {
    const auto kernel = narrow ? rope_mixed_kernel<__half, uint32_t> : rope_mixed_kernel<__half, int64_t>;
    KILN_LAUNCH(kernel, grid, kThreads, 0, stream, p);
  } else {
    const auto kernel = narrow ? rope_mixed_kernel<__nv_bfloat16, uint32_t> : rope_mixed_kernel<__nv_bfloat16, int64_t>;
    KILN_LAUNCH(kernel, grid, kThreads, 0, stream, p);
  }
}

void launch_rope(const RopeParams& p, Stream stream) {
  const int64_t total = p.batch * p.heads * p.seq * (p.dim / 2);
  if (total == 0) return;
  const unsigned grid = grid_for(total);
  const bool narrow = narrow_index(total, p.narrow_index_limit);
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    const auto kernel = narrow ? rope_kernel<T, uint32_t> : rope_kernel<T, int64_t>;
    KILN_LAUNCH(kernel, grid, kThreads, 0, stream, p);
  });
}

}  // namespace KILN_KERNELS_NS
