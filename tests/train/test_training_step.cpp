// One training step for kiln-pretrain and kiln-profile (train/training_step.h). Reference: the
// trainer itself. A profile point and a Trainer run the same settings over the same batches for
// 5 steps; their losses must agree bit for bit, so any difference between the two steps (learning
// rate, schedule, clipping, weight decay, initialisation, loss normalisation) fails here.
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/model/llama_config.h"
#include "kiln/profile/sweep.h"
#include "kiln/train/step.h"
#include "kiln/train/trainer.h"
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

TEST_CASE("a kiln-profile point runs kiln-pretrain's step: 5 steps, the same losses bit for bit", "[train][profile]") {
  const std::string dtype = GENERATE("fp32", "bf16");
  CAPTURE(dtype);
  const kiln::profile::SweepPoint point{.batch_size = 2, .grad_accum = 2, .cutoff_len = 32};

  kiln::profile::SweepConfig sweep;
  sweep.model = "tiny";
  sweep.dtype = dtype;
  sweep.device = "cpu";
  sweep.cutoff_lens = {point.cutoff_len};
  sweep.batch_sizes = {point.batch_size};
  sweep.grad_accums = {point.grad_accum};
  sweep.warmup = 1;
  sweep.steps = 4;
  sweep.peak_tflops = 1.0;  // no CPU peak measurement
  sweep.training = optimisation();
  const kiln::profile::SweepReport report = kiln::profile::run_sweep(sweep);
  REQUIRE(report.rows.size() == 1);
  REQUIRE(report.rows[0].status == "ok");
  const std::vector<double>& profiled = report.rows[0].losses;
  REQUIRE(profiled.size() == 5);

  kiln::train::PretrainConfig c = optimisation();
  c.model = "tiny";
  c.bf16 = dtype == "bf16";
  c.device = "cpu";
  c.kernels = sweep.kernels;
  c.seed = static_cast<int64_t>(sweep.seed);
  c.cutoff_len = point.cutoff_len;
  c.per_device_train_batch_size = point.batch_size;
  c.gradient_accumulation_steps = point.grad_accum;
  c.max_steps = 5;
  c.logging_steps = 1;
  c.save_steps = 0;
  c.output_dir = kiln::test::scratch_dir("training_step_" + dtype).string();
  const std::vector<kiln::train::MicroBatch> batches =
      kiln::profile::synthetic_batches(kiln::model::load_llama_config("tiny"), point, sweep.seed);
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
