// The training loop on the embedded corpus (tiny model, CPU, fp32). References: a run stopped
// at step k and resumed from its checkpoint must reproduce the uninterrupted run's losses
// exactly; a poisoned parameter must stop the run naming the step (nan_policy: stop).
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include <ATen/Context.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/common/format.h"
#include "kiln/common/process_settings.h"
#include "kiln/cost/memory.h"
#include "kiln/data/loader.h"
#include "kiln/data/shards.h"
#include "kiln/kiln.h"
#include "kiln/model/llama_config.h"
#include "kiln/ops/dispatch.h"
#include "kiln/train/evaluate.h"
#include "kiln/train/kernel_choices.h"
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

TEST_CASE("a pending signal stops cleanly; before any step nothing is saved, after one the step is", "[train]") {
  PretrainConfig c = small_run("signal");
  {
    Trainer t(c);
    Trainer::pending_signal().store(SIGTERM);  // as if it came during set-up
    const auto r = t.train();
    CHECK(r.interrupted);
    CHECK(r.global_step == 0);
    CHECK(r.last_checkpoint.empty());
    CHECK_FALSE(fs::exists(fs::path(c.output_dir) / "checkpoint-0"));
    CHECK(Trainer::pending_signal().load() == 0);
  }
  // A signal after two completed steps: checkpoint-2 is saved; resumed and stopped again at once,
  // nothing new is written and the result names the checkpoint the run stands on.
  Trainer t(c);
  t.set_step_callback([](int64_t step) {
    if (step == 2) Trainer::pending_signal().store(SIGINT);
  });
  const auto r = t.train();
  CHECK(r.interrupted);
  CHECK(r.global_step == 2);
  const fs::path ckpt = fs::path(c.output_dir) / "checkpoint-2";
  CHECK(fs::exists(ckpt / "optimizer.safetensors"));
  CHECK(Trainer::pending_signal().load() == 0);
  const auto written = fs::last_write_time(ckpt / "model.safetensors");
  c.resume_from_checkpoint = "true";
  Trainer again(c);
  Trainer::pending_signal().store(SIGTERM);
  const auto r2 = again.train();
  CHECK(r2.interrupted);
  CHECK(r2.global_step == 2);
  CHECK(r2.last_checkpoint == ckpt.string());
  CHECK(fs::last_write_time(ckpt / "model.safetensors") == written);
}

TEST_CASE("val_size holds out random blocks of the train split", "[train]") {
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
  }
  at::globalContext().setDeterministicAlgorithms(before, warn_before);
  // The default kernels run SDPA's attention, whose fused backwards are not deterministic in
  // warn-only mode: under full_determinism the trainer takes kiln's kernels (a deterministic
  // backward) unless the spec was written otherwise.
  using kiln::train::trainer_kernels;
  CHECK(trainer_kernels(kiln::ops::kDefaultKernels, true) == "kiln");
  CHECK(trainer_kernels(kiln::ops::kDefaultKernels, false) == kiln::ops::kDefaultKernels);
  CHECK(trainer_kernels("aten", true) == "aten");
  CHECK(trainer_kernels("kiln,rope=aten", true) == "kiln,rope=aten");
  // cuBLAS's fixed workspace is a process setting: the program's (kiln-pretrain's) to set, never
  // the library's; a user's own value wins.
  const char* saved = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string saved_value = saved ? saved : "";
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  CHECK(kiln::set_cublas_deterministic_workspace() == "CUBLAS_WORKSPACE_CONFIG=:4096:8");
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":4096:8");
  setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  CHECK(kiln::set_cublas_deterministic_workspace().empty());
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":16:8");
  if (saved) {
    setenv("CUBLAS_WORKSPACE_CONFIG", saved_value.c_str(), 1);
  } else {
    unsetenv("CUBLAS_WORKSPACE_CONFIG");
  }
}

namespace {

// A stop request that comes true at the n-th time the trainer asks (it asks at the top of every
// step, before every micro-batch and before every evaluation batch).
std::function<bool()> stop_at_call(int n, int* calls) {
  return [n, calls] { return ++*calls >= n; };
}

}  // namespace

TEST_CASE("a stop request inside a step drops the partial step, and the run resumes exactly", "[train]") {
  PretrainConfig full = small_run("stop_full");
  Trainer(full).train();
  const auto la = losses(full.output_dir);

  // Calls per step: 1 at the top + 2 micro-batches. Call 9 = before step 3's second micro-batch.
  PretrainConfig cut = small_run("stop_cut");
  cut.save_steps = 0;
  Trainer t(cut);
  int calls = 0;
  t.set_stop_check(stop_at_call(9, &calls));
  const auto r = t.train();
  CHECK(calls == 9);  // asked no further: the stop acted within one micro-batch
  CHECK(r.interrupted);
  CHECK(r.global_step == 2);
  CHECK(r.last_checkpoint == (fs::path(cut.output_dir) / "checkpoint-2").string());
  const auto state = nlohmann::json::parse(std::ifstream(fs::path(r.last_checkpoint) / "loader_state.json"));
  CHECK(state["position"].get<int64_t>() == 4);  // 2 steps x 2 micro-batches: step 3's batches not consumed

  PretrainConfig resumed = small_run("stop_resumed");
  resumed.resume_from_checkpoint = r.last_checkpoint;
  Trainer(resumed).train();
  const auto lb = losses(resumed.output_dir);
  REQUIRE(lb.size() == 6);
  for (size_t i = 0; i < lb.size(); ++i) {
    CAPTURE(i);
    CHECK(lb[i] == la[2 + i]);  // bit-identical to the uninterrupted run
  }
}

TEST_CASE("a stop request during evaluation drops it within one batch and saves", "[train]") {
  PretrainConfig c = small_run("stop_eval");
  c.val_size = 10;
  c.eval_steps = 4;
  c.save_steps = 0;
  c.per_device_eval_batch_size = 3;  // 10 blocks: 4 evaluation batches (the training batch of 2 would make 5)
  {
    Trainer t(c);
    int calls = 0;
    t.set_stop_check([&calls] { return ++calls > 1000; });
    calls = 0;
    t.evaluate();
    CHECK(calls == 4);  // asked once per evaluation batch, of per_device_eval_batch_size blocks
  }
  // Steps 1..4 ask 12 times; the evaluation after step 4 asks before each batch: stop at its 2nd.
  Trainer t(c);
  int calls = 0;
  t.set_stop_check(stop_at_call(14, &calls));
  const auto r = t.train();
  CHECK(calls == 14);
  CHECK(r.interrupted);
  CHECK(r.global_step == 4);
  CHECK_FALSE(r.final_eval);
  CHECK(fs::exists(fs::path(c.output_dir) / "checkpoint-4" / "trainer_state.json"));
  std::ifstream in(fs::path(c.output_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) CHECK_THAT(line, !Catch::Matchers::Contains("eval_loss"));
}

// The issue-12 scenario: an output folder with checkpoint-4 and -8 of a finished run; resume from 4
// with save_steps 1 and save_total_limit 1, stopped at step 7.
TEST_CASE("resuming an earlier checkpoint never deletes what it writes or resumed from", "[train]") {
  PretrainConfig first = small_run("rotate_resume");
  Trainer(first).train();
  const fs::path out(first.output_dir);
  REQUIRE(fs::exists(out / "checkpoint-4"));
  REQUIRE(fs::exists(out / "checkpoint-8"));
  fs::create_directories(out / ".checkpoint-9.tmp");  // what a kill during a save leaves
  std::ofstream(out / ".checkpoint-9.tmp" / "model.safetensors") << "partial";

  PretrainConfig again = small_run("unused");
  again.output_dir = first.output_dir;
  again.resume_from_checkpoint = (out / "checkpoint-4").string();
  again.save_steps = 1;
  again.save_total_limit = 1;
  Trainer t(again);
  int steps_seen = 0;
  // The top-of-step calls are every 3rd; stop at the top of step 8 (after step 7 completed).
  t.set_stop_check([&steps_seen] { return ++steps_seen == 3 * 3 + 1; });
  const auto r = t.train();
  CHECK(r.interrupted);
  CHECK(r.global_step == 7);
  CHECK(r.last_checkpoint == (out / "checkpoint-7").string());
  CHECK(kiln::train::latest_checkpoint(again.output_dir) == (out / "checkpoint-7").string());
  CHECK(fs::exists(out / "checkpoint-4" / "optimizer.safetensors"));  // resumed from: kept
  CHECK(fs::exists(out / "checkpoint-7" / "optimizer.safetensors"));  // just written: kept
  CHECK_FALSE(fs::exists(out / "checkpoint-5"));
  CHECK_FALSE(fs::exists(out / "checkpoint-6"));
  CHECK_FALSE(fs::exists(out / ".checkpoint-9.tmp"));  // cleaned at start
  // The abandoned run's checkpoint-8 is set aside, whole, not mixed with this run's.
  CHECK_FALSE(fs::exists(out / "checkpoint-8"));
  int aside = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().filename().string().rfind("abandoned-", 0) == 0) {
      CHECK(fs::exists(e.path() / "checkpoint-8" / "optimizer.safetensors"));
      ++aside;
    }
  }
  CHECK(aside == 1);
  for (const auto& e : fs::directory_iterator(out)) {
    CHECK(e.path().filename().string().rfind(".checkpoint", 0) != 0);  // no partial folders left
  }

  // resume_from_checkpoint: true now continues this run, at step 7.
  PretrainConfig cont = again;
  cont.resume_from_checkpoint = "true";
  Trainer c(cont);
  CHECK_THAT(c.banner(), Catch::Matchers::Contains("Resuming at step 7"));
}

TEST_CASE("resume_from_checkpoint: true recovers a re-save cut between its renames before choosing", "[train]") {
  PretrainConfig first = small_run("resume_after_cut_resave");
  first.max_steps = 4;
  first.save_steps = 2;
  Trainer(first).train();
  const fs::path out(first.output_dir);
  REQUIRE(fs::exists(out / "checkpoint-4" / "optimizer.safetensors"));
  // A kill while checkpoint-4 was re-saved on a file system without an atomic exchange: the
  // complete old folder is at .checkpoint-4.old, the new one half-written at .checkpoint-4.tmp.
  fs::rename(out / "checkpoint-4", out / ".checkpoint-4.old");
  fs::create_directories(out / ".checkpoint-4.tmp");
  std::ofstream(out / ".checkpoint-4.tmp" / "model.safetensors") << "partial";
  PretrainConfig again = first;
  again.resume_from_checkpoint = "true";
  again.max_steps = 5;
  std::vector<std::string> logged;
  kiln::set_log_handler([&](kiln::LogLevel, std::string_view m) { logged.emplace_back(m); });
  Trainer t(again);
  kiln::set_log_handler(nullptr);
  CHECK_THAT(t.banner(), Catch::Matchers::Contains("Resuming at step 4"));  // not checkpoint-2
  CHECK(fs::exists(out / "checkpoint-4" / "optimizer.safetensors"));
  CHECK_FALSE(fs::exists(out / ".checkpoint-4.old"));
  CHECK_FALSE(fs::exists(out / ".checkpoint-4.tmp"));
  const bool said = std::any_of(logged.begin(), logged.end(), [](const std::string& m) {
    return m.find("cleaned up 2 incomplete checkpoint folders") != std::string::npos &&
           m.find(".checkpoint-4.old restored as checkpoint-4") != std::string::npos;
  });
  CHECK(said);
}

TEST_CASE("cutoff_len beyond max_position_embeddings warns once, naming both numbers", "[train]") {
  PretrainConfig c = small_run("cutoff_warning");
  c.cutoff_len = 1100;  // the tiny preset has max_position_embeddings 1024
  c.max_steps = 1;
  std::vector<std::pair<kiln::LogLevel, std::string>> logged;
  kiln::set_log_handler([&](kiln::LogLevel l, std::string_view m) { logged.emplace_back(l, std::string(m)); });
  Trainer t(c);
  kiln::set_log_handler(nullptr);
  int warnings = 0;
  for (const auto& [level, m] : logged) {
    if (m.find("max_position_embeddings") == std::string::npos) continue;
    ++warnings;
    CHECK(level == kiln::LogLevel::kWarning);
    CHECK_THAT(m, Catch::Matchers::Contains("cutoff_len 1100") && Catch::Matchers::Contains("1024"));
  }
  CHECK(warnings == 1);
  c.cutoff_len = 32;
  logged.clear();
  kiln::set_log_handler([&](kiln::LogLevel l, std::string_view m) { logged.emplace_back(l, std::string(m)); });
  Trainer quiet(c);
  kiln::set_log_handler(nullptr);
  for (const auto& [level, m] : logged) CHECK(m.find("max_position_embeddings") == std::string::npos);
}

TEST_CASE("a dry run under a launcher plans the per-rank memory of the job's ZeRO stage", "[train]") {
  // The Slurm variables of rank 1 of 4; a plan joins no process group, so none needs to exist.
  const std::vector<std::pair<std::string, std::string>> vars = {{"SLURM_PROCID", "1"},
                                                                 {"SLURM_NTASKS", "4"},
                                                                 {"SLURM_LOCALID", "1"},
                                                                 {"SLURM_JOB_NODELIST", "node[01-02]"},
                                                                 {"SLURM_JOB_ID", "77"}};
  for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  PretrainConfig c = small_run("dry_run_dist");
  std::map<int, std::string> banners;
  for (const int stage : {0, 2}) {
    c.zero_stage = stage;
    banners[stage] = kiln::train::run_banner(kiln::train::plan_run(c));
  }
  for (const auto& [k, v] : vars) ::unsetenv(k.c_str());
  const std::string one = kiln::train::run_banner(kiln::train::plan_run(c));
  const auto per_rank = [&](int stage, int world) {
    const auto m = kiln::cost::estimate_training_memory(
        kiln::model::load_llama_config("tiny"),
        kiln::cost::RunDescription{.batch = c.per_device_train_batch_size,
                                   .cutoff_len = c.cutoff_len,
                                   .dtype = "fp32",
                                   .kernels = kiln::train::kernel_choices(c.kernels, "fp32", false),
                                   .parallel = {.data_parallel = world > 1,
                                                .world_size = world,
                                                .zero_stage = stage,
                                                .bucket_cap_bytes = c.ddp_bucket_cap_mb << 20}});
    return kiln::human_bytes(m.total());
  };
  for (const int stage : {0, 2}) {
    CAPTURE(banners[stage]);
    CHECK_THAT(banners[stage],
               Catch::Matchers::Contains(fmt::format(
                   "Distributed = 4 processes (slurm; planned, not joined; this is rank 1), ZeRO stage {}", stage)));
    CHECK_THAT(banners[stage], Catch::Matchers::Contains("Predicted peak memory per rank = " + per_rank(stage, 4)));
    CHECK_THAT(banners[stage], Catch::Matchers::Contains("Total train batch size (w. parallel, distributed & "
                                                         "accumulation) = 16"));
  }
  CHECK(per_rank(2, 4) != per_rank(0, 1));
  CHECK_THAT(one, Catch::Matchers::Contains("Predicted peak memory = " + per_rank(0, 1)));
  CHECK_THAT(one, !Catch::Matchers::Contains("Distributed"));
}

TEST_CASE("overwrite_output_dir deletes an earlier run's checkpoints instead of setting them aside", "[train]") {
  PretrainConfig c = small_run("overwrite");
  c.max_steps = 4;
  c.save_steps = 2;
  Trainer(c).train();
  REQUIRE(fs::exists(fs::path(c.output_dir) / "checkpoint-2"));
  c.overwrite_output_dir = true;
  c.max_steps = 1;
  Trainer(c).train();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(c.output_dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // The later checkpoints are gone; the rest is this run's (HF's and LLaMA-Factory's end-of-training
  // files included: the final model, its card and the run's arguments).
  CHECK(names == std::vector<std::string>{"README.md", "all_results.json", "checkpoint-1", "config.json",
                                          "eval_results.json", "generation_config.json", "kiln_data.json",
                                          "metrics.jsonl", "model.safetensors", "train_results.json",
                                          "trainer_log.jsonl", "trainer_state.json", "training_args.json"});
}

TEST_CASE("token ids the model cannot embed are refused before training, naming both numbers", "[train]") {
  // Shards whose tokenizer claims 320 ids (the tiny model's vocab_size) but hold id 400: an edited
  // meta.json, or shards of another tokenizer.
  const fs::path data = kiln::test::scratch_dir("trainer_bad_ids_data");
  kiln::data::ShardSetMeta meta;
  meta.tokenizer = "test";
  meta.vocab_size = 500;
  meta.eos_id = 1;
  meta.dtype = kiln::data::TokenDtype::kUint16;
  kiln::data::ShardWriter w(data.string(), "train", meta.dtype, 1 << 20);
  std::vector<int32_t> doc(300, 7);
  doc[123] = 400;
  w.add_document(doc);
  meta.splits.push_back(w.finish());
  kiln::data::write_shard_meta(data.string(), meta);
  PretrainConfig c = small_run("bad_ids");
  c.dataset_dir = data.string();
  CHECK_THAT(kiln::test::error_of([&] { Trainer t(c); }),
             Catch::Matchers::Contains("token id 400") && Catch::Matchers::Contains("vocab_size") &&
                 Catch::Matchers::Contains("320") && Catch::Matchers::Contains(data.string()));
}

TEST_CASE("checkpoints record their training data; evaluation can put a BOS before every block", "[train]") {
  PretrainConfig c = small_run("record");
  c.max_steps = 1;
  c.val_size = 4;
  Trainer t(c);
  const auto r = t.train();
  const auto record = kiln::data::DataRecord::read(r.last_checkpoint);
  REQUIRE(record);
  CHECK(record->tokenizer == "byte");
  CHECK(record->vocab_size == 259);
  CHECK_FALSE(record->add_special_tokens);
  // output_dir's final model has one too (kiln-generate --model output_dir); a folder without one: nullopt.
  CHECK(kiln::data::DataRecord::read(c.output_dir));
  CHECK_FALSE(kiln::data::DataRecord::read(kiln::test::scratch_dir("record_none").string()));

  // With a BOS before each block, every block token is a target, and the loss is that of the
  // model run on [BOS, block] by hand.
  auto shards = kiln::data::TokenShards::open(record->dataset_dir);
  const auto dataset = std::make_shared<kiln::data::PackedDataset>(shards->split("train"), 32, 0, 3);
  auto model = t.model();
  const auto plain = kiln::train::evaluate_dataset(model, dataset, {.batch_size = 2});
  const auto with_bos = kiln::train::evaluate_dataset(model, dataset, {.batch_size = 2, .prepend_token_id = 256});
  CHECK(plain.tokens == 3 * 31);
  CHECK(with_bos.tokens == 3 * 32);
  double sum = 0;
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<int64_t> ids(33);
    ids[0] = 256;
    dataset->read_block(b, ids.data() + 1);
    const at::Tensor x = at::tensor(ids, at::kLong).unsqueeze(0);
    at::NoGradGuard no_grad;
    model->eval();
    sum += model->forward(x, x).loss_sum.item<double>();
  }
  CHECK(with_bos.loss == Approx(sum / (3 * 32)).epsilon(1e-6));
}

TEST_CASE("two trainers with different kernels in one process do not interfere", "[train]") {
  // A: kiln's fused ops (on the CPU: the chunked linear + cross-entropy), B: the ATen reference
  // with recomputation (it re-enters B's kernel choice). Each alone,
  // then both at once on two threads: the same losses, bit for bit; the process-wide kernel
  // setting is never touched.
  auto config = [](const std::string& name, const std::string& kernels, bool checkpointing) {
    PretrainConfig c = small_run(name);
    c.kernels = kernels;
    c.gradient_checkpointing = checkpointing;
    c.save_steps = 0;
    c.overwrite_output_dir = true;
    return c;
  };
  kiln::ops::set_backends("kiln,rope=aten");
  const PretrainConfig a = config("two_a", "kiln", false), b = config("two_b", "aten", true);
  Trainer(a).train();
  Trainer(b).train();
  const auto alone_a = losses(a.output_dir), alone_b = losses(b.output_dir);
  REQUIRE(alone_a.size() == 8);
  CHECK(alone_a != alone_b);  // the kernel setting does change the numbers
  for (const auto& c : {a, b}) fs::remove_all(c.output_dir);
  Trainer ta(a), tb(b);
  std::thread first([&] { ta.train(); });
  std::thread second([&] { tb.train(); });
  first.join();
  second.join();
  CHECK(losses(a.output_dir) == alone_a);
  CHECK(losses(b.output_dir) == alone_b);
  CHECK(kiln::ops::backends_spec() == "kiln,rope=aten");
  kiln::ops::set_backend(kiln::ops::Backend::kKiln);
}

TEST_CASE("a trainer on host batches: max_steps required, bad batches named, the source's end saves", "[train]") {
  PretrainConfig c = small_run("host");
  c.max_steps = -1;
  const at::Tensor ids = at::arange(64, at::kLong).remainder(50).reshape({2, 32});
  int calls = 0;
  kiln::train::BatchSource five = [&]() -> std::optional<kiln::train::MicroBatch> {
    if (calls++ >= 5) return std::nullopt;
    return kiln::train::MicroBatch{ids, ids, at::Tensor()};
  };
  CHECK_THAT(kiln::test::error_of([&] { Trainer(c, five); }), Catch::Matchers::Contains("max_steps"));
  c.max_steps = 8;  // 2 micro-batches a step: the 5 batches end during step 3
  std::vector<std::string> logged;
  kiln::set_log_handler([&](kiln::LogLevel, std::string_view m) { logged.emplace_back(m); });
  Trainer t(c, five);
  std::vector<int64_t> steps;
  t.set_callbacks({.on_step = [&](int64_t s) { steps.push_back(s); }});
  const auto r = t.train();
  kiln::set_log_handler(nullptr);
  CHECK(r.data_exhausted);
  CHECK(r.global_step == 2);
  CHECK(steps == std::vector<int64_t>{1, 2});
  CHECK(fs::exists(fs::path(r.last_checkpoint) / "model.safetensors"));
  CHECK_FALSE(fs::exists(fs::path(r.last_checkpoint) / "loader_state.json"));
  REQUIRE(logged.size() >= 3);
  CHECK_THAT(logged.back(), Catch::Matchers::Contains("ran out during step 3"));
  // Evaluation over host batches equals the model run by hand.
  int left = 1;
  const auto ev = t.evaluate([&]() -> std::optional<kiln::train::MicroBatch> {
    if (left-- <= 0) return std::nullopt;
    return kiln::train::MicroBatch{ids, ids, at::Tensor()};
  });
  at::NoGradGuard no_grad;
  auto m = t.model();
  CHECK(ev.tokens == 2 * 31);
  CHECK(ev.loss == Approx(m->forward(ids, ids).loss.item<double>()).epsilon(1e-6));
  // A float batch is one clear line.
  calls = 0;
  kiln::train::BatchSource bad = [&]() -> std::optional<kiln::train::MicroBatch> {
    return kiln::train::MicroBatch{ids.to(at::kFloat), ids, at::Tensor()};
  };
  c.overwrite_output_dir = true;
  CHECK_THAT(kiln::test::error_of([&] { Trainer(c, bad).train(); }), Catch::Matchers::Contains("int64"));
  // A label outside the vocabulary (the loss head indexes a row by it) is refused where the batch
  // enters, naming the label; -100 is the ignored label and passes.
  for (const int64_t label : {int64_t{50000}, int64_t{-7}}) {
    CAPTURE(label);
    at::Tensor labels = ids.clone();
    labels[1][5] = label;
    labels[0][0] = -100;
    kiln::train::BatchSource out_of_range = [&]() -> std::optional<kiln::train::MicroBatch> {
      return kiln::train::MicroBatch{ids, labels, at::Tensor()};
    };
    const std::string e = kiln::test::error_of([&] { Trainer(c, out_of_range).train(); });
    CHECK_THAT(e, Catch::Matchers::Contains("label " + std::to_string(label)));
    CHECK_THAT(e, Catch::Matchers::Contains("vocab_size"));
  }
}

TEST_CASE("a CPU trainer and a CUDA trainer with other kernels run at once without interfering", "[train][cuda]") {
  // On a GPU: kiln's CUDA kernels (bf16) beside a CPU trainer on the ATen reference. Each alone,
  // then together on two threads: the CPU losses bit for bit, the GPU's within bf16 run-to-run
  // noise (its flash backward accumulates dQ with atomics).
  PretrainConfig cpu = small_run("mixed_cpu"), gpu = small_run("mixed_gpu");
  cpu.kernels = "aten";
  cpu.save_steps = gpu.save_steps = 0;
  cpu.overwrite_output_dir = gpu.overwrite_output_dir = true;
  gpu.device = "cuda";
  gpu.bf16 = true;
  gpu.kernels = "kiln";
  Trainer(cpu).train();
  Trainer(gpu).train();
  const auto alone_cpu = losses(cpu.output_dir), alone_gpu = losses(gpu.output_dir);
  for (const auto& c : {cpu, gpu}) fs::remove_all(c.output_dir);
  Trainer tc(cpu), tg(gpu);
  std::thread a([&] { tc.train(); });
  std::thread b([&] { tg.train(); });
  a.join();
  b.join();
  CHECK(losses(cpu.output_dir) == alone_cpu);
  const auto together_gpu = losses(gpu.output_dir);
  REQUIRE(together_gpu.size() == alone_gpu.size());
  for (size_t i = 0; i < alone_gpu.size(); ++i) CHECK(together_gpu[i] == Approx(alone_gpu[i]).epsilon(2e-2));
}

TEST_CASE("bf16 on a GPU below compute capability 8.0 is refused naming the GPU and pointing at fp16", "[train]") {
  PretrainConfig c = small_run("gpu_dtype");
  c.source = "run.yaml";
  c.bf16 = true;
  // Faked capabilities: a V100 (7.0) and a T4 (7.5) refuse bf16; an A100 (8.0) takes it.
  for (const auto& [gpu, major, minor] :
       std::vector<std::tuple<std::string, int, int>>{{"Tesla V100-SXM2-32GB", 7, 0}, {"Tesla T4", 7, 5}}) {
    const std::string e = kiln::test::error_of([&] { kiln::train::check_dtype_for_gpu(c, gpu, major, minor); });
    CAPTURE(gpu, e);
    CHECK_THAT(e, Catch::Matchers::Contains("run.yaml") && Catch::Matchers::Contains("bf16") &&
                      Catch::Matchers::Contains(gpu) &&
                      Catch::Matchers::Contains(fmt::format("compute capability {}.{}", major, minor)) &&
                      Catch::Matchers::Contains("fp16: true"));
  }
  CHECK_NOTHROW(kiln::train::check_dtype_for_gpu(c, "NVIDIA A100-SXM4-80GB", 8, 0));
  c.bf16 = false;
  c.fp16 = true;
  CHECK_NOTHROW(kiln::train::check_dtype_for_gpu(c, "Tesla V100-SXM2-32GB", 7, 0));
}

namespace {

// An HF config folder: config.json alone (no weights, no tokenizer: the embedded corpus's byte
// ids fit its vocab_size). initializer_range 0.05, not the default, so the init must read it.
fs::path config_folder(const std::string& name) {
  const fs::path dir = kiln::test::scratch_dir(name);
  std::ofstream(dir / "config.json") << R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "initializer_range": 0.05,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16"
})";
  return dir;
}

PretrainConfig from_scratch_run(const std::string& name, const fs::path& folder) {
  PretrainConfig c = small_run(name);
  c.model.clear();
  c.model_name_or_path = folder.string();
  c.train_from_scratch = true;
  return c;
}

}  // namespace

TEST_CASE("train_from_scratch: a config folder without weights is initialised at random by the seed", "[train]") {
  const fs::path folder = config_folder("scratch_config");
  PretrainConfig c = from_scratch_run("scratch_init", folder);
  c.seed = 11;
  Trainer t(c);
  const auto& model = t.model();
  CHECK(model->config().hidden_size == 64);
  CHECK(model->config().initializer_range == 0.05);
  CHECK_THAT(t.banner(), Catch::Matchers::Contains("initialised at random from " + (folder / "config.json").string()) &&
                             Catch::Matchers::Contains("seed 11"));
  // transformers' _init_weights: Linear and Embedding weights N(0, initializer_range), norms 1.
  // Each tensor's sample std has a relative standard error of 1/sqrt(2n) and its mean a standard
  // error of sigma/sqrt(n): 5 of them each (the draws are fixed by the seed; the smallest tensor,
  // k_proj's 32 x 64, allows 7.8%).
  int matrices = 0;
  for (const auto& item : model->named_parameters()) {
    CAPTURE(item.key());
    const at::Tensor p = item.value().detach().to(at::kDouble);
    if (item.key().ends_with("norm.weight")) {
      CHECK(at::equal(p, at::ones_like(p)));
      continue;
    }
    REQUIRE(p.dim() == 2);
    ++matrices;
    const double n = static_cast<double>(p.numel());
    CHECK(std::abs(p.std().item<double>() / 0.05 - 1) < 5 / std::sqrt(2 * n));
    CHECK(std::abs(p.mean().item<double>()) < 5 * 0.05 / std::sqrt(n));
  }
  CHECK(matrices == 2 + 2 * 7);  // embedding, lm_head; q, k, v, o, gate, up, down per layer
  // kiln's own init of a preset (LlamaForCausalLMImpl::init_weights), the same numbers by seed.
  kiln::model::LlamaForCausalLM same(model->config());
  same->init_weights(11);
  const auto want = same->named_parameters();
  for (const auto& item : model->named_parameters()) CHECK(at::equal(item.value(), want[item.key()]));
  c.seed = 12;
  CHECK_FALSE(at::equal(Trainer(c).model()->named_parameters()["lm_head.weight"], want["lm_head.weight"]));

  // Without train_from_scratch the folder has nothing to load: an error naming the file, before
  // any data is read.
  c.train_from_scratch = false;
  const std::string error = kiln::test::error_of([&] { Trainer u(c); });
  CHECK_THAT(error, Catch::Matchers::Contains((folder / "model.safetensors").string()) &&
                        Catch::Matchers::Contains("model_name_or_path") &&
                        Catch::Matchers::Contains("train_from_scratch: true"));
}

TEST_CASE("train_from_scratch: the run resumes exactly; the card claims no base model", "[train]") {
  const fs::path folder = config_folder("scratch_resume_config");
  PretrainConfig full = from_scratch_run("scratch_full", folder);
  Trainer(full).train();
  const auto la = losses(full.output_dir);
  REQUIRE(la.size() == 8);
  CHECK(la.back() < la.front());
  const fs::path out(full.output_dir);
  // HF's card for a model that was not fine-tuned from another; generation_config.json from the
  // model config (from_config), as the folder's would not be read.
  std::stringstream card_text;
  card_text << std::ifstream(out / "README.md").rdbuf();
  const std::string card = card_text.str();
  CHECK_THAT(card, Catch::Matchers::Contains("This model was trained from scratch on") &&
                       !Catch::Matchers::Contains("base_model") && !Catch::Matchers::Contains(folder.string()));
  CHECK(fs::exists(out / "generation_config.json"));
  CHECK(nlohmann::json::parse(std::ifstream(out / "training_args.json"))["train_from_scratch"] == true);

  PretrainConfig resumed = from_scratch_run("scratch_resumed", folder);
  resumed.resume_from_checkpoint = (out / "checkpoint-4").string();
  Trainer b(resumed);
  CHECK_THAT(b.banner(), Catch::Matchers::Contains("weights from the resumed checkpoint"));
  b.train();
  const auto lb = losses(resumed.output_dir);
  REQUIRE(lb.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(lb[i] == la[4 + i]);  // bit-identical
}
