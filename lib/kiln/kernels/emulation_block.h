// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): the
// configuration (schedule, cp.async landing, seed, architecture; defaults from the environment),
// the shared-memory limits, the state of a block and its fibers, warps and collectives, the
// per-process pools and records, and the fiber switches to and from the scheduler. The data every
// other part works on, apart from what each part does with it.
#pragma once

#include "kiln/common/env.h"
#include "kiln/kernels/emulation_fiber.h"

namespace kiln::emu {

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
  if (const auto v = env::choice("KILN_EMU_SCHEDULE", {"index", "reverse", "random", "warp-ahead"})) {
    for (Schedule x : {Schedule::kIndex, Schedule::kReverse, Schedule::kRandom, Schedule::kWarpAhead}) {
      if (*v == schedule_name(x)) c.schedule = x;
    }
  }
  if (const auto seed = env::integer("KILN_EMU_SEED", 0, INT64_MAX)) c.seed = static_cast<uint64_t>(*seed);
  if (const auto v = env::choice("KILN_EMU_CP_ASYNC", {"wait", "issue"})) {
    c.landing = *v == "issue" ? Landing::kAtIssue : Landing::kAtWait;
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

// A warp collective (WMMA, ldmatrix, mma.sync) being assembled; two, by the parity of the warp's
// collective count.
struct Collective {
  int arrived = 0;
  int kind = 0;  // 1 load, 2 store, 3 mma (WMMA); 4 ldmatrix, 5 mma.sync (emulation_mma.h)
  const void* ptr = nullptr;
  unsigned ldm = 0;
  int layout = 0;
  std::array<const void*, 32> frag_a{}, frag_b{}, frag_c{};  // each lane's fragments (its stack)
  alignas(16) unsigned char tile[256 * 4];                   // a load's elements, as each lane read its share
  float result[256];                                         // an mma's product, computed once
  uint32_t shuffle[32];                                      // a shuffle's values (bits)
  uint32_t lane_in[32][10];  // mma.sync: each lane's A (4), B (2) and C (4, fp32 bits) registers
  uint32_t lane_out[32][4];  // mma.sync: each lane's D registers
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

}  // namespace kiln::emu
