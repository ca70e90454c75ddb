// The component of a kernel at its launch (kernel_components.h).
#include "kiln/profile/counters/kernel_components.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>

#include "kiln/common/torch_internals.h"
#include "kiln/profile/counters/component_times.h"

namespace kiln::profile {

namespace {

std::mutex g_mutex;
std::vector<ClosedScope> g_scopes;

void on_close(const ClosedScope& s) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_scopes.push_back(s);
}

std::string component_name(const char* scope) {
  return std::string(scope).substr(std::string_view(kComponentPrefix).size());
}

}  // namespace

LaunchSite current_launch_site() {
  LaunchSite site;
  const ComponentScope* s = ComponentScope::innermost();
  for (const ComponentScope* p = s; p != nullptr; p = p->parent()) {
    if (std::strcmp(p->name(), kBackwardScope) == 0) site.in_backward = true;
  }
  if (s != nullptr && std::strcmp(s->name(), kBackwardScope) != 0) site.scope = s->name();
  if (const auto node = torch_internals::running_autograd_node()) {
    site.in_backward = true;
    site.node_seq = node->sequence_nr;
    site.node_thread = node->forward_thread;
  }
  return site;
}

ScopeLog::ScopeLog() {
  ScopeListener expected = nullptr;
  active_ = ComponentScope::listener().compare_exchange_strong(expected, &on_close);
  if (active_) {
    const std::lock_guard<std::mutex> lock(g_mutex);
    g_scopes.clear();
  }
}

ScopeLog::~ScopeLog() {
  if (!active_) return;
  ComponentScope::listener().store(nullptr, std::memory_order_release);
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_scopes.clear();
}

std::vector<ClosedScope> ScopeLog::scopes() const {
  if (!active_) return {};
  const std::lock_guard<std::mutex> lock(g_mutex);
  return g_scopes;
}

std::pair<std::string, std::string> launch_component(const LaunchSite& site, const std::vector<ClosedScope>& scopes) {
  if (!site.scope.empty()) {
    const std::string c = component_name(site.scope.c_str());
    return {c, site.in_backward ? "recompute" : is_step_component(c) ? "step" : "fwd"};
  }
  if (site.node_seq < 0) return {"", ""};
  // The innermost forward scope holding the node's number on its forward thread: of the scopes
  // whose range holds it, the one that opened last (a nested scope opens after its parent).
  const ClosedScope* best = nullptr;
  for (const ClosedScope& s : scopes) {
    if (s.thread != site.node_thread || s.first_seq > site.node_seq || site.node_seq >= s.end_seq) continue;
    if (std::strcmp(s.name, kBackwardScope) == 0) continue;
    if (best == nullptr || s.first_seq > best->first_seq ||
        (s.first_seq == best->first_seq && s.end_seq < best->end_seq))
      best = &s;
  }
  if (best == nullptr) return {"", ""};
  return {component_name(best->name), "bwd"};
}

}  // namespace kiln::profile
