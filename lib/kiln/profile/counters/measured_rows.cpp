// See measured_rows.h.
#include "kiln/profile/counters/measured_rows.h"

#include <algorithm>

namespace kiln::profile {

using report::cell;
using report::Column;
using report::json;
using report::object;
using report::opt;

std::vector<ComponentRow> component_rows(const cost::TrafficReport& report, const cost::Roofline& roof) {
  std::vector<ComponentRow> out;
  for (const cost::TrafficRow& row : report.rows) {
    const cost::Cost k = row.kiln_step();
    const bool idle = row.kiln.bytes == 0 && row.kiln.flops() == 0;
    out.push_back({.component = row.component,
                   .pass = cost::pass_name(row.pass),
                   .repeats = row.repeats,
                   .gemm_flops = k.gemm_flops,
                   .other_flops = k.other_flops,
                   .bytes = k.bytes,
                   .eager_bytes = row.eager_step().bytes,
                   .intensity = row.kiln.intensity(),
                   .bound = idle                          ? "-"
                            : roof.memory_bound(row.kiln) ? "memory"
                                                          : "compute",
                   .modelled_seconds = roof.seconds(row.kiln) * row.repeats,
                   .eager_modelled_seconds = roof.seconds(row.eager) * row.repeats,
                   .measured_seconds = {},
                   .counted_bytes = {}});
  }
  return out;
}

void add_measurements(std::vector<ComponentRow>& rows, const std::optional<ComponentTimes>& times,
                      const std::optional<CounterReading>& counters, int64_t counted_steps) {
  for (ComponentRow& r : rows) {
    if (times) {
      if (const auto it = times->seconds.find({r.component, r.pass}); it != times->seconds.end())
        r.measured_seconds = it->second;
    }
    if (!counters) continue;
    for (const KernelCounters& k : counters->components) {
      if (r.component == k.name && r.pass == k.pass && k.dram_bytes)
        r.counted_bytes = *k.dram_bytes / static_cast<double>(counted_steps);
    }
  }
}

std::vector<Column<ComponentRow>> component_columns(bool measured) {
  using C = const ComponentRow&;
  using report::number;
  auto text = [](const char* name, std::string ComponentRow::*m) -> Column<ComponentRow> {
    return {name, [m](C c) { return c.*m; }, name, [m](C c) { return json(c.*m); }};
  };
  std::vector<Column<ComponentRow>> out = {
      text("component", &ComponentRow::component),
      text("pass", &ComponentRow::pass),
      number<ComponentRow>("x", "repeats", 0, "{:g}", &ComponentRow::repeats),
      number<ComponentRow>("GEMM GFLOP", "gemm_flops", 'G', "{:.4f}", &ComponentRow::gemm_flops),
      number<ComponentRow>("other GFLOP", "other_flops", 'G', "{:.4f}", &ComponentRow::other_flops),
      number<ComponentRow>("MB", "bytes", 'M', "{:.3f}", &ComponentRow::bytes),
      number<ComponentRow>("MB eager", "eager_bytes", 'M', "{:.3f}", &ComponentRow::eager_bytes),
      {"MB counted", [](C c) { return cell(c.counted_bytes, 'M'); }, "", {}, true},
      number<ComponentRow>("FLOP/B", "intensity", 0, "{:.2f}", &ComponentRow::intensity),
      text("bound", &ComponentRow::bound),
      number<ComponentRow>("modelled ms", "modelled_seconds", 'm', "{:.3f}", &ComponentRow::modelled_seconds),
      number<ComponentRow>("modelled ms eager", "eager_modelled_seconds", 'm', "{:.3f}",
                           &ComponentRow::eager_modelled_seconds),
      {"measured ms", [](C c) { return cell(c.measured_seconds, 'm'); }, "measured_seconds",
       [](C c) { return opt(c.measured_seconds); }, true},
      report::field<ComponentRow>("counted_bytes", &ComponentRow::counted_bytes)};
  if (!measured) {
    std::erase_if(out, [](const auto& c) {
      return c.name == "MB counted" || c.name == "measured ms" || c.key == "counted_bytes";
    });
  }
  return out;
}

std::string component_times_note(const std::optional<ComponentTimes>& t) {
  if (!t) return "measured per component: n/a (--component-times measures it: docs/performance.md)";
  if (t->source == "gpu") {
    return fmt::format(
        "measured per component: LibTorch's profiler over as many steps again, {:.3f} ms of GPU kernels, copies and "
        "memsets per step, {:.3f} ms of them launched in no component's scope ({:g} of {:g} activities per step "
        "placed by their launch's time, {:g} unplaced)",
        t->profiled_seconds * 1e3, t->unattributed_seconds * 1e3, t->timed_activities,
        t->linked_activities + t->timed_activities + t->unplaced_activities, t->unplaced_activities);
  }
  return fmt::format(
      "measured per component: LibTorch's profiler over as many steps again, {:.3f} ms of CPU ops per step, "
      "{:.3f} ms of them in no component's scope",
      t->profiled_seconds * 1e3, t->unattributed_seconds * 1e3);
}

std::vector<std::tuple<std::string, std::string, double>> unmatched_component_times(
    const std::optional<ComponentTimes>& times, const std::vector<ComponentRow>& rows) {
  std::vector<std::tuple<std::string, std::string, double>> out;
  if (!times) return out;
  for (const auto& [key, seconds] : times->seconds) {
    const bool matched = std::any_of(rows.begin(), rows.end(), [&](const ComponentRow& c) {
      return c.component == key.first && c.pass == key.second;
    });
    if (!matched) out.emplace_back(key.first, key.second, seconds);
  }
  return out;
}

json component_times_json(const std::optional<ComponentTimes>& t, const std::vector<ComponentRow>& rows) {
  if (!t) return nullptr;
  json merged = json::array();
  for (const auto& [component, pass, seconds] : unmatched_component_times(t, rows))
    merged.push_back(object("component", component, "pass", pass, "measured_seconds", seconds));
  return object("source", t->source, "linked_activities", t->linked_activities, "timed_activities", t->timed_activities,
                "unplaced_activities", t->unplaced_activities, "profiled_seconds", t->profiled_seconds,
                "unattributed_seconds", t->unattributed_seconds, "merged_rows", merged);
}

std::string phase_of_pass(const std::string& pass) {
  if (pass == "fwd") return "forward";
  if (pass == "bwd" || pass == "recompute") return "backward";
  if (pass == "step") return "optimizer";
  return pass;
}

std::vector<PhaseRow> phase_rows(const CounterReading& reading, int64_t counted_steps,
                                 const std::vector<ComponentRow>& rows) {
  std::vector<PhaseRow> out;
  if (counted_steps <= 0) return out;
  const double n = static_cast<double>(counted_steps);
  auto per_step = [&](const std::optional<double>& v) { return v ? std::optional<double>(*v / n) : std::nullopt; };
  for (const PhaseCounters& p : reading.phases) {
    PhaseRow r{.counted = &p,
               .segments_per_step = static_cast<double>(p.segments) / n,
               .wall_seconds = p.seconds / n,
               .counted_seconds = per_step(p.gpu_seconds ? p.gpu_seconds : p.cpu_seconds),
               .modelled_seconds = {},
               .counted_bytes = per_step(p.dram_bytes),
               .modelled_bytes = {}};
    for (const ComponentRow& c : rows) {
      if (phase_of_pass(c.pass) != p.name) continue;
      r.modelled_seconds = r.modelled_seconds.value_or(0) + c.modelled_seconds;
      r.modelled_bytes = r.modelled_bytes.value_or(0) + c.bytes;
    }
    out.push_back(r);
  }
  return out;
}

std::vector<Column<PhaseRow>> phase_columns(const CounterReading& reading) {
  using P = const PhaseRow&;
  auto counted = [](std::optional<double> PhaseCounters::*m) { return [m](P p) { return opt(p.counted->*m); }; };
  auto percent = [](std::optional<double> PhaseCounters::*m) {
    return [m](P p) { return cell(p.counted->*m, '%', "{:.1f}%"); };
  };
  return {{"phase", [](P p) { return p.counted->name; }, "name", [](P p) { return json(p.counted->name); }},
          {"entered per step", [](P p) { return fmt::format("{:g}", p.segments_per_step); }, "segments",
           [](P p) { return json(p.counted->segments); }},
          {"wall ms", [](P p) { return cell(p.wall_seconds, 'm'); }, "seconds",
           [](P p) { return json(p.counted->seconds); }},
          {reading.source == "cupti" ? "GPU ms (counted)" : "CPU ms (counted, all threads)",
           [](P p) { return cell(p.counted_seconds, 'm'); }, "gpu_seconds", counted(&PhaseCounters::gpu_seconds)},
          {"", {}, "cpu_seconds", counted(&PhaseCounters::cpu_seconds)},
          {"", {}, "cycles", counted(&PhaseCounters::cycles)},
          {"", {}, "instructions", counted(&PhaseCounters::instructions)},
          {"modelled ms", [](P p) { return cell(p.modelled_seconds, 'm'); }, "modelled_seconds_per_step",
           [](P p) { return opt(p.modelled_seconds); }},
          {"DRAM GB counted", [](P p) { return cell(p.counted_bytes, 'G'); }, "dram_bytes",
           counted(&PhaseCounters::dram_bytes)},
          {"GB modelled", [](P p) { return cell(p.modelled_bytes, 'G'); }, "modelled_bytes_per_step",
           [](P p) { return opt(p.modelled_bytes); }},
          {"counted/modelled",
           [](P p) {
             return p.counted_bytes && p.modelled_bytes && *p.modelled_bytes > 0
                        ? fmt::format("{:.2f}", *p.counted_bytes / *p.modelled_bytes)
                        : "n/a";
           }},
          {"memory bandwidth", percent(&PhaseCounters::memory_bandwidth), "memory_bandwidth",
           counted(&PhaseCounters::memory_bandwidth)},
          {"", {}, "memory_throughput", counted(&PhaseCounters::memory_throughput)},
          {"tensor core", percent(&PhaseCounters::tensor_core), "tensor_core", counted(&PhaseCounters::tensor_core)},
          {"fp engine", percent(&PhaseCounters::fp_engine), "fp_engine", counted(&PhaseCounters::fp_engine)},
          {"", {}, "kernels", [](P p) { return json(p.counted->kernels); }}};
}

std::string phase_note(const CounterReading& reading, int64_t counted_steps) {
  return fmt::format(
      "counted per phase over {} step{}, per step; modelled: the traffic model's fwd rows (forward), bwd and "
      "recompute rows (backward), step rows (optimizer); the model counts compulsory bytes, a lower bound of what "
      "DRAM moves; {}",
      counted_steps, counted_steps == 1 ? "" : "s", reading.detail);
}

json counters_json(const std::optional<CounterReading>& reading, int64_t counted_steps,
                   const std::vector<ComponentRow>& rows) {
  if (!reading) return nullptr;
  const CounterReading& c = *reading;
  json per_range = json::array(), kernels = json::array(), components = json::array();
  for (const auto& [name, seconds] : c.per_range) per_range.push_back({name, seconds});
  auto kernel_json = [](const KernelCounters& k) {
    json j = object("name", k.name, "launches", k.launches, "seconds", k.seconds, "dram_bytes", k.dram_bytes,
                    "memory_bandwidth", k.memory_bandwidth, "memory_throughput", k.memory_throughput, "tensor_core",
                    k.tensor_core, "fp_engine", k.fp_engine);
    if (!k.pass.empty()) j["pass"] = k.pass;
    return j;
  };
  for (const KernelCounters& k : c.kernels) kernels.push_back(kernel_json(k));
  for (const KernelCounters& k : c.components) components.push_back(kernel_json(k));
  return object("source", c.source, "memory_bandwidth", c.memory_bandwidth, "tensor_core", c.tensor_core, "fp_engine",
                c.fp_engine, "dram_bytes", c.dram_bytes, "cycles", c.cycles, "instructions", c.instructions,
                "cpu_seconds", c.cpu_seconds, "memory_throughput", c.memory_throughput, "gpu_seconds", c.gpu_seconds,
                "ranges", c.ranges, "collect_seconds", c.collect_seconds, "seconds", c.seconds, "reason", c.reason,
                "detail", c.detail, "per_range", per_range, "kernels", kernels, "components", components,
                "unattributed", c.unattributed ? kernel_json(*c.unattributed) : json(nullptr), "phases",
                report::json_rows(phase_columns(c), phase_rows(c, counted_steps, rows)));
}

void set_counted(Utilisation& memory_bandwidth, Utilisation& tensor_core, Utilisation& fp_engine,
                 const CounterReading& r) {
  auto take = [&](Utilisation& u, const std::optional<double>& v, const std::string& own) {
    u.counted = v;
    u.counted_reason = v ? "" : !own.empty() ? own : !r.reason.empty() ? r.reason : "n/a: not counted";
  };
  take(memory_bandwidth, r.memory_bandwidth, r.memory_reason);
  take(tensor_core, r.tensor_core, r.tensor_reason);
  take(fp_engine, r.fp_engine, r.fp_reason);
}

}  // namespace kiln::profile
