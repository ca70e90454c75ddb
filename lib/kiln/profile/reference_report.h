// kiln-profile reference: every row of the reference runs' data file
// (configs/reference/llamafactory_runs.yaml) with its measured figures, the reference stack's
// prediction (cost/reference.h) and the ratio, and beside them kiln's own prediction for the same
// work on the same GPU. Nothing runs: the models, the data file and the host costs
// (configs/reference/host_costs.yaml) only. docs/performance.md, "The reference runs, predicted".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/cost/reference.h"
#include "kiln/cost/traffic.h"

namespace kiln::profile {

// The tolerances of the issue that asked for this table (52): a speed within 30%, a memory within 10%.
inline constexpr double kSpeedTolerance = 0.30, kMemoryTolerance = 0.10;

struct ReferenceRow {
  std::string table;   // the data file's table name
  std::string device;  // a cost/hardware.h name
  std::string model;   // a preset or configs/reference model
  std::string dtype;   // fp16 | bf16 | fp32
  int64_t batch = 1, accumulation = 1, cutoff_len = 1;
  std::string speed_text;                                          // as written ("12.9 it/s", "1.2 s/it")
  std::optional<double> measured_seconds;                          // per optimizer step
  std::optional<double> measured_memory;                           // bytes, as nvidia-smi showed them
  std::optional<double> memory_bandwidth, tensor_core, fp_engine;  // the user's profiler fractions

  // The reference stack's prediction.
  cost::StepTime predicted;
  cost::SmiMemory predicted_memory;
  cost::ModelledUtilisation counters_at_measured;  // its modelled counters at the measured step time
  std::string attention_backend;
  // The reference step's modelled device-memory traffic per pass (fwd, bwd, recompute, step),
  // bytes per optimizer step, and its GEMM FLOPs.
  std::vector<std::pair<std::string, double>> bytes_by_pass;
  double gemm_flops = 0;
  // kiln's own prediction for the same run on the same GPU (its default kernels and policy).
  cost::StepTime kiln;
  cost::SmiMemory kiln_memory;
  cost::ModelledUtilisation kiln_counters;  // at kiln's predicted step time
  std::string kiln_attention;

  std::optional<double> speed_ratio() const;   // predicted / measured step time
  std::optional<double> memory_ratio() const;  // predicted / measured memory
  bool speed_within() const;
  bool memory_within() const;
  std::vector<std::string> misses;  // for each figure outside its tolerance: the effect the model lacks
};

struct ReferenceReport {
  std::string data_source, host_source;
  std::vector<ReferenceRow> rows;
  std::vector<std::string> unmeasured;  // rows the data file holds without figures ("planned")
};

// Reads the data file and the host costs (a path, or "" for the copies compiled into the library)
// and predicts every row. Throws config::ConfigError naming the file and the key of a bad entry.
ReferenceReport reference_report(const std::string& data_path = "", const std::string& host_costs_path = "");

std::string reference_markdown(const ReferenceReport& report);
std::string reference_json(const ReferenceReport& report);
std::string reference_html(const ReferenceReport& report);
// Writes reference.{md,json,html} (each atomically) for `formats`; returns the paths.
std::vector<std::string> write_reference_reports(const ReferenceReport& report, const std::string& dir,
                                                 const std::vector<std::string>& formats);

// "12.9 it/s" -> 1 / 12.9 s, "1.2 s/it" -> 1.2 s; throws std::invalid_argument for another form.
double parse_speed_seconds(const std::string& text);

}  // namespace kiln::profile
