// Measured time per component of a training step, from LibTorch's profiler (kiln-profile
// --component-times; docs/performance.md, "Measured time per component"). The model, the step and
// the optimizer run each part inside a profiler scope named after its traffic-model row
// (common/component_scope.h: "kiln::q_proj", ...). From the CPU op events of profiled steps:
//   fwd        a component scope's exclusive time (autocast's casts of a projection's input run
//              inside its scope and count for it: the "autocast casts" row has no measured time);
//   recompute  the same, for a scope inside a backward ("kiln::backward": recomputation
//              runs the forward again there);
//   bwd        the time of each autograd node (the engine's "evaluate_function: <Node>" events),
//              credited to the scope in whose sequence-number range (component_scope.h) the node's
//              number lies, on the node's forward thread;
//   step       the AdamW, clipping and unscale scopes of the optimizer step.
// Every time is exclusive: an event's own time, less that of the events of interest nested in it
// (a checkpointed layer's backward node holds its recomputation and the nodes of the inner graph).
// What no scope covers (autograd's gradient sums inside a node are the node's; the engine's own
// book-keeping, the loss's division) is `unattributed`. On a CPU the ops' times are the work's.
// On a GPU the ops' times are launch times, so there a component's time is that of the GPU
// activities (kernels, copies, memsets) its ops launched, on the GPU's clock: an activity goes to
// the op Kineto linked it to (the innermost ATen op or autograd node open when it was launched),
// else, through its launch (the runtime call with the same correlation id), to the op the launch
// is linked to, else to the innermost scope or autograd node whose time holds the launch (a kiln
// kernel launched straight from a scope, with no ATen op around it); then, as on a CPU, to that
// op's nearest enclosing scope or node. Activities that reach no component are `unattributed`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kiln/common/torch_internals.h"

namespace kiln::profile {

struct ComponentTimes {
  // (component, pass) -> seconds per step; pass is fwd | bwd | recompute | step.
  std::map<std::pair<std::string, std::string>, double> seconds;
  // (component, pass) -> events per step (scopes or autograd nodes).
  std::map<std::pair<std::string, std::string>, double> events;
  // "cpu": the ops' exclusive CPU times; "gpu": the GPU activities' times (events held some).
  std::string source = "cpu";
  double profiled_seconds = 0;      // per step: the top-level events' time on all threads (gpu: the activities')
  double unattributed_seconds = 0;  // per step: profiled_seconds less every component's
  // gpu: activities per step placed through Kineto's link (theirs or their launch's), through
  // their launch's time, and not at all (no link, no launch, or nothing open around it).
  double linked_activities = 0, timed_activities = 0, unplaced_activities = 0;
  double seconds_of(const std::string& component, const std::string& pass) const;  // 0 when absent
};

// The optimizer step's scopes ("AdamW", "gradient clipping", "loss-scale unscale"): pass "step";
// every other scope outside a backward is a forward part.
bool is_step_component(const std::string& component);

// The attribution of `events` (those of `steps` whole steps) to components.
ComponentTimes attribute_component_times(const std::vector<torch_internals::OpEvent>& events, int64_t steps);

}  // namespace kiln::profile
