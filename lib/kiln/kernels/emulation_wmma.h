// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): WMMA as warp
// collectives that converge the warp but order no memory, each lane loading and storing its
// share of a tile through a seeded element-to-lane map, every lane's arguments and fragments
// checked equal; and nvcuda::wmma (16 x 16 x 16 fragments) on top of them. Apart since only the
// tensor-core kernels use it.
#pragma once

#include "kiln/kernels/emulation_sync.h"

namespace kiln::emu {

// ---- WMMA collectives

inline Warp& full_warp(const char* what) {
  const Internal internal;
  Warp& w = current_block()->warps[warp_index()];
  if (w.lanes != 32) fail(std::string(what) + " in a warp of " + std::to_string(w.lanes) + " threads (WMMA needs 32)");
  return w;
}

inline void check_tile_args(const void* p, unsigned ldm, size_t elem, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) fail(std::string(what) + ": pointer not 32-byte (256-bit) aligned");
  if ((ldm * elem) % 16 != 0) {
    fail(std::string(what) + ": ldm " + std::to_string(ldm) + " is not a multiple of 16 bytes (" +
         std::to_string(16 / elem) + " elements)");
  }
}

// Records this lane's arguments; the first lane's are the ones the others must match.
inline Collective& join(Warp& w, int kind, const void* ptr, unsigned ldm, int layout, const char* what) {
  const Internal internal;
  Collective& c = w.slot[w.converge.generation & 1];
  if (c.arrived++ == 0) {
    c.kind = kind, c.ptr = ptr, c.ldm = ldm, c.layout = layout;
  } else if (c.kind != kind || c.ptr != ptr || c.ldm != ldm || c.layout != layout) {
    fail(std::string(what) + ": lane " + std::to_string(lane()) +
         " called a different collective or arguments than lane 0");
  }
  return c;
}

// Converges the warp; the last lane to arrive runs `on_open` (before any other lane resumes) and
// clears the slot the next collective will use.
template <typename F>
void converge(Warp& w, F&& on_open) {
  const Internal internal;
  if (wait(w.converge, /*memory=*/false)) {
    on_open();
    w.slot[w.converge.generation & 1].arrived = 0;
  }
}

template <size_t kBytes>
void check_same(const std::array<const void*, 32>& frags, const char* what) {
  for (int l = 1; l < 32; ++l) {
    if (std::memcmp(frags[0], frags[l], kBytes) != 0) {
      fail(std::string(what) + ": lane " + std::to_string(l) + " holds another fragment than lane 0");
    }
  }
}

// This lane's share of a tile read into the collective (an instrumented read of the kernel's
// memory), then the whole tile once every lane has read its share.
template <typename T>
void tile_load(T (&x)[256], const T* p, unsigned ldm, bool row_major, const char* what) {
  check_tile_args(p, ldm, sizeof(T), what);
  Warp& w = full_warp(what);
  Collective& c = join(w, 1, p, ldm, row_major ? 0 : 1, what);
  const std::array<unsigned char, 256>& owner = *current_block()->owner;
  const unsigned l = lane();
  T share[256];
  for (int e = 0; e < 256; ++e) {
    if (owner[e] == l) share[e] = row_major ? p[(e / 16) * ldm + e % 16] : p[e / 16 + (e % 16) * ldm];
  }
  {
    const Internal internal;
    T* tile = reinterpret_cast<T*>(c.tile);
    for (int e = 0; e < 256; ++e) {
      if (owner[e] == l) tile[e] = share[e];
    }
  }
  converge(w, [] {});
  const Internal internal;
  std::memcpy(x, c.tile, sizeof(x));
}

}  // namespace kiln::emu

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// Each lane holds the whole 16 x 16 tile (the collectives keep the lanes' copies equal); which
// lane loads or stores which element is the emulation's seeded map.
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "emulation: 16 x 16 x 16 fragments only");
  static constexpr int num_elements = 256;
  T x[256];  // element (r, c) at x[r * 16 + c]
};

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T value) {
  std::fill(f.x, f.x + 256, value);
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "accumulators take a layout argument");
  ::kiln::emu::tile_load(f.x, p, ldm, std::is_same_v<Layout, row_major>, "wmma::load_matrix_sync");
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  ::kiln::emu::tile_load(f.x, p, ldm, l == mem_row_major, "wmma::load_matrix_sync (accumulator)");
}

// Converges the warp (every lane's fragment the same), then each lane writes its share as it leaves.
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  namespace emu = ::kiln::emu;
  const char* what = "wmma::store_matrix_sync";
  emu::check_tile_args(p, ldm, sizeof(float), what);
  emu::Warp& w = emu::full_warp(what);
  emu::Collective& c = emu::join(w, 2, p, ldm, l == mem_row_major ? 0 : 1, what);
  const unsigned lane = emu::lane();
  {
    const emu::Internal internal;
    c.frag_a[lane] = f.x;
  }
  emu::converge(w, [&] { emu::check_same<sizeof(f.x)>(c.frag_a, what); });
  const std::array<unsigned char, 256>& owner = *emu::current_block()->owner;
  for (int e = 0; e < 256; ++e) {
    if (owner[e] == lane) (l == mem_row_major ? p[(e / 16) * ldm + e % 16] : p[e / 16 + (e % 16) * ldm]) = f.x[e];
  }
}

// Converges the warp, checks every lane holds the same A, B and C, computes D once (fp32
// accumulation, as on the tensor cores) and gives every lane the product.
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  namespace emu = ::kiln::emu;
  const char* what = "wmma::mma_sync";
  emu::Warp& w = emu::full_warp(what);
  emu::Collective& s = emu::join(w, 3, nullptr, 0, 0, what);
  const unsigned lane = emu::lane();
  const emu::Internal internal;
  s.frag_a[lane] = a.x;
  s.frag_b[lane] = b.x;
  s.frag_c[lane] = c.x;
  emu::converge(w, [&] {
    emu::check_same<sizeof(a.x)>(s.frag_a, "wmma::mma_sync (A)");
    emu::check_same<sizeof(b.x)>(s.frag_b, "wmma::mma_sync (B)");
    emu::check_same<sizeof(c.x)>(s.frag_c, "wmma::mma_sync (C)");
    const T* ax = static_cast<const T*>(s.frag_a[0]);
    const T* bx = static_cast<const T*>(s.frag_b[0]);
    const float* cx = static_cast<const float*>(s.frag_c[0]);
    for (int r = 0; r < 16; ++r) {
      for (int col = 0; col < 16; ++col) {
        float acc = cx[r * 16 + col];
        for (int k = 0; k < 16; ++k) acc += static_cast<float>(ax[r * 16 + k]) * static_cast<float>(bx[k * 16 + col]);
        s.result[r * 16 + col] = acc;
      }
    }
  });
  std::copy(s.result, s.result + 256, d.x);
}

}  // namespace nvcuda::wmma
