// Measured time per component (component_times.h).
#include "kiln/profile/counters/component_times.h"

#include <algorithm>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "kiln/common/component_scope.h"

namespace kiln::profile {

namespace {

constexpr std::string_view kNodePrefix = "autograd::engine::evaluate_function: ";

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The autograd sequence numbers a scope's forward ops drew: [first, end).
struct SeqRange {
  int64_t first = 0, end = 0;
  size_t scope = 0;  // index into the events
};

// GPU activities to components (component_times.h): each to an op (through Kineto's link, its
// launch's link, or its launch's time), then to that op's owner.
template <typename IsScope, typename IsNode>
ComponentTimes attribute_gpu(ComponentTimes& out, const std::vector<const torch_internals::OpEvent*>& gpu,
                             const std::vector<const torch_internals::OpEvent*>& launches,
                             const std::vector<const torch_internals::OpEvent*>& events, const std::vector<long>& owner,
                             const std::vector<std::string>& component, const std::vector<std::string>& pass,
                             IsScope is_scope, IsNode is_node, int64_t steps) {
  using torch_internals::OpEvent;
  out.source = "gpu";
  std::unordered_map<uint64_t, size_t> op_of;  // an op's correlation id -> its index
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i]->correlation_id != 0) op_of.emplace(events[i]->correlation_id, i);
  }
  std::unordered_map<uint64_t, const OpEvent*> launch_of;  // CUPTI correlation id -> the launch
  for (const OpEvent* l : launches) {
    if (l->correlation_id != 0) launch_of.emplace(l->correlation_id, l);
  }
  // Scopes and nodes by start (an enclosing one first): the innermost one open at time t is the
  // last to start at or before t that has not ended by then (those that started after it closed).
  std::vector<size_t> spans;
  for (size_t i = 0; i < events.size(); ++i) {
    if (is_scope(i) || is_node(i)) spans.push_back(i);
  }
  std::sort(spans.begin(), spans.end(), [&](size_t a, size_t b) {
    return std::tie(events[a]->start_ns, events[b]->end_ns) < std::tie(events[b]->start_ns, events[a]->end_ns);
  });
  auto open_at = [&](uint64_t t) -> long {
    auto it = std::upper_bound(spans.begin(), spans.end(), t,
                               [&](uint64_t time, size_t i) { return time < events[i]->start_ns; });
    while (it != spans.begin()) {
      --it;
      if (events[*it]->end_ns >= t) return static_cast<long>(*it);
    }
    return -1;
  };
  auto linked = [&](uint64_t id) -> long {
    if (id == 0) return -1;
    const auto it = op_of.find(id);
    return it == op_of.end() ? -1 : static_cast<long>(it->second);
  };
  const double per_step = 1e-9 / static_cast<double>(steps), count = 1.0 / static_cast<double>(steps);
  double attributed = 0;
  for (const OpEvent* g : gpu) {
    long op = linked(g->linked_correlation_id);
    bool timed = false;
    if (op < 0 && g->correlation_id != 0) {
      if (const auto it = launch_of.find(g->correlation_id); it != launch_of.end()) {
        op = linked(it->second->linked_correlation_id);
        if (op < 0) {  // the launch's midpoint: the safer side of a small clock offset
          const OpEvent& l = *it->second;
          op = open_at(l.start_ns + (l.end_ns - l.start_ns) / 2);
          timed = op >= 0;
        }
      }
    }
    (op < 0 ? out.unplaced_activities : timed ? out.timed_activities : out.linked_activities) += count;
    const double s = static_cast<double>(g->end_ns - g->start_ns) * per_step;
    out.profiled_seconds += s;
    const long o = op >= 0 ? owner[static_cast<size_t>(op)] : -1;
    if (o < 0 || component[static_cast<size_t>(o)].empty()) continue;
    out.seconds[{component[static_cast<size_t>(o)], pass[static_cast<size_t>(o)]}] += s;
    attributed += s;
  }
  out.unattributed_seconds = std::max(0.0, out.profiled_seconds - attributed);
  return out;
}

}  // namespace

bool is_step_component(const std::string& c) {
  return c == "AdamW" || c == "gradient clipping" || c == "loss-scale unscale";
}

double ComponentTimes::seconds_of(const std::string& component, const std::string& pass) const {
  const auto it = seconds.find({component, pass});
  return it == seconds.end() ? 0.0 : it->second;
}

ComponentTimes attribute_component_times(const std::vector<torch_internals::OpEvent>& all, int64_t steps) {
  using torch_internals::OpEvent;
  ComponentTimes out;
  if (steps <= 0) return out;
  // The backward windows (on any thread: the autograd engine may run on its own), then the other
  // events, sorted per thread by start, an enclosing event before the events it contains.
  std::vector<std::pair<uint64_t, uint64_t>> backward;
  std::vector<const OpEvent*> events, launches, gpu;
  for (const OpEvent& e : all) {
    if (e.end_ns < e.start_ns) continue;
    if (e.kind == torch_internals::OpEventKind::launch) {
      launches.push_back(&e);
    } else if (e.kind == torch_internals::OpEventKind::gpu) {
      gpu.push_back(&e);
    } else if (e.name == kBackwardScope) {
      backward.emplace_back(e.start_ns, e.end_ns);
    } else {
      events.push_back(&e);
    }
  }
  std::sort(events.begin(), events.end(), [](const OpEvent* a, const OpEvent* b) {
    return std::tie(a->thread, a->start_ns, b->end_ns) < std::tie(b->thread, b->start_ns, a->end_ns);
  });
  const size_t n = events.size();
  std::vector<long> parent(n, -1);
  {
    std::vector<size_t> open;
    for (size_t i = 0; i < n; ++i) {
      const OpEvent& e = *events[i];
      if (i > 0 && e.thread != events[i - 1]->thread) open.clear();
      while (!open.empty() && events[open.back()]->end_ns < e.end_ns) open.pop_back();
      if (!open.empty()) parent[i] = static_cast<long>(open.back());
      open.push_back(i);
    }
  }
  auto is_scope = [&](size_t i) {
    return starts_with(events[i]->name, kComponentPrefix) && events[i]->name != kScopeEnd;
  };
  auto is_node = [&](size_t i) { return starts_with(events[i]->name, kNodePrefix); };
  auto in_backward = [&](const OpEvent& e) {
    return std::any_of(backward.begin(), backward.end(),
                       [&](const auto& w) { return w.first <= e.start_ns && e.end_ns <= w.second; });
  };

  // Each scope's component and pass, and the sequence numbers its forward ops drew: from the
  // number the scope opened with to the one its end marker (its child) closed with.
  std::vector<std::string> component(n), pass(n);
  std::map<uint64_t, std::vector<SeqRange>> ranges;  // per thread
  for (size_t i = 0; i < n; ++i) {
    if (is_scope(i)) {
      component[i] = events[i]->name.substr(std::string_view(kComponentPrefix).size());
      pass[i] = in_backward(*events[i]) ? "recompute" : is_step_component(component[i]) ? "step" : "fwd";
    } else if (events[i]->name == kScopeEnd && parent[i] >= 0 && is_scope(static_cast<size_t>(parent[i]))) {
      const OpEvent& scope = *events[static_cast<size_t>(parent[i])];
      if (scope.sequence_nr >= 0 && events[i]->sequence_nr > scope.sequence_nr)
        ranges[scope.thread].push_back({scope.sequence_nr, events[i]->sequence_nr, static_cast<size_t>(parent[i])});
    }
  }
  for (auto& [thread, r] : ranges)
    std::sort(r.begin(), r.end(), [](const SeqRange& a, const SeqRange& b) { return a.first < b.first; });
  // A backward node: the scope whose range holds its forward op's number, on its forward thread.
  for (size_t i = 0; i < n; ++i) {
    if (!is_node(i) || events[i]->sequence_nr < 0) continue;
    const auto it = ranges.find(events[i]->fwd_thread);
    if (it == ranges.end()) continue;
    const std::vector<SeqRange>& r = it->second;
    const int64_t seq = events[i]->sequence_nr;
    auto after = std::upper_bound(r.begin(), r.end(), seq, [](int64_t s, const SeqRange& x) { return s < x.first; });
    if (after == r.begin()) continue;
    const SeqRange& found = *std::prev(after);
    if (seq < found.end) component[i] = component[found.scope], pass[i] = "bwd";
  }

  // Exclusive time of each scope and node: its own, less the scopes and nodes nested in it.
  std::vector<double> exclusive(n, 0.0);
  std::vector<long> owner(n, -1);  // the nearest enclosing scope or node (itself if one)
  for (size_t i = 0; i < n; ++i) {
    const long p = parent[i];
    const double duration = static_cast<double>(events[i]->end_ns - events[i]->start_ns);
    if (is_scope(i) || is_node(i)) {
      owner[i] = static_cast<long>(i);
      exclusive[i] += duration;
      if (p >= 0 && owner[p] >= 0) exclusive[static_cast<size_t>(owner[p])] -= duration;
    } else {
      owner[i] = p >= 0 ? owner[p] : -1;
    }
  }
  const double per_step = 1e-9 / static_cast<double>(steps);
  double attributed = 0;
  for (size_t i = 0; i < n; ++i) {
    if (events[i]->name == kScopeEnd) continue;
    if (parent[i] < 0) out.profiled_seconds += static_cast<double>(events[i]->end_ns - events[i]->start_ns) * per_step;
    if (owner[i] != static_cast<long>(i) || component[i].empty()) continue;
    const double s = std::max(0.0, exclusive[i]) * per_step;
    out.seconds[{component[i], pass[i]}] += s;
    out.events[{component[i], pass[i]}] += 1.0 / static_cast<double>(steps);
    attributed += s;
  }
  out.unattributed_seconds = std::max(0.0, out.profiled_seconds - attributed);
  if (gpu.empty()) return out;
  // With GPU activities, they are the time: the scopes and nodes counted above stay, their CPU
  // times go.
  out.seconds.clear();
  for (const auto& [key, count] : out.events) out.seconds[key] = 0;  // ran, launched nothing: 0 s on the GPU
  out.profiled_seconds = out.unattributed_seconds = 0;
  return attribute_gpu(out, gpu, launches, events, owner, component, pass, is_scope, is_node, steps);
}

}  // namespace kiln::profile
