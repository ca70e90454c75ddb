// The kiln-profile sweep: one training step per grid point (cutoff_len x batch size x gradient
// accumulation), timed with the device synchronised and with its peak memory measured, next to
// the analytic FLOP and memory models, so that a table says how fast and how big a run is and
// how far the prediction is off.
//
// A step here is the trainer's step, not a copy of it: train::accumulate_gradients (autocast for
// bf16/fp16 over fp32 master weights), optim::clip_grad_norm, optim::AdamW::step, zero_grad, on a
// model built as train::Trainer builds it. Data is synthetic (random token ids of the point's
// shape) unless a shard directory is given. An out-of-memory point (a real one, or one past an
// artificial cap) becomes a row marked OOM and the sweep goes on.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/cost/memory.h"
#include "kiln/model/llama_config.h"

namespace kiln::profile {

struct SweepConfig {
  std::string source = "command line";  // where it came from, for error messages
  std::string model = "tiny";           // preset name or model YAML
  std::string dtype = "bf16";           // bf16 | fp16 | fp32 (compute; parameters stay fp32)
  std::vector<int64_t> cutoff_lens{128};
  std::vector<int64_t> batch_sizes{1};
  std::vector<int64_t> grad_accums{1};
  int64_t steps = 3;            // timed steps per point
  int64_t warmup = 1;           // untimed steps first
  std::string device = "auto";  // auto | cpu | cuda
  std::string dataset_dir;      // token shards; empty = synthetic ids
  bool gradient_checkpointing = false;
  // With it: full (layers 0, n, 2n, ... as gradient_checkpointing_every says: 1 = all), every_n
  // (the same) or selective (matmul outputs kept, element-wise parts recomputed; ignores every).
  std::string gradient_checkpointing_policy = "full";
  int64_t gradient_checkpointing_every = 1;  // with it: recompute layers 0, n, 2n, ... (1 = all)
  std::string attention = "sdpa";            // recorded for the memory model (kiln uses SDPA)
  std::string kernels = "kiln";              // ops backends for the run (ops/dispatch.h spec), as kiln-pretrain's key
  double peak_tflops = 0;                    // > 0 overrides the device table / CPU measurement
  int64_t memory_cap_bytes = 0;              // > 0: allocations past it fail as out-of-memory
  std::string task = "pretrain";             // the table's first column
  std::vector<std::string> formats{"md", "csv", "json", "html"};
  std::string output_dir = "profile";
  // Non-empty: after the timed steps of each point, `steps` more steps run under LibTorch's
  // (Kineto) profiler and their trace is written as trace_T<cutoff>_B<batch>_A<accum>.json here
  // (Chrome trace format, as torch.profiler's export_chrome_trace: Perfetto or chrome://tracing
  // opens it; scripts/bench_vs_hf.py --op-profile sums it per op). Not part of the timing.
  std::string trace_dir;
  uint64_t seed = 42;
  // Under torchrun/srun every rank runs the step data-parallel (kiln/dist/data_parallel.h).
  int64_t zero_stage = 0;
  int64_t ddp_bucket_cap_mb = 25;
  bool ddp_overlap = true;  // false: every bucket after backward (to measure what the overlap hides)

  void validate() const;  // throws config::ConfigError naming source and key
  // "none", "full", "every_2", "selective": what the points run.
  std::string recomputation() const;
};

// Reads a configs/profile/*.yaml (lists as YAML sequences or "128,256" strings).
SweepConfig load_sweep_config(const std::string& path);
// "128,256" -> {128, 256}; throws std::invalid_argument naming `what` for a bad entry.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what);

struct SweepPoint {
  int64_t batch_size = 1, grad_accum = 1, cutoff_len = 128;
};

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
  std::optional<double> dram_throughput;  // fraction of peak DRAM bandwidth (hardware counters)
  std::optional<double> tensor_pipe;      // fraction of tensor-pipe cycles (hardware counters)
  double ratio() const;                   // measured / predicted peak
  // "12.9 it/s" or "1.21 s/it", as HF's progress bar prints it.
  std::string speed() const;
};

struct SweepReport {
  SweepConfig config;
  model::LlamaConfig model;
  int64_t num_parameters = 0;
  std::string device;       // "cpu", "cuda:0 (NVIDIA H200)"
  std::string peak_name;    // what MFU divides by
  double peak_tflops = 0;   // 0 = unknown (MFU n/a)
  std::string peak_source;  // datasheet | measured | --peak-tflops
  std::string counters_note;
  int world_size = 1;             // processes of a data-parallel sweep
  std::string launcher = "none";  // torchrun | slurm | none
  std::string backend;            // gloo | nccl (data parallel only)
  std::vector<ProfileRow> rows;
};

// Runs every point of the grid (cutoff_len outermost, then batch size, then accumulation).
// `on_row` is called after each point (progress output). Launched by torchrun or srun, every
// rank must call it; tokens/s are then the job's, memory the largest rank's.
SweepReport run_sweep(const SweepConfig& config, const std::function<void(const ProfileRow&)>& on_row = {});

}  // namespace kiln::profile
