// The kiln-profile sweep: one training step per grid point (cutoff_len x batch size x gradient
// accumulation x recomputation), timed with the device synchronised and with its peak memory
// measured, next to the analytic FLOP and memory models, so that a table says how fast and how big
// a run is and how far the prediction is off.
//
// A step here is the trainer's step, the same code: train::TrainingStack::step (train/
// training_stack.h) on a stack built from the point's PretrainConfig (settings.h, point_config),
// on train::run_target's device, its micro-batches drawn by train::draw_window and its learning
// rate train::step_learning_rate's over the point's steps. Data is synthetic (random token ids of
// the point's shape) unless a shard directory is given. An out-of-memory point (a real one, or
// one past an artificial cap) becomes a row marked OOM and the sweep goes on.
//
// Beside the measurement, each point carries the traffic and FLOP model of its step per component
// (cost/traffic.h) against the device's roofline (the data-sheet row of a GPU; on the CPU its
// theoretical peak from cpuid/sysfs, cost/cpu_peak.h, and a measured copy bandwidth), and from it
// the user's three columns as modelled (memory bandwidth, tensor core, fp engine at the measured
// step time); with `counters`, hardware counters (profile/counters/counters.h) over as many more
// steps fill them as counted. A fraction of a peak above 100% (MFU, the measured GEMM rate against
// the CPU's theoretical peak) is reported as a bug in `warnings`, never clamped.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cost/cpu_peak.h"
#include "kiln/cost/hardware.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/traffic.h"
#include "kiln/model/llama_config.h"
#include "kiln/ops/dispatch.h"
#include "kiln/profile/counters/component_times.h"
#include "kiln/profile/counters/counters.h"
#include "kiln/profile/counters/measured_rows.h"
#include "kiln/profile/settings.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/recomputation.h"
#include "kiln/train/run_description.h"

namespace kiln::train {
struct MicroBatch;
}

namespace kiln::profile {

// What one point runs, as the memory and traffic models price it: train::describe_run of its
// trainer settings (point_config) on `target` (the kernels the step runs: kiln's flash kernels
// only on a GPU that runs them, SDPA on the CPU; recomputation; data parallelism).
cost::RunDescription point_run(const ProfileSettings& settings, const model::LlamaConfig& model,
                               const SweepPoint& point, const train::RunTarget& target);

// A point's micro-batches without a dataset_dir: gradient_accumulation_steps batches of uniform
// random ids (labels the ids), drawn from a generator seeded with seed + 1; every step of the
// point takes the same.
std::vector<train::MicroBatch> synthetic_batches(const model::LlamaConfig& model, const SweepPoint& point,
                                                 uint64_t seed);

struct ProfileRow {
  SweepPoint point;
  std::string status = "ok";  // ok | OOM | error: <what>
  std::string message;        // the OOM/error text
  double seconds_per_step = 0;
  double tokens_per_second = 0;
  double tflops = 0;  // model FLOPs (flops.h, no recomputation) per second
  std::optional<double> mfu;
  double peak_allocated_bytes = 0;            // CUDA: caching allocator peak; CPU: counted tensor bytes
  std::optional<double> peak_reserved_bytes;  // CUDA only
  double peak_rss_bytes = 0;                  // process peak RSS (never resets; host side)
  // The process's RSS high-water mark over the warmup and timed steps minus its RSS with the model
  // built (before the optimizer): optimizer state, gradients, activations and allocator slack, as
  // the OS sees them; measured the same way for another program (scripts/bench_vs_hf.py). Linux.
  std::optional<double> rss_peak_over_baseline_bytes;
  // Data parallel: the share of step time the host waited on collectives (gradient buckets not
  // hidden behind backward, the clipping norm, ZeRO's all-gather); peaks are the largest rank's.
  std::optional<double> comm_wait_share;
  // Data parallel: gradient buckets launched in the measured steps, and how many of them while
  // backward was still producing gradients (dist::LaunchCounts; 0 with --no-overlap).
  std::optional<int64_t> buckets_launched, buckets_overlapped;
  cost::MemoryEstimate predicted;
  // The user's columns: memory bandwidth (bytes moved / step time / peak bandwidth), tensor core
  // (GEMM FLOPs on the tensor cores / their peak / step time), fp engine (the rest on the vector
  // units), modelled and counted.
  Utilisation memory_bandwidth, tensor_core, fp_engine;
  std::vector<ComponentRow> components;           // the traffic model's rows (empty for a point that failed)
  double modelled_step_seconds = 0;               // their modelled times summed (0 without a roofline)
  double executed_flops = 0;                      // per step, kiln's rows (recomputation included)
  double traffic_bytes = 0;                       // per step, kiln's rows
  std::optional<CounterReading> counters;         // with --counters, when a session could start
  std::optional<ComponentTimes> component_times;  // with --component-times
  bool mfu_exceeds_peak = false;                  // a bug: reported in SweepReport::warnings
  // The loss (per target token) of every step the point ran, warmup first: read from the device
  // once the point is done, so the timing holds no host synchronisation for it.
  std::vector<double> losses;
  double ratio() const;  // measured / predicted peak
  // "12.9 it/s" or "1.21 s/it", as HF's progress bar prints it.
  std::string speed() const;
};

struct SweepReport {
  ProfileSettings config;
  model::LlamaConfig model;
  int64_t num_parameters = 0;
  std::string device;       // "cpu", "cuda:0 (NVIDIA H200)"
  std::string peak_name;    // what MFU divides by
  double peak_tflops = 0;   // 0 = unknown (MFU n/a)
  std::string peak_source;  // datasheet | theoretical | measured | --peak-tflops
  // The device as the roofline sees it (cost::machine_hardware): a GPU's data-sheet row, or the
  // CPU's theoretical peaks (their inputs, or why there are none) and measured copy bandwidth.
  cost::MachineHardware machine;
  std::optional<cost::Roofline> roofline;  // the model's columns use it
  // CPU: the fp32 GEMM rate measured beside the theoretical peak (common/device.h);
  // measured_gemm_exceeds_peak is the bug of a peak that does not hold.
  std::optional<double> measured_gemm_tflops;
  bool measured_gemm_exceeds_peak = false;
  std::string counters_note;          // one line: what the counted columns hold, or why they are empty
  std::vector<std::string> warnings;  // "BUG: ..." lines: a fraction of a peak above 100%
  int world_size = 1;                 // processes of a data-parallel sweep
  std::string launcher = "none";      // torchrun | slurm | none
  std::string backend;                // gloo | nccl (data parallel only)
  std::vector<ProfileRow> rows;
};

// Runs every point of the grid (cutoff_len outermost, then batch size, then accumulation).
// `on_row` is called after each point (progress output). Launched by torchrun or srun, every
// rank must call it; tokens/s are then the job's, memory the largest rank's.
SweepReport run_sweep(const ProfileSettings& config, const std::function<void(const ProfileRow&)>& on_row = {});

}  // namespace kiln::profile
