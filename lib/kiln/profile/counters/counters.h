// Hardware counters over an interval of a few sampled steps (docs/performance.md, "Hardware
// counters"): what the device itself counted, beside what the traffic model predicts.
//
//   CPU   perf_event_open(2): cycles, instructions and task-clock (CPU time) of every thread of the
//         process (one counter per thread that exists at start(), each with inherit=1 so that the
//         threads they create meanwhile are counted too), and DRAM traffic where the PMU names it in
//         sysfs (Intel's uncore_imc cas_count_read/write, uncore_imc_free_running data_read/write).
//         The uncore events count the whole socket (every process) and need perf_event_paranoid <= 0
//         or CAP_PERFMON; per-process counting needs <= 2 (user space only at 2).
//   CUDA  CUPTI's range profiler (cupti_range_profiler.h, cupti_profiler_host.h; CUDA 12.6+, compute
//         capability 7.5+) with metrics that fit one pass: GPU time, DRAM bytes, dram__throughput,
//         and the tensor and FMA pipes' active cycles as a share of the elapsed cycles. By default
//         one user range spans the whole interval (user replay, one pass: nothing is replayed,
//         saved or serialised, so the counted steps run at their own speed and the shares are over
//         the interval's GPU time, gaps between kernels included). With
//         CounterOptions::per_kernel, one range per kernel instead (auto range): per kernel its
//         values, the interval's being their GPU-time-weighted means over the kernels' time only.
//         Auto range synchronises after every kernel, serialising them: slow over a whole
//         training step, so it is for small intervals (docs/performance.md, "Hardware
//         counters").
//
// Nothing here throws because a counter is missing: a session that cannot count says why, in one
// line, e.g. "n/a: perf_event_paranoid=3 ..." or "n/a: CUPTI: GPU performance counters are
// restricted to admin users (ERR_NVGPUCTRPERM ...)".
//
// The sessions are perf_event.h and cupti.h; counters.cpp, the factory, is compiled in every build.
// Built with -DKILN_PROFILE_COUNTERS=OFF, kiln compiles neither session, and every session is
// unavailable with the reason "n/a: kiln was built without KILN_PROFILE_COUNTERS".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

namespace kiln::profile {

// One kernel name's launches within an interval (CUDA), GPU-time-weighted like the interval; or,
// in CounterReading::components, one component's (the traffic model's row, `pass` set).
struct KernelCounters {
  std::string name;  // demangled, without its parameter list; "kernel <i>" when names are unknown
  std::string pass;  // components: fwd | bwd | recompute | step ("" for a kernel name)
  int64_t launches = 0;
  double seconds = 0;                       // GPU time of these launches
  std::optional<double> dram_bytes;         // read + written
  std::optional<double> memory_bandwidth;   // dram_bytes / seconds / the device's peak
  std::optional<double> memory_throughput;  // CUPTI's dram__throughput (its own sustained peak)
  std::optional<double> tensor_core;        // fraction of elapsed cycles the tensor pipe was active
  std::optional<double> fp_engine;          // fraction of elapsed cycles the FMA pipe was active
};

// One phase of an interval (CounterSession::phase): its segments summed, in the reading's units.
// CPU: the thread counters' deltas between the phase's boundaries. CUDA, one range per phase
// segment: each segment's user range, its fractions GPU-time-weighted over the segments; per
// kernel: the kernels launched while the phase was current.
struct PhaseCounters {
  std::string name;
  int64_t segments = 0;  // times the phase was entered in the interval
  double seconds = 0;    // wall clock between its boundaries, summed
  std::optional<double> gpu_seconds;
  std::optional<double> dram_bytes, memory_bandwidth, memory_throughput, tensor_core, fp_engine;
  std::optional<double> cpu_seconds, cycles, instructions;
  int64_t kernels = 0;  // CUDA per kernel: the kernel launches counted in it
};

// One reading of hardware counters over an interval (a few sampled steps). Each optional is empty
// when the hardware or the permissions do not provide it; `reason` then says why, in one line.
struct CounterReading {
  std::string source;                          // "perf_event", "cupti", or "" when none
  std::optional<double> memory_bandwidth;      // fraction of the device's peak DRAM bandwidth (given to open())
  std::optional<double> tensor_core;           // fraction: tensor pipe active (CUDA)
  std::optional<double> fp_engine;             // fraction: FMA/FP32 pipe active (CUDA)
  std::optional<double> dram_bytes;            // bytes read + written in the interval
  std::optional<double> cycles, instructions;  // CPU: summed over the process's threads
  std::optional<double> cpu_seconds;           // CPU: task-clock, summed over the process's threads
  // CUDA: CUPTI's dram__throughput.avg.pct_of_peak_sustained_elapsed / 100, GPU-time-weighted (the
  // hardware's own sustained peak rather than the data sheet's).
  std::optional<double> memory_throughput;
  double seconds = 0;  // the interval measured, wall clock (on CUDA slowed by the per-kernel profiling)
  // CUDA: the GPU time the fractions are over: the interval's range (one range, the default), or
  // the kernels' summed time (per kernel: the gaps between kernels are not in it).
  std::optional<double> gpu_seconds;
  int64_t ranges = 0;          // CUDA: the ranges counted (1, or one per kernel)
  double collect_seconds = 0;  // CUDA: stop()'s own time (decoding and evaluating the ranges)
  std::string reason;          // why any column is empty, one line ("" when all are present)
  // The column's own reason, "" when its value is present.
  std::string memory_reason, tensor_reason, fp_reason;
  std::string detail;  // what was counted and how, one line (events, metrics, threads, passes)
  // CUPTI: per kernel name, (name, GPU seconds), largest first; `kernels` has every column.
  std::vector<std::pair<std::string, double>> per_range;
  std::vector<KernelCounters> kernels;
  // With CounterOptions::phases: per phase, in the order first entered (empty otherwise, or when
  // no phase() was called). Together they cover the interval: their sums are its totals.
  std::vector<PhaseCounters> phases;
  // CUDA per kernel: per (component, pass) of the traffic model, the kernels launched in it
  // (counters/kernel_components.h), largest GPU time first; kernels no component holds are
  // summed in `unattributed`.
  std::vector<KernelCounters> components;
  std::optional<KernelCounters> unattributed;
};

struct CounterOptions {
  // CUPTI: one range per kernel (names and columns per kernel in CounterReading::kernels) instead
  // of one range over the interval. The environment variable KILN_CUPTI_REPLAY=user|kernel picks
  // its replay mode (default kernel; both count the same with one pass, user replay saves nothing).
  bool per_kernel = false;
  // CUPTI, per kernel: kernel launches one interval can hold (the counter data image's ranges);
  // launches past it are not counted, and the reading says how many were dropped.
  int64_t max_kernels = 8192;
  // Counts per phase too (CounterSession::phase; kiln-profile sweep --counter-phases: forward, backward,
  // optimizer). CUDA, one range: each phase segment its own user range, with a device
  // synchronisation at every boundary (so that a range holds its segment's kernels only); per
  // kernel: each kernel goes to the phase current at its launch, at no extra cost.
  bool phases = false;
  // CUDA, one range with phases: the ranges (phase segments) one interval can hold; segments past
  // it are not counted, and the reading says how many were dropped. kiln-profile sets it to its
  // counted steps x (2 x gradient accumulation + 1).
  int64_t max_phase_ranges = 1024;
};

// Counts over start() .. stop() intervals, as many as wanted, one at a time. Never throws for a
// missing counter or permission: available() is false and reason() says why, and stop() returns a
// reading whose reason says why each empty column is empty.
class CounterSession {
 public:
  // A session for `device` (CPU: perf_event; CUDA: CUPTI; anything else, or a build without
  // KILN_PROFILE_COUNTERS: unavailable).
  // `peak_bandwidth_bytes_per_s` turns counted DRAM bytes into memory_bandwidth (0: not given,
  // the column stays empty with that reason).
  static std::unique_ptr<CounterSession> open(const c10::Device& device, double peak_bandwidth_bytes_per_s,
                                              const CounterOptions& options = {});
  virtual ~CounterSession();
  virtual bool available() const = 0;
  virtual std::string reason() const = 0;  // why not available ("" when it is)
  virtual void start() = 0;
  // With CounterOptions::phases, between start() and stop(): the work from here to the next
  // phase() or stop() belongs to phase `name` (a phase may be entered many times; its segments are
  // summed). The first phase() of an interval also takes the work since start() (on CUDA with one
  // range per phase, work launched between start() and the first phase() is in no range: call
  // it right after start()). Call it from the thread that calls start(). Without phases, or
  // outside an interval, it does nothing.
  virtual void phase(const std::string& name);
  // After the sampled steps; on CUDA synchronize the device first (torch::cuda::synchronize()).
  virtual CounterReading stop() = 0;
};

}  // namespace kiln::profile
