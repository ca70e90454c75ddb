// Named ranges for NVIDIA's tools (NVTX): every kiln component scope (common/component_scope.h:
// "kiln::q_proj", "kiln::attention core", ...), each micro-batch's "kiln::forward" and
// "kiln::backward", each optimizer step's "kiln::optimizer", the whole "kiln::step", and each
// evaluation's "kiln::evaluate". Nsight Systems shows them on its timeline (`nsys profile
// --trace=cuda,nvtx`), and Nsight Compute counts the kernels of one of them (`ncu --nvtx
// --nvtx-include "kiln::attention core/"`). Without a tool attached a range costs a check of a
// function pointer; a build without NVTX's headers (third_party/kiln_nvtx.cmake) compiles them out.
// Ranges are per thread: push and pop on the same thread.
#pragma once

namespace kiln::nvtx {

bool compiled_in();  // whether this build emits the ranges
void push(const char* name);
void pop();

// A range for its lifetime. `name` must outlive the push (NVTX copies it).
class Range {
 public:
  explicit Range(const char* name) { push(name); }
  ~Range() { pop(); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};

}  // namespace kiln::nvtx
