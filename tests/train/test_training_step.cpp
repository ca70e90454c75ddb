// One training step for kiln-pretrain and kiln-profile (train/training_step.h). Reference: the
// trainer itself. A profile point and a Trainer run the same settings over the same batches for
// 5 steps; their losses must agree bit for bit, so any difference between the two steps (learning
// rate, schedule, clipping, weight decay, initialisation, loss normalisation) fails here.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>
#include <torch/cuda.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/common/device.h"
#include "kiln/model/llama_config.h"
#include "kiln/ops/cpu_branches.h"
#include "kiln/profile/sweep.h"
#include "kiln/train/gradient_accumulation.h"
#include "kiln/train/trainer.h"
#include "kiln/train/training_stack.h"
#include "support.h"

namespace {

kiln::train::PretrainConfig optimisation() {
  kiln::train::PretrainConfig t;
  t.learning_rate = 3e-3;
  t.lr_scheduler_type = "cosine";
  t.warmup_steps = 2;
  t.weight_decay = 0.1;
  t.max_grad_norm = 0.05;  // small enough that every step clips
  return t;
}

}  // namespace

namespace {

// Both tests below run under every CPU's branches (ops/cpu_branches.h): the rules that pick a GEMM
// precision, the loss head's path and the loops' instruction set by the CPU's features are forced
// to what an AMX machine, an AVX2 one, ... would pick, so each machine checks the others' logic.
const std::vector<kiln::ops::testing::CpuBranches>& branches() {
  static const std::vector<kiln::ops::testing::CpuBranches> all = kiln::ops::testing::cpu_branches();
  return all;
}

}  // namespace

TEST_CASE("a kiln-profile point runs kiln-pretrain's step: 5 steps, the same losses bit for bit", "[train][profile]") {
  const std::string dtype = GENERATE("fp32", "bf16");
  const size_t branch = GENERATE(range(size_t{0}, branches().size()));
  const kiln::ops::testing::ForcedCpuBranches forced(branches()[branch]);
  const std::string rules = kiln::ops::testing::describe_cpu_rules();
  CAPTURE(dtype, branches()[branch].name, rules);
  const kiln::profile::SweepPoint point{.batch_size = 2, .gradient_accumulation_steps = 2, .cutoff_len = 32};

  kiln::profile::ProfileSettings sweep;
  sweep.run = optimisation();  // the step's optimisation keys, kiln-pretrain's
  sweep.run.model = "tiny";
  sweep.dtype = dtype;
  sweep.run.device = "cpu";
  sweep.cutoff_len = {point.cutoff_len};
  sweep.per_device_train_batch_size = {point.batch_size};
  sweep.gradient_accumulation_steps = {point.gradient_accumulation_steps};
  sweep.warmup = 1;
  sweep.steps = 4;
  sweep.peak_tflops = 1.0;  // no CPU peak measurement
  const kiln::profile::SweepReport report = kiln::profile::run_sweep(sweep);
  REQUIRE(report.rows.size() == 1);
  REQUIRE(report.rows[0].status == "ok");
  const std::vector<double>& profiled = report.rows[0].losses;
  REQUIRE(profiled.size() == 5);

  kiln::train::PretrainConfig c = optimisation();
  c.model = "tiny";
  c.bf16 = dtype == "bf16";
  c.device = "cpu";
  c.kernels = sweep.run.kernels;
  c.seed = static_cast<int64_t>(sweep.run.seed);
  c.cutoff_len = point.cutoff_len;
  c.per_device_train_batch_size = point.batch_size;
  c.gradient_accumulation_steps = point.gradient_accumulation_steps;
  c.max_steps = 5;
  c.logging_steps = 1;
  c.save_steps = 0;
  c.output_dir = kiln::test::scratch_dir("training_step_" + dtype).string();
  const std::vector<kiln::train::MicroBatch> batches =
      kiln::profile::synthetic_batches(kiln::model::load_llama_config("tiny"), point, sweep.run.seed);
  size_t next = 0;
  kiln::train::Trainer trainer(
      c, [&]() -> std::optional<kiln::train::MicroBatch> { return batches[next++ % batches.size()]; });
  std::vector<double> trained;
  trainer.set_callbacks({.on_log = [&](const std::string& line) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) trained.push_back(j["loss"].get<double>());
  }});
  trainer.train();
  REQUIRE(trained.size() == 5);
  for (size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(profiled[i] == trained[i]);
  }
  CHECK(trained.back() < trained.front());  // the steps learn: the equality is not of constants
}

namespace {

// Counts the host reads of a tensor's value that the code under test makes itself, on every thread,
// while it lives: a top-level aten::item, aten::is_nonzero or aten::_local_scalar_dense (the one
// op that copies a value to the host; on a GPU each is a synchronisation). Reads inside another
// ATen op (ATen's CPU kernels read their scalar arguments) are that op's own and not counted.
class HostReadCounter {
 public:
  HostReadCounter() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(
                                        [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                          const std::string_view name = fn.name();
                                          if (depth() == 0 && (name == "aten::item" || name == "aten::is_nonzero" ||
                                                               name == "aten::_local_scalar_dense"))
                                            ++count();
                                          ++depth();
                                          return nullptr;
                                        },
                                        [](const at::RecordFunction&, at::ObserverContext*) { --depth(); })
                                        .scopes({at::RecordScope::FUNCTION}));
  }
  ~HostReadCounter() { at::removeCallback(handle_); }
  static std::atomic<int64_t>& count() {
    static std::atomic<int64_t> n{0};
    return n;
  }

 private:
  static int& depth() {
    static thread_local int d = 0;
    return d;
  }
  at::CallbackHandle handle_;
};

}  // namespace

TEST_CASE("one training step reads no device value on the host", "[train]") {
  const std::string dtype = GENERATE("fp32", "bf16", "fp16");
  const size_t branch = GENERATE(range(size_t{0}, branches().size()));
  const kiln::ops::testing::ForcedCpuBranches forced(branches()[branch]);
  const std::string rules = kiln::ops::testing::describe_cpu_rules();
  CAPTURE(dtype, branches()[branch].name, rules);
  kiln::train::PretrainConfig c = optimisation();
  c.model = "tiny";
  c.bf16 = dtype == "bf16";
  c.fp16 = dtype == "fp16";
  const kiln::profile::SweepPoint point{.batch_size = 2, .gradient_accumulation_steps = 2, .cutoff_len = 32};
  const kiln::model::LlamaConfig mc = kiln::model::load_llama_config("tiny");
  kiln::train::TrainingStack stack(kiln::train::fresh_model(mc, at::kCPU, 7), at::kCPU,
                                   kiln::train::stack_options(c, nullptr, 0));
  const std::vector<kiln::train::MicroBatch> batches = kiln::profile::synthetic_batches(mc, point, 7);
  int64_t targets = 0;
  for (const auto& b : batches) targets += kiln::train::count_targets(b.labels);  // the host batch, before the step
  stack.step(batches, targets, 1e-3);  // a first step: one-time set-up may read
  HostReadCounter::count() = 0;
  {
    const HostReadCounter counter;
    const kiln::train::StepResult r = stack.step(batches, targets, 1e-3);
    CHECK(r.loss_sum.defined());
  }
  CHECK(HostReadCounter::count() == 0);
}

TEST_CASE("a training step on a GPU never makes the host wait (CUDA's sync debug mode: error)", "[train][cuda]") {
  REQUIRE(torch::cuda::is_available());
  const std::string dtype = GENERATE("bf16", "fp16");
  CAPTURE(dtype);
  kiln::train::PretrainConfig c = optimisation();
  c.bf16 = dtype == "bf16";
  c.fp16 = dtype == "fp16";
  const kiln::profile::SweepPoint point{.batch_size = 2, .gradient_accumulation_steps = 2, .cutoff_len = 64};
  const kiln::model::LlamaConfig mc = kiln::model::load_llama_config("tiny");
  const at::Device cuda(at::kCUDA, 0);
  kiln::train::TrainingStack stack(kiln::train::fresh_model(mc, cuda, 7), cuda,
                                   kiln::train::stack_options(c, nullptr, 0));
  const std::vector<kiln::train::MicroBatch> batches = kiln::profile::synthetic_batches(mc, point, 7);
  int64_t targets = 0;
  for (const auto& b : batches) targets += kiln::train::count_targets(b.labels);
  stack.step(batches, targets, 1e-3);  // the first step's one-time set-up (cuBLAS handles, workspaces)
  kiln::device::synchronize(cuda);
  {
    const kiln::device::SyncCheckScope no_waits;  // a synchronising CUDA call throws in here
    CHECK_NOTHROW(stack.step(batches, targets, 1e-3));
  }
  kiln::device::synchronize(cuda);
}
