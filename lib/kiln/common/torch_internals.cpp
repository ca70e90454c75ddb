// See torch_internals.h: the three uses of LibTorch's impl/detail API, and nothing else.
#include "kiln/common/torch_internals.h"

#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/autograd/variable.h>

namespace kiln::torch_internals {

namespace {

struct Hook final : torch::autograd::PostAccumulateGradHook {
  explicit Hook(std::function<void()> fn) : fn(std::move(fn)) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { fn(); }
  std::function<void()> fn;
};

}  // namespace

void set_post_accumulate_grad_hook(const at::Tensor& param, std::function<void()> fn) {
  TORCH_CHECK(param.is_leaf() && param.requires_grad(),
              "set_post_accumulate_grad_hook: only a leaf tensor that requires grad accumulates a gradient");
  torch::autograd::impl::set_post_acc_grad_hooks(param, std::make_unique<Hook>(std::move(fn)));
}

void clear_post_accumulate_grad_hook(const at::Tensor& param) {
  torch::autograd::impl::set_post_acc_grad_hooks(param, nullptr);
}

struct GradientRoot::Edge {
  torch::autograd::Edge edge;
};

GradientRoot::GradientRoot(const at::Tensor& output)
    : edge_(std::make_shared<const Edge>(Edge{torch::autograd::impl::gradient_edge(output)})) {
  TORCH_CHECK(edge_->edge.is_valid(), "GradientRoot: the output has no gradient function (it does not require grad)");
}

std::vector<at::Tensor> backprop_from(const GradientRoot& root, const at::Tensor& grad,
                                      const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(root.edge_ != nullptr, "backprop_from: an empty GradientRoot");
  torch::autograd::edge_list outputs;
  outputs.reserve(inputs.size());
  for (const auto& t : inputs) outputs.push_back(torch::autograd::impl::gradient_edge(t));
  return torch::autograd::Engine::get_default_engine().execute({root.edge_->edge}, {grad}, /*keep_graph=*/false,
                                                               /*create_graph=*/false, /*accumulate_grad=*/false,
                                                               outputs);
}

namespace {

// The Kineto profiler on (CPU ops; CUDA kernels too with `cuda`), and off from a destructor.
void enable_kineto(bool cuda, bool input_shapes) {
  namespace prof = torch::profiler::impl;
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (cuda) activities.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, input_shapes);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

void disable_kineto_quietly() {
  try {
    torch::autograd::profiler::disableProfiler();
  } catch (...) {  // a destructor on an error path: the profiler is off either way
  }
}

}  // namespace

KinetoTrace::KinetoTrace(bool cuda) {
  enable_kineto(cuda, /*input_shapes=*/true);
  active_ = true;
}

KinetoTrace::~KinetoTrace() {
  if (active_) disable_kineto_quietly();
}

void KinetoTrace::save(const std::string& path) {
  TORCH_CHECK(active_, "KinetoTrace::save: the trace was already saved");
  active_ = false;
  const auto result = torch::autograd::profiler::disableProfiler();
  result->save(path);
}

OpEventRecorder::OpEventRecorder(bool cuda) {
  enable_kineto(cuda, /*input_shapes=*/false);
  active_ = true;
}

OpEventRecorder::~OpEventRecorder() {
  if (active_) disable_kineto_quietly();
}

std::vector<OpEvent> OpEventRecorder::stop() {
  TORCH_CHECK(active_, "OpEventRecorder::stop: already stopped");
  active_ = false;
  const auto result = torch::autograd::profiler::disableProfiler();
  using libkineto::ActivityType;
  auto is = [](const torch::autograd::profiler::KinetoEvent& e, ActivityType t) {
    return e.activityType() == static_cast<uint8_t>(t);
  };
  std::vector<OpEvent> out;
  out.reserve(result->events().size());
  for (const auto& e : result->events()) {
    OpEvent ev{e.name(), e.startNs(), e.endNs(), e.startThreadId(), e.fwdThreadId(), e.sequenceNr()};
    ev.correlation_id = e.correlationId();
    ev.linked_correlation_id = e.linkedCorrelationId();
    if (is(e, ActivityType::CONCURRENT_KERNEL) || is(e, ActivityType::GPU_MEMCPY) || is(e, ActivityType::GPU_MEMSET)) {
      ev.kind = OpEventKind::gpu;
    } else if (is(e, ActivityType::CUDA_RUNTIME) || is(e, ActivityType::CUDA_DRIVER)) {
      ev.kind = OpEventKind::launch;
    } else if (!(is(e, ActivityType::CPU_OP) || is(e, ActivityType::USER_ANNOTATION)) || e.isAsync()) {
      continue;  // allocations, instant events, GPU-side annotations, Kineto's own records
    }
    out.push_back(std::move(ev));
  }
  return out;
}

std::optional<RunningNode> running_autograd_node() {
  const std::shared_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
  if (!node) return std::nullopt;
  return RunningNode{.sequence_nr = static_cast<int64_t>(node->sequence_nr()), .forward_thread = node->thread_id()};
}

}  // namespace kiln::torch_internals
