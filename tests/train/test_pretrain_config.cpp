// Pretraining config: LLaMA-Factory key names load, command-line overrides win, and every bad
// input names its source and key. Reference: the error contract (file/command line, key, value).
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/train/pretrain_config.h"
#include "support.h"

using Catch::Matchers::Contains;
using kiln::test::error_of;
using kiln::train::load_pretrain_config;
using kiln::train::parse_overrides;

namespace {
std::string write_yaml(const std::string& name, const std::string& text) {
  static const auto dir = kiln::test::scratch_dir("pretrain_config");
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}
// The keys of the user's LLaMA-Factory runs (shared/seed/pretrain-history.txt).
const char* kLlamaFactory = R"(
model: llama-100m
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
cutoff_len: 1024
)";
}  // namespace

TEST_CASE("a LLaMA-Factory style config loads", "[train][config]") {
  const auto c = load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory));
  CHECK(c.per_device_train_batch_size == 1);
  CHECK(c.gradient_accumulation_steps == 8);
  CHECK(c.learning_rate == 1e-4);
  CHECK(c.lr_scheduler_type == "cosine");
  CHECK(c.warmup_ratio == 0.1);
  CHECK(c.bf16);
  CHECK(c.cutoff_len == 1024);
  CHECK_FALSE(c.full_determinism);
}

TEST_CASE("command-line overrides win and are checked like the file", "[train][config]") {
  const std::string path = write_yaml("lf.yaml", kLlamaFactory);
  const auto c = load_pretrain_config(path, parse_overrides({"--learning_rate", "3e-4", "--cutoff_len=2048", "--bf16",
                                                             "false", "--full_determinism", "true"}));
  CHECK(c.learning_rate == 3e-4);
  CHECK(c.cutoff_len == 2048);
  CHECK(c.full_determinism);
  CHECK_FALSE(c.bf16);
  CHECK_THAT(error_of([&] {
               load_pretrain_config(path, parse_overrides({"--learning_rate", "fast"}));
             }),
             Contains("command line") && Contains("learning_rate") && Contains("'fast'"));
  CHECK_THAT(error_of([&] {
               load_pretrain_config(path, parse_overrides({"--lr", "1"}));
             }),
             Contains("command line") && Contains("'lr'") && Contains("unknown"));
  CHECK_THAT(error_of([] { parse_overrides({"--seed"}); }), Contains("seed") && Contains("missing value"));
  // A model named on the command line replaces the file's, whichever key either used.
  const auto hf = load_pretrain_config(path, {{"model_name_or_path", "/models/x"}});
  CHECK(hf.model.empty());
  CHECK(hf.model_name_or_path == "/models/x");
  CHECK(hf.source == path + " + command line");
  CHECK(load_pretrain_config("quickstart").source == "preset 'quickstart'");
  CHECK_THAT(error_of([] { parse_overrides({"stray"}); }), Contains("'stray'"));
  // A key given twice, in either spelling: the last wins (argparse's rule), so a wrapper can
  // append overrides to a base command line.
  const auto twice = parse_overrides({"--seed", "1", "--cutoff_len", "64", "--seed=2"});
  CHECK(twice.size() == 3);
  CHECK(load_pretrain_config(path, twice).seed == 2);
}

TEST_CASE("training_args.json holds the keys the LLaMA-Factory table acts on too", "[train][config]") {
  const auto c = load_pretrain_config("quickstart", parse_overrides({"--report_to", "tensorboard", "--seed", "9"}));
  const auto j = nlohmann::json::parse(kiln::train::pretrain_config_json(c));
  CHECK(j.at("report_to") == "tensorboard");
  CHECK(j.at("seed") == 9);
  for (const auto& key : kiln::train::pretrain_config_keys()) CHECK(j.contains(key));
}

TEST_CASE("bad pretraining configs name the file and key", "[train][config]") {
  auto err = [](const std::string& extra) {
    const std::string path = write_yaml("bad.yaml", std::string(kLlamaFactory) + extra);
    return error_of([&] { load_pretrain_config(path); });
  };
  CHECK_THAT(err("learning_rat: 1\n"), Contains("bad.yaml") && Contains("'learning_rat'") && Contains("unknown"));
  CHECK_THAT(err("fp16: true\n"), Contains("bad.yaml") && Contains("fp16"));
  CHECK_THAT(err("save_steps: -3\n"), Contains("save_steps") && Contains("-3"));
  CHECK_THAT(err("warmup_ratio: 1.5\n"), Contains("warmup_ratio") && Contains("more than once"));
  CHECK_THAT(err("min_lr_ratio: 1.5\n"), Contains("min_lr_ratio") && Contains("1.5"));
  CHECK_THAT(err("optim: sgd\n"), Contains("'optim'") && Contains("'sgd' is not supported") && Contains("adamw_torch"));
  CHECK_THAT(error_of([] {
               load_pretrain_config("", {{"model", "tiny"}, {"lr_scheduler_type", "cosine_restarts"}});
             }),
             Contains("lr_scheduler_type") && Contains("cosine_restarts"));
  CHECK_THAT(err("model_name_or_path: /some/dir\n"), Contains("model"));
  CHECK_THAT(err("adam_beta2: [1, 2]\n"), Contains("adam_beta2") && Contains("list"));
  CHECK_THAT(error_of([] { load_pretrain_config("/no/such/config.yaml"); }), Contains("/no/such/config.yaml"));
}

TEST_CASE("every documented key is accepted", "[train][config]") {
  for (const auto& key : kiln::train::pretrain_config_keys()) {
    CAPTURE(key);
    const std::string msg = error_of([&] {
      load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{key, "not-a-valid-value?"}});
    });
    CHECK_THAT(msg, !Contains("unknown key"));
  }
}

TEST_CASE("ZeRO stage from zero_stage or LLaMA-Factory's DeepSpeed JSON; stage 3 and offload refused",
          "[train][config]") {
  const auto ds = [](const std::string& name, const std::string& json) { return write_yaml(name, json); };
  const std::string z2 = ds("ds_z2_config.json", R"({"train_batch_size": "auto", "zero_optimization": {"stage": 2,
      "allgather_partitions": true, "overlap_comm": true, "contiguous_gradients": true}})");
  const std::string z0 = ds("ds_z0_config.json", R"({"zero_optimization": {"stage": 0}})");
  CHECK(load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{"deepspeed", z2}}).resolved_zero_stage() == 2);
  CHECK(load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{"deepspeed", z0}}).resolved_zero_stage() == 0);
  CHECK(load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), {{"zero_stage", "1"}}).resolved_zero_stage() == 1);
  auto err = [](const std::vector<std::pair<std::string, std::string>>& overrides) {
    return error_of([&] { load_pretrain_config(write_yaml("lf.yaml", kLlamaFactory), overrides); });
  };
  const std::string z3 = ds("ds_z3_config.json", R"({"zero_optimization": {"stage": 3}})");
  const std::string off =
      ds("ds_z2_offload_config.json", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  const std::string broken = ds("broken.json", R"({"zero_optimization": )");
  CHECK_THAT(err({{"deepspeed", z3}}),
             Contains("ds_z3_config.json") && Contains("zero_optimization.stage 3") && Contains("not supported yet"));
  CHECK_THAT(err({{"deepspeed", off}}), Contains("offload_optimizer.device 'cpu'") && Contains("not supported"));
  CHECK_THAT(err({{"deepspeed", broken}}), Contains("broken.json") && Contains("not JSON"));
  CHECK_THAT(err({{"deepspeed", "/no/such/ds.json"}}), Contains("deepspeed") && Contains("cannot open"));
  CHECK_THAT(err({{"deepspeed", z2}, {"zero_stage", "1"}}), Contains("zero_stage") && Contains("says stage 2"));
  CHECK_THAT(err({{"zero_stage", "3"}}), Contains("zero_stage") && Contains("not supported yet"));
  CHECK_THAT(err({{"zero_stage", "7"}}), Contains("zero_stage") && Contains("7"));
  CHECK_THAT(err({{"ddp_timeout", "0"}}), Contains("ddp_timeout"));
}
