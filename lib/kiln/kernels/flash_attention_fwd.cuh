// The sm_80+ flash-attention forward, after FlashAttention-2's flash_fwd_kernel (included by
// flash_attention.cu, which documents the algorithm and holds the launchers). Written in the
// instructions of kernels/mma.cuh:
//
// - A CTA is 64 query rows of one (batch, query head) and 4 warps of 16 rows (FwdTile::kMT m16
//   blocks per warp; 1, not FA2's 2 at head_dim 64, so that 3 CTAs = 12 warps fit an SM: 168
//   registers at D 64, where 2 blocks need 244; docs/attention.md). Q's fragments are loaded
//   from shared memory once, with ldmatrix, and stay in registers for every key tile.
// - Key tiles of 64: S = Q K^T with mma.sync.m16n8k16, K's fragments by ldmatrix from an
//   XOR-swizzled tile (no padding, no bank conflicts); S, the probabilities P, the output O and
//   the row statistics m, l live in registers. Row max by two quad shuffles; the row sum stays
//   per thread until the end (FA2). P is rounded to the input dtype and reused in place as the A
//   operand of O += P V, V's fragments by ldmatrix.trans. No shared-memory traffic besides the
//   K, V fragments between the first and the last mma of a tile.
// - Shared memory is Q, K and V, one tile each (24 KiB at D 64, 48 KiB at 128). V_j is copied
//   (cp.async) while S_j is computed, K_j+1 while P_j V_j is: two barriers per key tile.
// - Masks are applied only to the tiles that need them (the causal diagonal, the ragged end, a
//   tile pair with more than one document), in a step of their own; the hot loop runs the
//   unmasked step (7.2 SASS instructions per HMMA at D 64 on sm_90, scripts/check_kernel_sass.py).
// - ldmatrix addresses: one per-lane offset per tile, another k16 step an XOR of it (the swizzle
//   touches only the chunk bits), another row block a constant: no address arithmetic in the loop.
// - Packed documents: with the launcher's per-tile document ranges (FlashShape::doc_ranges), a
//   key tile whose range cannot meet the query tile's is skipped, neither loaded nor computed.
// - The output goes through the (by then unused) Q tile, so global stores are 128-bit rows.
#pragma once

namespace KILN_KERNELS_NS {
namespace {

template <int D>
struct FwdTile {
  static constexpr int kMT = 1;  // m16 row blocks per warp (docs/attention.md: why not FA2's 2 at D 64)
  static constexpr int kWarps = 4, kThreads = kWarps * 32;
  static constexpr int kMinBlocks = D == 64 ? 3 : 2;  // per SM: 12 warps at D 64 (<= 168 registers)
  static constexpr int kBlockM = 16 * kMT * kWarps, kBlockN = 64;
  static constexpr size_t kSmemBytes = size_t(kBlockM + 2 * kBlockN) * D * 2;
};

// Starts copying rows [row0, row0 + kRows) of a [rows, D] matrix into a swizzled [kRows x D]
// tile; rows past `rows` become zero.
template <typename T, int D, int kRows, int kThreads>
__device__ __forceinline__ void copy_tile_sw(T* dst, const T* src, int row0, int rows) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "whole rounds of 16-byte chunks");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int r = i / kChunks, c = i % kChunks * 8;
    const bool valid = row0 + r < rows;
    tc::cp_async16(dst + tc::swizzle<D>(r, c), valid ? src + size_t(row0 + r) * D + c : src, valid);
  }
}

// The min and max segment id of the 64-key tiles [t0, t1] of one batch row (doc_ranges).
__device__ __forceinline__ int2 doc_range(const int* ranges, int t0, int t1) {
  int2 r = make_int2(ranges[2 * t0], ranges[2 * t0 + 1]);
  for (int t = t0 + 1; t <= t1; ++t) r = make_int2(min(r.x, ranges[2 * t]), max(r.y, ranges[2 * t + 1]));
  return r;
}

// The key tiles that the query tile [q0, q0 + kBlockM) of batch row b walks, in order (the
// forward and the deterministic dQ kernel): causal, up to the last key its last row sees; with the
// launcher's per-tile document ranges (FlashShape::doc_ranges), only those whose range can meet
// the query tile's. seg: batch row b's segment ids, or null.
template <int kBlockM, int kBlockN>
struct KeyTileWalk {
  const FlashShape& p;
  int q0;
  int offset;   // causal alignment: query i sees keys <= i + offset
  int n_tiles;  // the walk ends at the first j >= n_tiles
  int tiles_k;  // the key tiles of the row (a next tile that is none: nothing to copy)
  const int* seg;
  const int* ranges;  // batch row b's doc_ranges, or null (no segment ids or no ranges)
  int2 qr;            // the query tile's id range (with ranges)

  __device__ __forceinline__ KeyTileWalk(const FlashShape& p_, int b, int q0_, const int* seg_)
      : p(p_), q0(q0_), offset(p.seq_k - p.seq_q), seg(seg_), qr(make_int2(0, 0)) {
    const int k_end = p.causal ? min(p.seq_k, q0 + kBlockM + offset) : p.seq_k;
    n_tiles = (k_end + kBlockN - 1) / kBlockN;
    tiles_k = (p.seq_k + kBlockN - 1) / kBlockN;
    ranges = seg != nullptr && p.doc_ranges != nullptr ? p.doc_ranges + size_t(b) * tiles_k * 2 : nullptr;
    if (ranges != nullptr) qr = doc_range(ranges, q0 / kBlockN, (min(q0 + kBlockM, p.seq_q) - 1) / kBlockN);
  }

  __device__ __forceinline__ int first() const { return next(-1); }
  // The tile after j that can meet the query tile (>= n_tiles past the last).
  __device__ __forceinline__ int next(int j) const {
    do {
      ++j;
    } while (j < n_tiles && ranges != nullptr && (ranges[2 * j + 1] < qr.x || ranges[2 * j] > qr.y));
    return j;
  }
  // A tile that every (query, key) pair of the block sees in full runs without masks.
  __device__ __forceinline__ bool needs_mask(int j) const {
    const int k0 = j * kBlockN;
    if (k0 + kBlockN > p.seq_k || (p.causal && k0 + kBlockN - 1 > q0 + offset)) return true;
    if (seg == nullptr) return false;
    return ranges == nullptr || !(qr.x == qr.y && ranges[2 * j] == qr.x && ranges[2 * j + 1] == qr.x);
  }
};

// One CTA's forward: its tiles, its registers, and the step over one key tile.
template <typename T, int D>
struct FlashFwdBlock {
  using Tile = FwdTile<D>;
  static constexpr int kMT = Tile::kMT, kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kThreads = Tile::kThreads;
  static constexpr int kNT = kBlockN / 8;   // n8 tiles of S
  static constexpr int kDT = D / 8;         // n8 tiles of O
  static constexpr int kKD = D / 16;        // k16 steps of Q K^T
  static constexpr int kKN = kBlockN / 16;  // k16 steps of P V

  int seq_k;
  int* tiles_done;
  T *q_s, *k_s, *v_s;
  const T *k, *v;
  const int* seg;
  int lane, g, t, lj, lr;  // ldmatrix: this lane supplies row lr of matrix lj
  // This lane's ldmatrix rows in the swizzled K and V tiles, as element offsets for k16 step 0
  // (K) and n16 column block 0 (V): the swizzle makes another step an XOR of the offset (the
  // chunk bits; row * D has none of them set) and another row block a constant.
  int k_lane, v_lane;
  int q0, row_w, offset;
  float scale_log2;
  uint32_t qf[kMT][kKD][4];    // Q's A fragments, loaded once
  float o[kMT][kDT][4];        // the output accumulator
  float m[kMT][2], l[kMT][2];  // rows g and g + 8: the running max (raw scores) and this thread's sum
  int limit[kMT][2];           // a row's keys are < limit (causal and the end of the keys)
  int qseg[kMT][2];

  // One key tile: S = Q K^T, masks if kMask, the online softmax, then (once V_j has landed) the
  // next K tile's copy and O += P V. Expects K_j landed and visible; issues V_j itself.
  template <bool kMask>
  __device__ __forceinline__ void step(int j, int jn) {
    const int k0 = j * kBlockN;
    copy_tile_sw<T, D, kBlockN, kThreads>(v_s, v, k0, seq_k);  // V_j lands during S_j
    tc::cp_async_commit();

    // S = Q K^T: per k16 step and pair of n8 tiles, one ldmatrix.x4 of K (rows n, columns k).
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kb[4];  // b0 b1 of n8 tile 2np, b0 b1 of 2np + 1
        tc::ldmatrix<4, false>(kb, k_s + ((k_lane ^ (kk << 4)) + np * 16 * D));
        const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          tc::mma_16816<T>(s[mt][2 * np], qf[mt][kk], b0);
          tc::mma_16816<T>(s[mt][2 * np + 1], qf[mt][kk], b1);
        }
      }
    }

    if constexpr (kMask) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kj = k0 + nt * 8 + 2 * t + e;
          const int kseg = seg != nullptr && kj < seq_k ? seg[kj] : -2;
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if (kj >= limit[mt][h] || (seg != nullptr && kseg != qseg[mt][h])) s[mt][nt][2 * h + e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax in registers: rows g and g + 8 of each m16 block, a quad per row.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m[mt][h];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = tc::quad_max(mx);
        // A row that has seen only masked keys keeps max -inf; shift by 0 then (exp2(-inf) = 0).
        const float shift = kMask && mx == -INFINITY ? 0.f : mx * scale_log2;
        const float alpha = tc::exp2_approx(m[mt][h] * scale_log2 - shift);
        m[mt][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pr = tc::exp2_approx(s[mt][nt][2 * h + e] * scale_log2 - shift);
            s[mt][nt][2 * h + e] = pr;
            sum += pr;
          }
        }
        l[mt][h] = l[mt][h] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][2 * h] *= alpha;
          o[mt][dt][2 * h + 1] *= alpha;
        }
      }
    }

    tc::cp_async_wait<0>();
    __syncthreads();  // V_j has landed, and every warp is done with K_j
    if (jn * kBlockN < seq_k) copy_tile_sw<T, D, kBlockN, kThreads>(k_s, k, jn * kBlockN, seq_k);  // during P V
    tc::cp_async_commit();

    // O += P V: P's C fragments (n8 tiles 2kk, 2kk + 1) packed are the A fragment over keys
    // 16kk..; V's B fragments by ldmatrix.trans (rows k, columns n), two n8 tiles per x4.
#pragma unroll
    for (int kk = 0; kk < kKN; ++kk) {
      uint32_t pf[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pf[mt][0] = tc::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pf[mt][1] = tc::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pf[mt][2] = tc::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pf[mt][3] = tc::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t vb[4];
        tc::ldmatrix<4, true>(vb, v_s + ((v_lane ^ (dp << 4)) + kk * 16 * D));
        const uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          tc::mma_16816<T>(o[mt][2 * dp], pf[mt], b0);
          tc::mma_16816<T>(o[mt][2 * dp + 1], pf[mt], b1);
        }
      }
    }
    if (tiles_done != nullptr && threadIdx.x == 0) atomicAdd(tiles_done, 1);

    tc::cp_async_wait<0>();
    __syncthreads();  // K_jn has landed, and every warp is done with V_j
  }
};

template <typename T, int D>
__device__ __forceinline__ void flash_fwd_sm80_body(const FlashFwdParams& p) {
  using Block = FlashFwdBlock<T, D>;
  constexpr int kMT = Block::kMT, kBlockM = Block::kBlockM, kBlockN = Block::kBlockN, kThreads = Block::kThreads;
  constexpr int kDT = Block::kDT, kKD = Block::kKD;
  KILN_DYNAMIC_SMEM(smem);
  Block f;
  f.seq_k = p.seq_k;
  f.tiles_done = p.tiles_done;
  f.q_s = reinterpret_cast<T*>(smem);
  f.k_s = f.q_s + kBlockM * D;
  f.v_s = f.k_s + kBlockN * D;
  const int warp = threadIdx.x / 32;
  f.lane = threadIdx.x % 32;
  f.g = f.lane / 4;
  f.t = f.lane % 4;
  f.lj = f.lane / 8;
  f.lr = f.lane % 8;
  f.k_lane = tc::swizzle<D>(f.lr + 8 * (f.lj / 2), 8 * (f.lj % 2));
  f.v_lane = tc::swizzle<D>(f.lr + 8 * (f.lj % 2), 8 * (f.lj / 2));

  const int bh = blockIdx.y, b = bh / p.heads_q, hq = bh % p.heads_q;
  const int hkv = hq / (p.heads_q / p.heads_kv);
  const int q0 = f.q0 = blockIdx.x * kBlockM;
  const T* q = static_cast<const T*>(p.q) + size_t(bh) * p.seq_q * D;
  f.k = static_cast<const T*>(p.k) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  f.v = static_cast<const T*>(p.v) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const int* seg = f.seg = p.segment_ids != nullptr ? p.segment_ids + size_t(b) * p.seq_k : nullptr;
  const int row_w = f.row_w = warp * 16 * kMT;              // this warp's first row in the tile
  f.scale_log2 = p.scale * 1.4426950408889634f;             // exp(x) = exp2(x log2 e)
  const KeyTileWalk<kBlockM, kBlockN> walk(p, b, q0, seg);  // the key tiles, packed documents skipped
  const int offset = f.offset = walk.offset, n_tiles = walk.n_tiles;

  int j = walk.first();
  copy_tile_sw<T, D, kBlockM, kThreads>(f.q_s, q, q0, p.seq_q);
  if (j < n_tiles) copy_tile_sw<T, D, kBlockN, kThreads>(f.k_s, f.k, j * kBlockN, p.seq_k);
  tc::cp_async_commit();

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) f.o[mt][dt][0] = f.o[mt][dt][1] = f.o[mt][dt][2] = f.o[mt][dt][3] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f.m[mt][h] = -INFINITY;
      f.l[mt][h] = 0.f;
      const int qi = q0 + row_w + mt * 16 + f.g + 8 * h;
      f.limit[mt][h] = p.causal ? min(p.seq_k, qi + offset + 1) : p.seq_k;
      f.qseg[mt][h] = seg != nullptr && qi < p.seq_q ? seg[qi] : -1;
    }
  }

  tc::cp_async_wait<0>();
  __syncthreads();
  // Q's A fragments, once: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) of each 16 x 16.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      tc::ldmatrix<4, false>(f.qf[mt][kk],
                             f.q_s + tc::swizzle<D>(row_w + mt * 16 + f.lr + 8 * (f.lj % 2), kk * 16 + 8 * (f.lj / 2)));
    }
  }

  // The hot loop runs the tiles that need no mask; a masked tile (the diagonal, the ragged end,
  // a tile pair with more than one document) takes the other step, outside it.
  while (j < n_tiles) {
    while (j < n_tiles && !walk.needs_mask(j)) {
      const int jn = walk.next(j);
      f.template step<false>(j, jn < n_tiles ? jn : walk.tiles_k);
      j = jn;
    }
    if (j >= n_tiles) break;
    const int jn = walk.next(j);
    f.template step<true>(j, jn < n_tiles ? jn : walk.tiles_k);
    j = jn;
  }

  // out = O / l through this warp's rows of the Q tile (unused since its fragments were
  // loaded), then 128-bit rows to global memory; lse = m * scale + log(l), +inf for a row that
  // saw no key (its output is 0, and the backward's exp(s - lse) is 0 there).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_w + mt * 16 + f.g + 8 * h, qi = q0 + row;
      const float sum = tc::quad_sum(f.l[mt][h]);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      if (f.t == 0 && qi < p.seq_q) {
        p.lse[size_t(bh) * p.seq_q + qi] = sum > 0.f ? f.m[mt][h] * p.scale + __logf(sum) : INFINITY;
      }
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        *reinterpret_cast<uint32_t*>(f.q_s + tc::swizzle<D>(row, dt * 8 + 2 * f.t)) =
            tc::pack2<T>(f.o[mt][dt][2 * h] * inv, f.o[mt][dt][2 * h + 1] * inv);
      }
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out) + size_t(bh) * p.seq_q * D;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int it = 0; it < 16 * kMT * kChunks / 32; ++it) {
    const int i = f.lane + it * 32;
    const int row = row_w + i / kChunks, c = i % kChunks * 8;
    if (q0 + row < p.seq_q) {
      *reinterpret_cast<uint4*>(out + size_t(q0 + row) * D + c) =
          *reinterpret_cast<const uint4*>(f.q_s + tc::swizzle<D>(row, c));
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(FwdTile<D>::kThreads) flash_fwd_sm80_kernel(FlashFwdParams p) {
  if constexpr (tc::has_sm80()) {
    flash_fwd_sm80_body<T, D>(p);
  } else {
    __trap();
  }
}

}  // namespace
}  // namespace KILN_KERNELS_NS
