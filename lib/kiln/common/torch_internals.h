// The only place kiln uses LibTorch's impl/detail namespaces and the autograd engine's internals:
// the things its public C++ API cannot do. Everything else in kiln calls LibTorch through `at::`/`torch::`/`c10::`
// functions of installed headers (docs/architecture.md, "LibTorch's public API"; scripts/check_public_api.py fails the
// suite if an impl/detail use, a hand-written declaration of a LibTorch symbol or a header LibTorch
// does not install appears anywhere else in lib/ or apps/).
//
// Each function says what it wraps, why no public route does the job, and which test pins the
// behaviour kiln relies on (tests/common/test_torch_internals.cpp), so that a LibTorch upgrade that
// changes one fails there, with its name, instead of in a training run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace kiln::torch_internals {

// ---- Post-accumulate-grad hooks (dist/data_parallel.cpp) ----
// `fn` runs each time autograd has finished accumulating into `param.grad()` (after the sum, so
// .grad holds the micro-batch's total), on the thread running the backward. Wraps
// torch::autograd::impl::set_post_acc_grad_hooks: Python's Tensor.register_post_accumulate_grad_hook
// has no C++ counterpart (at::Tensor::register_hook runs *before* accumulation, with the incoming
// gradient only). Data parallelism needs "this gradient is final" to start its bucket's all-reduce
// during backward. One hook per parameter; setting another replaces it.
void set_post_accumulate_grad_hook(const at::Tensor& param, std::function<void()> fn);
void clear_post_accumulate_grad_hook(const at::Tensor& param);

// ---- Back-propagation from a dropped output (train/recompute_layers.cpp) ----
// The graph edge of `output` (which must require grad), kept without keeping `output` itself.
class GradientRoot {
 public:
  GradientRoot() = default;
  explicit GradientRoot(const at::Tensor& output);
  struct Edge;

 private:
  std::shared_ptr<const Edge> edge_;
  friend std::vector<at::Tensor> backprop_from(const GradientRoot&, const at::Tensor&, const std::vector<at::Tensor>&);
};

// d(output)/d(inputs) . grad for the root's graph, as torch::autograd::grad({output}, inputs, {grad})
// would return it, nothing accumulated into any .grad, the graph freed. The difference from that
// public call: the output tensor may already be gone, so selective recomputation holds one
// activation-sized tensor fewer at backward's peak (the memory model counts on it). Wraps
// torch::autograd::impl::gradient_edge and Engine::execute.
std::vector<at::Tensor> backprop_from(const GradientRoot& root, const at::Tensor& grad,
                                      const std::vector<at::Tensor>& inputs);

// ---- A Kineto trace of a code region (profile/sweep.cpp, kiln-profile sweep --trace) ----
// Starts the Kineto profiler (CPU ops; CUDA kernels too with `cuda`) on construction; save() stops
// it and writes a Chrome trace to `path`. Wraps torch::autograd::profiler::{prepare,enable,disable}Profiler
// and torch::profiler::impl's config types: LibTorch's C++ API has no other way to record a Kineto
// trace (torch.profiler is Python).
class KinetoTrace {
 public:
  explicit KinetoTrace(bool cuda);
  ~KinetoTrace();  // stops the profiler if save() was not called
  void save(const std::string& path);
  KinetoTrace(const KinetoTrace&) = delete;
  KinetoTrace& operator=(const KinetoTrace&) = delete;

 private:
  bool active_ = false;
};

// ---- The ops of a code region, as events (profile/component_times.h) ----
// One op or record_function scope the profiler saw on the CPU: its name ("aten::mm",
// "kiln::q_proj", "autograd::engine::evaluate_function: MmBackward0"), when it ran, on which thread,
// and, for autograd, the sequence number of the graph node (-1 for none) and the thread of the
// forward op that made that node: a backward node's event carries its forward op's sequence number
// and thread, which is how a backward op is traced to the forward scope it came from.
// With CUDA, two more kinds: a launch (a CUDA runtime or driver call on the CPU: cudaLaunchKernel,
// cudaMemcpyAsync, ...) and a GPU activity (a kernel, copy or memset, its start and end on the
// GPU). A launch and the activity it made share a correlation id (CUPTI's); each carries, as
// linked_correlation_id, the correlation id of the innermost op that was open on the launching
// thread (0 for none: Kineto links to ops, not to record_function user scopes, so a kernel
// launched directly inside a kiln:: scope, outside any ATen op, is linked to nothing, and only
// its launch's time places it). An op's own correlation_id is what those links name.
enum class OpEventKind : uint8_t { op, launch, gpu };
struct OpEvent {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t thread = 0, fwd_thread = 0;
  int64_t sequence_nr = -1;
  OpEventKind kind = OpEventKind::op;
  uint64_t correlation_id = 0, linked_correlation_id = 0;
};
// Starts the Kineto profiler (CPU activity, no shapes; CUDA activity too with `cuda`) on
// construction; stop() ends it and returns its events: the CPU ops (async ones left out) and, with
// `cuda`, the launches and GPU activities (GPU-side user annotations, synchronisation and overhead
// records left out). Wraps the same calls as KinetoTrace and the result's
// torch::autograd::profiler::KinetoEvent list: LibTorch's C++ API has no other way to read op
// events (torch.profiler's key_averages is Python).
class OpEventRecorder {
 public:
  explicit OpEventRecorder(bool cuda = false);
  ~OpEventRecorder();  // stops the profiler if stop() was not called
  std::vector<OpEvent> stop();
  OpEventRecorder(const OpEventRecorder&) = delete;
  OpEventRecorder& operator=(const OpEventRecorder&) = delete;

 private:
  bool active_ = false;
};

// ---- The autograd node running on this thread (profile/kernel_components.cpp) ----
// While backward runs a node's apply on this thread: that node's sequence number (the forward op's
// position in its thread's sequence, what the profiler's events carry as sequence_nr) and the
// thread its forward op ran on; nullopt outside a node. Wraps torch::autograd::get_current_node and
// Node::sequence_nr/thread_id (torch/csrc/autograd/function.h): the public API names the node of
// a tensor (grad_fn) but not the one running, which is what attributes a kernel launched inside
// backward to the forward op it differentiates.
struct RunningNode {
  int64_t sequence_nr = -1;
  uint64_t forward_thread = 0;
};
std::optional<RunningNode> running_autograd_node();

}  // namespace kiln::torch_internals
