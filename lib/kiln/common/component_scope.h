// A named range of the training step for LibTorch's profiler: an at::RecordFunction of the user
// scope, named "kiln::<component>" after a row of the traffic model (cost/traffic.h: "q_proj",
// "attention core", "AdamW", ...). kiln-profile --component-times reads them back to measure each
// component's time (profile/component_times.h); autograd ties each backward node to the forward
// scope its op ran in. With no profiler running, a scope costs one thread-local check. Each scope is
// an NVTX range of the same name too (common/nvtx.h), for Nsight Systems and Nsight Compute.
#pragma once

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
class ComponentScope {
 public:
  // `name` must outlive the scope (a string literal).
  explicit ComponentScope(const char* name) : guard_(at::RecordScope::USER_SCOPE) {
    nvtx::push(name);
    if (guard_.isActive()) guard_.before(name, static_cast<int64_t>(at::sequence_number::peek()));
  }
  ~ComponentScope() {
    nvtx::pop();
    if (!guard_.isActive()) return;
    at::RecordFunction end(at::RecordScope::USER_SCOPE);
    if (end.isActive()) end.before(kScopeEnd, static_cast<int64_t>(at::sequence_number::peek()));
  }
  ComponentScope(const ComponentScope&) = delete;
  ComponentScope& operator=(const ComponentScope&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace kiln
