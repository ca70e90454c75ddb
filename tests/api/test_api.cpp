// kiln's public API as a host uses it: only kiln/kiln.h (no internal header). The trainer's
// callbacks fire at the steps the settings name, with the values the run logs and saves; the log
// level filters kiln's records; Model::create names what it cannot find. (The installed package:
// tests/consumer, whose api_check covers Model::create, save_pretrained, evaluate and kOff.)
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/kiln.h"
#include "support.h"

namespace fs = std::filesystem;

namespace {

// A model (the tiny preset) on the embedded corpus: blocks of 32 tokens, 4 held out for evaluation.
kiln::TrainConfig small_run(const std::string& name, const std::string& extra, const std::string& model = "tiny") {
  return kiln::train_config_from_yaml(
      "model: " + model +
          "\ncutoff_len: 32\nper_device_train_batch_size: 2\nper_device_eval_batch_size: 4\nval_size: 4\n"
          "learning_rate: 1.0e-3\ndevice: cpu\noutput_dir: " +
          kiln::test::scratch_dir("api_" + name).string() + "\n" + extra,
      name + ".yaml");
}

}  // namespace

TEST_CASE("kiln::Trainer's on_log, on_evaluate and on_save fire at their steps, with the run's values", "[api]") {
  kiln::Trainer trainer(small_run("callbacks", "max_steps: 6\nlogging_steps: 2\neval_steps: 3\nsave_steps: 4\n"));
  std::vector<int64_t> steps;
  std::vector<nlohmann::json> logged;
  std::vector<std::pair<int64_t, kiln::EvalResult>> evaluated;
  std::vector<std::pair<int64_t, std::string>> saved;
  std::vector<bool> saved_whole;  // the folder holds the checkpoint when on_save runs
  trainer.set_callbacks({
      .on_step = [&](int64_t s) { steps.push_back(s); },
      .on_log = [&](const std::string& line) { logged.push_back(nlohmann::json::parse(line)); },
      .on_evaluate = [&](int64_t s, const kiln::EvalResult& r) { evaluated.emplace_back(s, r); },
      .on_save =
          [&](int64_t s, const std::string& dir) {
            saved.emplace_back(s, dir);
            saved_whole.push_back(fs::is_regular_file(fs::path(dir) / "model.safetensors") &&
                                  fs::is_regular_file(fs::path(dir) / "config.json") &&
                                  fs::is_regular_file(fs::path(dir) / "trainer_state.json"));
          },
  });
  const kiln::TrainResult result = trainer.train();
  REQUIRE(result.global_step == 6);
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6});

  // on_evaluate: every eval_steps, and once at the end; loss and perplexity = exp(loss) over the
  // 4 held-out blocks (31 targets each).
  REQUIRE(evaluated.size() == 2);
  CHECK(evaluated[0].first == 3);
  CHECK(evaluated[1].first == 6);
  for (const auto& [step, r] : evaluated) {
    CHECK(r.tokens == 4 * 31);
    CHECK(std::isfinite(r.loss));
    CHECK(r.perplexity == std::exp(r.loss));
    CHECK_FALSE(r.interrupted);
  }
  CHECK(evaluated[1].second.loss < evaluated[0].second.loss);
  REQUIRE(result.final_eval);
  CHECK(result.final_eval->loss == evaluated[1].second.loss);
  CHECK(trainer.evaluate().loss == Approx(evaluated[1].second.loss).epsilon(1e-9));

  // on_log: the metrics.jsonl lines, in order: a training window every logging_steps, and each
  // evaluation with on_evaluate's numbers exactly.
  REQUIRE(logged.size() == 5);
  std::vector<int64_t> log_steps;
  for (const auto& j : logged) log_steps.push_back(j.at("step").get<int64_t>());
  CHECK(log_steps == std::vector<int64_t>{2, 3, 4, 6, 6});
  for (const size_t i : {0, 2, 3}) {
    CHECK(logged[i].at("loss").get<double>() > 0);
    CHECK(logged[i].at("learning_rate").get<double>() > 0);
    CHECK_FALSE(logged[i].contains("eval_loss"));
  }
  for (const auto& [i, e] : {std::pair<size_t, size_t>{1, 0}, {4, 1}}) {
    CHECK(logged[i].at("eval_loss").get<double>() == evaluated[e].second.loss);
    CHECK(logged[i].at("eval_perplexity").get<double>() == evaluated[e].second.perplexity);
    CHECK(logged[i].at("eval_tokens").get<int64_t>() == evaluated[e].second.tokens);
  }
  std::ifstream metrics(fs::path(result.last_checkpoint).parent_path() / "metrics.jsonl");
  int64_t lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    REQUIRE(lines < 5);
    CHECK(nlohmann::json::parse(line) == logged[lines++]);
  }
  CHECK(lines == 5);

  // on_save: every save_steps and at the end, with the folder that exists by then; the last one is
  // the result's, and holds the trained model.
  REQUIRE(saved.size() == 2);
  CHECK(saved[0].first == 4);
  CHECK(saved[1].first == 6);
  CHECK(fs::path(saved[0].second).filename() == "checkpoint-4");
  CHECK(fs::path(saved[1].second).filename() == "checkpoint-6");
  CHECK(saved_whole == std::vector<bool>{true, true});
  CHECK(saved[1].second == result.last_checkpoint);
  const at::Tensor ids = at::arange(64, at::kLong).remainder(50).reshape({2, 32});
  CHECK(at::equal(kiln::Model::from_pretrained(saved[1].second).logits(ids), trainer.model().logits(ids)));
  CHECK_FALSE(at::equal(kiln::Model::from_pretrained(saved[0].second).logits(ids), trainer.model().logits(ids)));
}

TEST_CASE("Model::save_pretrained of a trained model reloads with the same parameters and logits", "[api]") {
  const at::Tensor ids = at::arange(64, at::kLong).remainder(50).reshape({2, 32});
  kiln::Trainer trainer(small_run("save_pretrained", "max_steps: 3\nsave_steps: 0\n"), [&] {
    return std::optional(kiln::Batch{ids, ids});
  });
  trainer.train();
  const kiln::Model trained = trainer.model();
  CHECK_FALSE(at::equal(trained.logits(ids), kiln::Model::create("tiny").logits(ids)));  // it did train
  const fs::path dir = kiln::test::scratch_dir("api_save_pretrained_out");
  trained.save_pretrained(dir.string());
  const kiln::Model back = kiln::Model::from_pretrained(dir.string());
  CHECK(back.num_parameters() == trained.num_parameters());
  CHECK(at::equal(back.logits(ids), trained.logits(ids)));
  // bf16 weights save as bf16 and reload as such.
  const kiln::Model half = kiln::Model::create("tiny", {.dtype = at::kBFloat16});
  half.save_pretrained((dir / "bf16").string());
  CHECK(at::equal(kiln::Model::from_pretrained((dir / "bf16").string()).logits(ids), half.logits(ids)));
}

TEST_CASE("set_log_level filters kiln's records by level, kOff all of them", "[api]") {
  // A model YAML whose context is shorter than cutoff_len: the trainer warns (once, at
  // construction); training logs an info line per step.
  const fs::path yaml = kiln::test::scratch_dir("api_log_level_model") / "short.yaml";
  std::ofstream(yaml) << "vocab_size: 320\nhidden_size: 64\nintermediate_size: 128\nnum_hidden_layers: 1\n"
                         "num_attention_heads: 2\nnum_key_value_heads: 1\nmax_position_embeddings: 16\n";
  const at::Tensor ids = at::arange(32, at::kLong).remainder(50).reshape({2, 16});
  std::vector<std::pair<kiln::LogLevel, std::string>> records;
  kiln::set_log_handler([&](kiln::LogLevel level, std::string_view m) { records.emplace_back(level, m); });
  struct Restore {  // the default logger again, whatever happens
    ~Restore() {
      kiln::set_log_handler(nullptr);
      kiln::set_log_level(kiln::LogLevel::kInfo);
    }
  } restore;
  auto run = [&](kiln::LogLevel level) {
    records.clear();
    kiln::set_log_level(level);
    kiln::Trainer t(
        small_run("log_level", "max_steps: 2\nlogging_steps: 1\noverwrite_output_dir: true\n", yaml.string()), [&] {
          return std::optional(kiln::Batch{ids, ids});
        });
    t.train();
    int warnings = 0, others = 0;
    for (const auto& [l, m] : records) (l == kiln::LogLevel::kWarning ? warnings : others)++;
    return std::pair{warnings, others};
  };
  const auto info = run(kiln::LogLevel::kInfo);
  CHECK(info.first == 1);
  CHECK(info.second >= 2);
  CHECK_THAT(records.front().second, Catch::Matchers::Contains("max_position_embeddings 16"));
  CHECK(run(kiln::LogLevel::kWarning) == std::pair{1, 0});
  CHECK(run(kiln::LogLevel::kError) == std::pair{0, 0});
  CHECK(run(kiln::LogLevel::kOff) == std::pair{0, 0});
  CHECK(run(kiln::LogLevel::kDebug).second >= info.second);
  // Level and destination are independent: a new handler keeps the level set before it.
  kiln::set_log_level(kiln::LogLevel::kWarning);
  std::vector<std::pair<kiln::LogLevel, std::string>> later;
  kiln::set_log_handler([&](kiln::LogLevel level, std::string_view m) { later.emplace_back(level, m); });
  kiln::Trainer t(small_run("log_level", "max_steps: 2\nlogging_steps: 1\noverwrite_output_dir: true\n", yaml.string()),
                  [&] {
                    return std::optional(kiln::Batch{ids, ids});
                  });
  t.train();
  REQUIRE(later.size() == 1);
  CHECK(later.front().first == kiln::LogLevel::kWarning);
}

TEST_CASE("Model::create names a preset it does not know, and a model YAML's unknown key", "[api]") {
  const std::string message = kiln::test::error_of([] { kiln::Model::create("tinyy"); });
  CHECK_THAT(message, Catch::Matchers::Contains("'tinyy'") && Catch::Matchers::Contains("tiny") &&
                          Catch::Matchers::Contains("llama-100m"));
  const fs::path yaml = kiln::test::scratch_dir("api_bad_yaml") / "bad.yaml";
  std::ofstream(yaml) << "vocab_size: 320\nhidden_size: 64\nintermediate_size: 128\nnum_hidden_layers: 1\n"
                         "num_attention_heads: 2\nnum_key_value_head: 1\n";  // a misspelt key
  CHECK_THAT(kiln::test::error_of([&] { kiln::Model::create(yaml.string()); }),
             Catch::Matchers::Contains("bad.yaml") && Catch::Matchers::Contains("num_key_value_head"));
}
