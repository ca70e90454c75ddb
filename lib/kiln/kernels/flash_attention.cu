// Flash-attention forward, FlashAttention-2 style, on WMMA tensor-core tiles.
//
// One CTA = 64 query rows of one (batch, query head); 4 warps of 16 rows each. Per key tile of 64:
//   S = Q K^T (WMMA bf16/fp16 -> fp32, into shared memory), per-row online softmax by the warp
//   (running max m, denominator l, rescale factor alpha), P in the input dtype, O = alpha * O + P V
//   with O kept in fp32 in shared memory (WMMA accumulators are loaded from and stored back to it,
//   since a fragment's element-to-row mapping is unspecified and rows must be rescaled).
// GQA: the CTA reads the K/V head hq / (Hq / Hkv); nothing is repeated in memory. Causal tiles
// past the diagonal are skipped. Shared memory: 640 * D + 25 KiB (66 KiB at D = 64, 105 KiB at
// D = 128), hence the opt-in dynamic shared memory size.
//
// This first version favours clarity over the last factor of speed (no cp.async pipelining, no
// register-resident O); docs/kernels.md lists what a faster one changes. The backward pass is
// ops/flash_attention.cpp's blocked algorithm, which recomputes from the log-sum-exp written here.
#include "kiln/kernels/flash_attention.cuh"

#include <cuda_runtime.h>
#include <mma.h>

#include <cfloat>

namespace kiln::kernels {
namespace {

using namespace nvcuda;

constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32, kRows = 16;

__host__ __device__ constexpr size_t smem_bytes(int d) {
  return 3 * size_t(kBlockQ) * d * 2             // Q, K, V tiles (16-bit)
         + size_t(kWarps) * kRows * kBlockK * 4  // S (fp32) per warp
         + size_t(kWarps) * kRows * kBlockK * 2  // P (16-bit) per warp
         + size_t(kWarps) * kRows * d * 4        // O (fp32) per warp
         + size_t(kWarps) * kRows * 3 * 4;       // m, l, alpha per row
}

// Copies rows [row0, row0 + 64) of a [rows, D] matrix into shared memory, zero past `rows`.
template <typename T, int D>
__device__ void load_tile(T* dst, const T* src, int row0, int rows) {
  constexpr int kVec = 8;  // 16 bytes of 16-bit values
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int i = threadIdx.x; i < kBlockQ * D / kVec; i += kThreads) {
    const int r = i * kVec / D, c = i * kVec % D;
    const uint4 val = row0 + r < rows ? *reinterpret_cast<const uint4*>(src + size_t(row0 + r) * D + c) : zero;
    *reinterpret_cast<uint4*>(dst + r * D + c) = val;
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

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(FlashFwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* cursor = smem;
  auto take = [&](size_t bytes) {
    unsigned char* at = cursor;
    cursor += bytes;
    return at;
  };
  T* q_s = reinterpret_cast<T*>(take(sizeof(T) * kBlockQ * D));
  T* k_s = reinterpret_cast<T*>(take(sizeof(T) * kBlockK * D));
  T* v_s = reinterpret_cast<T*>(take(sizeof(T) * kBlockK * D));
  float* s_w = reinterpret_cast<float*>(take(4 * kWarps * kRows * kBlockK)) + warp * kRows * kBlockK;
  T* p_w = reinterpret_cast<T*>(take(sizeof(T) * kWarps * kRows * kBlockK)) + warp * kRows * kBlockK;
  float* o_w = reinterpret_cast<float*>(take(4 * kWarps * kRows * D)) + warp * kRows * D;
  float* m_row = reinterpret_cast<float*>(take(4 * kWarps * kRows * 3)) + warp * kRows * 3;
  float* l_row = m_row + kRows;
  float* alpha_row = m_row + 2 * kRows;

  const int bh = blockIdx.y, b = bh / p.heads_q, hq = bh % p.heads_q;
  const int hkv = hq / (p.heads_q / p.heads_kv);
  const int q0 = blockIdx.x * kBlockQ;
  const T* q = static_cast<const T*>(p.q) + size_t(bh) * p.seq_q * D;
  const T* k = static_cast<const T*>(p.k) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const T* v = static_cast<const T*>(p.v) + (size_t(b) * p.heads_kv + hkv) * p.seq_k * D;
  const int offset = p.seq_k - p.seq_q;  // causal alignment: query i sees keys <= i + offset

  load_tile<T, D>(q_s, q, q0, p.seq_q);
  for (int i = lane; i < kRows * D; i += 32) o_w[i] = 0.f;
  if (lane < kRows) {
    m_row[lane] = -FLT_MAX;
    l_row[lane] = 0.f;
  }
  const int k_end = p.causal ? min(p.seq_k, q0 + kBlockQ + offset) : p.seq_k;

  for (int k0 = 0; k0 < k_end; k0 += kBlockK) {
    __syncthreads();  // the previous tile is no longer read
    load_tile<T, D>(k_s, k, k0, p.seq_k);
    load_tile<T, D>(v_s, v, k0, p.seq_k);
    __syncthreads();

    // S = Q_w K^T: [16 x D] x [D x 64]; K stored row-major [64][D] is K^T in column-major.
    for (int n = 0; n < kBlockK / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bfrag;
        wmma::load_matrix_sync(a, q_s + warp * kRows * D + kk * 16, D);
        wmma::load_matrix_sync(bfrag, k_s + n * 16 * D + kk * 16, D);
        wmma::mma_sync(acc, a, bfrag, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, kBlockK, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, one row at a time; lane covers columns lane and lane + 32.
    for (int r = 0; r < kRows; ++r) {
      const int qi = q0 + warp * kRows + r;
      float s[2];
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j, ki = k0 + c;
        const bool masked = ki >= p.seq_k || (p.causal && ki > qi + offset);
        s[j] = masked ? -INFINITY : s_w[r * kBlockK + c] * p.scale;
      }
      const float m_old = m_row[r];
      // m starts at -FLT_MAX, not -inf, so a row whose keys are all masked so far gives
      // exp(-inf - m) = 0 rather than exp(-inf + inf) = NaN.
      const float m_new = fmaxf(m_old, warp_max(fmaxf(s[0], s[1])));
      const float p0 = __expf(s[0] - m_new), p1 = __expf(s[1] - m_new);
      const float sum = warp_sum(p0 + p1);
      p_w[r * kBlockK + lane] = static_cast<T>(p0);
      p_w[r * kBlockK + lane + 32] = static_cast<T>(p1);
      __syncwarp();
      if (lane == 0) {
        const float alpha = m_old == -FLT_MAX ? 0.f : __expf(m_old - m_new);
        alpha_row[r] = alpha;
        l_row[r] = l_row[r] * alpha + sum;
        m_row[r] = m_new;
      }
    }
    __syncwarp();
    for (int i = lane; i < kRows * D; i += 32) o_w[i] *= alpha_row[i / D];
    __syncwarp();

    // O_w += P V: [16 x 64] x [64 x D].
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + n * 16, D, wmma::mem_row_major);
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bfrag;
        wmma::load_matrix_sync(a, p_w + kk * 16, kBlockK);
        wmma::load_matrix_sync(bfrag, v_s + kk * 16 * D + n * 16, D);
        wmma::mma_sync(acc, a, bfrag, acc);
      }
      wmma::store_matrix_sync(o_w + n * 16, acc, D, wmma::mem_row_major);
    }
    __syncwarp();
  }

  // out = O / l, lse = m + log(l), for the rows that exist.
  T* out = static_cast<T*>(p.out) + size_t(bh) * p.seq_q * D;
  for (int r = 0; r < kRows; ++r) {
    const int qi = q0 + warp * kRows + r;
    if (qi >= p.seq_q) break;
    const float inv = 1.f / l_row[r];
    for (int c = lane; c < D; c += 32) out[size_t(qi) * D + c] = static_cast<T>(o_w[r * D + c] * inv);
    if (lane == 0) p.lse[size_t(bh) * p.seq_q + qi] = m_row[r] + __logf(l_row[r]);
  }
}

template <typename T, int D>
void launch(const FlashFwdParams& p, Stream stream) {
  const size_t bytes = smem_bytes(D);
  cudaFuncSetAttribute(flash_fwd_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  const dim3 grid((p.seq_q + kBlockQ - 1) / kBlockQ, p.batch * p.heads_q);
  flash_fwd_kernel<T, D><<<grid, kThreads, bytes, stream>>>(p);
}

}  // namespace

bool flash_fwd_supported(const FlashFwdParams& p) {
  return (p.dtype == DType::kBFloat16 || p.dtype == DType::kFloat16) && (p.head_dim == 64 || p.head_dim == 128) &&
         p.batch > 0 && p.heads_q > 0 && p.heads_kv > 0 && p.heads_q % p.heads_kv == 0 && p.seq_q > 0 &&
         p.seq_k >= (p.causal ? p.seq_q : 1);
}

void launch_flash_fwd(const FlashFwdParams& p, Stream stream) {
  if (p.dtype == DType::kBFloat16) {
    p.head_dim == 64 ? launch<__nv_bfloat16, 64>(p, stream) : launch<__nv_bfloat16, 128>(p, stream);
  } else {
    p.head_dim == 64 ? launch<__half, 64>(p, stream) : launch<__half, 128>(p, stream);
  }
}

}  // namespace kiln::kernels
