// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): what orders a
// block's threads and their shared memory: the generation-counted barriers (__syncthreads,
// __syncwarp), the warp shuffle, cp.async (landing at the wait or at issue) and the poisoned
// static __shared__ arrays. Apart from the scheduler (emulation_launch.h) that runs the fibers.
#pragma once

#include "kiln/kernels/emulation_block.h"

namespace kiln::emu {

// ---- barriers

// Arrives at `barrier` and waits until every expected fiber has; returns true in the fiber that
// arrived last (which opened it and did not wait). `memory`: a memory barrier (ThreadSanitizer
// sees the order), else convergence only.
inline bool wait(Barrier& barrier, bool memory = true) {
  const Internal internal;
  const unsigned generation = barrier.generation;
#ifdef KILN_EMU_TSAN
  if (memory) __tsan_release(&barrier.order[generation & 1]);
#endif
  bool last = false;
  if (++barrier.count == barrier.expected) {
    barrier.count = 0;
    ++barrier.generation;
    last = true;
  } else {
    Block* block = current_block();
    Fiber& fiber = block->fibers[block->current];
    fiber.waiting = &barrier;
    fiber.wait_generation = generation;
    switch_to_scheduler(fiber);
  }
#ifdef KILN_EMU_TSAN
  if (memory) __tsan_acquire(&barrier.order[generation & 1]);
#else
  (void)memory;
#endif
  return last;
}

inline void sync_warp() {
  const Internal internal;
  wait(current_block()->warps[warp_index()].sync);
}

// A 32-bit value's bits from lane ^ mask (float or int: __shfl_xor_sync's overloads).
template <typename V>
V shuffle_xor(V value, int mask) {
  static_assert(sizeof(V) == 4, "32-bit shuffles");
  const Internal internal;
  Warp& w = current_block()->warps[warp_index()];
  const unsigned l = lane();
  Collective& c = w.slot[w.converge.generation & 1];
  std::memcpy(&c.shuffle[l], &value, 4);
  if (wait(w.converge, /*memory=*/false)) w.slot[w.converge.generation & 1].arrived = 0;
  const unsigned from = l ^ static_cast<unsigned>(mask);
  if (from >= w.lanes) fail("__shfl_xor_sync reads lane " + std::to_string(from) + " of a partial warp");
  V out;
  std::memcpy(&out, &c.shuffle[from], 4);
  return out;
}

// ---- cp.async

inline bool in_shared(const Block& b, const void* p, size_t bytes) {
  const Internal internal;
  const auto* c = static_cast<const unsigned char*>(p);
  if (c >= b.dynamic_shared && c + bytes <= b.dynamic_shared + b.dynamic_bytes) return true;
  for (const StaticSmem& s : b.statics) {
    if (c >= s.bytes && c + bytes <= s.bytes + s.size) return true;
  }
  return false;
}

inline void cp_async16(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0) fail("cp.async to a shared address that is not 16-byte aligned");
  if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fail("cp.async from a global address that is not 16-byte aligned");
  if (!in_shared(*current_block(), dst, 16)) fail("cp.async to an address outside the block's shared memory");
  PendingCopy c{dst, {}};
  if (valid) std::memcpy(c.bytes, src, 16);  // not valid: zero-filled, nothing read
  if (config().landing == Landing::kAtIssue) {
    std::memcpy(dst, c.bytes, 16);
    return;
  }
  const Internal internal;
  current_fiber().open_group.push_back(c);
}
inline void cp_async_commit() {
  const Internal internal;
  Fiber& f = current_fiber();
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}
// Retires this thread's committed groups until at most `pending` are in flight.
// (The copies land as this fiber's writes, which ThreadSanitizer checks; the queue is bookkeeping.)
inline void cp_async_wait(int pending) {
  Fiber& f = current_fiber();
  for (;;) {
    std::vector<PendingCopy> group;
    {
      const Internal internal;
      if (f.committed.size() <= static_cast<size_t>(pending)) return;
      group = std::move(f.committed.front());
      f.committed.erase(f.committed.begin());
    }
    for (const PendingCopy& c : group) std::memcpy(c.dst, c.bytes, 16);
  }
}

// ---- static shared memory: one poisoned array per declaration and block

// (The arena is allocated and poisoned by the scheduler before the block starts: 0xFF, NaN as
// fp32 and -1 as an integer.)
inline void* static_shared(const void* key, size_t bytes) {
  const Internal internal;
  Block& b = *current_block();
  for (const StaticSmem& s : b.statics) {
    if (s.key == key) return s.bytes;
  }
  const size_t at = (b.static_bytes + 15) / 16 * 16;
  if (at + bytes > b.static_arena.size()) {
    fail("static __shared__ arrays of more than " + std::to_string(b.static_arena.size()) + " bytes");
  }
  b.statics.push_back({key, b.static_arena.data() + at, bytes});
  b.static_bytes = at + bytes;
  return b.static_arena.data() + at;
}

}  // namespace kiln::emu
