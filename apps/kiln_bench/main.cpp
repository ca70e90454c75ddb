// kiln-bench: kiln's fused ops against their ATen references (fused_ops.cpp), with --ops
// attention kiln's flash attention against the SDPA backends (attention.cpp), and with --ops comm
// the collectives' bus bandwidth (comm.cpp); timing and memory measurement in timing.h. Runs on
// CPU (CPU figures) and CUDA. This file parses the options and runs what they name, in that order.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "../cli.h"
#include "bench.h"
#include "kiln/dist/env.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/dispatch.h"
#include "kiln/profile/cpu_allocator.h"
#include "kiln/profile/sweep.h"

int main(int argc, char** argv) {
  kiln::profile::CountingCpuAllocatorGuard counter;  // before any tensor exists, so all are counted

  cxxopts::Options options("kiln-bench",
                           "kiln fused ops vs their ATen reference: time, GB/s, peak memory; with --ops attention, "
                           "kiln's flash attention vs SDPA backends: fwd/bwd time, TFLOP/s, peak memory");
  // clang-format off
  options.add_options()
    ("device", "auto, cpu or cuda (default auto: cuda when present)", cxxopts::value<std::string>())
    ("dtype", "fp32, bf16 or fp16 (default: bf16 on cuda, fp32 on cpu)", cxxopts::value<std::string>())
    ("ops", "comma list of rmsnorm, swiglu, rope, linear_ce, linear, attention, comm (attention and comm only when named; comm under torchrun/srun); linear: tokens x hidden -> intermediate, fp32 weight under --dtype autocast", cxxopts::value<std::string>()->default_value("rmsnorm,swiglu,rope,linear_ce,linear"))
    ("comm-max-bytes", "comm: largest buffer, from 1 MiB up by x4; default 1 GiB on cuda, 64 MiB on cpu", cxxopts::value<int64_t>())
    ("tokens", "rows (batch x sequence); default 8192 on cuda, 1024 on cpu", cxxopts::value<int64_t>())
    ("hidden", "hidden size; default 4096 on cuda, 1024 on cpu", cxxopts::value<int64_t>())
    ("intermediate", "MLP width; default 14336 on cuda, 2816 on cpu", cxxopts::value<int64_t>())
    ("vocab", "vocabulary for linear_ce; default 128256 on cuda, 32000 on cpu", cxxopts::value<int64_t>())
    ("ce-hidden", "hidden size for linear_ce; default 2048 (Llama 3.2 1B's head) on cuda, 512 on cpu", cxxopts::value<int64_t>())
    ("seqlens", "attention: comma list of sequence lengths T; default 512,1024,2048,4096,8192 on cuda, 128,256 on cpu", cxxopts::value<std::string>())
    ("head-dims", "attention: comma list of head dims D", cxxopts::value<std::string>()->default_value("64,128"))
    ("batch", "attention: batch B; default 16384 tokens / T (at least 1) on cuda, 1 on cpu", cxxopts::value<int64_t>())
    ("heads", "attention: query heads; default 16 on cuda, 4 on cpu", cxxopts::value<int64_t>())
    ("kv-heads", "attention: key/value heads, dividing --heads (GQA); default = heads", cxxopts::value<int64_t>())
    ("iters", "timed iterations per case (median reported; attention: fastest sample, each repeating the call for about 10 ms)", cxxopts::value<int>()->default_value("5"))
    ("json", "also write the results to this JSON file", cxxopts::value<std::string>())
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    const at::Device device = kiln::cli::device(kiln::cli::optional_string(args, "device"));
    const bool cuda = device.is_cuda();
    const std::string dev_name = cuda ? "cuda" : "cpu";
    std::string dtype_name = kiln::cli::optional_string(args, "dtype");
    if (dtype_name.empty()) dtype_name = cuda ? "bf16" : "fp32";
    at::ScalarType dtype;
    if (dtype_name == "fp32") {
      dtype = at::kFloat;
    } else if (dtype_name == "bf16") {
      dtype = at::kBFloat16;
    } else if (dtype_name == "fp16") {
      dtype = at::kHalf;
    } else {
      throw std::invalid_argument("--dtype must be fp32, bf16 or fp16, got '" + dtype_name + "'");
    }
    auto pick = [&](const char* key, int64_t gpu, int64_t cpu) {  // a size: given, else the device's default
      if (!args.count(key)) return cuda ? gpu : cpu;
      const int64_t v = args[key].as<int64_t>();
      if (v <= 0) throw std::invalid_argument(fmt::format("--{} must be positive, got {}", key, v));
      return v;
    };
    kiln::bench::FusedOpsCase fused;
    fused.tokens = pick("tokens", 8192, 1024);
    fused.hidden = pick("hidden", 4096, 1024);
    fused.intermediate = pick("intermediate", 14336, 2816);
    fused.vocab = pick("vocab", 128256, 32000);
    fused.ce_hidden = pick("ce-hidden", 2048, 512);
    const int iters = std::max(1, args["iters"].as<int>());
    fused.iters = iters;
    const std::string ops = "," + args["ops"].as<std::string>() + ",";
    fused.ops = ops;
    for (size_t start = 1; start < ops.size();) {
      const size_t end = ops.find(',', start);
      const std::string name = ops.substr(start, end - start);
      if (name != "rmsnorm" && name != "swiglu" && name != "rope" && name != "linear_ce" && name != "linear" &&
          name != "attention" && name != "comm") {
        throw std::invalid_argument("--ops: unknown op '" + name +
                                    "' (rmsnorm, swiglu, rope, linear_ce, linear, attention, comm)");
      }
      start = end + 1;
    }
    kiln::bench::AttentionSweep sweep;
    const bool attention = ops.find(",attention,") != std::string::npos;
    // An op's sizes without the op would be silently ignored.
    for (const char* key : {"seqlens", "head-dims", "batch", "heads", "kv-heads"}) {
      if (args.count(key) && !attention) {
        throw std::invalid_argument(fmt::format("--{} applies to --ops attention, which --ops does not name", key));
      }
    }
    if (args.count("comm-max-bytes") && ops.find(",comm,") == std::string::npos) {
      throw std::invalid_argument("--comm-max-bytes applies to --ops comm, which --ops does not name");
    }
    if (attention) {
      const std::string seqlens = kiln::cli::optional_string(args, "seqlens");
      sweep.seqlens = kiln::profile::parse_int_list(
          seqlens.empty() ? (cuda ? "512,1024,2048,4096,8192" : "128,256") : seqlens, "--seqlens");
      sweep.head_dims = kiln::profile::parse_int_list(args["head-dims"].as<std::string>(), "--head-dims");
      sweep.batch = pick("batch", 0, 0);
      sweep.heads = pick("heads", 16, 4);
      sweep.kv_heads = pick("kv-heads", sweep.heads, sweep.heads);
      if (sweep.heads % sweep.kv_heads != 0) {
        throw std::invalid_argument(
            fmt::format("--kv-heads ({}) must divide --heads ({})", sweep.kv_heads, sweep.heads));
      }
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
    const std::string json_path = kiln::cli::optional_string(args, "json");
    auto flush_json = [&] {
      if (!json_path.empty()) kiln::io::write_file_atomic(json_path, out.dump(2) + "\n");
    };
    flush_json();
    std::fflush(stdout);
    if (attention) kiln::bench::run_attention(sweep, opt, dtype_name, mem, out, flush_json);
    if (ops.find(",comm,") != std::string::npos) {
      kiln::bench::run_comm(opt, iters, pick("comm-max-bytes", int64_t{1} << 30, int64_t{64} << 20), out);
      if (kiln::dist::read_dist_env().rank == 0) flush_json();
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-bench: error: {}\n", kiln::cli::error_text(e));
    return 2;  // as the other kiln-* programs
  }
}
