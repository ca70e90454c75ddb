// kiln-bench --predict: the fraction of copy bandwidth each memory-bound op's kernels can sustain,
// read from their machine code. scripts/check_kernel_sass.py counts, per kernel and architecture,
// the global-load bytes an SM keeps in flight (resident warps x independent loads per thread) and
// writes them to docs/kernel_sass.json, which CMake embeds here. By Little's law a kernel moves at
// most bytes-in-flight / latency per SM, so against a device that needs bandwidth x latency / SMs
// bytes in flight per SM it reaches min(1, in flight / needed) of the copy bandwidth; an op is
// held to its slowest kernel (forward or backward). On a GPU the bandwidth is this run's measured
// copy and the SMs this device's; the latency is the JSON's figure for the architecture.
#include <algorithm>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "kiln_bench/kernel_sass_json.h"

#ifdef KILN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace kiln::bench {
namespace {

const nlohmann::json& sass() {
  static const nlohmann::json doc = nlohmann::json::parse(kKernelSassJson);
  return doc;
}

// The architecture the checker read for a compute capability (x 10): sm_86 runs sm_80's code.
int checked_arch(int arch) {
  return arch >= 90 ? 90 : arch >= 80 ? 80 : 70;
}

}  // namespace

std::optional<double> predicted_copy_fraction(const std::string& op, const std::string& dtype, const at::Device& device,
                                              double copy_gbps) {
#ifdef KILN_WITH_CUDA
  if (!device.is_cuda() || copy_gbps <= 0) return std::nullopt;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  const int arch = checked_arch(prop->major * 10 + prop->minor);
  double latency_ns = 0;
  for (const auto& [name, dev] : sass()["devices"].items()) {
    if (dev["arch"].get<int>() == arch) latency_ns = dev["latency_ns"].get<double>();
  }
  std::optional<double> kb;  // the op's slowest kernel
  for (const auto& k : sass()["kernels"]) {
    if (k["op"] == op && k["dtype"] == dtype && k["arch"].get<int>() == arch) {
      kb = std::min(kb.value_or(1e300), k["kb_in_flight_per_sm"].get<double>());
    }
  }
  if (!kb || latency_ns <= 0) return std::nullopt;
  const double needed = copy_gbps * 1e9 * latency_ns * 1e-9 / prop->multiProcessorCount;
  return std::min(1.0, *kb * 1024 / needed);
#else
  (void)op, (void)dtype, (void)device, (void)copy_gbps;
  return std::nullopt;
#endif
}

void print_reference_predictions() {
  std::string head = "| op | dtype |", rule = "|---|---|";
  for (const auto& [name, dev] : sass()["devices"].items()) {
    head += fmt::format(" {} (sm_{}) |", name, dev["arch"].get<int>());
    rule += "---:|";
  }
  fmt::print(
      "\nPredicted fraction of copy bandwidth from the kernels' machine code, min(1, headroom), with the\n"
      "headroom (bytes in flight per SM / bytes needed in flight) in brackets (docs/kernels.md):\n\n{}\n{}\n",
      head, rule);
  for (const auto& [op, by_dtype] : sass()["headroom"].items()) {
    for (const auto& [dtype, cells] : by_dtype.items()) {
      std::string line = fmt::format("| {} | {} |", op, dtype);
      for (const auto& [name, dev] : sass()["devices"].items()) {
        if (!cells.contains(name)) {
          line += " - |";
          continue;
        }
        const double h = cells[name].get<double>();
        line += fmt::format(" {:.0f}% ({:.1f}x) |", 100 * std::min(1.0, h), h);
      }
      fmt::print("{}\n", line);
    }
  }
}

}  // namespace kiln::bench
