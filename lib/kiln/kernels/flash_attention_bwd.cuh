// The sm_80+ flash-attention backward, after FlashAttention-2's seqk-parallel flash_bwd kernels
// (included by flash_attention.cu, which documents the algorithm and holds the shared helpers).
// Written in the instructions of kernels/mma.cuh, in the forward's manner (flash_attention_fwd.cuh):
//
// - dK/dV: a CTA owns 64 keys of one (batch, KV head), warp w keys 16w..16w+15, and loops over
//   every query head of the GQA group and every query tile that can see its keys. dK and dV of
//   the warp's rows stay in fp32 registers for the whole loop, so the group's sum needs neither
//   atomics nor a second pass, and K and V are read from memory once. The scores are computed
//   transposed (S^T = K Q^T, dP^T = V dO^T): then P^T and dS^T are C fragments whose rows are the
//   warp's keys, packed in place into the A operands of dV += P^T dO and dK += dS^T Q (as the
//   forward reuses P), with Q and dO as B operands by ldmatrix.trans; nothing round-trips
//   through shared memory but dS for dQ.
// - K's and V's A fragments are read per k16 step with one ldmatrix.x4 (one per 8 mma) from their
//   tiles, which stay resident anyway: held in registers (BwdTile::kKVRegs) they add 32 at
//   D 64 and spill beside dK, dV (64 fp32) and the scores; at D 128 dK and dV alone are 128.
// - A tile's scores are computed in chunks (BwdTile::kChunk*): S^T, P^T, dV, then dP^T, dS^T,
//   dK, so that only one chunk's S^T and dP^T are live (16 queries of the dK/dV kernel; 16 keys
//   of the dQ kernel at D 64, 32 at D 128), and the atomic dQ is computed in column passes. At
//   D 64 that fits 168 registers, 3 CTAs = 12 warps per SM on sm_90 (ptxas -v: no spill).
// - The query tiles (Q, dO, and lse, delta for their 64 rows) are double-buffered: tile i+1 is
//   copied with cp.async while tile i is computed, one barrier per tile (two with the atomic dQ).
// - dQ, default: dS^T goes to a swizzled shared tile, and after a barrier each warp computes dQ
//   for 16 of the tile's query rows (dS by ldmatrix.trans of dS^T, K by ldmatrix.trans) and adds
//   it to the fp32 dq_accum with atomics; flash_bwd_dq_convert_kernel scales and rounds it.
// - dQ, deterministic: a second kernel per 64 queries of one (batch, query head) recomputes S
//   and dP over the key tiles in order with Q's and dO's fragments in registers, and reuses dS
//   from registers as the A operand of dQ += dS K (the forward's P V): a fixed summation order,
//   no atomics, no shared memory for dS. K and V tiles are double-buffered; Q and dO are staged
//   through the second buffer only to load their fragments.
// - Masks only where needed (the causal diagonal, the ragged key end, a tile pair with more than
//   one document), in a step of their own; the hot loops run the unmasked step. Query rows past
//   the end need no mask: their Q and dO rows are zero-filled and their lse is +inf, so P = 0.
// - Packed documents: with the per-tile document ranges (FlashShape::doc_ranges, 64-row tiles
//   for keys and queries alike since seq_q == seq_k there), a query tile (dK/dV) or key tile (dQ)
//   whose range cannot meet the CTA's is skipped, neither loaded nor computed.
// - ldmatrix addresses as in the forward: one per-lane offset per operand, another k16 step or
//   n16 block an XOR of it (the swizzle touches only the chunk bits), another row block a constant.
#pragma once

#include "kiln/kernels/flash_attention_fwd.cuh"  // copy_tile_sw, doc_range, KeyTileWalk

namespace KILN_KERNELS_NS {
namespace {

template <int D>
struct BwdTile {
  static constexpr int kWarps = 4, kThreads = kWarps * 32;
  static constexpr int kBlockM = 64, kBlockN = 64;  // query rows, key rows of a tile
  static constexpr bool kKVRegs = false;            // K's and V's A fragments in registers (spills; see the top)
  // Keys per chunk of the dQ kernel's tile (kChunk) and queries per chunk of the dK/dV kernel's
  // (kChunkKV): one chunk's scores are live at a time, so that D 64 fits 168 registers (3 CTAs
  // per SM, kMinBlocks) and D 128 255 (ptxas -v: larger chunks spill beside the accumulators).
  static constexpr int kChunk = D == 64 ? 16 : 32, kChunkKV = 16;
  static_assert(kChunk % 16 == 0 && kChunkKV % 16 == 0, "a chunk is whole k16 steps of the next product");
  static constexpr int kStages = 2;  // query-tile buffers of the dK/dV kernel
  static constexpr int kMinBlocksKV = D == 64 ? 3 : 1, kMinBlocksQ = D == 64 ? 3 : 1;
  static constexpr size_t kTileBytes = size_t(kBlockM) * D * 2;
  // K, V; Q and dO per stage; dS^T (64 x 64); lse and delta per stage.
  static constexpr size_t kKVSmemBytes =
      (2 + 2 * kStages) * kTileBytes + size_t(kBlockN) * kBlockM * 2 + size_t(kStages) * 2 * kBlockM * 4;
  static constexpr size_t kQSmemBytes = 4 * kTileBytes;  // K and V, two buffers (Q, dO staged in one)
};

template <int D>
constexpr size_t bwd_sm80_smem_bytes() {
  return BwdTile<D>::kKVSmemBytes > BwdTile<D>::kQSmemBytes ? BwdTile<D>::kKVSmemBytes : BwdTile<D>::kQSmemBytes;
}

// One dK/dV CTA: its tiles, its registers, and the step over one query tile.
template <typename T, int D, bool kDQ>
struct FlashBwdKVBlock {
  using Tile = BwdTile<D>;
  static constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kThreads = Tile::kThreads;
  static constexpr bool kKVRegs = Tile::kKVRegs;
  static constexpr int kQC = Tile::kChunkKV;  // queries per chunk of a tile
  static constexpr int kNC = kQC / 8;         // n8 tiles of a chunk's S^T
  static constexpr int kKC = kQC / 16;        // k16 steps of a chunk's P^T dO (queries)
  static constexpr int kDT = D / 8;           // n8 tiles of dK, dV, dQ
  static constexpr int kKD = D / 16;          // k16 steps of K Q^T
  static constexpr int kKN = kBlockN / 16;    // k16 steps of dS K (keys)

  int seq_q, seq_k, offset;
  bool causal;
  const int* seg;
  T *k_s, *v_s, *q_s, *do_s, *ds_s;  // q_s, do_s: stage 0, the next stage kBlockM * D on
  float *lse_s, *delta_s;            // stage 0, the next stage kBlockM on
  float* dq_accum;
  float scale_log2;
  int lane, g, t, warp;
  // ldmatrix lane offsets: A rows of this warp's keys (K, V); B non-transposed (rows n: Q, dO);
  // B transposed (rows k: dO, Q, K); A transposed from the dS^T tile (this warp's query rows).
  int a_lane, b_lane, bt_lane, ds_lane;
  int kj[2], kseg[2];  // rows g and g + 8: the key and its segment id
  uint32_t kf[kKVRegs ? kKD : 1][4], vf[kKVRegs ? kKD : 1][4];
  float dk[kDT][4], dv[kDT][4];

  __device__ __forceinline__ void kfrag(uint32_t (&a)[4], int kk) const {
    if constexpr (kKVRegs) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = kf[kk][i];
    } else {
      tc::ldmatrix<4, false>(a, k_s + (a_lane ^ (kk << 4)));
    }
  }
  __device__ __forceinline__ void vfrag(uint32_t (&a)[4], int kk) const {
    if constexpr (kKVRegs) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = vf[kk][i];
    } else {
      tc::ldmatrix<4, false>(a, v_s + (a_lane ^ (kk << 4)));
    }
  }

  // One query tile (landed in `stage`): S^T, dP^T, P^T, dS^T, dV and dK, then dQ if kDQ.
  template <bool kMask>
  __device__ __forceinline__ void step(int stage, int q0, float* dq_acc) {
    const T* qs = q_s + stage * kBlockM * D;
    const T* dos = do_s + stage * kBlockM * D;
    const float* lses = lse_s + stage * kBlockM;
    const float* deltas = delta_s + stage * kBlockM;

    // The tile in chunks of kQC queries: S^T, P^T, dV, dP^T, dS^T, dK per chunk keeps the live
    // scores to 2 x 16 fp32 (the whole tile's S^T and dP^T would add 32 registers). At D 128
    // the chunks are not unrolled: unrolled, their addresses stay live beside dK and dV (spills).
#pragma unroll(kDQ&& D == 128 ? kBlockM / kQC : 1)
    for (int c = 0; c < kBlockM / kQC; ++c) {
      // S^T = K Q^T: per k16 step and pair of n8 tiles, one ldmatrix.x4 of Q (rows n, columns k).
      float s[kNC][4];
#pragma unroll
      for (int nt = 0; nt < kNC; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKD; ++kk) {
        uint32_t ka[4];
        kfrag(ka, kk);
#pragma unroll
        for (int np = 0; np < kNC / 2; ++np) {
          uint32_t qb[4];
          tc::ldmatrix<4, false>(qb, qs + ((b_lane ^ (kk << 4)) + (c * kQC + np * 16) * D));
          const uint32_t b0[2] = {qb[0], qb[1]}, b1[2] = {qb[2], qb[3]};
          tc::mma_16816<T>(s[2 * np], ka, b0);
          tc::mma_16816<T>(s[2 * np + 1], ka, b1);
        }
      }

      // P^T = exp(S^T scale - lse) (lse_s holds lse log2 e), masked where kMask says.
#pragma unroll
      for (int nt = 0; nt < kNC; ++nt) {
        const float2 l = *reinterpret_cast<const float2*>(lses + c * kQC + nt * 8 + 2 * t);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int qi = q0 + c * kQC + nt * 8 + 2 * t + e;
          int qseg = -1;
          if constexpr (kMask) {
            if (seg != nullptr && qi < seq_q) qseg = seg[qi];
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float pr = tc::exp2_approx(s[nt][2 * h + e] * scale_log2 - (e == 0 ? l.x : l.y));
            if constexpr (kMask) {
              if (kj[h] >= seq_k || (causal && kj[h] > qi + offset) || (seg != nullptr && kseg[h] != qseg)) pr = 0.f;
            }
            s[nt][2 * h + e] = pr;
          }
        }
      }

      // dV += P^T dO: P^T's C tiles 2kk, 2kk + 1 packed are the A fragment over queries 16kk..;
      // dO's B fragments by ldmatrix.trans (rows k, columns n), two n8 tiles per x4.
#pragma unroll
      for (int kk = 0; kk < kKC; ++kk) {
        const uint32_t pf[4] = {tc::pack2<T>(s[2 * kk][0], s[2 * kk][1]), tc::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                tc::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                tc::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp2 = 0; dp2 < kDT / 2; ++dp2) {
          uint32_t ob[4];
          tc::ldmatrix<4, true>(ob, dos + ((bt_lane ^ (dp2 << 4)) + (c * kQC + kk * 16) * D));
          const uint32_t b0[2] = {ob[0], ob[1]}, b1[2] = {ob[2], ob[3]};
          tc::mma_16816<T>(dv[2 * dp2], pf, b0);
          tc::mma_16816<T>(dv[2 * dp2 + 1], pf, b1);
        }
      }

      // dP^T = V dO^T, then dS^T = P^T (dP^T - delta) in place.
      float dp[kNC][4];
#pragma unroll
      for (int nt = 0; nt < kNC; ++nt) dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKD; ++kk) {
        uint32_t va[4];
        vfrag(va, kk);
#pragma unroll
        for (int np = 0; np < kNC / 2; ++np) {
          uint32_t ob[4];
          tc::ldmatrix<4, false>(ob, dos + ((b_lane ^ (kk << 4)) + (c * kQC + np * 16) * D));
          const uint32_t b0[2] = {ob[0], ob[1]}, b1[2] = {ob[2], ob[3]};
          tc::mma_16816<T>(dp[2 * np], va, b0);
          tc::mma_16816<T>(dp[2 * np + 1], va, b1);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNC; ++nt) {
        const float2 d = *reinterpret_cast<const float2*>(deltas + c * kQC + nt * 8 + 2 * t);
#pragma unroll
        for (int i = 0; i < 4; ++i) dp[nt][i] = s[nt][i] * (dp[nt][i] - (i % 2 == 0 ? d.x : d.y));
      }

      // dK += dS^T Q, as dV; with the atomic dQ, dS^T also goes to its shared tile.
#pragma unroll
      for (int kk = 0; kk < kKC; ++kk) {
        const uint32_t df[4] = {tc::pack2<T>(dp[2 * kk][0], dp[2 * kk][1]), tc::pack2<T>(dp[2 * kk][2], dp[2 * kk][3]),
                                tc::pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                tc::pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
        if constexpr (kDQ) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp * 16 + g + 8 * h;
            *reinterpret_cast<uint32_t*>(ds_s + tc::swizzle<64>(row, c * kQC + kk * 16 + 2 * t)) = df[h];
            *reinterpret_cast<uint32_t*>(ds_s + tc::swizzle<64>(row, c * kQC + kk * 16 + 8 + 2 * t)) = df[2 + h];
          }
        }
#pragma unroll
        for (int dp2 = 0; dp2 < kDT / 2; ++dp2) {
          uint32_t qb[4];
          tc::ldmatrix<4, true>(qb, qs + ((bt_lane ^ (dp2 << 4)) + (c * kQC + kk * 16) * D));
          const uint32_t b0[2] = {qb[0], qb[1]}, b1[2] = {qb[2], qb[3]};
          tc::mma_16816<T>(dk[2 * dp2], df, b0);
          tc::mma_16816<T>(dk[2 * dp2 + 1], df, b1);
        }
      }
    }

    if constexpr (kDQ) {
      __syncthreads();  // every warp's dS^T rows are written
                        // dQ rows 16w.. of the tile = dS[16w.., 64 keys] K: A = dS by ldmatrix.trans of dS^T
                        // (rows: keys), B = K by ldmatrix.trans (rows: keys); at most 64 columns at a time on sm_80,
                        // so that at D 128 the dQ accumulator adds 32 registers beside dK and dV, not 64.
                        // (ptxas on sm_90 fits D 128's whole dQ without a spill, on sm_80 only in halves.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      constexpr int kDQT = D == 64 ? 4 : kDT;  // n8 tiles of dQ per pass
#else
      constexpr int kDQT = D == 64 ? 4 : 8;
#endif
#pragma unroll
      for (int d0 = 0; d0 < kDT; d0 += kDQT) {
        float dq[kDQT][4];
#pragma unroll
        for (int dt = 0; dt < kDQT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kKN; ++kk) {
          uint32_t a[4];
          tc::ldmatrix<4, true>(a, ds_s + (ds_lane + kk * 16 * 64));
#pragma unroll
          for (int dp2 = 0; dp2 < kDQT / 2; ++dp2) {
            uint32_t kb[4];
            tc::ldmatrix<4, true>(kb, k_s + ((bt_lane ^ ((d0 / 2 + dp2) << 4)) + kk * 16 * D));
            const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
            tc::mma_16816<T>(dq[2 * dp2], a, b0);
            tc::mma_16816<T>(dq[2 * dp2 + 1], a, b1);
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = warp * 16 + g + 8 * h;
          if (q0 + row < seq_q) {
            float* dst = dq_acc + size_t(q0 + row) * D + d0 * 8 + 2 * t;
#pragma unroll
            for (int dt = 0; dt < kDQT; ++dt) {
              atomicAdd(dst + dt * 8, dq[dt][2 * h]);
              atomicAdd(dst + dt * 8 + 1, dq[dt][2 * h + 1]);
            }
          }
        }
      }
    }
  }
};

template <typename T, int D, bool kDQ>
__device__ __forceinline__ void flash_bwd_dkdv_sm80_body(const FlashBwdParams& p) {
  using Block = FlashBwdKVBlock<T, D, kDQ>;
  constexpr int kBlockM = Block::kBlockM, kBlockN = Block::kBlockN, kThreads = Block::kThreads;
  constexpr int kDT = Block::kDT, kKD = Block::kKD;
  KILN_DYNAMIC_SMEM(smem);
  Block f;
  f.seq_q = p.seq_q;
  f.seq_k = p.seq_k;
  f.causal = p.causal;
  const int offset = f.offset = p.seq_k - p.seq_q;  // causal alignment: query i sees keys <= i + offset
  f.k_s = reinterpret_cast<T*>(smem);
  f.v_s = f.k_s + kBlockN * D;
  f.q_s = f.v_s + kBlockN * D;
  f.do_s = f.q_s + BwdTile<D>::kStages * kBlockM * D;
  f.ds_s = f.do_s + BwdTile<D>::kStages * kBlockM * D;
  f.lse_s = reinterpret_cast<float*>(f.ds_s + kBlockN * kBlockM);
  f.delta_s = f.lse_s + BwdTile<D>::kStages * kBlockM;
  const int warp = f.warp = threadIdx.x / 32;
  f.lane = threadIdx.x % 32;
  f.g = f.lane / 4;
  f.t = f.lane % 4;
  const int lj = f.lane / 8, lr = f.lane % 8;
  f.a_lane = tc::swizzle<D>(warp * 16 + lr + 8 * (lj % 2), 8 * (lj / 2));
  f.b_lane = tc::swizzle<D>(lr + 8 * (lj / 2), 8 * (lj % 2));
  f.bt_lane = tc::swizzle<D>(lr + 8 * (lj % 2), 8 * (lj / 2));
  f.ds_lane = tc::swizzle<64>(lr + 8 * (lj / 2), warp * 16 + 8 * (lj % 2));
  f.scale_log2 = p.scale * 1.4426950408889634f;

  const int b = blockIdx.y / p.heads_kv, hkv = blockIdx.y % p.heads_kv, group = p.heads_q / p.heads_kv;
  const int k0 = blockIdx.x * kBlockN;
  const size_t kv_off = (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const int* seg = f.seg = p.segment_ids != nullptr ? p.segment_ids + size_t(b) * p.seq_k : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int kj = f.kj[h] = k0 + warp * 16 + f.g + 8 * h;
    f.kseg[h] = seg != nullptr && kj < p.seq_k ? seg[kj] : -2;
  }

  // The query tiles that can see these keys: causal, from the first that reaches key k0; packed
  // documents, those whose id range meets the key tile's.
  const int n_qt = (p.seq_q + kBlockM - 1) / kBlockM;
  const int qt_begin = p.causal ? max(0, k0 - offset) / kBlockM : 0;
  const int tiles_k = (p.seq_k + kBlockN - 1) / kBlockN;
  const int* ranges = seg != nullptr && p.doc_ranges != nullptr ? p.doc_ranges + size_t(b) * tiles_k * 2 : nullptr;
  int2 kr = make_int2(0, 0);
  if (ranges != nullptr) kr = make_int2(ranges[2 * blockIdx.x], ranges[2 * blockIdx.x + 1]);
  auto visible = [&](int qt) {
    return qt < n_qt && (ranges == nullptr || !(ranges[2 * qt + 1] < kr.x || ranges[2 * qt] > kr.y));
  };
  // (h, qt) -> the next visible (head, query tile) pair; h == group past the last.
  auto advance = [&](int& h, int& qt) {
    do {
      if (++qt >= n_qt) {
        ++h;
        qt = qt_begin;
      }
    } while (h < group && !visible(qt));
  };
  auto needs_mask = [&](int qt) {
    if (k0 + kBlockN > p.seq_k || (p.causal && k0 + kBlockN - 1 > qt * kBlockM + offset)) return true;
    if (seg == nullptr) return false;
    return ranges == nullptr || !(kr.x == kr.y && ranges[2 * qt] == kr.x && ranges[2 * qt + 1] == kr.x);
  };
  const size_t bhq0 = size_t(b) * p.heads_q + size_t(hkv) * group;  // the group's first query head
  // Starts copying query tile qt of head h (of the group) into `stage`: Q and dO by cp.async,
  // lse (times log2 e; +inf past the end, so P = 0 there) and delta by plain loads.
  auto issue = [&](int h, int qt, int stage) {
    const size_t bhq = bhq0 + h;
    const int q0 = qt * kBlockM;
    copy_tile_sw<T, D, kBlockM, kThreads>(f.q_s + stage * kBlockM * D, static_cast<const T*>(p.q) + bhq * p.seq_q * D,
                                          q0, p.seq_q);
    copy_tile_sw<T, D, kBlockM, kThreads>(f.do_s + stage * kBlockM * D,
                                          static_cast<const T*>(p.dout) + bhq * p.seq_q * D, q0, p.seq_q);
    const int i = threadIdx.x % kBlockM, qi = q0 + i;
    if (threadIdx.x < kBlockM) {
      f.lse_s[stage * kBlockM + i] = qi < p.seq_q ? p.lse[bhq * p.seq_q + qi] * 1.4426950408889634f : INFINITY;
    } else {
      f.delta_s[stage * kBlockM + i] = qi < p.seq_q ? p.delta[bhq * p.seq_q + qi] : 0.f;
    }
  };

  int h = 0, qt = qt_begin - 1;
  advance(h, qt);
  copy_tile_sw<T, D, kBlockN, kThreads>(f.k_s, static_cast<const T*>(p.k) + kv_off, k0, p.seq_k);
  copy_tile_sw<T, D, kBlockN, kThreads>(f.v_s, static_cast<const T*>(p.v) + kv_off, k0, p.seq_k);
  if (h < group) issue(h, qt, 0);
  tc::cp_async_commit();
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f.dk[dt][i] = f.dv[dt][i] = 0.f;
  }
  tc::cp_async_wait<0>();
  __syncthreads();
  if constexpr (Block::kKVRegs) {
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      tc::ldmatrix<4, false>(f.kf[kk], f.k_s + (f.a_lane ^ (kk << 4)));
      tc::ldmatrix<4, false>(f.vf[kk], f.v_s + (f.a_lane ^ (kk << 4)));
    }
  }

  // One query tile: the next one's copy in flight during it, then a barrier.
  int stage = 0;
  auto tile = [&](auto mask) {
    int nh = h, nqt = qt;
    advance(nh, nqt);
    if (nh < group) issue(nh, nqt, stage ^ 1);
    tc::cp_async_commit();
    float* dq_acc = kDQ ? p.dq_accum + (bhq0 + h) * p.seq_q * D : nullptr;
    f.template step<decltype(mask)::value>(stage, qt * kBlockM, dq_acc);
    tc::cp_async_wait<0>();
    __syncthreads();  // the next tile has landed, and every warp is done with this one
    h = nh;
    qt = nqt;
    stage ^= 1;
  };
  while (h < group) {
    while (h < group && !needs_mask(qt)) tile(std::false_type{});
    if (h >= group) break;
    tile(std::true_type{});
  }

  // dK scale and dV through this warp's rows of the K and V tiles (no warp reads them after the
  // last barrier; without one, each warp has read only its own rows), then 128-bit rows.
  __syncwarp();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = warp * 16 + f.g + 8 * hh;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      *reinterpret_cast<uint32_t*>(f.k_s + tc::swizzle<D>(row, dt * 8 + 2 * f.t)) =
          tc::pack2<T>(f.dk[dt][2 * hh] * p.scale, f.dk[dt][2 * hh + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(f.v_s + tc::swizzle<D>(row, dt * 8 + 2 * f.t)) =
          tc::pack2<T>(f.dv[dt][2 * hh], f.dv[dt][2 * hh + 1]);
    }
  }
  __syncwarp();
  T* dk = static_cast<T*>(p.dk) + kv_off;
  T* dv = static_cast<T*>(p.dv) + kv_off;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int it = 0; it < 16 * kChunks / 32; ++it) {
    const int i = f.lane + it * 32;
    const int row = warp * 16 + i / kChunks, c = i % kChunks * 8;
    if (k0 + row < p.seq_k) {
      *reinterpret_cast<uint4*>(dk + size_t(k0 + row) * D + c) =
          *reinterpret_cast<const uint4*>(f.k_s + tc::swizzle<D>(row, c));
      *reinterpret_cast<uint4*>(dv + size_t(k0 + row) * D + c) =
          *reinterpret_cast<const uint4*>(f.v_s + tc::swizzle<D>(row, c));
    }
  }
}

// One deterministic-dQ CTA: 64 query rows of one (batch, query head), warp w rows 16w..16w+15.
template <typename T, int D>
struct FlashBwdQBlock {
  using Tile = BwdTile<D>;
  static constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kThreads = Tile::kThreads;
  static constexpr int kKCh = Tile::kChunk;  // keys per chunk of a tile
  static constexpr int kNC = kKCh / 8;       // n8 tiles of a chunk's S
  static constexpr int kKC = kKCh / 16;      // k16 steps of a chunk's dS K
  static constexpr int kDT = D / 8;          // n8 tiles of dQ
  static constexpr int kKD = D / 16;         // k16 steps of Q K^T

  int seq_k;
  const int* seg;
  const T *k, *v;
  T* kv_s;  // K, V of buffer 0; buffer 1 is 2 * kBlockN * D on
  int lane, g, t, b_lane, bt_lane;
  float scale_log2;
  uint32_t qf[kKD][4], of[kKD][4];  // Q's and dO's A fragments, loaded once
  float dq[kDT][4];
  float lse2[2], dl[2];  // rows g and g + 8: lse log2 e and delta
  int limit[2], qseg[2];

  // One key tile (K_j, V_j landed in `buf`): S, dP, dS = P (dP - delta), dQ += dS K, with the
  // next tile's copy into the other buffer in flight.
  template <bool kMask>
  __device__ __forceinline__ void step(int j, int jn, int buf) {
    const int k0 = j * kBlockN;
    T* ks = kv_s + buf * 2 * kBlockN * D;
    T* vs = ks + kBlockN * D;
    if (jn * kBlockN < seq_k) {
      T* kn = kv_s + (buf ^ 1) * 2 * kBlockN * D;
      copy_tile_sw<T, D, kBlockN, kThreads>(kn, k, jn * kBlockN, seq_k);
      copy_tile_sw<T, D, kBlockN, kThreads>(kn + kBlockN * D, v, jn * kBlockN, seq_k);
    }
    tc::cp_async_commit();

    // In chunks of kKCh keys, not unrolled (the whole tile's S and dP, or the unrolled chunks'
    // addresses, would not fit beside Q's, dO's fragments and dQ: ptxas -v spills).
#pragma unroll 1
    for (int c = 0; c < kBlockN / kKCh; ++c) {
      float s[kNC][4], dp[kNC][4];
#pragma unroll
      for (int nt = 0; nt < kNC; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] = dp[nt][i] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < kKD; ++kk) {
#pragma unroll
        for (int np = 0; np < kNC / 2; ++np) {
          uint32_t kb[4], vb[4];
          tc::ldmatrix<4, false>(kb, ks + ((b_lane ^ (kk << 4)) + (c * kKCh + np * 16) * D));
          tc::ldmatrix<4, false>(vb, vs + ((b_lane ^ (kk << 4)) + (c * kKCh + np * 16) * D));
          const uint32_t k0b[2] = {kb[0], kb[1]}, k1b[2] = {kb[2], kb[3]};
          const uint32_t v0b[2] = {vb[0], vb[1]}, v1b[2] = {vb[2], vb[3]};
          tc::mma_16816<T>(s[2 * np], qf[kk], k0b);
          tc::mma_16816<T>(s[2 * np + 1], qf[kk], k1b);
          tc::mma_16816<T>(dp[2 * np], of[kk], v0b);
          tc::mma_16816<T>(dp[2 * np + 1], of[kk], v1b);
        }
      }

#pragma unroll
      for (int nt = 0; nt < kNC; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kj = k0 + c * kKCh + nt * 8 + 2 * t + e;
          int kseg = -2;
          if constexpr (kMask) {
            if (seg != nullptr && kj < seq_k) kseg = seg[kj];
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float pr = tc::exp2_approx(s[nt][2 * h + e] * scale_log2 - lse2[h]);
            if constexpr (kMask) {
              if (kj >= limit[h] || (seg != nullptr && kseg != qseg[h])) pr = 0.f;
            }
            dp[nt][2 * h + e] = pr * (dp[nt][2 * h + e] - dl[h]);
          }
        }
      }

      // dQ += dS K: dS's C tiles packed are the A fragment over keys c kKCh + 16kk..; K by ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < kKC; ++kk) {
        const uint32_t df[4] = {tc::pack2<T>(dp[2 * kk][0], dp[2 * kk][1]), tc::pack2<T>(dp[2 * kk][2], dp[2 * kk][3]),
                                tc::pack2<T>(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                tc::pack2<T>(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
        for (int dp2 = 0; dp2 < kDT / 2; ++dp2) {
          uint32_t kb[4];
          tc::ldmatrix<4, true>(kb, ks + ((bt_lane ^ (dp2 << 4)) + (c * kKCh + kk * 16) * D));
          const uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
          tc::mma_16816<T>(dq[2 * dp2], df, b0);
          tc::mma_16816<T>(dq[2 * dp2 + 1], df, b1);
        }
      }
    }

    tc::cp_async_wait<0>();
    __syncthreads();  // the next tile has landed, and every warp is done with this one
  }
};

template <typename T, int D>
__device__ __forceinline__ void flash_bwd_dq_sm80_body(const FlashBwdParams& p) {
  using Block = FlashBwdQBlock<T, D>;
  constexpr int kBlockM = Block::kBlockM, kBlockN = Block::kBlockN, kThreads = Block::kThreads;
  constexpr int kDT = Block::kDT, kKD = Block::kKD;
  KILN_DYNAMIC_SMEM(smem);
  Block f;
  f.seq_k = p.seq_k;
  f.kv_s = reinterpret_cast<T*>(smem);
  const int warp = threadIdx.x / 32;
  f.lane = threadIdx.x % 32;
  f.g = f.lane / 4;
  f.t = f.lane % 4;
  const int lj = f.lane / 8, lr = f.lane % 8;
  f.b_lane = tc::swizzle<D>(lr + 8 * (lj / 2), 8 * (lj % 2));
  f.bt_lane = tc::swizzle<D>(lr + 8 * (lj % 2), 8 * (lj / 2));
  f.scale_log2 = p.scale * 1.4426950408889634f;

  const int bh = blockIdx.y, b = bh / p.heads_q, hq = bh % p.heads_q;
  const int hkv = hq / (p.heads_q / p.heads_kv);
  const int q0 = blockIdx.x * kBlockM;
  const size_t q_off = size_t(bh) * p.seq_q * D;
  f.k = static_cast<const T*>(p.k) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  f.v = static_cast<const T*>(p.v) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const int* seg = f.seg = p.segment_ids != nullptr ? p.segment_ids + size_t(b) * p.seq_k : nullptr;
  const KeyTileWalk<kBlockM, kBlockN> walk(p, b, q0, seg);
  const int offset = walk.offset, n_tiles = walk.n_tiles;
  const int row_w = warp * 16;

  // Q and dO through buffer 1 (their fragments, then free), the first K and V into buffer 0.
  int j = walk.first();
  T* q_s = f.kv_s + 2 * kBlockN * D;
  T* do_s = q_s + kBlockM * D;
  copy_tile_sw<T, D, kBlockM, kThreads>(q_s, static_cast<const T*>(p.q) + q_off, q0, p.seq_q);
  copy_tile_sw<T, D, kBlockM, kThreads>(do_s, static_cast<const T*>(p.dout) + q_off, q0, p.seq_q);
  if (j < n_tiles) {
    copy_tile_sw<T, D, kBlockN, kThreads>(f.kv_s, f.k, j * kBlockN, p.seq_k);
    copy_tile_sw<T, D, kBlockN, kThreads>(f.kv_s + kBlockN * D, f.v, j * kBlockN, p.seq_k);
  }
  tc::cp_async_commit();
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) f.dq[dt][0] = f.dq[dt][1] = f.dq[dt][2] = f.dq[dt][3] = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qi = q0 + row_w + f.g + 8 * h;
    f.lse2[h] = qi < p.seq_q ? p.lse[size_t(bh) * p.seq_q + qi] * 1.4426950408889634f : INFINITY;
    f.dl[h] = qi < p.seq_q ? p.delta[size_t(bh) * p.seq_q + qi] : 0.f;
    f.limit[h] = p.causal ? min(p.seq_k, qi + offset + 1) : p.seq_k;
    f.qseg[h] = seg != nullptr && qi < p.seq_q ? seg[qi] : -1;
  }
  tc::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < kKD; ++kk) {
    const int off = tc::swizzle<D>(row_w + lr + 8 * (lj % 2), kk * 16 + 8 * (lj / 2));
    tc::ldmatrix<4, false>(f.qf[kk], q_s + off);
    tc::ldmatrix<4, false>(f.of[kk], do_s + off);
  }
  __syncthreads();  // every warp has its fragments: buffer 1 is free for K, V

  int buf = 0;
  while (j < n_tiles) {
    while (j < n_tiles && !walk.needs_mask(j)) {
      const int jn = walk.next(j);
      f.template step<false>(j, jn < n_tiles ? jn : walk.tiles_k, buf);
      buf ^= 1;
      j = jn;
    }
    if (j >= n_tiles) break;
    const int jn = walk.next(j);
    f.template step<true>(j, jn < n_tiles ? jn : walk.tiles_k, buf);
    buf ^= 1;
    j = jn;
  }

  // dq = dQ scale through this warp's rows of buffer 0 (free after the last barrier), then
  // 128-bit rows.
  T* o_s = f.kv_s;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_w + f.g + 8 * h;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      *reinterpret_cast<uint32_t*>(o_s + tc::swizzle<D>(row, dt * 8 + 2 * f.t)) =
          tc::pack2<T>(f.dq[dt][2 * h] * p.scale, f.dq[dt][2 * h + 1] * p.scale);
    }
  }
  __syncwarp();
  T* dq = static_cast<T*>(p.dq) + q_off;
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int it = 0; it < 16 * kChunks / 32; ++it) {
    const int i = f.lane + it * 32;
    const int row = row_w + i / kChunks, c = i % kChunks * 8;
    if (q0 + row < p.seq_q) {
      *reinterpret_cast<uint4*>(dq + size_t(q0 + row) * D + c) =
          *reinterpret_cast<const uint4*>(o_s + tc::swizzle<D>(row, c));
    }
  }
}

template <typename T, int D, bool kDQ>
__global__ void __launch_bounds__(BwdTile<D>::kThreads, BwdTile<D>::kMinBlocksKV)
    flash_bwd_dkdv_sm80_kernel(FlashBwdParams p) {
  if constexpr (tc::has_sm80()) {
    flash_bwd_dkdv_sm80_body<T, D, kDQ>(p);
  } else {
    __trap();
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(BwdTile<D>::kThreads, BwdTile<D>::kMinBlocksQ)
    flash_bwd_dq_sm80_kernel(FlashBwdParams p) {
  if constexpr (tc::has_sm80()) {
    flash_bwd_dq_sm80_body<T, D>(p);
  } else {
    __trap();
  }
}

template <typename T, int D>
void launch_bwd_sm80(const FlashBwdParams& p, Stream stream) {
  using Tile = BwdTile<D>;
  const size_t rows = size_t(p.batch) * p.heads_q * p.seq_q;
  const auto delta_kernel = flash_bwd_delta_kernel<T, D>;
  KILN_LAUNCH(delta_kernel, static_cast<unsigned>((rows + 7) / 8), 256, 0, stream, static_cast<const T*>(p.out),
              static_cast<const T*>(p.dout), p.delta, rows);
  launch_doc_ranges(p, stream);
  const dim3 kv_grid((p.seq_k + Tile::kBlockN - 1) / Tile::kBlockN, p.batch * p.heads_kv);
  if (p.deterministic) {
    const auto dkdv = flash_bwd_dkdv_sm80_kernel<T, D, false>;
    allow_smem(dkdv, Tile::kKVSmemBytes);
    KILN_LAUNCH(dkdv, kv_grid, Tile::kThreads, Tile::kKVSmemBytes, stream, p);
    const auto dq = flash_bwd_dq_sm80_kernel<T, D>;
    allow_smem(dq, Tile::kQSmemBytes);
    const dim3 q_grid((p.seq_q + Tile::kBlockM - 1) / Tile::kBlockM, p.batch * p.heads_q);
    KILN_LAUNCH(dq, q_grid, Tile::kThreads, Tile::kQSmemBytes, stream, p);
  } else {
    const auto dkdv = flash_bwd_dkdv_sm80_kernel<T, D, true>;
    allow_smem(dkdv, Tile::kKVSmemBytes);
    KILN_LAUNCH(dkdv, kv_grid, Tile::kThreads, Tile::kKVSmemBytes, stream, p);
    const size_t n = rows * D;
    const auto convert = flash_bwd_dq_convert_kernel<T>;
    KILN_LAUNCH(convert, static_cast<unsigned>(std::min<size_t>((n + 255) / 256, 65535)), 256, 0, stream, p.dq_accum,
                static_cast<T*>(p.dq), p.scale, n);
  }
}

}  // namespace
}  // namespace KILN_KERNELS_NS
