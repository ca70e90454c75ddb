// kiln-bench's `--ops comm`, under torchrun or srun: the bus bandwidth of the collectives data
// parallelism uses, on the data group kiln trains with (NCCL on CUDA, Gloo on CPU), as
// nccl-tests defines it: algbw = S / t for a buffer of S bytes (all_reduce: in = out = S;
// reduce_scatter: in = S; all_gather: out = S), busbw = algbw x 2(n-1)/n for all_reduce and
// x (n-1)/n for the other two.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench.h"
#include "kiln/common/format.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/env.h"

namespace kiln::bench {

void run_comm(at::TensorOptions opt, int iters, int64_t max_bytes, nlohmann::json& out) {
  const auto env = kiln::dist::read_dist_env();
  if (!env.distributed()) {
    throw std::invalid_argument(
        "--ops comm needs a launcher: torchrun --no-python --nproc-per-node N kiln-bench --ops comm (or srun)");
  }
  if (opt.device().is_cuda()) {  // one GPU per process, as the trainer
    const at::Device mine(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    at::accelerator::setDeviceIndex(mine.index());
    opt = opt.device(mine);
  }
  auto comm = kiln::dist::connect(env, {.cuda_device = opt.device().is_cuda() ? opt.device().index() : -1});
  const int n = comm->world_size();
  const bool main_rank = comm->rank() == 0;
  const int64_t esize = static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(opt.dtype())));
  if (main_rank) {
    fmt::print(
        "\ncollectives on the {} group, {} ranks ({}), {}; median of {} (nccl-tests' busbw)\n\n"
        "| bytes | all_reduce ms | busbw GB/s | reduce_scatter ms | busbw GB/s | all_gather ms | busbw GB/s |\n"
        "|---:|---:|---:|---:|---:|---:|---:|\n",
        comm->backend(), n, env.launcher, opt.device().str(), iters);
  }
  out["comm"] = nlohmann::json::array();
  const double ar = 2.0 * (n - 1) / n, rs = static_cast<double>(n - 1) / n;
  for (int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    const int64_t elems = bytes / esize / n * n;  // divisible by the world size
    at::Tensor full = at::ones({elems}, opt), part = at::ones({elems / n}, opt);
    auto time = [&](const std::function<std::unique_ptr<kiln::dist::Pending>()>& launch) {
      launch()->wait();  // warm-up (NCCL's communicator was created by connect())
      std::vector<double> samples;
      for (int i = 0; i < iters; ++i) {
        comm->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        launch()->wait();
        sync(opt.device());
        samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(samples.begin(), samples.end());
      // The job's time is its slowest rank's.
      return static_cast<double>(comm->host_max({static_cast<int64_t>(samples[samples.size() / 2] * 1e9)})[0]) / 1e9;
    };
    const double t_ar = time([&] { return comm->all_reduce_sum(full); });
    const double t_rs = time([&] { return comm->reduce_scatter_sum(part, full); });
    const double t_ag = time([&] { return comm->all_gather(full, part); });
    const double size = static_cast<double>(elems * esize);
    auto bus = [&](double t, double factor) { return size / t / 1e9 * factor; };
    if (main_rank) {
      fmt::print("| {} | {:.3f} | {:.2f} | {:.3f} | {:.2f} | {:.3f} | {:.2f} |\n", kiln::human_bytes(size), t_ar * 1e3,
                 bus(t_ar, ar), t_rs * 1e3, bus(t_rs, rs), t_ag * 1e3, bus(t_ag, rs));
    }
    out["comm"].push_back({{"bytes", size},
                           {"world_size", n},
                           {"backend", comm->backend()},
                           {"all_reduce_s", t_ar},
                           {"all_reduce_busbw_gbps", bus(t_ar, ar)},
                           {"reduce_scatter_s", t_rs},
                           {"reduce_scatter_busbw_gbps", bus(t_rs, rs)},
                           {"all_gather_s", t_ag},
                           {"all_gather_busbw_gbps", bus(t_ag, rs)}});
  }
  comm->shutdown();  // in order, now (docs/distributed.md, "Shutdown")
}

}  // namespace kiln::bench
