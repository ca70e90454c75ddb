// The training loop on the embedded corpus (tiny model, CPU, fp32). References: a run stopped
// at step k and resumed from its checkpoint must reproduce the uninterrupted run's losses
// exactly; a poisoned parameter must stop the run naming the step (nan_policy: stop).
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/Context.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/train/trainer.h"
#include "support.h"

namespace fs = std::filesystem;
using kiln::train::PretrainConfig;
using kiln::train::Trainer;

namespace {

PretrainConfig small_run(const std::string& name) {
  PretrainConfig c;
  c.model = "tiny";
  c.cutoff_len = 32;
  c.per_device_train_batch_size = 2;
  c.gradient_accumulation_steps = 2;
  c.learning_rate = 1e-3;
  c.lr_scheduler_type = "cosine";
  c.warmup_steps = 2;
  c.max_steps = 8;
  c.logging_steps = 1;
  c.save_steps = 4;
  c.device = "cpu";
  c.output_dir = kiln::test::scratch_dir("trainer_" + name).string();
  return c;
}

std::vector<double> losses(const std::string& output_dir) {
  std::vector<double> out;
  std::ifstream in(fs::path(output_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

}  // namespace

TEST_CASE("a resumed run reproduces the uninterrupted run's losses exactly", "[train]") {
  PretrainConfig full = small_run("full");
  Trainer a(full);
  CHECK(a.plan().total_steps == 8);
  const auto ra = a.train();
  CHECK(ra.global_step == 8);
  const auto la = losses(full.output_dir);
  REQUIRE(la.size() == 8);
  CHECK(la.back() < la.front());
  REQUIRE(fs::exists(fs::path(full.output_dir) / "checkpoint-4" / "model.safetensors"));
  REQUIRE(fs::exists(fs::path(full.output_dir) / "checkpoint-8" / "trainer_state.json"));

  PretrainConfig resumed = small_run("resumed");
  resumed.resume_from_checkpoint = (fs::path(full.output_dir) / "checkpoint-4").string();
  Trainer b(resumed);
  const auto rb = b.train();
  CHECK(rb.global_step == 8);
  const auto lb = losses(resumed.output_dir);
  REQUIRE(lb.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(lb[i] == la[4 + i]);  // bit-identical
  }
}

TEST_CASE("save_total_limit keeps the newest checkpoints", "[train]") {
  PretrainConfig c = small_run("rotate");
  c.max_steps = 6;
  c.save_steps = 2;
  c.save_total_limit = 2;
  c.logging_steps = 3;
  Trainer(c).train();
  CHECK_FALSE(fs::exists(fs::path(c.output_dir) / "checkpoint-2"));
  CHECK(fs::exists(fs::path(c.output_dir) / "checkpoint-4"));
  CHECK(fs::exists(fs::path(c.output_dir) / "checkpoint-6"));
  CHECK(kiln::train::latest_checkpoint(c.output_dir) == (fs::path(c.output_dir) / "checkpoint-6").string());
}

TEST_CASE("a non-finite loss stops the run and names the step", "[train]") {
  PretrainConfig c = small_run("nan");
  c.max_steps = 3;
  Trainer t(c);
  {
    at::NoGradGuard no_grad;
    t.model()->named_parameters()["model.norm.weight"].fill_(NAN);
  }
  CHECK_THAT(kiln::test::error_of([&] { t.train(); }),
             Catch::Matchers::Contains("non-finite") && Catch::Matchers::Contains("step 1"));
}

TEST_CASE("nan_policy skip skips every update of a poisoned run and finishes", "[train]") {
  PretrainConfig c = small_run("nan_skip");
  c.max_steps = 3;
  c.nan_policy = "skip";
  Trainer t(c);
  std::map<std::string, at::Tensor> before;
  for (const auto& p : t.model()->named_parameters()) before[p.key()] = p.value().detach().clone();
  {
    at::NoGradGuard no_grad;
    t.model()->named_parameters()["model.norm.weight"].fill_(NAN);
  }
  const auto r = t.train();
  CHECK(r.global_step == 3);
  for (const auto& p : t.model()->named_parameters()) {
    if (p.key() != "model.norm.weight") CHECK(at::equal(p.value(), before[p.key()]));  // no update applied
  }
}

TEST_CASE("fp16 autocast with loss scaling trains on the CPU", "[train]") {
  PretrainConfig c = small_run("fp16");
  c.fp16 = true;
  c.max_steps = 4;
  Trainer t(c);
  CHECK_THAT(t.banner(), Catch::Matchers::Contains("fp16 (autocast, loss scaling)"));
  const auto r = t.train();
  REQUIRE(r.final_loss);
  CHECK(std::isfinite(*r.final_loss));
  CHECK(t.model()->named_parameters()["lm_head.weight"].scalar_type() == at::kFloat);  // fp32 masters
  CHECK(fs::exists(fs::path(c.output_dir) / "checkpoint-4" / "optimizer.safetensors"));
}

TEST_CASE("a pending signal saves a checkpoint and stops cleanly", "[train]") {
  PretrainConfig c = small_run("signal");
  Trainer t(c);
  Trainer::pending_signal().store(SIGTERM);
  const auto r = t.train();
  CHECK(r.interrupted);
  CHECK(r.global_step == 0);
  CHECK(fs::exists(fs::path(c.output_dir) / "checkpoint-0" / "optimizer.safetensors"));
  CHECK(Trainer::pending_signal().load() == 0);
}

TEST_CASE("val_size holds out the last blocks of the train split", "[train]") {
  PretrainConfig c = small_run("val_size");
  const int64_t all = Trainer(c).plan().num_examples;
  c.val_size = 10;
  Trainer t(c);
  CHECK(t.plan().num_examples == all - 10);
  CHECK_THAT(t.banner(), Catch::Matchers::Contains("val 10 blocks held out by val_size"));
  c.val_size = static_cast<double>(all);
  CHECK_THAT(kiln::test::error_of([&] { Trainer bad(c); }),
             Catch::Matchers::Contains("val_size") && Catch::Matchers::Contains("nothing is left"));
}

TEST_CASE("resume_from_checkpoint: true without checkpoints is a clear error", "[train]") {
  PretrainConfig c = small_run("no_ckpt");
  c.resume_from_checkpoint = "true";
  CHECK_THAT(kiln::test::error_of([&] { Trainer t(c); }),
             Catch::Matchers::Contains("resume_from_checkpoint") && Catch::Matchers::Contains("no checkpoint"));
}

TEST_CASE("full_determinism turns on PyTorch's deterministic algorithms and cuBLAS's fixed workspace", "[train]") {
  PretrainConfig c = small_run("determinism");
  c.full_determinism = true;
  const bool before = at::globalContext().deterministicAlgorithms();
  const bool warn_before = at::globalContext().deterministicAlgorithmsWarnOnly();
  {
    const Trainer t(c);
    CHECK(at::globalContext().deterministicAlgorithms());
    CHECK(at::globalContext().deterministicAlgorithmsWarnOnly());
    REQUIRE(std::getenv("CUBLAS_WORKSPACE_CONFIG") != nullptr);
  }
  at::globalContext().setDeterministicAlgorithms(before, warn_before);
}
