// The one switch between kiln's CUDA kernels and the ATen reference ops.
//
// Every op in kiln::ops has an ATen reference path that runs on any device; where a kiln
// implementation exists and applies (CUDA tensor, supported dtype and shape; for the chunked
// linear + cross-entropy, any device), the op uses it unless its backend is kAten. Tests use
// kAten to get the reference on the same device.
//
// The choice is written as one string (config key `kernels`, CLI `--kernels`): "kiln", "aten",
// or a comma list whose first item may be the default and whose other items are op=backend,
// e.g. "kiln,rope=aten" or "aten,linear_ce=kiln". A bare first item sets every op; without one
// the items apply on top of kDefaultKernels. It lives in two places:
//   - a process-wide setting (set_backend / set_backends), what programs and tests use;
//   - a BackendScope, which overrides it for the current thread while it lives. A Trainer runs
//     its forward, backward and evaluation inside one, so two trainers in one process (two
//     threads, or interleaved in one) each get their own kernels and never change the other's.
// The choice is made where an op runs forward; a backward follows what its forward chose (the
// recomputation's forward re-enters the scope it was saved under).
//
// The spec is the one switch a run sets, on the CPU as on a GPU: which implementation each op
// runs. Inside kiln's CPU implementations three rules pick a precision or a loop by the CPU's
// features (ops/linear.h: fp32 GEMMs on a CPU without AMX; ops/linear_cross_entropy.h: the loss
// head's matmul dtype and its fused row loops). They are not settings: each has an environment
// override, for measuring and testing on a machine whose CPU would pick the other path, listed in
// docs/architecture.md's one table of environment variables, and a `testing::force_*` hook that
// sets that variable's override inside one test process (common/env.h: the same reader, the same
// code path as a user's setting).
#pragma once

#include <memory>
#include <string>

namespace kiln::ops {

enum class Backend { kKiln, kAten };

// The ops with a kiln implementation; names as in the spec string.
enum class Op { kRmsNorm, kRope, kSwiGlu, kLinearCrossEntropy, kAttention, kLinear, kCount };

// What runs when nothing is chosen (the process-wide setting at start, the programs' `kernels`
// default): kiln's implementation of every op except attention, which is ATen's SDPA (its
// flash / cuDNN / memory-efficient backends). kiln's flash-attention kernels ran at 0.07-0.14x
// SDPA flash's TFLOP/s forward and 0.18-0.42x backward on an H200 (docs/attention.md), so they
// are opt-in ("kiln" or "...,attention=kiln") until they pay.
inline constexpr const char* kDefaultKernels = "kiln,attention=aten";

// Sets the default for every op and clears per-op overrides.
void set_backend(Backend backend);
// The default backend (what ops without an override use).
Backend backend();
// One op's backend: its override, else the default.
void set_backend(Op op, Backend backend);
Backend backend(Op op);

// "kiln" or "aten"; parse_backend throws std::invalid_argument naming the bad value.
std::string backend_name(Backend backend);
Backend parse_backend(const std::string& name);
// "rmsnorm", "rope", "swiglu", "linear_ce", "attention", "linear".
std::string op_name(Op op);

// Applies a spec string as described above. Throws std::invalid_argument naming the bad item;
// nothing is changed then. validate_backends only checks.
void set_backends(const std::string& spec);
void validate_backends(const std::string& spec);
// What `spec` selects for one op, without applying it (validated as set_backends does).
Backend backend_in_spec(const std::string& spec, Op op);
// The current setting as a spec string ("kiln", "kiln,rope=aten").
std::string backends_spec();

// Sets `spec` for the current thread until destroyed (then the previous scope, or the
// process-wide setting, applies again). Throws std::invalid_argument for a bad spec.
class BackendScope {
 public:
  explicit BackendScope(const std::string& spec);
  ~BackendScope();
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;
  struct State;  // every op's resolved backend (dispatch.cpp)

 private:
  const State* previous_;
  std::unique_ptr<State> state_;
};
// The spec in force on this thread (its innermost scope's, else the process-wide one).
std::string effective_backends_spec();

// True when this build compiled the CUDA kernels (KILN_CUDA on).
bool kernels_compiled();

}  // namespace kiln::ops
