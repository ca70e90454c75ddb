// RoPE, after Liger-Kernel's rope: a block owns whole token rows (b, t), kTokensPerBlock of them,
// and rotates every head of q and then of k for each (GQA: k has its own head count and strides),
// so q and k take one launch and a token's cos/sin are read once and reused across all its heads.
// RoPE moves 2 bytes per 2 flops: it is memory-bound, and what sets its speed is how many bytes
// each SM keeps in flight. So within a token a thread owns one column of kPairs = 8 pairs (the
// 16-byte pack of x1 at i and the one of x2 at i + D/2; fp32: two packs each) and walks the heads
// h0, h0 + hs, ...: its table packs are loaded once, every access is 128-bit, and the next head's
// two (fp32: four) packs are loaded before this head's are stored. Without that order the
// compiler must keep a store before the following loads (dst may alias src), and the loop makes
// two dependent round trips per head. The column and first head come from threadIdx by shifts and
// one division outside the loop, the token from blockIdx, the batch from blockIdx.y: no division
// in the loop (the previous one-thread-per-pair kernel made three per pair, and its 2-byte scalar
// accesses kept about a third of the bytes in flight an H200 needs).
//
// Every kernel here rounds as the ATen reference does, with Tout the result's dtype:
//   forward   y1 = Tout( r(x1 c1) - r(x2 s1) ),  y2 = Tout( r(x2 c2) + r(x1 s2) )
//   backward  y1 = Tout( r(x1 c1) + r(x2 s2) ),  y2 = Tout( r(x2 c2) - r(x1 s1) )   (the transpose)
// r(v) = float(Tout(v)): each product rounded to the result's dtype, then the sum (same-dtype:
// T(float(T(x*cos)) + float(T(rotate_half(x)*sin))); autocast's forward: all fp32; its backward:
// each term rounded to x's dtype as autograd's casts round it). __fmul_rn / __fadd_rn keep every
// fp32 product and sum rounded on its own (no FMA contraction), as ATen's separate ops round.
// Backward is the same kernel with the sign flipped (a template bool), reading dy from src and
// writing dx to dst (dst == src rotates in place; the autograd Function writes a fresh dx).
//
// The 128-bit kernel needs D/2 a multiple of 8, strides a multiple of a pack and 16-byte aligned
// pointers; any other shape takes the scalar kernel (one thread per pair, its (b, h, t, i) from
// the flat index by three divisions, in 32 bits while the pairs fit: a GPU's 64-bit division is a
// long instruction sequence), launched once per tensor.
#ifndef KILN_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <type_traits>

#include "kiln/kernels/rope.cuh"

namespace KILN_KERNELS_NS {
namespace {

// The 128-bit kernel's launch: kVecThreads threads per block, kTokensPerBlock token rows per block
// (kThreadsPerToken threads each), kPairs pairs per thread and head.
constexpr int kVecThreads = 128;
constexpr int kTokensPerBlock = 2;
constexpr int kThreadsPerToken = kVecThreads / kTokensPerBlock;
constexpr int kPairs = 8;
// Heads a thread loads before it stores any: 2 x kHeadsPerStep 128-bit loads in flight (fp32: 4 x).
constexpr int kHeadsPerStep = 2;
// The scalar fallback: one thread per pair.
constexpr int kScalarThreads = 256;
static_assert(kVecThreads % kTokensPerBlock == 0 && kThreadsPerToken % 32 == 0, "whole warps per token");

// A launch's work: q and k (t[1].heads == 0: q only), as RopeParams or one tensor of autocast's form.
struct Job {
  RopeTensor t[2];
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t batch = 0, seq = 0, dim = 0;
  bool table_batched = false, backward = false;
  int64_t narrow_index_limit = 0;
  bool vectorized = true;
};

template <typename T>
__device__ __forceinline__ float f(T v) {
  return static_cast<float>(v);
}

// A product rounded to the result's dtype (identity for fp32).
template <typename Tout>
__device__ __forceinline__ float rmul(float a, float b) {
  return static_cast<float>(static_cast<Tout>(__fmul_rn(a, b)));
}

// One pair (x1, x2) with its table entries (c1, c2, s1, s2) into (y1, y2): the header's formula.
template <typename Tout>
__device__ __forceinline__ void rotate(bool backward, float x1, float x2, float c1, float c2, float s1, float s2,
                                       Tout& y1, Tout& y2) {
  if (!backward) {
    y1 = static_cast<Tout>(__fadd_rn(rmul<Tout>(x1, c1), -rmul<Tout>(x2, s1)));
    y2 = static_cast<Tout>(__fadd_rn(rmul<Tout>(x2, c2), rmul<Tout>(x1, s2)));
  } else {
    y1 = static_cast<Tout>(__fadd_rn(rmul<Tout>(x1, c1), rmul<Tout>(x2, s2)));
    y2 = static_cast<Tout>(__fadd_rn(rmul<Tout>(x2, c2), -rmul<Tout>(x1, s1)));
  }
}

// ---- The 128-bit kernel

// kPairs consecutive elements: one 16-byte pack of a 16-bit type, two of fp32.
template <typename T>
struct Vec {
  T v[kPairs];
};
template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* p) {
  constexpr int kP = kPack<T>;
  Vec<T> r;
#pragma unroll
  for (int c = 0; c < kPairs / kP; ++c) {
    const Pack<T> pk = reinterpret_cast<const Pack<T>*>(p)[c];
#pragma unroll
    for (int j = 0; j < kP; ++j) r.v[c * kP + j] = pk.v[j];
  }
  return r;
}
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T>& r) {
  constexpr int kP = kPack<T>;
#pragma unroll
  for (int c = 0; c < kPairs / kP; ++c) {
    Pack<T> pk;
#pragma unroll
    for (int j = 0; j < kP; ++j) pk.v[j] = r.v[c * kP + j];
    reinterpret_cast<Pack<T>*>(p)[c] = pk;
  }
}

// Grid (ceil(T / kTokensPerBlock), min(B, 65535)); block kVecThreads. Tin: what src holds, Tout:
// dst, Tab: the tables.
template <typename Tin, typename Tout, typename Tab, bool kBackward>
__global__ void __launch_bounds__(kVecThreads) rope_vec_kernel(Job p) {
  const int slot = threadIdx.x / kThreadsPerToken, lane = threadIdx.x % kThreadsPerToken;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + slot;
  if (t >= p.seq) return;  // the last block's missing tokens (no barrier follows)
  const int half = static_cast<int>(p.dim / 2), columns = half / kPairs;
  // This lane's columns c0, c0 + kThreadsPerToken, ... and heads h0, h0 + hs, ... (q's, then k's).
  int c0 = lane, h0 = 0, hs = 1;
  if (columns <= kThreadsPerToken) {
    hs = kThreadsPerToken / columns;
    c0 = lane % columns;
    h0 = lane / columns;
  }
  if (h0 >= hs) return;  // lanes past hs * columns: their first head is another lane's
  const int nq = static_cast<int>(p.t[0].heads), nh = nq + static_cast<int>(p.t[1].heads);
  const int64_t qh = p.t[0].src_stride[1], kh = p.t[1].src_stride[1];
  const int64_t qdh = p.t[0].dst_stride[1], kdh = p.t[1].dst_stride[1];
  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const int64_t table = ((p.table_batched ? b : 0) * p.seq + t) * p.dim;
    const Tab* __restrict__ cos = static_cast<const Tab*>(p.cos) + table;
    const Tab* __restrict__ sin = static_cast<const Tab*>(p.sin) + table;
    const Tin* q_src = static_cast<const Tin*>(p.t[0].src) + b * p.t[0].src_stride[0] + t * p.t[0].src_stride[2];
    const Tin* k_src = static_cast<const Tin*>(p.t[1].src) + b * p.t[1].src_stride[0] + t * p.t[1].src_stride[2];
    Tout* q_dst = static_cast<Tout*>(p.t[0].dst) + b * p.t[0].dst_stride[0] + t * p.t[0].dst_stride[2];
    Tout* k_dst = static_cast<Tout*>(p.t[1].dst) + b * p.t[1].dst_stride[0] + t * p.t[1].dst_stride[2];
    for (int c = c0; c < columns; c += kThreadsPerToken) {
      const int i = c * kPairs;
      const Vec<Tab> c1 = load_vec(cos + i), c2 = load_vec(cos + half + i);
      const Vec<Tab> s1 = load_vec(sin + i), s2 = load_vec(sin + half + i);
      // Head h's x1 (x2 is half further): q's heads first, then k's (selects, no branch).
      auto src_at = [&](int h) {
        const bool in_q = h < nq;
        return (in_q ? q_src : k_src) + (in_q ? h : h - nq) * (in_q ? qh : kh) + i;
      };
      auto dst_at = [&](int h) {
        const bool in_q = h < nq;
        return (in_q ? q_dst : k_dst) + (in_q ? h : h - nq) * (in_q ? qdh : kdh) + i;
      };
      // kHeadsPerStep heads a step: all their packs are loaded before the first is stored.
      for (int h = h0; h < nh; h += kHeadsPerStep * hs) {
        Vec<Tin> x1[kHeadsPerStep], x2[kHeadsPerStep];
#pragma unroll
        for (int u = 0; u < kHeadsPerStep; ++u) {
          // Past the last head a slot reloads head h (this thread's own, in cache): no branch.
          const int hu = h + u * hs < nh ? h + u * hs : h;
          x1[u] = load_vec(src_at(hu));
          x2[u] = load_vec(src_at(hu) + half);
        }
#pragma unroll
        for (int u = 0; u < kHeadsPerStep; ++u) {
          if (h + u * hs < nh) {
            Vec<Tout> y1, y2;
#pragma unroll
            for (int j = 0; j < kPairs; ++j) {
              rotate<Tout>(kBackward, f(x1[u].v[j]), f(x2[u].v[j]), f(c1.v[j]), f(c2.v[j]), f(s1.v[j]), f(s2.v[j]),
                           y1.v[j], y2.v[j]);
            }
            store_vec(dst_at(h + u * hs), y1);
            store_vec(dst_at(h + u * hs) + half, y2);
          }
        }
      }
    }
  }
}

// ---- The scalar fallback

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

// One thread per pair of one tensor (a grid-stride loop over the flat pair index, in Index
// arithmetic); all six loads of a pair before its two stores, so dst may be src.
template <typename Tin, typename Tout, typename Tab, typename Index>
__global__ void __launch_bounds__(kScalarThreads) rope_scalar_kernel(Job p, RopeTensor x) {
  const Index half = static_cast<Index>(p.dim / 2), seq = static_cast<Index>(p.seq),
              heads = static_cast<Index>(x.heads);
  const Index total = static_cast<Index>(p.batch) * heads * seq * half;
  const Index stride = static_cast<Index>(gridDim.x) * kScalarThreads;
  for (Index idx = static_cast<Index>(blockIdx.x) * kScalarThreads + threadIdx.x; idx < total; idx += stride) {
    const Pair q = pair_of(idx, half, seq, heads);
    const int64_t table = ((p.table_batched ? q.b : 0) * p.seq + q.t) * p.dim, h = p.dim / 2;
    const Tin* src =
        static_cast<const Tin*>(x.src) + q.b * x.src_stride[0] + q.h * x.src_stride[1] + q.t * x.src_stride[2] + q.i;
    Tout* dst = static_cast<Tout*>(x.dst) + q.b * x.dst_stride[0] + q.h * x.dst_stride[1] + q.t * x.dst_stride[2] + q.i;
    const Tab* c = static_cast<const Tab*>(p.cos) + table + q.i;
    const Tab* s = static_cast<const Tab*>(p.sin) + table + q.i;
    Tout y1, y2;
    rotate<Tout>(p.backward, f(src[0]), f(src[h]), f(c[0]), f(c[h]), f(s[0]), f(s[h]), y1, y2);
    dst[0] = y1;
    dst[h] = y2;
  }
}

// ---- Launch

// Whether `pairs` are indexed in 32 bits: below the limit, with room for a grid stride past it.
inline bool narrow_index(int64_t pairs, int64_t limit) {
  return pairs < std::min<int64_t>(limit, int64_t{1} << 30);
}

// The 128-bit kernel's conditions: whole columns of 8 pairs, every pack 16-byte aligned.
template <typename Tin, typename Tout, typename Tab>
bool vec_applies(const Job& p) {
  if (!p.vectorized || p.dim % (2 * kPairs) != 0 || p.dim > (int64_t{1} << 30)) return false;
  if (p.t[0].heads + p.t[1].heads > (int64_t{1} << 30)) return false;
  if (!aligned16(static_cast<const Tab*>(p.cos)) || !aligned16(static_cast<const Tab*>(p.sin))) return false;
  for (const RopeTensor& x : p.t) {
    if (x.heads == 0) continue;
    if (!aligned16(static_cast<const Tin*>(x.src)) || !aligned16(static_cast<const Tout*>(x.dst))) return false;
    for (int d = 0; d < 3; ++d) {
      if (x.src_stride[d] % kPack<Tin> != 0 || x.dst_stride[d] % kPack<Tout> != 0) return false;
    }
  }
  return true;
}

template <typename Tin, typename Tout, typename Tab>
void launch_job(const Job& p, Stream stream) {
  if (p.batch == 0 || p.seq == 0 || p.dim == 0 || p.t[0].heads + p.t[1].heads == 0) return;
  if (vec_applies<Tin, Tout, Tab>(p)) {
    const dim3 grid(static_cast<unsigned>((p.seq + kTokensPerBlock - 1) / kTokensPerBlock),
                    static_cast<unsigned>(std::min<int64_t>(p.batch, 65535)));
    // Autocast's form has one direction per type pair (fp32 in: backward; fp32 out: forward).
    constexpr bool kMixed = !std::is_same_v<Tin, Tout>, kMixedBackward = std::is_same_v<Tin, float>;
    const bool backward = kMixed ? kMixedBackward : p.backward;
    const auto kernel = backward           ? rope_vec_kernel < Tin, Tout, Tab,
               !kMixed || kMixedBackward > : rope_vec_kernel < Tin, Tout, Tab, kMixed && kMixedBackward > ;
    KILN_LAUNCH(kernel, grid, kVecThreads, 0, stream, p);
    return;
  }
  for (const RopeTensor& x : p.t) {
    const int64_t pairs = p.batch * x.heads * p.seq * (p.dim / 2);
    if (pairs == 0) continue;
    // One thread per pair, at most 8 x 65535 blocks (then grid-stride).
    const auto grid =
        static_cast<unsigned>(std::min<int64_t>((pairs + kScalarThreads - 1) / kScalarThreads, 65535 * 8));
    const auto kernel = narrow_index(pairs, p.narrow_index_limit) ? rope_scalar_kernel<Tin, Tout, Tab, uint32_t>
                                                                  : rope_scalar_kernel<Tin, Tout, Tab, int64_t>;
    KILN_LAUNCH(kernel, grid, kScalarThreads, 0, stream, p, x);
  }
}

// The fields RopeParams and RopeMixedParams share, into a Job without tensors.
template <typename P>
Job job_of(const P& p) {
  Job j;
  j.cos = p.cos;
  j.sin = p.sin;
  j.batch = p.batch;
  j.seq = p.seq;
  j.dim = p.dim;
  j.table_batched = p.table_batched;
  j.backward = p.backward;
  j.narrow_index_limit = p.narrow_index_limit;
  j.vectorized = p.vectorized;
  return j;
}

}  // namespace

void launch_rope(const RopeParams& p, Stream stream) {
  Job j = job_of(p);
  j.t[0] = p.q;
  j.t[1] = p.k;
  KILN_DTYPE_SWITCH(p.dtype, T, [&] { launch_job<T, T, T>(j, stream); });
}

void launch_rope_mixed(const RopeMixedParams& p, Stream stream) {
  Job j = job_of(p);
  j.t[0].src = p.src;
  j.t[0].dst = p.dst;
  j.t[0].heads = p.heads;
  std::copy(p.src_stride, p.src_stride + 3, j.t[0].src_stride);
  std::copy(p.dst_stride, p.dst_stride + 3, j.t[0].dst_stride);
  // Forward: x (dtype) into an fp32 y; backward: an fp32 dy into dx (dtype).
  if (p.dtype == DType::kFloat16) {
    p.backward ? launch_job<float, __half, float>(j, stream) : launch_job<__half, float, float>(j, stream);
  } else {
    p.backward ? launch_job<float, __nv_bfloat16, float>(j, stream)
               : launch_job<__nv_bfloat16, float, float>(j, stream);
  }
}

}  // namespace KILN_KERNELS_NS
