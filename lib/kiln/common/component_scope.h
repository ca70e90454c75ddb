// A named range of the training step for LibTorch's profiler: an at::RecordFunction of the user
// scope, named "kiln::<component>" after a row of the traffic model (cost/traffic.h: "q_proj",
// "attention core", "AdamW", ...). kiln-profile sweep --component-times reads them back to measure each
// component's time (profile/component_times.h); autograd ties each backward node to the forward
// scope its op ran in. With no profiler running, a scope costs one thread-local check. Each scope is
// an NVTX range of the same name too (common/nvtx.h), for Nsight Systems and Nsight Compute. The
// innermost open scope of each thread is known (ComponentScope::innermost), and a listener, when
// one is set, hears of each scope as it closes (profile/kernel_components.h: the component of a
// kernel at its launch, for the counters per kernel).
#pragma once

#include <atomic>
#include <cstdint>

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#include "kiln/common/nvtx.h"

namespace kiln {

// The prefix of every scope's name; the scope around a micro-batch's backward (not a component:
// the scopes inside it are recomputation); the marker each scope ends with.
inline constexpr const char* kComponentPrefix = "kiln::";
inline constexpr const char* kBackwardScope = "kiln::backward";
inline constexpr const char* kScopeEnd = "kiln::end";

// The scope's event carries the thread's next autograd sequence number as it opens, and a
// zero-length "kiln::end" event nested in it the next one as it closes: every autograd node made
// inside has a number in between (the node's backward event carries it too), whatever made the
// node (an ATen op or a custom autograd Function, which the profiler records no number for).
// A scope as it closed: the sequence numbers its forward ops drew on its thread, [first, end).
struct ClosedScope {
  const char* name;
  int64_t first_seq, end_seq;
  uint64_t thread;  // at::RecordFunction::currentThreadId()
};
using ScopeListener = void (*)(const ClosedScope&);

class ComponentScope {
 public:
  // `name` must outlive the scope (a string literal).
  explicit ComponentScope(const char* name)
      : guard_(at::RecordScope::USER_SCOPE),
        name_(name),
        parent_(innermost_),
        first_seq_(static_cast<int64_t>(at::sequence_number::peek())) {
    innermost_ = this;
    nvtx::push(name);
    if (guard_.isActive()) guard_.before(name, first_seq_);
  }
  ~ComponentScope() {
    innermost_ = parent_;
    nvtx::pop();
    if (const ScopeListener listen = listener().load(std::memory_order_acquire)) {
      listen({name_, first_seq_, static_cast<int64_t>(at::sequence_number::peek()),
              at::RecordFunction::currentThreadId()});
    }
    if (!guard_.isActive()) return;
    at::RecordFunction end(at::RecordScope::USER_SCOPE);
    if (end.isActive()) end.before(kScopeEnd, static_cast<int64_t>(at::sequence_number::peek()));
  }
  ComponentScope(const ComponentScope&) = delete;
  ComponentScope& operator=(const ComponentScope&) = delete;

  const char* name() const { return name_; }
  const ComponentScope* parent() const { return parent_; }
  // This thread's innermost open scope (nullptr: none).
  static const ComponentScope* innermost() { return innermost_; }
  // Told of every scope of every thread as it closes, while set (one listener at a time).
  static std::atomic<ScopeListener>& listener() {
    static std::atomic<ScopeListener> l{nullptr};
    return l;
  }

 private:
  at::RecordFunction guard_;
  const char* name_;
  const ComponentScope* parent_;
  int64_t first_seq_;
  static inline thread_local const ComponentScope* innermost_ = nullptr;
};

}  // namespace kiln
