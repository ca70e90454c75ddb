// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): the launch
// and its scheduler: the grid's and the block's limits, blocks one after another, each thread a
// fiber run in the seeded order, dynamic shared memory poisoned between canaries, deadlocks and
// shared-memory overuse refused. The part that decides what a missing barrier lets happen.
#pragma once

#include "kiln/kernels/emulation_sync.h"

namespace kiln::emu {

// ---- launch

inline void fiber_entry() {
  Block* block = current_block();
#ifdef KILN_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &block->asan_scheduler_bottom, &block->asan_scheduler_size);
#endif
#ifdef KILN_EMU_TSAN
  __tsan_acquire(&block->tsan_start);
#endif
  try {
    block->body();
  } catch (const std::exception& e) {
    const Internal internal;
    if (block->error.empty()) block->error = e.what();
  }
  Fiber& f = current_fiber();
  cp_async_commit();
  cp_async_wait(0);  // the hardware completes a thread's copies when it exits
  {
    const Internal internal;
    f.done = true;
  }
  switch_to_scheduler(f, /*last=*/true);  // never returns here
}

// The order fibers run in during one scheduling round (kWarpAhead: the priority order).
inline void schedule_order(std::vector<size_t>& order, unsigned n, std::mt19937_64& rng) {
  order.resize(n);
  std::iota(order.begin(), order.end(), size_t{0});
  switch (config().schedule) {
    case Schedule::kIndex:
      break;
    case Schedule::kReverse:
      std::reverse(order.begin(), order.end());
      break;
    case Schedule::kRandom:
      std::shuffle(order.begin(), order.end(), rng);
      break;
    case Schedule::kWarpAhead: {  // priority: warps from a seeded first one on, lanes rotated per warp
      const unsigned warps = (n + 31) / 32;
      size_t k = 0;
      for (unsigned j = 0; j < warps; ++j) {
        const unsigned w = static_cast<unsigned>((config().seed + j) % warps);
        const unsigned lanes = std::min(32u, n - 32 * w);
        const unsigned rot = static_cast<unsigned>((config().seed + 11u * w) % lanes);
        for (unsigned i = 0; i < lanes; ++i) order[k++] = 32 * w + (i + rot) % lanes;
      }
      break;
    }
  }
}

// Runs `kernel(args...)` over the grid: blocks in order, the threads of a block as fibers.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 threads, size_t dynamic_shared_bytes, Args... args) {
  const Config cfg = config();
  const size_t stack = size_t{128} * 1024
#if defined(KILN_EMU_ASAN) || defined(KILN_EMU_TSAN)
                       * 4
#endif
      ;
  const unsigned n = threads.x * threads.y * threads.z;
  const void* key = reinterpret_cast<const void*>(kernel);
  if (threads.y != 1 || threads.z != 1 || grid.z != 1) throw Error("emulation: 1-D blocks, 2-D grids only");
  if (n == 0 || n > 1024) throw Error("emulation: a block of " + std::to_string(n) + " threads (1 to 1024)");
  if (grid.x == 0 || grid.y == 0 || grid.y > 65535 || grid.x > 2147483647u) {
    throw Error("emulation: grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) +
                ") outside 1..2^31-1 x 1..65535");
  }
  const size_t limit = smem_block_limit(cfg.arch);
  {
    const auto opt = dynamic_smem_opt_in().find(key);
    const size_t allowed = opt != dynamic_smem_opt_in().end() ? opt->second : kSmemWithoutOptIn;
    if (dynamic_shared_bytes > allowed) {
      throw Error("emulation: a launch with " + std::to_string(dynamic_shared_bytes) +
                  " bytes of dynamic shared memory, over the " + std::to_string(allowed) +
                  " allowed (cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raises it)");
    }
  }
  std::mt19937_64 rng(cfg.seed * 0x9E3779B97F4A7C15ull + 12345);
  // Which lane holds which of a WMMA tile's 256 elements: 8 each, a seeded permutation.
  std::array<unsigned char, 256> owner{};
  {
    std::array<unsigned char, 256> perm{};
    std::iota(perm.begin(), perm.end(), static_cast<unsigned char>(0));
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int e = 0; e < 256; ++e) owner[perm[e]] = static_cast<unsigned char>(e / 8);
  }
  constexpr size_t kCanary = 256;
  LaunchRecord record;
  record.dynamic_smem_bytes = dynamic_shared_bytes;
  std::vector<size_t> order;
#ifdef KILN_EMU_TSAN
  void* const tsan_self = __tsan_get_current_fiber();
#endif
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      auto holder = std::make_unique<Block>();
      Block& block = *holder;
      block.block_idx = {bx, by, 0};
      block.block_dim = threads;
      block.grid_dim = grid;
      block.owner = &owner;
      block.poison = static_cast<unsigned char>(rng() | 1);
      block.body = [&] { kernel(args...); };
      block.block_barrier.expected = static_cast<int>(n);
      const unsigned warps = (n + 31) / 32;
      block.warps.resize(warps);
      for (unsigned w = 0; w < warps; ++w) {
        block.warps[w].lanes = std::min(32u, n - 32 * w);
        block.warps[w].sync.expected = block.warps[w].converge.expected = static_cast<int>(block.warps[w].lanes);
      }
      // Dynamic shared memory, 128-byte aligned, poisoned, between two canaries.
      block.shared.assign(dynamic_shared_bytes + 2 * kCanary + 128, block.poison);
      const auto base = reinterpret_cast<uintptr_t>(block.shared.data()) + kCanary;
      block.dynamic_shared = block.shared.data() + kCanary + ((128 - base % 128) % 128);
      block.dynamic_bytes = dynamic_shared_bytes;
      unsigned char* const canary_end = block.dynamic_shared + dynamic_shared_bytes;
      const unsigned char canary = static_cast<unsigned char>(block.poison ^ 0x5A);
      std::fill(block.shared.data(), block.dynamic_shared, canary);
      std::fill(canary_end, block.shared.data() + block.shared.size(), canary);
      block.static_arena.assign(kSmemWithoutOptIn, 0xFF);
      block.fibers.resize(n);
#ifdef KILN_EMU_TSAN
      block.tsan_scheduler = tsan_self;
#endif
      while (stack_pool().size() < n) stack_pool().emplace_back(new char[stack]);  // not zeroed
      for (unsigned t = 0; t < n; ++t) {
        Fiber& f = block.fibers[t];
        f.thread_idx = {t, 0, 0};
        f.stack = stack_pool()[t].get();
        f.stack_size = stack;
#ifdef KILN_EMU_ASAN
        // The redzones of the frames an earlier fiber left on this stack (it never returned).
        ASAN_UNPOISON_MEMORY_REGION(f.stack, stack);
#endif
        f.context = new_context(f.stack, stack, fiber_entry);
#ifdef KILN_EMU_TSAN
        while (tsan_fiber_pool().size() <= t) tsan_fiber_pool().push_back(__tsan_create_fiber(0));
        f.tsan_fiber = tsan_fiber_pool()[t];
#endif
      }
      block_slot() = &block;
#ifdef KILN_EMU_TSAN
      __tsan_release(&block.tsan_start);
#endif
      auto abandon = [&](const std::string& why) {
        block_slot() = nullptr;
#ifdef KILN_EMU_TSAN
        for (unsigned t = 0; t < n; ++t) {  // stopped mid-block: fresh fibers for the next launch
          __tsan_destroy_fiber(tsan_fiber_pool()[t]);
          tsan_fiber_pool()[t] = __tsan_create_fiber(0);
        }
#endif
        throw Error(why);
      };
      for (size_t live = n, round = 0; live > 0; ++round) {
        bool ran = false;
        schedule_order(order, n, rng);
        for (const size_t i : order) {
          Fiber& f = block.fibers[i];
          if (f.done || (f.waiting != nullptr && f.waiting->generation == f.wait_generation)) continue;
          f.waiting = nullptr;
          block.current = i;
          block.running = &f;
          switch_to_fiber(block, f);
          ran = true;
          if (!block.error.empty()) {
            abandon(block.error + " (block (" + std::to_string(bx) + ", " + std::to_string(by) + "), thread " +
                    std::to_string(i) + ")");
          }
          if (f.done) --live;
          if (cfg.schedule == Schedule::kWarpAhead) break;  // again from the first in priority
        }
        if (!ran) {
          abandon("emulation: deadlock in block (" + std::to_string(bx) + ", " + std::to_string(by) +
                  "): every live thread waits at a barrier others never reach");
        }
      }
#ifdef KILN_EMU_TSAN
      __tsan_acquire(&block.tsan_end);
#endif
      block_slot() = nullptr;
      for (const unsigned char* p = block.shared.data(); p < block.shared.data() + block.shared.size(); ++p) {
        if ((p < block.dynamic_shared || p >= canary_end) && *p != canary) {
          const bool after = p >= canary_end;
          throw Error("emulation: block (" + std::to_string(bx) + ", " + std::to_string(by) + ") wrote " +
                      (after ? std::to_string(p - canary_end) + " bytes past the end of"
                             : std::to_string(block.dynamic_shared - p) + " bytes before") +
                      " its " + std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory");
        }
      }
      record.static_smem_bytes = std::max(record.static_smem_bytes, block.static_bytes);
      known_static_smem()[key] = std::max(known_static_smem()[key], block.static_bytes);
      if (dynamic_shared_bytes + block.static_bytes > limit) {
        throw Error("emulation: a block uses " + std::to_string(dynamic_shared_bytes) + " dynamic + " +
                    std::to_string(block.static_bytes) + " static bytes of shared memory, over the " +
                    std::to_string(limit) + " of sm_" + std::to_string(cfg.arch));
      }
      const auto opt = dynamic_smem_opt_in().find(key);
      const size_t allowed = opt != dynamic_smem_opt_in().end()
                                 ? opt->second
                                 : kSmemWithoutOptIn - std::min(kSmemWithoutOptIn, block.static_bytes);
      if (dynamic_shared_bytes > allowed) {
        throw Error("emulation: " + std::to_string(dynamic_shared_bytes) + " bytes of dynamic shared memory beside " +
                    std::to_string(block.static_bytes) + " static ones need cudaFuncSetAttribute first");
      }
      ++record.blocks;
    }
  }
  last_launch() = record;
}

}  // namespace kiln::emu
