// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): the sm_80
// tensor-core instructions the FA2-class kernels are written in, as warp collectives with the
// fragment layouts of the PTX ISA (kernels/mma.cuh is the device side, one call per instruction):
//
// - ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16: lane 8j + r supplies the address
//   of row r of matrix j (only the first 8 x num lanes' addresses are used). Each supplier reads
//   its 16 bytes when it arrives, as the WMMA loads do (a lane that arrives before another lane
//   wrote the row reads stale data); once the warp has converged, lane 4r + w receives, in
//   register j, the 16-bit pair (r, 2w), (r, 2w + 1) of matrix j, or with .trans the pair
//   (2w, r), (2w + 1, r). Addresses must be 16-byte aligned and in the block's shared memory.
// - mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: with g = lane / 4 and t = lane % 4,
//   A (16 x 16) registers a0..a3 hold (g, 2t..2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..);
//   B (16 x 8) registers b0, b1 hold (2t..2t+1, g), (2t + 8.., g); C and D (16 x 8, fp32) hold
//   (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). The warp converges, every lane's registers
//   are assembled into the three matrices, D = A B + C is computed once in fp32 and every lane
//   receives its share. A lane of another dtype fails the launch.
#pragma once

#include "kiln/kernels/emulation_wmma.h"

namespace kiln::emu {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// A 16-bit value of a register half as fp32: bf16 (is_bf16) or IEEE fp16.
inline float half_bits_to_float(uint16_t h, bool is_bf16) {
  if (is_bf16) return bits_to_float(uint32_t(h) << 16);
  __half_raw raw;
  raw.x = h;
  return __half2float(__half(raw));
}

// ldmatrix: `num` 8 x 8 matrices of 16-bit values into out[0..num).
inline void ldmatrix(uint32_t* out, int num, bool trans, const void* row) {
  const char* what = trans ? "ldmatrix (.trans)" : "ldmatrix";
  Warp& w = full_warp(what);
  Collective& c = join(w, 4, nullptr, static_cast<unsigned>(num), trans ? 1 : 0, what);
  const unsigned l = lane();
  if (l < 8u * static_cast<unsigned>(num)) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fail(std::string(what) + ": a row address not 16-byte aligned");
    if (!in_shared(*current_block(), row, 16)) fail(std::string(what) + ": a row address outside shared memory");
    unsigned char bytes[16];
    std::memcpy(bytes, row, 16);  // the kernel's memory, read as this lane arrives
    const Internal internal;
    std::memcpy(c.tile + l * 16, bytes, 16);
  }
  converge(w, [] {});
  const Internal internal;
  const unsigned r = l / 4, word = l % 4;
  for (int j = 0; j < num; ++j) {
    const unsigned char* m = c.tile + j * 128;  // matrix j: 8 rows of 16 bytes
    uint16_t lo, hi;
    if (!trans) {
      std::memcpy(&lo, m + r * 16 + word * 4, 2);
      std::memcpy(&hi, m + r * 16 + word * 4 + 2, 2);
    } else {
      std::memcpy(&lo, m + (2 * word) * 16 + r * 2, 2);
      std::memcpy(&hi, m + (2 * word + 1) * 16 + r * 2, 2);
    }
    out[j] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
}

// mma.sync m16n8k16, fp32 accumulate: d = a b + c.
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                      bool is_bf16) {
  const char* what = "mma.sync.m16n8k16";
  Warp& w = full_warp(what);
  Collective& s = join(w, 5, nullptr, 0, is_bf16 ? 1 : 2, what);
  const unsigned l = lane();
  {
    const Internal internal;
    for (int i = 0; i < 4; ++i) s.lane_in[l][i] = a[i];
    for (int i = 0; i < 2; ++i) s.lane_in[l][4 + i] = b[i];
    for (int i = 0; i < 4; ++i) s.lane_in[l][6 + i] = float_to_bits(c[i]);
  }
  converge(w, [&] {
    float A[16][16], B[16][8], C[16][8];
    for (unsigned ln = 0; ln < 32; ++ln) {
      const unsigned g = ln / 4, t = ln % 4;
      const uint32_t* in = s.lane_in[ln];
      for (int i = 0; i < 4; ++i) {  // a_i: rows g (+8 for odd i), columns 2t (+8 for i >= 2)
        const unsigned row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
        A[row][col] = half_bits_to_float(uint16_t(in[i] & 0xffffu), is_bf16);
        A[row][col + 1] = half_bits_to_float(uint16_t(in[i] >> 16), is_bf16);
      }
      for (int i = 0; i < 2; ++i) {  // b_i: rows (k) 2t (+8 for i = 1), column (n) g
        B[2 * t + 8 * i][g] = half_bits_to_float(uint16_t(in[4 + i] & 0xffffu), is_bf16);
        B[2 * t + 8 * i + 1][g] = half_bits_to_float(uint16_t(in[4 + i] >> 16), is_bf16);
      }
      for (int i = 0; i < 4; ++i) C[g + 8 * (i / 2)][2 * t + i % 2] = bits_to_float(in[6 + i]);
    }
    for (unsigned ln = 0; ln < 32; ++ln) {
      const unsigned g = ln / 4, t = ln % 4;
      for (int i = 0; i < 4; ++i) {
        const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float acc = C[row][col];
        for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
        s.lane_out[ln][i] = float_to_bits(acc);
      }
    }
  });
  const Internal internal;
  for (int i = 0; i < 4; ++i) d[i] = bits_to_float(s.lane_out[l][i]);
}

}  // namespace kiln::emu
