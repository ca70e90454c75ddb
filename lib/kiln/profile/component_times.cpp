// Measured time per component (component_times.h).
#include "kiln/profile/component_times.h"

#include <algorithm>
#include <string_view>
#include <tuple>

#include "kiln/common/component_scope.h"

namespace kiln::profile {

namespace {

constexpr std::string_view kNodePrefix = "autograd::engine::evaluate_function: ";

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The optimizer step's scopes; every other scope outside a backward is a forward part.
bool step_component(const std::string& c) {
  return c == "AdamW" || c == "gradient clipping" || c == "loss-scale unscale";
}

// The autograd sequence numbers a scope's forward ops drew: [first, end).
struct SeqRange {
  int64_t first = 0, end = 0;
  size_t scope = 0;  // index into the events
};

}  // namespace

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
  std::vector<const OpEvent*> events;
  for (const OpEvent& e : all) {
    if (e.end_ns < e.start_ns) continue;
    if (e.name == kBackwardScope) {
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
      pass[i] = in_backward(*events[i]) ? "recompute" : step_component(component[i]) ? "step" : "fwd";
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
  return out;
}

}  // namespace kiln::profile
