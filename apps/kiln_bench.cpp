// kiln-bench: each fused op against its ATen reference (the eager composition, differentiated
// by autograd) side by side in one run: forward + backward time, achieved bandwidth against a
// measured device-to-device copy, and peak extra memory. Runs on CPU (CPU figures) and CUDA.
//
// Bandwidth counts the bytes an ideal fused fwd+bwd must move (inputs read, outputs written
// once); the ATen path moves more, which is the point. Peak memory is measured above what the
// inputs already hold: the CUDA caching allocator's peak, or on CPU a counting wrapper around
// the CPU allocator installed before any tensor exists.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#ifdef KILN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "cli.h"
#include "kiln/io/safetensors.h"
#include "kiln/ops/dispatch.h"
#include "kiln/ops/linear_cross_entropy.h"
#include "kiln/ops/rmsnorm.h"
#include "kiln/ops/rope.h"
#include "kiln/ops/swiglu.h"
#include "kiln/profile/cpu_allocator.h"

namespace {

kiln::profile::CountingCpuAllocatorGuard* g_cpu_counter = nullptr;  // installed in main()

struct Memory {
  at::Device device;
  int64_t base = 0;
  void reset() {
#ifdef KILN_WITH_CUDA
    if (device.is_cuda()) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
      base = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
      return;
    }
#endif
    g_cpu_counter->reset_peak();
    base = g_cpu_counter->stats().current_bytes;
  }
  int64_t peak_extra() const {
#ifdef KILN_WITH_CUDA
    if (device.is_cuda()) {
      return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak - base;
    }
#endif
    return g_cpu_counter->stats().peak_bytes - base;
  }
};

void sync(const at::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(d.index());
}

// Median seconds of fn over iters runs after warmup runs.
double time_it(const at::Device& d, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < 2; ++i) fn();
  sync(d);
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync(d);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string op, impl;
  double ms = 0, gbps = 0, copy_frac = 0;
  int64_t peak = 0;
  bool has_bw = true;
};

}  // namespace

int main(int argc, char** argv) {
  kiln::profile::CountingCpuAllocatorGuard counter;  // before any tensor exists, so all are counted
  g_cpu_counter = &counter;

  cxxopts::Options options("kiln-bench", "kiln fused ops vs their ATen reference: time, GB/s, peak memory");
  // clang-format off
  options.add_options()
    ("device", "cpu or cuda (default: cuda when present)", cxxopts::value<std::string>()->default_value(""))
    ("dtype", "fp32, bf16 or fp16 (default: bf16 on cuda, fp32 on cpu)", cxxopts::value<std::string>()->default_value(""))
    ("ops", "comma list of rmsnorm, swiglu, rope, linear_ce", cxxopts::value<std::string>()->default_value("rmsnorm,swiglu,rope,linear_ce"))
    ("tokens", "rows (batch x sequence); default 8192 on cuda, 1024 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("hidden", "hidden size; default 4096 on cuda, 1024 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("intermediate", "MLP width; default 14336 on cuda, 2816 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("vocab", "vocabulary for linear_ce; default 128256 on cuda, 32000 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("ce-hidden", "hidden size for linear_ce; default 2048 (Llama 3.2 1B's head) on cuda, 512 on cpu", cxxopts::value<int64_t>()->default_value("0"))
    ("iters", "timed iterations per case (median reported)", cxxopts::value<int>()->default_value("5"))
    ("json", "also write the results to this JSON file", cxxopts::value<std::string>()->default_value(""))
    ("h,help", "print this help");
  // clang-format on
  try {
    const auto args = kiln::cli::parse(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << "\n";
      return 0;
    }
    const at::Device device = kiln::cli::device(args["device"].as<std::string>());
    const bool cuda = device.is_cuda();
    const std::string dev_name = cuda ? "cuda" : "cpu";
    std::string dtype_name = args["dtype"].as<std::string>();
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
    auto pick = [&](const char* key, int64_t gpu, int64_t cpu) {
      const int64_t v = args[key].as<int64_t>();
      if (v < 0) throw std::invalid_argument(fmt::format("--{} must be positive, got {}", key, v));
      return v > 0 ? v : (cuda ? gpu : cpu);
    };
    const int64_t tokens = pick("tokens", 8192, 1024), hidden = pick("hidden", 4096, 1024);
    const int64_t inter = pick("intermediate", 14336, 2816), vocab = pick("vocab", 128256, 32000);
    const int64_t ce_hidden = pick("ce-hidden", 2048, 512);
    const int iters = std::max(1, args["iters"].as<int>());
    const std::string ops = "," + args["ops"].as<std::string>() + ",";
    for (size_t start = 1; start < ops.size();) {
      const size_t end = ops.find(',', start);
      const std::string name = ops.substr(start, end - start);
      if (name != "rmsnorm" && name != "swiglu" && name != "rope" && name != "linear_ce") {
        throw std::invalid_argument("--ops: unknown op '" + name + "' (rmsnorm, swiglu, rope, linear_ce)");
      }
      start = end + 1;
    }
    const at::TensorOptions opt = at::TensorOptions().device(device).dtype(dtype);
    const int64_t esize = static_cast<int64_t>(c10::elementSize(dtype));
    at::manual_seed(0);

    // Device copy bandwidth: read + write of a buffer larger than the caches.
    const int64_t copy_bytes = cuda ? (int64_t{1} << 30) : (int64_t{1} << 27);
    double copy_gbps = 0;
    {
      const at::Tensor src = at::empty({copy_bytes}, opt.dtype(at::kByte)).fill_(1);
      at::Tensor dst = at::empty_like(src);
      const double s = time_it(device, iters, [&] { dst.copy_(src); });
      copy_gbps = 2.0 * static_cast<double>(copy_bytes) / s / 1e9;
    }
    fmt::print("kiln-bench on {} ({}), copy bandwidth {:.1f} GB/s, kernels compiled: {}\n", dev_name, dtype_name,
               copy_gbps, kiln::ops::kernels_compiled() ? "yes" : "no");

    std::vector<Row> rows;
    Memory mem{device};
    // Runs fwd+bwd of `body` under both backends. bytes = ideal traffic (0 = compute bound).
    auto bench = [&](const std::string& op, double bytes, const std::function<void()>& body) {
      for (auto b : {kiln::ops::Backend::kKiln, kiln::ops::Backend::kAten}) {
        kiln::ops::set_backend(b);
        Row r{op, b == kiln::ops::Backend::kKiln ? "kiln" : "aten (eager)"};
        r.ms = time_it(device, iters, body) * 1e3;
        sync(device);
        mem.reset();
        body();
        sync(device);
        r.peak = mem.peak_extra();
        r.has_bw = bytes > 0;
        r.gbps = bytes / (r.ms * 1e-3) / 1e9;
        r.copy_frac = r.gbps / copy_gbps;
        rows.push_back(r);
      }
      kiln::ops::set_backend(kiln::ops::Backend::kKiln);
    };

    if (ops.find(",rmsnorm,") != std::string::npos) {
      const at::Tensor x = at::randn({tokens, hidden}, opt).requires_grad_(true);
      const at::Tensor w = (at::rand({hidden}, opt) + 0.5).requires_grad_(true);
      const at::Tensor gy = at::randn({tokens, hidden}, opt);
      // fwd: read x, write y; bwd: read x, dy, write dx (weight and its gradient are negligible)
      bench("rmsnorm fwd+bwd", 5.0 * tokens * hidden * esize, [&] {
        const at::Tensor y = kiln::ops::rmsnorm(x, w, 1e-5);
        torch::autograd::grad({y}, {x, w}, {gy});
      });
    }
    if (ops.find(",swiglu,") != std::string::npos) {
      const at::Tensor g = at::randn({tokens, inter}, opt).requires_grad_(true);
      const at::Tensor u = at::randn({tokens, inter}, opt).requires_grad_(true);
      const at::Tensor gy = at::randn({tokens, inter}, opt);
      // fwd: read g, u, write y; bwd: read g, u, dy, write dg, du
      bench("swiglu fwd+bwd", 8.0 * tokens * inter * esize, [&] {
        const at::Tensor y = kiln::ops::swiglu(g, u);
        torch::autograd::grad({y}, {g, u}, {gy});
      });
    }
    if (ops.find(",rope,") != std::string::npos) {
      const int64_t head_dim = 128, heads = hidden / head_dim;
      const at::Tensor base = at::randn({1, tokens, heads * head_dim}, opt).requires_grad_(true);
      const at::Tensor ang =
          at::arange(tokens, opt.dtype(at::kFloat)).unsqueeze(1) * at::rand({head_dim}, opt.dtype(at::kFloat));
      const at::Tensor cos = ang.cos().to(dtype).unsqueeze(0), sin = ang.sin().to(dtype).unsqueeze(0);
      const at::Tensor gy = at::randn({1, heads, tokens, head_dim}, opt);
      // fwd: read + write x in place; bwd: read dy, write dx (tables are small)
      bench("rope fwd+bwd", 4.0 * tokens * hidden * esize, [&] {
        const at::Tensor x = (base * 1).view({1, tokens, heads, head_dim}).transpose(1, 2);
        const at::Tensor y = kiln::ops::apply_rope_(x, cos, sin);
        torch::autograd::grad({y}, {base}, {gy});
      });
    }
    if (ops.find(",linear_ce,") != std::string::npos) {
      const at::Tensor h = (at::randn({tokens, ce_hidden}, opt) * 0.5).requires_grad_(true);
      const at::Tensor w = (at::randn({vocab, ce_hidden}, opt) * 0.02).requires_grad_(true);
      const at::Tensor y = at::randint(vocab, {tokens}, opt.dtype(at::kLong));
      bench(fmt::format("linear_ce fwd+bwd V={} H={}", vocab, ce_hidden), 0, [&] {
        const auto r = kiln::ops::linear_cross_entropy(h, w, y);
        torch::autograd::grad({r.loss}, {h, w});
      });
    }

    fmt::print("\n| op | impl | time ms | GB/s | of copy | peak extra MiB |\n|---|---|---:|---:|---:|---:|\n");
    nlohmann::json out = {{"device", dev_name}, {"dtype", dtype_name},    {"copy_gbps", copy_gbps},
                          {"tokens", tokens},   {"hidden", hidden},       {"intermediate", inter},
                          {"vocab", vocab},     {"ce_hidden", ce_hidden}, {"results", nlohmann::json::array()}};
    for (const Row& r : rows) {
      fmt::print("| {} | {} | {:.3f} | {} | {} | {:.1f} |\n", r.op, r.impl, r.ms,
                 r.has_bw ? fmt::format("{:.1f}", r.gbps) : "-",
                 r.has_bw ? fmt::format("{:.0f}%", 100 * r.copy_frac) : "-", static_cast<double>(r.peak) / (1 << 20));
      out["results"].push_back({{"op", r.op},
                                {"impl", r.impl},
                                {"ms", r.ms},
                                {"gbps", r.has_bw ? r.gbps : 0.0},
                                {"copy_fraction", r.has_bw ? r.copy_frac : 0.0},
                                {"peak_extra_bytes", r.peak}});
    }
    // The GPU goals, checked against this run's own figures.
    for (size_t i = 0; i + 1 < rows.size(); i += 2) {
      const Row &k = rows[i], &a = rows[i + 1];
      if (k.op.rfind("linear_ce", 0) == 0) {
        fmt::print("linear_ce: kiln peak = {:.1f}% of aten, time = {:.2f}x aten (goal on GPU: <= 15%, <= 1.10x)\n",
                   100.0 * static_cast<double>(k.peak) / std::max<double>(1, static_cast<double>(a.peak)), k.ms / a.ms);
      } else if (k.op.rfind("rmsnorm", 0) == 0) {
        fmt::print("rmsnorm: kiln fwd+bwd at {:.0f}% of copy bandwidth (goal on GPU: >= 80%)\n", 100 * k.copy_frac);
      }
    }
    const std::string json_path = args["json"].as<std::string>();
    if (!json_path.empty()) kiln::io::write_file_atomic(json_path, out.dump(2) + "\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-bench: {}\n", e.what());
    return 1;
  }
}
