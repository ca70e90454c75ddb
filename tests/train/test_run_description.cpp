// One run description (cost/run.h) for every program (train/run_description.h). References: the
// config keys themselves (each lands in its field) and the programs' own derivations: a
// kiln-profile sweep point, kiln-profile explain and kiln-profile plan given the same settings
// must describe the same run as kiln-pretrain's config does, so the memory and traffic models
// price one run the same wherever it is asked.
#include <string>

#include <catch2/catch.hpp>

#include "kiln/cost/hardware.h"
#include "kiln/cost/memory.h"
#include "kiln/cost/plan.h"
#include "kiln/cost/run.h"
#include "kiln/cost/traffic.h"
#include "kiln/model/llama_config.h"
#include "kiln/profile/settings.h"
#include "kiln/profile/sweep.h"
#include "kiln/train/pretrain_config.h"
#include "kiln/train/run_description.h"

namespace {

using kiln::cost::RunDescription;

// The fields every model reads (loss_chunk_tokens compared by its values at a few sizes).
void check_same(const RunDescription& a, const RunDescription& b) {
  CHECK(a.batch == b.batch);
  CHECK(a.cutoff_len == b.cutoff_len);
  CHECK(a.gradient_accumulation_steps == b.gradient_accumulation_steps);
  CHECK(a.dtype == b.dtype);
  CHECK(a.recompute == b.recompute);
  CHECK(a.every == b.every);
  CHECK(a.cuda == b.cuda);
  CHECK(a.clip_grad_norm == b.clip_grad_norm);
  CHECK(a.parallel.data_parallel == b.parallel.data_parallel);
  CHECK(a.parallel.world_size == b.parallel.world_size);
  CHECK(a.parallel.zero_stage == b.parallel.zero_stage);
  CHECK(a.parallel.bucket_cap_bytes == b.parallel.bucket_cap_bytes);
  const auto& k = a.kernels;
  const auto& l = b.kernels;
  CHECK(k.fused_rmsnorm == l.fused_rmsnorm);
  CHECK(k.fused_swiglu == l.fused_swiglu);
  CHECK(k.fused_loss_head == l.fused_loss_head);
  CHECK(k.loss_head_low_precision == l.loss_head_low_precision);
  CHECK(k.cpu_loss_loop == l.cpu_loss_loop);
  CHECK(k.cpu_loss_loop_low_precision == l.cpu_loss_loop_low_precision);
  CHECK(k.projections_fp32 == l.projections_fp32);
  CHECK(k.fused_rope == l.fused_rope);
  CHECK(k.mixed_rope_fused == l.mixed_rope_fused);
  CHECK(k.attention == l.attention);
  REQUIRE(static_cast<bool>(k.loss_chunk_tokens) == static_cast<bool>(l.loss_chunk_tokens));
  if (k.loss_chunk_tokens) {
    for (const int64_t tokens : {1, 4096, 1 << 20}) {
      CHECK(k.loss_chunk_tokens(tokens, 128256, 2048) == l.loss_chunk_tokens(tokens, 128256, 2048));
    }
  }
}

}  // namespace

TEST_CASE("describe_run: each of kiln-pretrain's keys lands in its field", "[train][cost]") {
  const auto model = kiln::model::load_llama_config("llama-3.2-1b");
  kiln::train::PretrainConfig c;
  c.per_device_train_batch_size = 3;
  c.cutoff_len = 768;
  c.gradient_accumulation_steps = 5;
  c.bf16 = true;
  c.gradient_checkpointing = true;
  c.gradient_checkpointing_every = 4;  // policy by the stride: every_n
  c.zero_stage = 2;
  c.ddp_bucket_cap_mb = 40;
  c.max_grad_norm = 0;
  c.kernels = "kiln";
  const kiln::train::RunTarget gpu{
      .cuda = true, .hardware = kiln::cost::hardware_spec("H100-80GB"), .world_size = 8, .data_parallel = true};
  const RunDescription r = kiln::train::describe_run(c, model, gpu);
  CHECK(r.batch == 3);
  CHECK(r.cutoff_len == 768);
  CHECK(r.gradient_accumulation_steps == 5);
  CHECK(r.dtype == "bf16");
  CHECK(r.recompute == "every_n");
  CHECK(r.every == 4);
  CHECK(r.recomputed_stride() == 4);
  CHECK(r.cuda);
  CHECK(r.parallel.data_parallel);
  CHECK(r.parallel.world_size == 8);
  CHECK(r.parallel.zero_stage == 2);
  CHECK(r.parallel.bucket_cap_bytes == 40ll << 20);
  CHECK_FALSE(r.clip_grad_norm);
  // "kiln" chooses kiln's flash kernels; an H100 runs them for bf16 at head_dim 64.
  REQUIRE(model.resolved_head_dim() == 64);
  CHECK(r.kernels.attention == "flash");
  CHECK(r.kernels.fused_rmsnorm);
  CHECK(r.kernels.fused_rope);

  c.gradient_checkpointing_every = 0;
  c.gradient_checkpointing_policy = "selective";
  c.bf16 = false;
  c.fp16 = true;
  c.max_grad_norm = 1.0;
  c.kernels = kiln::ops::kDefaultKernels;  // SDPA's attention
  const RunDescription s = kiln::train::describe_run(c, model, gpu);
  CHECK(s.recompute == "selective");
  CHECK(s.recomputed_stride() == 0);
  CHECK(s.dtype == "fp16");
  CHECK(s.clip_grad_norm);
  CHECK(s.kernels.attention == "sdpa");

  c.gradient_checkpointing = false;
  c.gradient_checkpointing_policy.clear();
  c.fp16 = false;
  const RunDescription cpu = kiln::train::describe_run(c, model, {});
  CHECK(cpu.recompute == "none");
  CHECK(cpu.dtype == "fp32");
  CHECK_FALSE(cpu.cuda);
  CHECK_FALSE(cpu.parallel.data_parallel);
  CHECK(cpu.parallel.world_size == 1);
  CHECK(cpu.kernels.attention == "sdpa");
}

TEST_CASE("a sweep point, explain and plan describe the run kiln-pretrain's config describes", "[train][profile]") {
  const std::string model_name = "llama-100m";
  const auto model = kiln::model::load_llama_config(model_name);
  const auto a100 = kiln::cost::hardware_spec("A100-80GB");
  REQUIRE(a100);
  for (const std::string dtype : {"bf16", "fp32"}) {
    for (const std::string kernels : {"kiln", "kiln,attention=aten", "aten"}) {
      CAPTURE(dtype, kernels);
      // kiln-pretrain's keys.
      kiln::train::PretrainConfig c;
      c.per_device_train_batch_size = 2;
      c.cutoff_len = 512;
      c.gradient_accumulation_steps = 4;
      kiln::train::set_compute_dtype(c, dtype);
      c.kernels = kernels;
      c.gradient_checkpointing = true;
      c.gradient_checkpointing_policy = "every_n";
      c.gradient_checkpointing_every = 3;
      c.zero_stage = 1;
      const kiln::train::RunTarget target{.cuda = true, .hardware = a100, .world_size = 4, .data_parallel = true};
      const RunDescription want = kiln::train::describe_run(c, model, target);

      // kiln-profile sweep: the same keys, one point.
      kiln::profile::ProfileSettings sweep;
      sweep.run.model = model_name;
      sweep.dtype = dtype;
      sweep.run.kernels = kernels;
      sweep.run.gradient_checkpointing = true;
      sweep.run.gradient_checkpointing_policy = "every_n";
      sweep.run.gradient_checkpointing_every = 3;
      sweep.run.zero_stage = 1;
      kiln::profile::settle(sweep);
      const kiln::profile::SweepPoint point{.batch_size = 2, .gradient_accumulation_steps = 4, .cutoff_len = 512};
      check_same(kiln::profile::point_run(sweep, model, point, target), want);

      // kiln-profile explain.
      kiln::profile::ProfileSettings e;
      e.command = kiln::profile::Command::kExplain;
      e.run.model = model_name;
      e.cutoff_len = {512};
      e.per_device_train_batch_size = {2};
      e.gradient_accumulation_steps = {4};
      e.dtype = dtype;
      e.run.kernels = kernels;
      e.run.gradient_checkpointing = true;
      e.run.gradient_checkpointing_policy = "every_n";
      e.run.gradient_checkpointing_every = 3;
      e.world_size = 4;
      e.run.zero_stage = 1;
      kiln::profile::settle(e);
      const kiln::profile::ExplainDevice device{.cuda = true, .hardware = *a100};
      check_same(kiln::profile::explain_run(e, model, device), want);

      // kiln-profile plan: its base run; the planner chooses batch, accumulation and
      // recomputation, so those are set as the trainer's before comparing.
      kiln::profile::ProfileSettings p;
      p.command = kiln::profile::Command::kPlan;
      p.run.model = model_name;
      p.dtype = dtype;
      p.run.kernels = kernels;
      p.device_memory = "A100-80GB";
      p.target_sequences = 32;
      p.world_size = 4;
      p.run.zero_stage = 1;
      p.cutoff_len = {1024};
      kiln::profile::settle(p);
      RunDescription planned = kiln::profile::plan_config(p).run;
      planned.batch = 2;
      planned.cutoff_len = 512;
      planned.gradient_accumulation_steps = 4;
      planned.recompute = "every_n";
      planned.every = 3;
      check_same(planned, want);

      // One description, one price: the models give the same figures for each derivation.
      const RunDescription from_sweep = kiln::profile::point_run(sweep, model, point, target);
      CHECK(kiln::cost::estimate_training_memory(model, from_sweep).total() ==
            kiln::cost::estimate_training_memory(model, want).total());
      CHECK(kiln::cost::traffic_model(model, from_sweep).kiln_step().bytes ==
            kiln::cost::traffic_model(model, want).kiln_step().bytes);
    }
  }
}

TEST_CASE("RunDescription::validate names the field", "[cost]") {
  RunDescription r;
  r.kernels.attention = "flash";
  r.dtype = "fp32";
  CHECK_THROWS_WITH(r.validate(), Catch::Matchers::Contains("attention 'flash' needs bf16 or fp16"));
  r = RunDescription{};
  r.recompute = "sometimes";
  CHECK_THROWS_WITH(r.validate(), Catch::Matchers::Contains("recompute 'sometimes'"));
  r = RunDescription{};
  r.parallel.zero_stage = 3;
  CHECK_THROWS_WITH(r.validate(), Catch::Matchers::Contains("zero_stage must be 0, 1 or 2, got 3"));
  r = RunDescription{};
  r.kernels.fused_loss_head = true;
  CHECK_THROWS_WITH(r.validate(), Catch::Matchers::Contains("loss_chunk_tokens"));
}
