// RMSNorm forward and backward. fp32 accumulation through warp shuffles, the rounding order of
// the Hugging Face reference in the forward pass:
//   y = T( float(weight) * float( T(h * rstd) ) )
// so the kernel agrees with the ATen reference bit for bit in fp32 and to one rounding in
// bf16/fp16.
//
// Backward (g = dy * w, n = h * rstd, both fp32):
//   dh = rstd * (g - n * mean(g * n)) (+ dh_direct),   dweight = sum_rows dy * T(n)
// dweight is summed per block, written as one fp32 row per block, and summed over blocks by the
// caller: no atomics, deterministic for a given grid.
//
// Both directions are memory-bound: the design goal is the copy roof, i.e. enough independent
// 128-bit loads in flight per SM (about 25 KB on an H200) and each byte read or written once.
//
// Register variants (rows in 128-bit packs, cols and pointers allowing, rows not too long). A row
// is spread over kRowThreads consecutive threads (a warp or a whole number of warps); thread t of
// a row owns packs t, t + kRowThreads, ... (each warp reads 512 contiguous bytes per item).
// - Forward (rmsnorm_fwd_regs_kernel): each thread issues all its kFwdItems pack loads of x (and
//   of the residual) before it uses any (4 x 16 bytes in flight per thread, 8 with a residual),
//   keeps the row in registers in its storage dtype, writes h once, reduces, reads the weight and
//   writes y once: one read of x, no second pass. kRowThreads is the smallest power of two from
//   32 to 1024 with kRowThreads x kFwdItems >= packs per row; short rows share a block (a warp per
//   row needs no shared memory and no barrier), so a block has at least kFwdBlockThreads threads
//   and many rows in flight per SM. A row fills at least half its threads' items (the next smaller
//   variant did not fit), so an active thread has >= 2 loads in flight before its first use.
// - Backward (rmsnorm_bwd_regs_kernel): each thread owns fixed packs of the row for the whole
//   kernel, so its dweight partial stays in fp32 registers over all the rows its row group walks
//   (no shared-memory accumulator, no bank conflicts), and the weight is read once. A block of
//   kBwdBlockThreads holds kGroups = kBwdBlockThreads / kRowThreads row groups walking rows in
//   step; each iteration first issues the next row's x, dy (and dh) loads, then reduces the
//   current row's dot product (one barrier, double-buffered slots) and writes dx. kBwdItems = 1:
//   two rows' packs, the weight and the partial in registers fit 64 registers in every dtype (two
//   items do not), which is what kBwdResidentThreads (32 warps) per SM needs; the launcher's grid
//   is kBwdResidentThreads / block threads blocks per SM (rmsnorm_bwd_blocks). At the end the
//   groups' partials are added in group order through shared memory, once.
// Everything else (cols not a multiple of the pack, unaligned pointers or row stride, rows longer
// than the largest variant) takes the generic kernels below them: a block per row, two passes in
// the forward, a shared-memory dweight accumulator in the backward.
#ifndef KILN_CUDA_EMULATION
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kiln/kernels/rmsnorm.cuh"

namespace KILN_KERNELS_NS {
namespace {

// ---- launch constants
// Register variants: threads per row run over the powers of two kMinRowThreads..kMaxRowThreads.
constexpr int kMinRowThreads = 32;
constexpr int kMaxRowThreads = 1024;
// Forward: packs per thread; a block is kFwdBlockThreads threads (kFwdBlockThreads / kRowThreads
// rows), or one row of kRowThreads when that is more. kFwdResidentThreads per SM is what
// __launch_bounds__ holds the registers to (64 at 1024 threads).
constexpr int kFwdItems = 4;
constexpr int kFwdBlockThreads = 256;
constexpr int kFwdResidentThreads = 1024;
constexpr int64_t kFwdMaxPacks = int64_t{kMaxRowThreads} * kFwdItems;  // fp32 16384 cols, bf16/fp16 32768
// Backward: packs per thread; a block is kBwdBlockThreads threads (or one row of 1024), and the
// grid is kBwdBlocksPerSm blocks per SM (one where a block is 1024 threads): 32 resident warps at
// <= 64 registers, which __launch_bounds__ enforces (the registers a 1024-thread block needs).
constexpr int kBwdItems = 1;
constexpr int kBwdBlockThreads = 512;
constexpr int kBwdBlocksPerSm = 2;
constexpr int kBwdResidentThreads = kBwdBlocksPerSm * kBwdBlockThreads;
constexpr int64_t kBwdMaxPacks = int64_t{kMaxRowThreads} * kBwdItems;  // fp32 4096 cols, bf16/fp16 8192
// Generic kernels: a block per row (forward); 2 blocks of kGenericBwdThreads per SM (backward).
constexpr int kGenericFwdThreads = 256;
constexpr int kGenericBwdThreads = 256;
constexpr int kGenericBwdBlocksPerSm = 2;
// The most the generic backward asks for, within sm_80's opt-in (163 KB); a device's own opt-in
// (a V100's 96 KiB) lowers it (rmsnorm_bwd_max_smem).
constexpr int64_t kMaxSmem = 160 * 1024;

__host__ __device__ constexpr int fwd_block_threads(int row_threads) {
  return row_threads > kFwdBlockThreads ? row_threads : kFwdBlockThreads;
}
__host__ __device__ constexpr int bwd_block_threads(int row_threads) {
  return row_threads > kBwdBlockThreads ? row_threads : kBwdBlockThreads;
}
__host__ __device__ constexpr int bwd_blocks_per_sm(int row_threads) {
  return kBwdResidentThreads / bwd_block_threads(row_threads);
}

template <typename T>
__device__ __forceinline__ float f(T v) {
  return static_cast<float>(v);
}

// ---- register variants

// The sum of v over the kRowThreads consecutive threads of a row (a warp, or a whole number of
// warps of a block of kBlockThreads); every thread of the row gets the same bits. Several warps
// meet in shared memory: one barrier, then each warp sums its row's warp totals in the same lane
// order. `parity` alternates between calls: a row's slots are written again only two calls later,
// after every thread has passed the barrier of the call in between, so no second barrier.
template <int kRowThreads, int kBlockThreads>
__device__ __forceinline__ float row_sum(float v, int parity) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if constexpr (kRowThreads > 32) {
    constexpr int kWarps = kBlockThreads / 32, kRowWarps = kRowThreads / 32;
    KILN_STATIC_SMEM(float, slots, 2 * kWarps);
    float* const s = slots + parity * kWarps;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) s[warp] = v;
    __syncthreads();
    v = lane < kRowWarps ? s[warp / kRowWarps * kRowWarps + lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// A 128-bit pack held as four 32-bit words, each element unpacked where it is used: held as
// Pack<T> (eight 16-bit values) the compiler gives every bf16/fp16 element a register of its own,
// twice the registers, and the backward's 16-bit variants spilled.
__device__ __forceinline__ uint32_t word(const uint4& pk, int i) {
  return i == 0 ? pk.x : i == 1 ? pk.y : i == 2 ? pk.z : pk.w;
}
template <typename To, typename From>
__device__ __forceinline__ To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  memcpy(&out, &v, sizeof(To));
  return out;
}
// Element j of a pack of T, as fp32.
template <typename T>
__device__ __forceinline__ float elem(const uint4& pk, int j) {
  if constexpr (sizeof(T) == 4) {
    return bits_as<float>(word(pk, j));
  } else {
    const uint32_t w = word(pk, j / 2);
    return f(bits_as<T>(static_cast<uint16_t>(j % 2 != 0 ? w >> 16 : w & 0xffffu)));
  }
}
// The pack whose element j is T(value(j)).
template <typename T, typename Fn>
__device__ __forceinline__ uint4 make_pack(Fn value) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      w[i] = bits_as<uint32_t>(static_cast<float>(value(i)));
    } else {
      const uint32_t lo = bits_as<uint16_t>(static_cast<T>(value(2 * i)));
      const uint32_t hi = bits_as<uint16_t>(static_cast<T>(value(2 * i + 1)));
      w[i] = lo | hi << 16;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T, int kRowThreads, bool kResidual>
__global__ void __launch_bounds__(fwd_block_threads(kRowThreads), kFwdResidentThreads / fwd_block_threads(kRowThreads))
    rmsnorm_fwd_regs_kernel(RmsNormFwdParams p) {
  constexpr int kBlock = fwd_block_threads(kRowThreads), kRows = kBlock / kRowThreads, kN = kPack<T>;
  const int t = threadIdx.x % kRowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kRowThreads;
  // A last block's rows past the end load and store nothing but still meet the row's barrier.
  const bool live = row < p.rows;
  const int64_t n_packs = p.cols / kN, r = live ? row : 0;
  const uint4* x = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + r * p.x_row_stride) + t;
  const uint4* res = kResidual ? static_cast<const uint4*>(p.residual) + r * n_packs + t : nullptr;
  uint4* h = kResidual ? static_cast<uint4*>(p.h) + r * n_packs + t : nullptr;
  const uint4* w = static_cast<const uint4*>(p.weight) + t;
  uint4* y = static_cast<uint4*>(p.y) + r * n_packs + t;

  // Every load of the row first (kFwdItems, or twice that with a residual), then the arithmetic.
  bool in_row[kFwdItems];
  uint4 v[kFwdItems], rv[kFwdItems];
#pragma unroll
  for (int k = 0; k < kFwdItems; ++k) {
    in_row[k] = live && t + k * kRowThreads < n_packs;
    v[k] = in_row[k] ? x[k * kRowThreads] : uint4{};
    if constexpr (kResidual) rv[k] = in_row[k] ? res[k * kRowThreads] : uint4{};
  }
  float sum_sq = 0.f;
#pragma unroll
  for (int k = 0; k < kFwdItems; ++k) {
    if constexpr (kResidual) {  // h = T(x + residual), the dtype's own add
      v[k] = make_pack<T>([&](int j) { return elem<T>(v[k], j) + elem<T>(rv[k], j); });
      if (in_row[k]) h[k * kRowThreads] = v[k];
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) sum_sq += elem<T>(v[k], j) * elem<T>(v[k], j);
  }
  const float rstd = rsqrtf(row_sum<kRowThreads, kBlock>(sum_sq, 0) / static_cast<float>(p.cols) + p.eps);
  if (p.rstd != nullptr && live && t == 0) p.rstd[row] = rstd;
  uint4 wv[kFwdItems];
#pragma unroll
  for (int k = 0; k < kFwdItems; ++k) wv[k] = in_row[k] ? w[k * kRowThreads] : uint4{};
#pragma unroll
  for (int k = 0; k < kFwdItems; ++k) {
    const uint4 out =
        make_pack<T>([&](int j) { return elem<T>(wv[k], j) * f(static_cast<T>(elem<T>(v[k], j) * rstd)); });
    if (in_row[k]) y[k * kRowThreads] = out;
  }
}

template <typename T, int kRowThreads, bool kDh>
__global__ void __launch_bounds__(bwd_block_threads(kRowThreads), bwd_blocks_per_sm(kRowThreads))
    rmsnorm_bwd_regs_kernel(RmsNormBwdParams p) {
  constexpr int kBlock = bwd_block_threads(kRowThreads), kGroups = kBlock / kRowThreads, kN = kPack<T>;
  const int t = threadIdx.x % kRowThreads, group = threadIdx.x / kRowThreads;
  const int64_t n_packs = p.cols / kN;
  // Pointers at this thread's first pack of row 0; a row's packs are at row * n_packs after them.
  const uint4* x = static_cast<const uint4*>(p.x) + t;
  const uint4* dy = static_cast<const uint4*>(p.dy) + t;
  const uint4* dh = kDh ? static_cast<const uint4*>(p.dh) + t : nullptr;
  uint4* dx = static_cast<uint4*>(p.dx) + t;

  // This thread's packs (t, t + kRowThreads, ...) for the whole kernel.
  bool mine[kBwdItems];
  uint4 wv[kBwdItems];
  float acc[kBwdItems][kN];  // sum over this group's rows of dy * T(n)
#pragma unroll
  for (int k = 0; k < kBwdItems; ++k) {
    mine[k] = t + k * kRowThreads < n_packs;
    wv[k] = mine[k] ? static_cast<const uint4*>(p.weight)[t + k * kRowThreads] : uint4{};
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[k][j] = 0.f;
  }

  // The group's rows: row, row + stride, ...; the block's groups walk them in step (one barrier
  // per row), so the loop runs while the block's first group has a row, and a group past the end
  // rides along with zeros. nx, ndy, nrstd: the next row's values (zeros past the end), loaded
  // one iteration ahead so that they are in flight while this row is reduced. dh is needed only
  // after the reduction: it is loaded with them, for the current row (one pack less to hold).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGroups;
  uint4 nx[kBwdItems], ndy[kBwdItems];
  float nrstd = 0.f;
  auto load = [&](int64_t r) {
    const bool live = r < p.rows;
    const int64_t at = r * n_packs;
#pragma unroll
    for (int k = 0; k < kBwdItems; ++k) {
      const bool ok = live && mine[k];
      nx[k] = ok ? x[at + k * kRowThreads] : uint4{};
      ndy[k] = ok ? dy[at + k * kRowThreads] : uint4{};
    }
    nrstd = live ? p.rstd[r] : 0.f;
  };
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  int parity = 0;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  load(row);
  for (; row - group < p.rows; row += stride) {
    const bool live = row < p.rows;  // this group's row (the block's last step may have none)
    uint4 xv[kBwdItems], dv[kBwdItems], hv[kBwdItems];
#pragma unroll
    for (int k = 0; k < kBwdItems; ++k) {
      xv[k] = nx[k];
      dv[k] = ndy[k];
      hv[k] = kDh && live && mine[k] ? dh[row * n_packs + k * kRowThreads] : uint4{};
    }
    const float rstd = nrstd;
    load(row + stride);  // before the reduction: the next row's loads are in flight across its barrier
    float dot = 0.f;     // sum g * n
#pragma unroll
    for (int k = 0; k < kBwdItems; ++k) {
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float n = elem<T>(xv[k], j) * rstd, d = elem<T>(dv[k], j);
        dot += d * elem<T>(wv[k], j) * n;
        acc[k][j] += d * f(static_cast<T>(n));
      }
    }
    const float mean_dot = row_sum<kRowThreads, kBlock>(dot, parity) * inv_cols;
    parity ^= 1;
#pragma unroll
    for (int k = 0; k < kBwdItems; ++k) {
      const uint4 out = make_pack<T>([&](int j) {
        float g = rstd * (elem<T>(dv[k], j) * elem<T>(wv[k], j) - elem<T>(xv[k], j) * rstd * mean_dot);
        if constexpr (kDh) g += elem<T>(hv[k], j);
        return g;
      });
      if (live && mine[k]) dx[row * n_packs + k * kRowThreads] = out;
    }
  }

  // The block's dweight row: one group's registers as they are, or the groups' added in group
  // order through shared memory (the same order in every block and run).
  float4* const partial = reinterpret_cast<float4*>(p.dweight_partial + static_cast<int64_t>(blockIdx.x) * p.cols);
  constexpr int kQuads = kN / 4;  // float4s per pack of fp32 partials
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int k = 0; k < kBwdItems; ++k) {
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        const float4 s = make_float4(acc[k][4 * q], acc[k][4 * q + 1], acc[k][4 * q + 2], acc[k][4 * q + 3]);
        if (mine[k]) partial[(t + k * kRowThreads) * kQuads + q] = s;
      }
    }
  } else {
    // Unrolled, like the copy below: the epilogue has no loop (the row loop is the kernel's one).
    constexpr int kSums = kRowThreads * kBwdItems * kQuads;  // float4s: one row's partials
    static_assert(kSums <= kBlock, "the copy gives each thread at most one float4");
    KILN_STATIC_SMEM(float4, dw_sum, kSums);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (group == g) {
#pragma unroll
        for (int k = 0; k < kBwdItems; ++k) {
#pragma unroll
          for (int q = 0; q < kQuads; ++q) {
            float4 s = make_float4(acc[k][4 * q], acc[k][4 * q + 1], acc[k][4 * q + 2], acc[k][4 * q + 3]);
            const int c = (t + k * kRowThreads) * kQuads + q;
            if (g != 0) {
              const float4 a = dw_sum[c];
              s = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
            }
            dw_sum[c] = s;
          }
        }
      }
      __syncthreads();  // group g's sums are in before group g + 1 adds to them, or the copy reads them
    }
    if (threadIdx.x < n_packs * kQuads) partial[threadIdx.x] = dw_sum[threadIdx.x];
  }
}

// ---- generic kernels (any cols, row stride and alignment; the long rows)

// Loads pack i (kVec) or element i of a row into out[0..n), n = kPack<T> or 1.
template <typename T, bool kVec>
struct RowIo {
  static constexpr int kN = kVec ? kPack<T> : 1;
  __device__ __forceinline__ static void load(const T* row, int64_t i, float* out) {
    if constexpr (kVec) {
      const Pack<T> pk = reinterpret_cast<const Pack<T>*>(row)[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) out[j] = f(pk.v[j]);
    } else {
      out[0] = f(row[i]);
    }
  }
  __device__ __forceinline__ static void store(T* row, int64_t i, const float* in) {
    if constexpr (kVec) {
      Pack<T> pk;
#pragma unroll
      for (int j = 0; j < kN; ++j) pk.v[j] = static_cast<T>(in[j]);
      reinterpret_cast<Pack<T>*>(row)[i] = pk;
    } else {
      row[i] = static_cast<T>(in[0]);
    }
  }
};

template <typename T, bool kVec, bool kResidual>
__global__ void __launch_bounds__(kGenericFwdThreads) rmsnorm_fwd_kernel(RmsNormFwdParams p) {
  using Io = RowIo<T, kVec>;
  constexpr int kN = Io::kN;
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
  const T* res = kResidual ? static_cast<const T*>(p.residual) + row * p.cols : nullptr;
  T* h = kResidual ? static_cast<T*>(p.h) + row * p.cols : nullptr;
  const T* w = static_cast<const T*>(p.weight);
  T* y = static_cast<T*>(p.y) + row * p.cols;
  const int64_t n_items = p.cols / kN;

  float sum_sq = 0.f;
  for (int64_t i = threadIdx.x; i < n_items; i += kGenericFwdThreads) {
    float v[kN];
    Io::load(x, i, v);
    if constexpr (kResidual) {
      float r[kN];
      Io::load(res, i, r);
#pragma unroll
      for (int j = 0; j < kN; ++j) v[j] = f(static_cast<T>(v[j] + r[j]));  // the dtype's own add
      Io::store(h, i, v);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) sum_sq += v[j] * v[j];
  }
  const float rstd = rsqrtf(block_sum<kGenericFwdThreads>(sum_sq) / static_cast<float>(p.cols) + p.eps);
  if (p.rstd != nullptr && threadIdx.x == 0) p.rstd[row] = rstd;
  // The second read comes from L1/L2 (this block just read it); with a residual, from h, which
  // this thread itself wrote.
  const T* src = kResidual ? h : x;
  for (int64_t i = threadIdx.x; i < n_items; i += kGenericFwdThreads) {
    float v[kN], wv[kN];
    Io::load(src, i, v);
    Io::load(w, i, wv);
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = wv[j] * f(static_cast<T>(v[j] * rstd));
    Io::store(y, i, v);
  }
}

// The generic backward keeps its packs in the storage dtype and converts element by element:
// holding four packs as fp32 arrays cost enough registers to spill in the bf16/fp16 + dh variants.
template <typename T, int N>
struct alignas(sizeof(T) * N) Items {
  T v[N];
};

template <typename T, bool kVec, bool kDh>
__global__ void __launch_bounds__(kGenericBwdThreads) rmsnorm_bwd_kernel(RmsNormBwdParams p) {
  constexpr int kN = kVec ? kPack<T> : 1;
  using It = Items<T, kN>;
  KILN_DYNAMIC_SMEM(dw_smem);
  float* dw_acc = reinterpret_cast<float*>(dw_smem);  // [cols]
  const int64_t n_items = p.cols / kN;
  for (int64_t c = threadIdx.x; c < p.cols; c += kGenericBwdThreads) dw_acc[c] = 0.f;
  __syncthreads();
  // In the row loop each thread touches only its own columns of dw_acc: no barrier needed there.
  const It* w = static_cast<const It*>(p.weight);
  const float inv_cols = 1.f / static_cast<float>(p.cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const It* x = static_cast<const It*>(p.x) + row * n_items;
    const It* dy = static_cast<const It*>(p.dy) + row * n_items;
    const float rstd = p.rstd[row];
    float dot = 0.f;  // sum g * n
    for (int64_t i = threadIdx.x; i < n_items; i += kGenericBwdThreads) {
      const It xv = x[i], dv = dy[i], wv = w[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float n = f(xv.v[j]) * rstd, d = f(dv.v[j]);
        dot += d * f(wv.v[j]) * n;
        dw_acc[i * kN + j] += d * f(static_cast<T>(n));
      }
    }
    const float mean_dot = block_sum<kGenericBwdThreads>(dot) * inv_cols;
    It* dx = static_cast<It*>(p.dx) + row * n_items;
    const It* dh = kDh ? static_cast<const It*>(p.dh) + row * n_items : nullptr;
    for (int64_t i = threadIdx.x; i < n_items; i += kGenericBwdThreads) {
      const It xv = x[i], dv = dy[i], wv = w[i];
      It out;
      if constexpr (kDh) out = dh[i];
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        float g = rstd * (f(dv.v[j]) * f(wv.v[j]) - f(xv.v[j]) * rstd * mean_dot);
        if constexpr (kDh) g += f(out.v[j]);
        out.v[j] = static_cast<T>(g);
      }
      dx[i] = out;
    }
  }
  __syncthreads();
  float* partial = p.dweight_partial + static_cast<int64_t>(blockIdx.x) * p.cols;
  for (int64_t c = threadIdx.x; c < p.cols; c += kGenericBwdThreads) partial[c] = dw_acc[c];
}

// ---- launch helpers

template <typename T>
bool can_vectorise(int64_t cols, int64_t stride, std::initializer_list<const void*> ptrs) {
  if (cols % kPack<T> != 0 || stride % kPack<T> != 0) return false;
  for (const void* q : ptrs) {
    if (q != nullptr && (reinterpret_cast<uintptr_t>(q) & 15u) != 0) return false;
  }
  return true;
}

// The register variant's threads per row for a row of n_packs packs at `items` packs per thread:
// the smallest power of two from kMinRowThreads with row_threads x items >= n_packs.
int row_threads_for(int64_t n_packs, int items) {
  int threads = kMinRowThreads;
  while (int64_t{threads} * items < n_packs) threads *= 2;
  return threads;
}

// Calls fn(std::integral_constant<int, row_threads>) for row_threads in 32..1024 (the static switch).
template <typename Fn>
void with_row_threads(int row_threads, Fn&& fn) {
  switch (row_threads) {
    case 32:
      return fn(std::integral_constant<int, 32>{});
    case 64:
      return fn(std::integral_constant<int, 64>{});
    case 128:
      return fn(std::integral_constant<int, 128>{});
    case 256:
      return fn(std::integral_constant<int, 256>{});
    case 512:
      return fn(std::integral_constant<int, 512>{});
    default:
      return fn(std::integral_constant<int, 1024>{});
  }
}

template <typename T>
bool bwd_rows_applies(const RmsNormBwdParams& p) {
  return p.cols / kPack<T> <= kBwdMaxPacks &&
         can_vectorise<T>(p.cols, p.cols, {p.x, p.weight, p.dy, p.dh, p.dx, p.dweight_partial});
}

}  // namespace

void launch_rmsnorm_fwd(const RmsNormFwdParams& p, Stream stream) {
  if (p.rows == 0) return;
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    const bool vec = can_vectorise<T>(p.cols, p.x_row_stride, {p.x, p.residual, p.weight, p.y, p.h});
    const int64_t n_packs = p.cols / kPack<T>;
    if (vec && n_packs <= kFwdMaxPacks) {
      with_row_threads(row_threads_for(n_packs, kFwdItems), [&](auto row_threads) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        constexpr int kBlock = fwd_block_threads(kRowThreads), kRows = kBlock / kRowThreads;
        const unsigned grid = static_cast<unsigned>((p.rows + kRows - 1) / kRows);
        if (p.residual != nullptr) {
          const auto kernel = rmsnorm_fwd_regs_kernel<T, kRowThreads, true>;
          KILN_LAUNCH(kernel, grid, kBlock, 0, stream, p);
        } else {
          const auto kernel = rmsnorm_fwd_regs_kernel<T, kRowThreads, false>;
          KILN_LAUNCH(kernel, grid, kBlock, 0, stream, p);
        }
      });
      return;
    }
    const unsigned grid = static_cast<unsigned>(p.rows);
    if (p.residual != nullptr) {
      if (vec) {
        const auto kernel = rmsnorm_fwd_kernel<T, true, true>;
        KILN_LAUNCH(kernel, grid, kGenericFwdThreads, 0, stream, p);
      } else {
        const auto kernel = rmsnorm_fwd_kernel<T, false, true>;
        KILN_LAUNCH(kernel, grid, kGenericFwdThreads, 0, stream, p);
      }
    } else if (vec) {
      const auto kernel = rmsnorm_fwd_kernel<T, true, false>;
      KILN_LAUNCH(kernel, grid, kGenericFwdThreads, 0, stream, p);
    } else {
      const auto kernel = rmsnorm_fwd_kernel<T, false, false>;
      KILN_LAUNCH(kernel, grid, kGenericFwdThreads, 0, stream, p);
    }
  });
}

int64_t rmsnorm_bwd_smem_bytes(int64_t cols) {
  return cols * static_cast<int64_t>(sizeof(float));
}
int64_t rmsnorm_bwd_static_smem_bytes() {
  return kBlockReduceSmemBytes;  // block_sum's slots
}
int64_t rmsnorm_bwd_max_smem(int64_t device_optin) {
  return std::min(kMaxSmem, device_optin);
}
bool rmsnorm_bwd_fits(int64_t cols, int64_t device_optin) {
  // The generic kernel's plan: every width the register variants take also fits it (they stop
  // at 8192 columns), and it is what a misaligned tensor of any width falls back to.
  return rmsnorm_bwd_smem_bytes(cols) + rmsnorm_bwd_static_smem_bytes() <= rmsnorm_bwd_max_smem(device_optin);
}
bool rmsnorm_bwd_uses_registers(const RmsNormBwdParams& p) {
  return KILN_DTYPE_SWITCH(p.dtype, T, [&] { return bwd_rows_applies<T>(p); });
}
int rmsnorm_bwd_blocks(const RmsNormBwdParams& p, int64_t sms) {
  sms = std::max<int64_t>(sms, 1);
  const int64_t rows = std::max<int64_t>(p.rows, 1);
  return KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    int64_t blocks;
    if (bwd_rows_applies<T>(p)) {
      // Resident blocks per SM x SMs, but no block without a row for each of its groups.
      const int row_threads = row_threads_for(p.cols / kPack<T>, kBwdItems);
      const int groups = bwd_block_threads(row_threads) / row_threads;
      blocks = std::min<int64_t>((rows + groups - 1) / groups,
                                 int64_t{kBwdResidentThreads} / bwd_block_threads(row_threads) * sms);
    } else {
      blocks = std::min<int64_t>(rows, kGenericBwdBlocksPerSm * sms);
    }
    return static_cast<int>(blocks);
  });
}

void launch_rmsnorm_bwd(const RmsNormBwdParams& p, Stream stream) {
  if (p.rows == 0) return;
  KILN_DTYPE_SWITCH(p.dtype, T, [&] {
    if (bwd_rows_applies<T>(p)) {
      with_row_threads(row_threads_for(p.cols / kPack<T>, kBwdItems), [&](auto row_threads) {
        constexpr int kRowThreads = decltype(row_threads)::value;
        const unsigned grid = static_cast<unsigned>(p.blocks);
        if (p.dh != nullptr) {
          const auto kernel = rmsnorm_bwd_regs_kernel<T, kRowThreads, true>;
          KILN_LAUNCH(kernel, grid, bwd_block_threads(kRowThreads), 0, stream, p);
        } else {
          const auto kernel = rmsnorm_bwd_regs_kernel<T, kRowThreads, false>;
          KILN_LAUNCH(kernel, grid, bwd_block_threads(kRowThreads), 0, stream, p);
        }
      });
      return;
    }
    const int smem = static_cast<int>(rmsnorm_bwd_smem_bytes(p.cols));
    const bool vec = can_vectorise<T>(p.cols, p.cols, {p.x, p.weight, p.dy, p.dh, p.dx});
    auto run = [&](auto kernel) {
      // Beyond 48 KiB, static and dynamic together, a block needs the kernel's opt-in (the
      // emulation has its own cudaFuncSetAttribute and holds the launch to it).
      if (smem + rmsnorm_bwd_static_smem_bytes() > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          throw std::runtime_error("rmsnorm backward: cannot allow " + std::to_string(smem) +
                                   " bytes of shared memory per block: " + cudaGetErrorString(e));
        }
      }
      KILN_LAUNCH(kernel, static_cast<unsigned>(p.blocks), kGenericBwdThreads, smem, stream, p);
    };
    if (p.dh != nullptr) {
      vec ? run(rmsnorm_bwd_kernel<T, true, true>) : run(rmsnorm_bwd_kernel<T, false, true>);
    } else {
      vec ? run(rmsnorm_bwd_kernel<T, true, false>) : run(rmsnorm_bwd_kernel<T, false, false>);
    }
  });
}

}  // namespace KILN_KERNELS_NS
