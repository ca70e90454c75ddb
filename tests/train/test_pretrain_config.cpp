// Pretraining config: LLaMA-Factory key names load, command-line overrides win, and every bad
// input names its source and key. Reference: the error contract (file/command line, key, value).
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

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
  CHECK_THAT(err("optim: sgd\n"), Contains("'optim'") && Contains("unknown"));
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
