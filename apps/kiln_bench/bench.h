// kiln-bench's benchmarks, as main.cpp calls them: each prints its markdown table(s) to stdout
// and adds its figures to the run's JSON document `out`.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>
#include <nlohmann/json_fwd.hpp>

#include "timing.h"

namespace kiln::bench {

// The fused ops against their ATen reference (fused_ops.cpp). `ops` is --ops with a comma at each
// end (",rmsnorm,swiglu,"); the ops it names among rmsnorm, swiglu, rope, linear_ce and linear run.
struct FusedOpsCase {
  std::string ops;
  int64_t tokens = 0, hidden = 0, intermediate = 0, vocab = 0, ce_hidden = 0;
  int iters = 1;
  bool predict = false;  // a "predicted" column beside "of copy" (predict.cpp)
};
// Prints the table and the goals' lines; sets out's shape keys and out["results"] (empty when no
// fused op is named). copy_gbps: the device's copy bandwidth (copy_bandwidth_gbps).
void run_fused_ops(const FusedOpsCase& c, const at::TensorOptions& opt, double copy_gbps, Memory& mem,
                   nlohmann::json& out);

// The fraction of copy bandwidth an op's kernels (op: rmsnorm, swiglu, rope; dtype: fp32, bf16,
// fp16) can sustain on this CUDA device by their machine code, against this run's copy bandwidth
// (predict.cpp; docs/kernel_sass.json); nullopt on the CPU or for an op without memory-bound kernels.
std::optional<double> predicted_copy_fraction(const std::string& op, const std::string& dtype, const at::Device& device,
                                              double copy_gbps);
// The same for the reference devices of docs/kernel_sass.json (V100, A100, H200), as a table.
void print_reference_predictions();

// Causal attention: kiln's flash attention against the SDPA backends (attention.cpp).
struct AttentionSweep {
  std::vector<int64_t> seqlens, head_dims;
  int64_t batch = 0;  // 0: 16384 tokens / T on cuda, 1 on cpu
  int64_t heads = 0, kv_heads = 0;
  int64_t docs = 0;  // > 0: that many equal documents per row (the last takes the remainder)
  int iters = 1;
};

// The attention sweep: prints one table per (T, D), appends rows to out["attention"] and calls
// flush_json after each (T, D). Inputs are fresh N(0, 1) tensors per case, same for every impl.
void run_attention(const AttentionSweep& sw, const at::TensorOptions& opt, const std::string& dtype_name, Memory& mem,
                   nlohmann::json& out, const std::function<void()>& flush_json);

// The collectives' bus bandwidth under torchrun or srun (comm.cpp): buffers from 1 MiB up to
// max_bytes by x4; sets out["comm"]. Throws without a launcher.
void run_comm(at::TensorOptions opt, int iters, int64_t max_bytes, nlohmann::json& out);

}  // namespace kiln::bench
