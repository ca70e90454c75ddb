// A CPU emulation of the CUDA features kiln's kernels use, so that a kernel source (.cu) compiles
// as host C++ and runs thread by thread in the tests of a machine without a GPU. This checks a
// kernel's own index arithmetic, tiling, masking, shared-memory carve-up and synchronisation
// order against the ATen reference; it cannot check timing, occupancy or what only hardware does
// (memory-model races that barriers would not order, bank conflicts, real cp.async latency).
//
// How: every CUDA thread of a block is a cooperative fiber (ucontext) on one OS thread; blocks
// run one after another. __syncthreads / __syncwarp are generation-counted barriers; a fiber
// that waits yields to a scheduler that resumes only fibers whose barrier has opened, and a
// block in which every live fiber waits is reported as a deadlock (a divergent barrier). Warp
// shuffles exchange through per-warp slots. `__shared__` variables become function statics,
// shared by the block's fibers (blocks never overlap). cp.async copies land only at the
// cp.async.wait_group that retires them (a read before it sees the old bytes). WMMA fragments hold the whole 16 x 16
// tile in every lane, in logical row-major order; load/store/mma are warp-collective, and each collective begins with a
// warp barrier, which orders it after every lane's previous collective as the hardware's convergence does. Accumulation
// is fp32, as on the tensor cores.
//
// Use: include this header, then the .cu source, in a translation unit of its own (the macros
// below must not leak into LibTorch's headers). The kernels then live in
// kiln::kernels::emulated (KILN_KERNELS_NS) and KILN_LAUNCH runs them here.
#pragma once

#define KILN_CUDA_EMULATION 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <ucontext.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace kiln::emu {

struct Barrier {
  int expected = 0;
  int count = 0;
  unsigned generation = 0;
};

// A cp.async in flight: its source is read when issued, its destination written only when a
// cp.async.wait_group retires its group, so a kernel that reads a tile before waiting for it
// reads what was there before (the hardware may be that slow), not the new data.
struct PendingCopy {
  void* dst;
  unsigned char bytes[16];
};

struct Fiber {
  ucontext_t context{};
  std::unique_ptr<char[]> stack;
  uint3 thread_idx{0, 0, 0};
  bool done = false;
  const Barrier* waiting = nullptr;  // resumed once waiting->generation != wait_generation
  unsigned wait_generation = 0;
  std::vector<PendingCopy> open_group;              // issued since the last commit
  std::vector<std::vector<PendingCopy>> committed;  // oldest first
};

struct Block {
  uint3 block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
  std::vector<Fiber> fibers;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<std::array<float, 64>> shuffle_slots;  // per warp: two generations x 32 lanes
  std::vector<unsigned char> shared;                 // dynamic shared memory (+ alignment slack)
  unsigned char* dynamic_shared = nullptr;
  std::function<void()> body;
  ucontext_t scheduler{};
  size_t current = 0;
};

inline Block*& current_block() {
  static Block* block = nullptr;
  return block;
}
inline Fiber& current_fiber() {
  return current_block()->fibers[current_block()->current];
}
inline unsigned lane() {
  return current_fiber().thread_idx.x % 32;
}

inline void wait(Barrier& barrier) {
  const unsigned generation = barrier.generation;
  if (++barrier.count == barrier.expected) {
    barrier.count = 0;
    ++barrier.generation;
    return;
  }
  Block* block = current_block();
  Fiber& fiber = block->fibers[block->current];
  fiber.waiting = &barrier;
  fiber.wait_generation = generation;
  swapcontext(&fiber.context, &block->scheduler);
}

inline void sync_warp() {
  Block* block = current_block();
  wait(block->warp_barriers[current_fiber().thread_idx.x / 32]);
}

inline float shuffle_xor(float value, int mask) {
  Block* block = current_block();
  const unsigned warp = current_fiber().thread_idx.x / 32, l = lane();
  const unsigned parity = block->warp_barriers[warp].generation & 1u;
  block->shuffle_slots[warp][parity * 32 + l] = value;
  sync_warp();  // a slot of this parity is rewritten only after the next barrier, which every reader passed
  return block->shuffle_slots[warp][parity * 32 + (l ^ static_cast<unsigned>(mask))];
}

inline void cp_async16(void* dst, const void* src, bool valid) {
  PendingCopy c{dst, {}};
  if (valid) std::memcpy(c.bytes, src, 16);  // not valid: zero-filled, nothing read
  current_fiber().open_group.push_back(c);
}
inline void cp_async_commit() {
  Fiber& f = current_fiber();
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}
// Retires this thread's committed groups until at most `pending` are in flight.
inline void cp_async_wait(int pending) {
  Fiber& f = current_fiber();
  while (f.committed.size() > static_cast<size_t>(pending)) {
    for (const PendingCopy& c : f.committed.front()) std::memcpy(c.dst, c.bytes, 16);
    f.committed.erase(f.committed.begin());
  }
}

inline void fiber_entry() {
  Block* block = current_block();
  block->body();
  block->fibers[block->current].done = true;  // uc_link returns to the scheduler
}

// Runs `kernel(args...)` over the grid: blocks in order, the threads of a block as fibers.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 threads, size_t dynamic_shared_bytes, Args... args) {
  constexpr size_t kStack = 128 * 1024;
  const unsigned n = threads.x * threads.y * threads.z;
  if (threads.y != 1 || threads.z != 1 || grid.z != 1) throw std::invalid_argument("emulation: 1-D blocks, 2-D grids");
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block block;
      block.block_idx = {bx, by, 0};
      block.block_dim = threads;
      block.grid_dim = grid;
      block.body = [&] { kernel(args...); };
      block.block_barrier.expected = static_cast<int>(n);
      const unsigned warps = (n + 31) / 32;
      block.warp_barriers.resize(warps);
      for (unsigned w = 0; w < warps; ++w)
        block.warp_barriers[w].expected = static_cast<int>(std::min(32u, n - 32 * w));
      block.shuffle_slots.resize(warps);
      block.shared.assign(dynamic_shared_bytes + 128, 0xCD);  // garbage-filled, as on a GPU
      const auto base = reinterpret_cast<uintptr_t>(block.shared.data());
      block.dynamic_shared = block.shared.data() + ((128 - base % 128) % 128);
      block.fibers.resize(n);
      for (unsigned t = 0; t < n; ++t) {
        Fiber& f = block.fibers[t];
        f.thread_idx = {t, 0, 0};
        f.stack.reset(new char[kStack]);  // not zeroed: 128 KiB per thread
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.get();
        f.context.uc_stack.ss_size = kStack;
        f.context.uc_link = &block.scheduler;
        makecontext(&f.context, fiber_entry, 0);
      }
      current_block() = &block;
      for (size_t live = n; live > 0;) {
        bool ran = false;
        for (size_t i = 0; i < n; ++i) {
          Fiber& f = block.fibers[i];
          if (f.done || (f.waiting != nullptr && f.waiting->generation == f.wait_generation)) continue;
          f.waiting = nullptr;
          block.current = i;
          swapcontext(&block.scheduler, &f.context);
          ran = true;
          if (f.done) --live;
        }
        if (!ran) {
          current_block() = nullptr;
          throw std::runtime_error("emulation: deadlock in block (" + std::to_string(bx) + ", " + std::to_string(by) +
                                   "): every live thread waits at a barrier others never reach");
        }
      }
      current_block() = nullptr;
    }
  }
}

}  // namespace kiln::emu

// ---- the CUDA surface the kernels use
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

#define threadIdx (::kiln::emu::current_fiber().thread_idx)
#define blockIdx (::kiln::emu::current_block()->block_idx)
#define blockDim (::kiln::emu::current_block()->block_dim)
#define gridDim (::kiln::emu::current_block()->grid_dim)

inline void __syncthreads() {
  ::kiln::emu::wait(::kiln::emu::current_block()->block_barrier);
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::kiln::emu::sync_warp();
}
inline float __shfl_xor_sync(unsigned, float value, int mask) {
  return ::kiln::emu::shuffle_xor(value, mask);
}
[[noreturn]] inline void __trap() {  // a variant the launcher never selects was launched
  std::abort();
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float rsqrtf(float x) {
  return 1.f / std::sqrt(x);
}
// Rounded on their own, never contracted into an FMA (volatile keeps the host compiler from it).
inline float __fmul_rn(float a, float b) {
  volatile float p = a * b;
  return p;
}
inline float __fadd_rn(float a, float b) {
  volatile float s = a + b;
  return s;
}
inline float atomicAdd(float* address, float value) {  // fibers never preempt one another
  const float old = *address;
  *address = old + value;
  return old;
}
using std::max;
using std::min;

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

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
  ::kiln::emu::sync_warp();
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[r + c * ldm];
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  ::kiln::emu::sync_warp();
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[r + c * ldm];
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  ::kiln::emu::sync_warp();
  if (::kiln::emu::lane() != 0) return;  // every lane holds the same tile
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) (l == mem_row_major ? p[r * ldm + c] : p[r + c * ldm]) = f.x[r * 16 + c];
  }
}

template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int r = 0; r < 16; ++r) {
    for (int col = 0; col < 16; ++col) {
      float acc = c.x[r * 16 + col];
      for (int k = 0; k < 16; ++k) acc += static_cast<float>(a.x[r * 16 + k]) * static_cast<float>(b.x[k * 16 + col]);
      out[r * 16 + col] = acc;
    }
  }
  std::copy(out, out + 256, d.x);
}

}  // namespace nvcuda::wmma
