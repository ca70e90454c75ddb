// Warp-level tensor-core primitives of sm_80 and later, the vocabulary of the FA2-class attention
// kernels: ldmatrix (x1/x2/x4, .trans), mma.sync.m16n8k16 (bf16/fp16 in, fp32 accumulate),
// cp.async, the XOR swizzle of 16-bit shared tiles, and packing fp32 pairs to 16 bits. On the
// GPU each is one PTX instruction; compiled against the CPU emulation (KILN_CUDA_EMULATION) each
// is a warp collective with the PTX ISA's fragment layouts (emulation_mma.h), so one kernel
// source runs in both. Fragment layouts (g = lane / 4, t = lane % 4):
//   A, m16 x k16, 4 registers: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B, k16 x n8, 2 registers:  (2t..2t+1, g), (2t+8.., g)
//   C, m16 x n8, 4 fp32:       (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// so C tiles 2j and 2j+1 of a row block, packed pairwise to 16 bits, are the A operand over keys
// 16j..16j+15: the probabilities of S = Q K^T feed P V without leaving registers.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kiln/kernels/common.cuh"

namespace KILN_KERNELS_NS {
namespace tc {

// Whether this compilation pass has sm_80's instructions (the emulation has them all).
__host__ __device__ constexpr bool has_sm80() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return false;
#else
  return true;
#endif
}

// ---- shared-memory layout

// Element offset of (row, col) in a 16-bit [rows x D] tile whose 16-byte chunks are XOR-swizzled
// by row: chunk c of row r lives at chunk c ^ (r % 8). Eight consecutive rows' chunk c fall in
// eight different 16-byte bank groups, so ldmatrix (8 rows x 16 bytes per matrix) and the
// cp.async fills (whole rows) are conflict-free with no padding. D is a multiple of 64.
template <int D>
__host__ __device__ __forceinline__ int swizzle(int row, int col) {
  static_assert(D % 64 == 0, "the swizzle permutes 8 chunks of 8 elements");
  return row * D + (((col >> 3) ^ (row & 7)) << 3) + (col & 7);
}

// ---- cp.async (16 bytes, zero-filled when !valid) and its groups

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(KILN_CUDA_EMULATION)
  ::kiln::emu::cp_async16(smem, gmem, valid);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
#else
  (void)smem, (void)gmem, (void)valid;
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(KILN_CUDA_EMULATION)
  ::kiln::emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed groups of this thread are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(KILN_CUDA_EMULATION)
  ::kiln::emu::cp_async_wait(kPending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// ---- ldmatrix: lane 8j + r gives the address of row r of matrix j (16 bytes, shared memory)

template <int kNum, bool kTrans>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[kNum], const void* row) {
  static_assert(kNum == 1 || kNum == 2 || kNum == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(KILN_CUDA_EMULATION)
  ::kiln::emu::ldmatrix(r, kNum, kTrans, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kNum == 4 && kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else if constexpr (kNum == 4) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else if constexpr (kNum == 2 && kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  } else if constexpr (kNum == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  } else if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  }
#else
  (void)r, (void)row;
  __trap();
#endif
}

// ---- mma.sync.m16n8k16, fp32 accumulate in place: acc += A B (T: __nv_bfloat16 or __half)

template <typename T>
__device__ __forceinline__ void mma_16816(float (&acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or fp16 operands");
#if defined(KILN_CUDA_EMULATION)
  ::kiln::emu::mma_16816(acc, a, b, acc, std::is_same_v<T, __nv_bfloat16>);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)acc, (void)a, (void)b;
  __trap();
#endif
}

// ---- registers

// Two fp32 values rounded to T and packed, `lo` in the low half (the first column of a pair).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const T l = static_cast<T>(lo), h = static_cast<T>(hi);
  uint16_t lb, hb;
  static_assert(sizeof(T) == 2, "16-bit values");
  __builtin_memcpy(&lb, &l, 2);
  __builtin_memcpy(&hb, &h, 2);
  return uint32_t(lb) | (uint32_t(hb) << 16);
}

// 2^x: one MUFU.EX2 on the GPU (ex2.approx, ~2 ulp; what FlashAttention-2's softmax uses).
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// Max and sum over the 4 lanes of a quad (the lanes that share a row of a C fragment).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace tc
}  // namespace KILN_KERNELS_NS
