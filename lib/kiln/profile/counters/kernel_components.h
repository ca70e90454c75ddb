// The component of a kernel at its launch (kiln-profile sweep --counters-per-kernel: the per-component
// table's counted bytes; docs/performance.md, "Counted bytes per component"). Called on the
// launching thread (from CUPTI's launch callback), it reads the same things LibTorch's profiler
// attribution does (counters/component_times.h), without the profiler:
//   fwd        the thread's innermost component scope (common/component_scope.h), outside any
//              autograd node;
//   recompute  that scope while an autograd node runs on the thread (recomputation's
//              forward again, in backward), or inside "kiln::backward";
//   bwd        no scope (autograd's own thread) or only "kiln::backward": the running autograd
//              node, credited to the forward scope whose sequence numbers hold the node's, on the
//              node's forward thread (ScopeLog keeps the scopes as they close);
//   step       the optimizer step's scopes (AdamW, gradient clipping, loss-scale unscale).
// A launch that reaches no scope is unattributed ("").
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/common/component_scope.h"

namespace kiln::profile {

// What is running on this thread at a launch.
struct LaunchSite {
  std::string scope;         // the innermost component scope's name ("kiln::q_proj"), "" when none
  bool in_backward = false;  // inside "kiln::backward", or an autograd node is running here
  int64_t node_seq = -1;     // the running autograd node's sequence number (-1: none)
  uint64_t node_thread = 0;  // its forward op's thread
};
LaunchSite current_launch_site();

// The scopes of every thread as they close, while it lives (ComponentScope's listener; one at a
// time: a second ScopeLog while one lives records nothing, and says so through active()).
class ScopeLog {
 public:
  ScopeLog();
  ~ScopeLog();
  ScopeLog(const ScopeLog&) = delete;
  ScopeLog& operator=(const ScopeLog&) = delete;
  bool active() const { return active_; }
  std::vector<ClosedScope> scopes() const;  // so far, in closing order

 private:
  bool active_ = false;
};

// The (component, pass) of a launch from its site and the scopes closed meanwhile: pass is fwd,
// bwd, recompute or step, the component the scope's name without "kiln::"; ("", "") when none.
std::pair<std::string, std::string> launch_component(const LaunchSite& site, const std::vector<ClosedScope>& scopes);

}  // namespace kiln::profile
