// kiln-bench: kiln's fused ops against their ATen references (fused_ops.cpp), with --ops
// attention kiln's flash attention against the SDPA backends (attention.cpp), and with --ops comm
// the collectives' bus bandwidth (comm.cpp); timing and memory measurement in timing.h. Runs on
// CPU (CPU figures) and CUDA. This file reads the settings (../settings.h) and runs what they name,
// in that order.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../cli.h"
#include "../settings.h"
#include "bench.h"
#include "kiln/common/dtype_names.h"
#include "kiln/dist/env.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/dispatch.h"
#include "kiln/profile/counters/cpu_allocator.h"

int main(int argc, char** argv) {
  kiln::profile::CountingCpuAllocatorGuard counter;  // before any tensor exists, so all are counted

  try {
    const auto line = kiln::config::parse_command_line(kiln::cli::arguments(argc, argv), kiln::cli::bench_spelling());
    if (line.help) {
      std::cout << kiln::cli::settings_help(
          "Usage: kiln-bench [--KEY VALUE ...]\n\n"
          "kiln fused ops vs their ATen reference: time, GB/s, peak memory; with --ops attention, kiln's flash\n"
          "attention vs SDPA backends: fwd/bwd time, TFLOP/s, peak memory; with --ops comm (under torchrun or\n"
          "srun), the collectives' bus bandwidth.",
          kiln::cli::bench_keys());
      return 0;
    }
    const kiln::cli::BenchSettings s = kiln::cli::read_bench_settings(line);
    const at::Device device = kiln::cli::device(s.given, s.device);
    const bool cuda = device.is_cuda();
    const std::string dev_name = cuda ? "cuda" : "cpu";
    const std::string dtype_name = !s.dtype.empty() ? s.dtype : cuda ? "bf16" : "fp32";
    const at::ScalarType dtype = kiln::dtype_from_name(dtype_name);
    auto pick = [&](int64_t given, int64_t gpu, int64_t cpu) { return given > 0 ? given : cuda ? gpu : cpu; };
    kiln::bench::FusedOpsCase fused;
    fused.tokens = pick(s.tokens, 8192, 1024);
    fused.hidden = pick(s.hidden, 4096, 1024);
    fused.intermediate = pick(s.intermediate, 14336, 2816);
    fused.vocab = pick(s.vocab, 128256, 32000);
    fused.ce_hidden = pick(s.ce_hidden, 2048, 512);
    const int iters = static_cast<int>(s.iters);
    fused.iters = iters;
    fused.predict = s.predict;
    std::string ops = ",";
    for (const std::string& op : s.ops) ops += op + ",";
    fused.ops = ops;
    kiln::bench::AttentionSweep sweep;
    const bool attention = s.runs("attention");
    if (attention) {
      sweep.seqlens = !s.seqlens.empty() ? s.seqlens
                      : cuda             ? std::vector<int64_t>{512, 1024, 2048, 4096, 8192}
                                         : std::vector<int64_t>{128, 256};
      sweep.head_dims = s.head_dims;
      sweep.batch = s.batch;  // 0: the sweep's default
      sweep.heads = pick(s.heads, 16, 4);
      sweep.kv_heads = pick(s.kv_heads, sweep.heads, sweep.heads);
      if (sweep.heads % sweep.kv_heads != 0) {
        s.given.fail("kv_heads", fmt::format("({}) must divide heads ({})", sweep.kv_heads, sweep.heads));
      }
      sweep.docs = s.docs;
      sweep.iters = iters;
    }
    const at::TensorOptions opt = at::TensorOptions().device(device).dtype(dtype);
    at::manual_seed(0);

    const double copy_gbps = kiln::bench::copy_bandwidth_gbps(opt, iters);
    if (kiln::dist::read_dist_env().rank == 0) {  // under a launcher (--ops comm), rank 0 reports
      fmt::print("kiln-bench on {} ({}), copy bandwidth {:.1f} GB/s, kernels compiled: {}\n", dev_name, dtype_name,
                 copy_gbps, kiln::ops::kernels_compiled() ? "yes" : "no");
    }

    kiln::bench::Memory mem{device, &counter};
    nlohmann::json out = {{"device", dev_name}, {"dtype", dtype_name}, {"copy_gbps", copy_gbps}};
    kiln::bench::run_fused_ops(fused, opt, copy_gbps, mem, out);
    if (s.predict) kiln::bench::print_reference_predictions();
    const std::string& json_path = s.json;
    auto flush_json = [&] {
      if (!json_path.empty()) kiln::io::write_file_atomic(json_path, out.dump(2) + "\n");
    };
    flush_json();
    std::fflush(stdout);
    if (attention) kiln::bench::run_attention(sweep, opt, dtype_name, mem, out, flush_json);
    if (s.runs("comm")) {
      kiln::bench::run_comm(opt, iters, pick(s.comm_max_bytes, int64_t{1} << 30, int64_t{64} << 20), out);
      if (kiln::dist::read_dist_env().rank == 0) flush_json();
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-bench: error: {}\n", kiln::cli::error_text(e));
    return 2;  // as the other kiln-* programs
  }
}
