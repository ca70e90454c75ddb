// Part of the CPU emulation of CUDA (emulation.h, which is the header to include): the fibers'
// context switches (a few instructions on x86-64, ucontext elsewhere), the sanitizers' hooks,
// and Internal, the scope in which ThreadSanitizer ignores the emulation's own bookkeeping. The
// lowest layer, apart so that the scheduler above reads without the assembly.
#pragma once

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

}  // namespace kiln::emu
