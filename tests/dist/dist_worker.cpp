// kiln-dist-worker: kiln's Trainer as kiln-pretrain runs it (same config keys, same launchers),
// writing this rank's parameters after every optimizer step to DIR/step<S>_rank<R>.bin (fp32, in
// the model's parameter order) and, at the end, one JSON line of this rank's memory figures and
// gradient-bucket launch counts.
// tests/python/test_distributed.py compares the files across ranks and with one process.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "kiln/common/process_settings.h"
#include "kiln/dist/comm.h"
#include "kiln/dist/data_parallel.h"
#include "kiln/train/trainer.h"

int main(int argc, char** argv) {
  kiln::pin_cpu_math_threads();  // as kiln-pretrain
  std::string dump_dir, config_path = "quickstart";
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dump-dir" && i + 1 < argc) {
      dump_dir = argv[++i];
    } else if (a == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else {
      rest.push_back(a);
    }
  }
  try {
    kiln::train::Trainer trainer(kiln::train::load_pretrain_config(config_path, kiln::train::parse_overrides(rest)));
    if (!dump_dir.empty()) {
      trainer.set_step_callback([&](int64_t step) {
        std::ofstream out(fmt::format("{}/step{}_rank{}.bin", dump_dir, step, trainer.rank()), std::ios::binary);
        for (const auto& p : trainer.model()->named_parameters()) {
          const at::Tensor t = p.value().detach().to(at::kCPU).contiguous();
          out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
        }
        if (!out) throw std::runtime_error("cannot write the parameter dump");
      });
    }
    trainer.train();
    if (auto* comm = trainer.comm()) comm->shutdown();  // as kiln-pretrain
    const auto* dp = trainer.data_parallel();
    fmt::print(
        "{{\"rank\": {}, \"world_size\": {}, \"optimizer_state_bytes\": {}, \"grad_bytes\": {}, "
        "\"buckets\": {}, \"buckets_launched\": {}, \"buckets_overlapped\": {}}}\n",
        trainer.rank(), trainer.world_size(), trainer.optimizer_state_bytes(), dp ? dp->grad_bytes() : 0,
        dp ? dp->buckets().size() : 0, dp ? dp->launch_counts().buckets : 0, dp ? dp->launch_counts().overlapped : 0);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-dist-worker: error: {}\n", e.what());
    return 2;
  }
}
