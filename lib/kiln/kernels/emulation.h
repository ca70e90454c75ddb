// A CPU emulation of the CUDA features kiln's kernels use, so that a kernel source (.cu) compiles
// as host C++ and runs thread by thread in the tests of a machine without a GPU. It checks a
// kernel's own index arithmetic, tiling, masking, shared-memory carve-up and synchronisation
// against a reference, and is built to make a kernel that only works by luck fail:
//
// - Threads are cooperative fibers on one OS thread; blocks run one after another. A
//   fiber runs until it reaches a barrier or a warp collective, so what a missing barrier lets
//   happen depends on the order fibers run in: that order is seeded (Config::schedule: index
//   order, reverse, a fresh random permutation per round, or warp-ahead: always the first fiber
//   that can run in a seeded warp priority, so one warp runs on to the next block barrier before
//   any other moves), and the tests run under several seeds.
// - __syncthreads / __syncwarp are generation-counted barriers (memory barriers: under
//   ThreadSanitizer they are its release/acquire points). A block in which every live fiber waits
//   is a deadlock (a divergent barrier) and fails the launch.
// - WMMA load/store/mma are warp collectives that converge the warp but order no memory, as on
//   the hardware: a load reads each lane's share of the tile when that lane arrives (a lane that
//   arrives before another lane wrote its part reads stale data), a store writes each lane's share
//   when that lane leaves (a lane that reads another lane's part before a __syncwarp reads stale
//   data). Which lane holds which element is a seeded map, so code that assumes a layout fails.
//   Every collective checks that all 32 lanes call it with the same pointer and ldm and hold the
//   same fragments; pointers must be 32-byte aligned and ldm a multiple of 16 bytes.
// - cp.async: a copy lands at the cp.async.wait_group that retires it (Landing::kAtWait: a read
//   before the wait sees old bytes) or as soon as it is issued (Landing::kAtIssue: a buffer that
//   other warps still read is overwritten at once when a barrier before the copy is missing).
//   Source and destination must be 16-byte aligned, the destination in the block's shared memory.
// - Shared memory: the dynamic buffer is poison-filled per block with canaries on both sides that
//   are checked when the block ends; static __shared__ arrays (KILN_STATIC_SMEM) are poisoned per
//   block (a kernel that reads what an earlier block left there reads NaN); static plus dynamic
//   bytes are held to the planned architecture's per-block limit (Config::arch), and more than
//   48 KiB of dynamic memory needs cudaFuncSetAttribute first, as on a GPU.
// - Launches check the grid's and the block's limits.
// - Sanitizers: under AddressSanitizer the fiber switches are announced to it; under
//   ThreadSanitizer every fiber is one of its fibers, switches carry no ordering, and only the
//   barriers order memory, so a race that no schedule happens to expose is still reported.
//
// What it cannot check: timing, occupancy, bank conflicts, or what only hardware does.
//
// Use: include this header, then the .cu source, in a translation unit of its own (the macros
// below must not leak into LibTorch's headers). The kernels then live in
// kiln::kernels::emulated (KILN_KERNELS_NS) and KILN_LAUNCH runs them here.
#pragma once

#define KILN_CUDA_EMULATION 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <driver_types.h>
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
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#define KILN_EMU_TSAN 1
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#define KILN_EMU_NO_TSAN __attribute__((no_sanitize_thread))
#else
#define KILN_EMU_NO_TSAN
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KILN_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// Fiber switches. On x86-64 a few instructions that save and restore the callee-saved registers
// and the floating-point control words (glibc's swapcontext also saves the signal mask, one
// system call per switch, which was most of the emulation's time); elsewhere ucontext.
#if defined(__x86_64__) && !defined(KILN_EMU_UCONTEXT)
#define KILN_EMU_ASM_SWITCH 1
// kiln_emu_switch(save, load): stores the current stack pointer in *save and continues at the
// context `load` (a stack pointer an earlier switch saved, or one made by kiln::emu::new_stack).
extern "C" void kiln_emu_switch(void** save, void* load);
asm(R"(
    .text
    .weak kiln_emu_switch
    .type kiln_emu_switch, @function
kiln_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kiln_emu_switch, .-kiln_emu_switch
)");
#endif

namespace kiln::emu {

#ifdef KILN_EMU_ASM_SWITCH
struct Context {
  void* sp = nullptr;
};
// A context that starts `entry` (which must never return) on the stack [base, base + size).
inline Context new_context(char* base, size_t size, void (*entry)()) {
  auto top = (reinterpret_cast<uintptr_t>(base) + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;                                  // entry's return address: it never returns
  *--slot = reinterpret_cast<uint64_t>(entry);  // where kiln_emu_switch's ret goes
  for (int r = 0; r < 6; ++r) *--slot = 0;      // rbp, rbx, r12-r15
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--slot = uint64_t{mxcsr} | uint64_t{fpucw} << 32;  // this thread's rounding and exception masks
  return Context{slot};
}
// Where a switch goes, read before the switch is announced to ThreadSanitizer (after it, a read
// counts as the target fiber's).
using Target = void*;
inline Target target_of(const Context& c) {
  return c.sp;
}
inline void switch_context(Context& save, Target load) {
  kiln_emu_switch(&save.sp, load);
}
#else
struct Context {
  ucontext_t uc{};
};
inline Context new_context(char* base, size_t size, void (*entry)()) {
  Context c;
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = base;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
  return c;
}
using Target = const ucontext_t*;
inline Target target_of(const Context& c) {
  return &c.uc;
}
inline void switch_context(Context& save, Target load) {
  swapcontext(&save.uc, load);
}
#endif

// The emulation's own bookkeeping (barrier counts, the scheduler's state, a collective's slots) is
// shared by all fibers without ThreadSanitizer's ordering; inside this scope it ignores the
// current fiber's accesses, so that only the kernels' own memory is checked.
struct Internal {
#ifdef KILN_EMU_TSAN
  Internal() {
    __tsan_ignore_thread_begin();
  }
  ~Internal() {
    __tsan_ignore_thread_end();
  }
#endif
  Internal(const Internal&) = delete;
  Internal& operator=(const Internal&) = delete;
#ifndef KILN_EMU_TSAN
  Internal() = default;
#endif
};

// ---- configuration

// kIndex, kReverse: each round runs every fiber that can run, in that order; kRandom: a fresh
// permutation each round; kWarpAhead: always the first fiber that can run in a seeded priority
// order of warps, so one warp runs on until all its threads wait at a block barrier before the
// next warp starts (a warp as far ahead of the others as a barrier lets it be).
enum class Schedule { kIndex, kReverse, kRandom, kWarpAhead };
enum class Landing { kAtWait, kAtIssue };

struct Config {
  Schedule schedule = Schedule::kIndex;
  Landing landing = Landing::kAtWait;
  uint64_t seed = 1;  // the random schedule, the fragment layout, the poison bytes
  int arch = 90;      // compute capability whose per-block shared-memory limit launches are held to
};

inline const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kIndex:
      return "index";
    case Schedule::kReverse:
      return "reverse";
    case Schedule::kRandom:
      return "random";
    case Schedule::kWarpAhead:
      return "warp-ahead";
  }
  return "?";
}

// Defaults from KILN_EMU_SCHEDULE (index|reverse|random|warp-ahead), KILN_EMU_SEED and
// KILN_EMU_CP_ASYNC (wait|issue), so a whole test run can be repeated under another schedule.
inline Config config_from_env() {
  Config c;
  if (const char* s = std::getenv("KILN_EMU_SCHEDULE"); s != nullptr && *s != '\0') {
    const std::string v(s);
    bool known = false;
    for (Schedule x : {Schedule::kIndex, Schedule::kReverse, Schedule::kRandom, Schedule::kWarpAhead}) {
      if (v == schedule_name(x)) c.schedule = x, known = true;
    }
    if (!known)
      throw std::invalid_argument("KILN_EMU_SCHEDULE: '" + v + "' is not index, reverse, random or warp-ahead");
  }
  if (const char* s = std::getenv("KILN_EMU_SEED"); s != nullptr && *s != '\0') c.seed = std::strtoull(s, nullptr, 10);
  if (const char* s = std::getenv("KILN_EMU_CP_ASYNC"); s != nullptr && *s != '\0') {
    const std::string v(s);
    if (v != "wait" && v != "issue") throw std::invalid_argument("KILN_EMU_CP_ASYNC: '" + v + "' is not wait or issue");
    c.landing = v == "issue" ? Landing::kAtIssue : Landing::kAtWait;
  }
  return c;
}

inline Config& config() {
  static Config c = config_from_env();
  return c;
}

// Sets the configuration for a scope (tests run a kernel under several).
class ConfigScope {
 public:
  explicit ConfigScope(const Config& c) : saved_(config()) { config() = c; }
  ~ConfigScope() { config() = saved_; }
  ConfigScope(const ConfigScope&) = delete;
  ConfigScope& operator=(const ConfigScope&) = delete;

 private:
  Config saved_;
};

// Shared memory one block may hold, static and dynamic together, after opting in
// (sharedMemPerBlockOptin): the CUDA C++ Programming Guide's table of compute capabilities.
constexpr size_t smem_block_limit(int arch) {
  return arch >= 90                 ? 227 * 1024
         : arch == 86 || arch == 89 ? 99 * 1024
         : arch >= 80               ? 163 * 1024
         : arch >= 70               ? 96 * 1024
                                    : 48 * 1024;
}
constexpr size_t kSmemWithoutOptIn = 48 * 1024;

// What a failed check throws (inside a fiber it ends the block; the launch rethrows it).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- state

struct Barrier {
  int expected = 0;
  int count = 0;
  unsigned generation = 0;
  char order[2] = {0, 0};  // ThreadSanitizer's synchronisation objects, one per generation parity
};

// A cp.async in flight: its source is read when issued, its destination written when a
// cp.async.wait_group retires its group (Landing::kAtWait).
struct PendingCopy {
  void* dst;
  unsigned char bytes[16];
};

struct Fiber {
  Context context;
  char* stack = nullptr;  // from stack_pool()
  size_t stack_size = 0;
  uint3 thread_idx{0, 0, 0};
  bool started = false;
  bool done = false;
  const Barrier* waiting = nullptr;  // resumed once waiting->generation != wait_generation
  unsigned wait_generation = 0;
  std::vector<PendingCopy> open_group;              // issued since the last commit
  std::vector<std::vector<PendingCopy>> committed;  // oldest first
  void* tsan_fiber = nullptr;
};

// A warp collective (WMMA) being assembled; two, by the parity of the warp's collective count.
struct Collective {
  int arrived = 0;
  int kind = 0;  // 1 load, 2 store, 3 mma
  const void* ptr = nullptr;
  unsigned ldm = 0;
  int layout = 0;
  std::array<const void*, 32> frag_a{}, frag_b{}, frag_c{};  // each lane's fragments (its stack)
  alignas(16) unsigned char tile[256 * 4];                   // a load's elements, as each lane read its share
  float result[256];                                         // an mma's product, computed once
  float shuffle[32];                                         // a shuffle's values
};

struct Warp {
  Barrier sync;      // __syncwarp: a memory barrier
  Barrier converge;  // collectives: converge, order nothing
  Collective slot[2];
  unsigned lanes = 32;
};

struct StaticSmem {
  const void* key;
  unsigned char* bytes;
  size_t size;
};

struct Block {
  uint3 block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
  std::vector<Fiber> fibers;
  Barrier block_barrier;
  std::vector<Warp> warps;
  std::vector<unsigned char> shared;  // dynamic shared memory between two canaries
  unsigned char* dynamic_shared = nullptr;
  size_t dynamic_bytes = 0;
  std::vector<StaticSmem> statics;
  std::vector<unsigned char> static_arena;  // static __shared__ arrays, carved in declaration order
  size_t static_bytes = 0;
  unsigned char poison = 0xCD;
  std::function<void()> body;
  Context scheduler;
  size_t current = 0;
  Fiber* running = nullptr;  // &fibers[current]
  std::string error;
  const std::array<unsigned char, 256>* owner = nullptr;  // WMMA element -> lane
  void* tsan_scheduler = nullptr;
  char tsan_start = 0;  // released by the scheduler before the block, acquired by each fiber
  char tsan_end = 0;    // released by each fiber at its end, acquired by the scheduler
  const void* asan_scheduler_bottom = nullptr;
  size_t asan_scheduler_size = 0;
};

// Fiber stacks, reused from block to block (a fresh 128 KiB per thread and block costs more in
// page faults than the kernels' own work).
inline std::vector<std::unique_ptr<char[]>>& stack_pool() {
  static std::vector<std::unique_ptr<char[]>> pool;
  return pool;
}
// ThreadSanitizer's fibers, likewise reused (each one's creation maps memory): thread t of every
// block is the same fiber to it, and blocks run in order anyway, so only a block's own threads
// are checked against each other.
inline std::vector<void*>& tsan_fiber_pool() {
  static std::vector<void*> pool;
  return pool;
}

inline Block*& block_slot() {
  static Block* block = nullptr;
  return block;
}
KILN_EMU_NO_TSAN inline Block* current_block() {
  return block_slot();
}
KILN_EMU_NO_TSAN inline Fiber& current_fiber() {
  return *current_block()->running;
}
KILN_EMU_NO_TSAN inline unsigned lane() {
  return current_fiber().thread_idx.x % 32;
}
KILN_EMU_NO_TSAN inline unsigned warp_index() {
  return current_fiber().thread_idx.x / 32;
}

// Per launch: what the last launch found, for tests (e.g. a kernel's static shared memory).
struct LaunchRecord {
  size_t static_smem_bytes = 0;
  size_t dynamic_smem_bytes = 0;
  unsigned blocks = 0;
};
inline LaunchRecord& last_launch() {
  static LaunchRecord r;
  return r;
}
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), per kernel.
inline std::map<const void*, size_t>& dynamic_smem_opt_in() {
  static std::map<const void*, size_t> m;
  return m;
}
// The static shared memory each kernel was seen to use (known after its first block).
inline std::map<const void*, size_t>& known_static_smem() {
  static std::map<const void*, size_t> m;
  return m;
}

[[noreturn]] inline void fail(const std::string& what) {
  throw Error("emulation: " + what);
}

// ---- fiber switches (announced to the sanitizers)

// `last`: the fiber has ended; its end is released to the scheduler (ThreadSanitizer), and its
// fake stack freed (AddressSanitizer).
inline void switch_to_scheduler(Fiber& f, bool last = false) {
  Target to{};
  [[maybe_unused]] void* tsan_to = nullptr;
  [[maybe_unused]] void* end_sync = nullptr;
  [[maybe_unused]] const void* bottom = nullptr;
  [[maybe_unused]] size_t size = 0;
  {
    const Internal internal;
    Block* b = current_block();
    to = target_of(b->scheduler);
#ifdef KILN_EMU_TSAN
    tsan_to = b->tsan_scheduler;
    end_sync = &b->tsan_end;
#endif
#ifdef KILN_EMU_ASAN
    bottom = b->asan_scheduler_bottom;
    size = b->asan_scheduler_size;
#endif
  }
#ifdef KILN_EMU_TSAN
  if (last) __tsan_release(end_sync);
  __tsan_switch_to_fiber(tsan_to, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef KILN_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(last ? nullptr : &fake, bottom, size);
  switch_context(f.context, to);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_context(f.context, to);
#endif
}

inline void switch_to_fiber(Block& b, Fiber& f) {
  const Internal internal;
  const Target target = target_of(f.context);
#ifdef KILN_EMU_TSAN
  __tsan_switch_to_fiber(f.tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef KILN_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, f.stack_size);
  switch_context(b.scheduler, target);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_context(b.scheduler, target);
#endif
}

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

inline float shuffle_xor(float value, int mask) {
  const Internal internal;
  Warp& w = current_block()->warps[warp_index()];
  const unsigned l = lane();
  Collective& c = w.slot[w.converge.generation & 1];
  c.shuffle[l] = value;
  if (wait(w.converge, /*memory=*/false)) w.slot[w.converge.generation & 1].arrived = 0;
  const unsigned from = l ^ static_cast<unsigned>(mask);
  if (from >= w.lanes) fail("__shfl_xor_sync reads lane " + std::to_string(from) + " of a partial warp");
  return c.shuffle[from];
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

// ---- the CUDA surface the kernels use
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
// Static shared arrays are declared with KILN_STATIC_SMEM (common.cuh), which poisons them per block.
#define __shared__ KILN_EMULATION_declare_static_shared_memory_with_KILN_STATIC_SMEM
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
  ::kiln::emu::fail("__trap(): a kernel variant this architecture does not have was launched");
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
// An atomic read-modify-write (ThreadSanitizer sees an atomic, not a race).
inline float atomicAdd(float* address, float value) {
  auto* bits = reinterpret_cast<uint32_t*>(address);
  uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), next;
  float was;
  do {
    std::memcpy(&was, &old, 4);
    const float sum = was + value;
    std::memcpy(&next, &sum, 4);
  } while (!__atomic_compare_exchange_n(bits, &old, next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return was;
}
using std::max;
using std::min;

// The runtime calls the launchers make: a kernel's opt-in to more dynamic shared memory.
template <typename Kernel>
inline cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  const void* key = reinterpret_cast<const void*>(kernel);
  const auto known = ::kiln::emu::known_static_smem().find(key);
  const size_t static_bytes = known != ::kiln::emu::known_static_smem().end() ? known->second : 0;
  if (value < 0 ||
      static_cast<size_t>(value) + static_bytes > ::kiln::emu::smem_block_limit(::kiln::emu::config().arch)) {
    return cudaErrorInvalidValue;
  }
  ::kiln::emu::dynamic_smem_opt_in()[key] = static_cast<size_t>(value);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorInvalidValue ? "invalid argument" : "emulated CUDA error";
}

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
