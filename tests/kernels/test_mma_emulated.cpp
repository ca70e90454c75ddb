// kernels/mma.cuh against the CPU emulation: ldmatrix and mma.sync.m16n8k16 give each lane the
// registers the PTX ISA's fragment tables say (written out here from the tables, independently of
// emulation_mma.h's loops), and a 16 x 16 x 8 product read through ldmatrix from XOR-swizzled
// shared tiles matches an fp64 matmul. These are the primitives the FA2-class attention kernels
// are written in; a layout wrong here would be wrong on the GPU too.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/kernels/emulation.h"
// (emulation.h first: the primitives call into it.)
#include "kiln/kernels/mma.cuh"

namespace emu = kiln::emu;
namespace tc = kiln::kernels::emulated::tc;

namespace {

using bf16 = __nv_bfloat16;
using fp16 = __half;

// [16 x 64] tiles in shared memory, swizzled as the attention kernels store them.
constexpr int kD = 64;

struct Probe {
  const uint16_t* a;   // [16 x 64] row-major (A, m x k)
  const uint16_t* b;   // [8 x 64] row-major: B^T (n x k), as K is stored
  const uint16_t* bt;  // [16 x 64]: B (k x n) in the first 8 columns, as V is stored
  uint32_t* regs;      // [32 lanes][4 + 2 + 2 + 1 + 1] registers as loaded
  float* c;            // [16 x 8] the product
};

template <typename T>
void probe_kernel(Probe p) {
  KILN_DYNAMIC_SMEM(smem);
  auto* a_s = reinterpret_cast<uint16_t*>(smem);
  uint16_t* b_s = a_s + 16 * kD;
  uint16_t* bt_s = b_s + 16 * kD;
  const int lane = threadIdx.x;
  for (int i = lane; i < 16 * kD; i += 32) {
    const int r = i / kD, c = i % kD;
    a_s[tc::swizzle<kD>(r, c)] = p.a[i];
    bt_s[tc::swizzle<kD>(r, c)] = p.bt[i];
    if (r < 8) b_s[tc::swizzle<kD>(r, c)] = p.b[i];
  }
  __syncwarp();
  const int j = lane / 8, r = lane % 8;
  uint32_t a[4], b[2], bt[2], x1[1], x1t[1];
  // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) -> a0..a3.
  tc::ldmatrix<4, false>(a, a_s + tc::swizzle<kD>(r + 8 * (j % 2), 8 * (j / 2)));
  // B from B^T rows (n) and k columns 0-7, 8-15 -> b0, b1.
  tc::ldmatrix<2, false>(b, b_s + tc::swizzle<kD>(r, 8 * (j % 2)));
  // B from B's own rows (k 0-7, 8-15), transposed.
  tc::ldmatrix<2, true>(bt, bt_s + tc::swizzle<kD>(r + 8 * (j % 2), 0));
  tc::ldmatrix<1, false>(x1, a_s + tc::swizzle<kD>(r, 0));
  tc::ldmatrix<1, true>(x1t, a_s + tc::swizzle<kD>(r, 0));
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc_t[4] = {0.f, 0.f, 0.f, 0.f};
  tc::mma_16816<T>(acc, a, b);
  tc::mma_16816<T>(acc_t, a, bt);
  uint32_t* out = p.regs + lane * 10;
  for (int i = 0; i < 4; ++i) out[i] = a[i];
  out[4] = b[0], out[5] = b[1], out[6] = bt[0], out[7] = bt[1], out[8] = x1[0], out[9] = x1t[0];
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    p.c[row * 8 + col] = acc[i];
    if (acc_t[i] != acc[i]) p.c[row * 8 + col] = NAN;  // both B paths must give the same product
  }
}

template <typename T>
uint16_t bits(float v) {
  const T x = static_cast<T>(v);
  uint16_t u;
  std::memcpy(&u, &x, 2);
  return u;
}
template <typename T>
float value(uint16_t u) {
  T x;
  std::memcpy(&x, &u, 2);
  return static_cast<float>(x);
}

template <typename T>
void probe() {
  std::mt19937 g(7);
  std::normal_distribution<float> d;
  std::vector<uint16_t> a(16 * kD), b(8 * kD), bt(16 * kD, 0);
  for (auto& x : a) x = bits<T>(d(g));
  for (auto& x : b) x = bits<T>(d(g));
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 8; ++n) bt[k * kD + n] = b[n * kD + k];
  }
  std::vector<uint32_t> regs(32 * 10);
  std::vector<float> c(16 * 8);
  emu::launch(probe_kernel<T>, dim3(1), dim3(32), size_t(3 * 16 * kD * 2),
              Probe{a.data(), b.data(), bt.data(), regs.data(), c.data()});
  auto pair = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; };
  // The PTX ISA's tables: A (g, 2t) / (g+8, 2t) / (g, 2t+8) / (g+8, 2t+8); B (2t, g) / (2t+8, g);
  // ldmatrix x1: lane 4r + w holds (r, 2w); .trans: (2w, r), (2w + 1, r).
  for (int lane = 0; lane < 32; ++lane) {
    CAPTURE(lane);
    const int gr = lane / 4, t = lane % 4;
    const uint32_t* r = regs.data() + lane * 10;
    for (int i = 0; i < 4; ++i) {
      const int row = gr + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
      CHECK(r[i] == pair(a[row * kD + col], a[row * kD + col + 1]));
    }
    for (int i = 0; i < 2; ++i) {
      const int k = 2 * t + 8 * i;
      CHECK(r[4 + i] == pair(b[gr * kD + k], b[gr * kD + k + 1]));
      CHECK(r[6 + i] == r[4 + i]);
    }
    CHECK(r[8] == pair(a[gr * kD + 2 * t], a[gr * kD + 2 * t + 1]));
    CHECK(r[9] == pair(a[(2 * t) * kD + gr], a[(2 * t + 1) * kD + gr]));
  }
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      double ref = 0;
      for (int k = 0; k < 16; ++k) ref += double(value<T>(a[m * kD + k])) * value<T>(b[n * kD + k]);
      CAPTURE(m, n);
      CHECK(std::abs(c[m * 8 + n] - ref) <= 1e-4 * (1 + std::abs(ref)));
    }
  }
}

[[maybe_unused]] void collective_in_branch_kernel(int) {
  uint32_t r[1];
  KILN_DYNAMIC_SMEM(smem);
  if (threadIdx.x < 16) tc::ldmatrix<1, false>(r, smem);  // half a warp: never converges
}

}  // namespace

TEST_CASE("ldmatrix and mma.sync m16n8k16 (emulated) follow the PTX ISA's fragment tables", "[kernels][emulated]") {
  probe<bf16>();
  probe<fp16>();
}

TEST_CASE("the swizzle maps a tile's chunks one to one and ldmatrix's 8 rows to 8 bank groups", "[kernels]") {
  for (int row = 0; row < 64; ++row) {
    std::vector<int> seen(64, 0);
    for (int col = 0; col < 64; ++col) ++seen[tc::swizzle<64>(row, col) - row * 64];
    for (int s : seen) CHECK(s == 1);
  }
  for (int chunk = 0; chunk < 16; ++chunk) {
    for (int r0 = 0; r0 < 64; r0 += 8) {
      std::vector<int> groups(8, 0);  // 16-byte bank groups of a 128-byte line
      for (int r = r0; r < r0 + 8; ++r) ++groups[(tc::swizzle<128>(r, chunk * 8) / 8) % 8];
      for (int n : groups) CHECK(n == 1);
    }
  }
}

#ifndef KILN_EMU_TSAN  // (a launch abandoned inside a collective leaves ThreadSanitizer's ignore scope open)
TEST_CASE("a collective that only part of a warp reaches fails the launch", "[kernels][emulated]") {
  CHECK_THROWS(emu::launch(collective_in_branch_kernel, dim3(1), dim3(32), size_t(64), 0));
}
#endif
