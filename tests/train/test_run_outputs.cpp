// The output files LLaMA-Factory's and HF's tools read (kiln/train/hf/tensorboard.h, loss_plot.h,
// run_outputs.h). References: the CRC-32C check values of RFC 3720 (B.4) and of the CRC
// catalogue ("123456789" -> 0xE3069283); an Event serialized by tensorboard's own protobuf
// classes (tensorboard 2.21, event_pb2); LLaMA-Factory's smooth() formula; matplotlib's ticks
// for round ranges. tests/python/test_run_outputs.py reads whole runs with the real readers.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "kiln/train/hf/loss_plot.h"
#include "kiln/train/hf/run_outputs.h"
#include "kiln/train/hf/tensorboard.h"
#include "support.h"

namespace fs = std::filesystem;
using namespace kiln::train;

namespace {

std::string hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

uint32_t crc_of(const std::string& s) {
  return crc32c(s.data(), s.size());
}

}  // namespace

TEST_CASE("CRC-32C matches the published check values", "[tensorboard]") {
  CHECK(crc_of("123456789") == 0xE3069283u);
  CHECK(crc_of(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc_of(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending(32, 0);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  CHECK(crc_of(ascending) == 0x46DD794Eu);
  // Continuing a CRC over a second piece equals one pass over both.
  CHECK(crc32c("56789", 5, crc32c("1234", 4)) == 0xE3069283u);
  CHECK(crc_of("") == 0u);
}

TEST_CASE("Event records are byte for byte what tensorboard's protobuf writes", "[tensorboard]") {
  // event_pb2.Event(wall_time=1.5, step=3) with summary.value {tag: "train/loss", simple_value: 2.5}
  CHECK(hex(encode_event(1.5, 3, {{"train/loss", 2.5f}})) ==
        "09000000000000f83f10032a130a110a0a747261696e2f6c6f73731500002040");
  // event_pb2.Event(wall_time=1.5, file_version="brain.Event:2")
  CHECK(hex(encode_event(1.5, 0, {}, "brain.Event:2")) == "09000000000000f83f1a0d627261696e2e4576656e743a32");
  // A record: length, masked CRC of the length, the data, masked CRC of the data.
  const std::string data = "abc";
  const std::string record = tfrecord(data);
  REQUIRE(record.size() == 8 + 4 + 3 + 4);
  uint64_t length = 0;
  std::memcpy(&length, record.data(), 8);
  CHECK(length == 3);
  const uint32_t crc = crc32c(data.data(), 3);
  uint32_t stored = 0;
  std::memcpy(&stored, record.data() + 15, 4);
  CHECK(stored == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  CHECK(record.substr(12, 3) == data);
}

TEST_CASE("log entries become HF TensorBoardCallback's tags", "[tensorboard]") {
  const nlohmann::json entry = {
      {"loss", 2.0}, {"eval_loss", 3.0}, {"step", 7}, {"learning_rate", 1e-3}, {"note", "text"}};
  const auto scalars = tensorboard_scalars(entry);
  std::map<std::string, float> got(scalars.begin(), scalars.end());
  CHECK(got == std::map<std::string, float>{{"eval/loss", 3.0f}, {"train/learning_rate", 1e-3f}, {"train/loss", 2.0f}});
}

TEST_CASE("plot_loss: LLaMA-Factory's smoothing, matplotlib's ticks, a 640x480 PNG", "[plot]") {
  const std::vector<double> v = {4.0, 3.0, 2.5, 2.0};
  const double w = 1.8 * (1 / (1 + std::exp(-0.05 * 4)) - 0.5);
  std::vector<double> expected;
  double last = v[0];
  for (double x : v) expected.push_back(last = last * w + (1 - w) * x);
  const auto s = smooth_losses(v);
  REQUIRE(s.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(s[i] == Approx(expected[i]).epsilon(1e-15));
  CHECK(smooth_losses({}).empty());

  CHECK(nice_ticks(0, 10, 9) == std::vector<double>{0, 2, 4, 6, 8, 10});
  CHECK(nice_ticks(-0.5, 10.5, 9) == std::vector<double>{0, 2, 4, 6, 8, 10});
  const auto t = nice_ticks(2.35, 5.65, 9);
  REQUIRE(t.size() == 7);  // 2.5, 3.0, ..., 5.5
  CHECK(t.front() == Approx(2.5));
  CHECK(t.back() == Approx(5.5));

  const fs::path dir = kiln::test::scratch_dir("loss_plot");
  const std::string png = (dir / "training_loss.png").string();
  if (!loss_plots_available()) {
    CHECK_THROWS_WITH(draw_loss_figure(png, "t", "loss", {1, 2}, {1, 2}), Catch::Contains("without Cairo"));
    return;
  }
  draw_loss_figure(png, "training loss of out", "loss", {1, 2, 3, 4}, v);
  std::ifstream in(png, std::ios::binary);
  std::string head(24, '\0');
  in.read(head.data(), 24);
  CHECK(head.substr(0, 8) == "\x89PNG\r\n\x1a\n");
  const auto be32 = [&](int at) {
    return (uint32_t(uint8_t(head[at])) << 24) | (uint32_t(uint8_t(head[at + 1])) << 16) |
           (uint32_t(uint8_t(head[at + 2])) << 8) | uint32_t(uint8_t(head[at + 3]));
  };
  CHECK(be32(16) == 640);
  CHECK(be32(20) == 480);
  // plot_loss: one figure per key present; a missing key only warns.
  const nlohmann::json history = {{{"loss", 3.0}, {"step", 1}}, {{"loss", 2.0}, {"step", 2}}};
  const auto written = plot_loss(dir.string(), history, {"loss", "eval_loss"});
  CHECK(written == std::vector<std::string>{(dir / "training_loss.png").string()});
  CHECK_FALSE(fs::exists(dir / "training_eval_loss.png"));
}

TEST_CASE("trainer_state.json has TrainerState's fields; save_metrics merges all_results.json", "[train]") {
  HfTrainerState s;
  s.global_step = 4;
  s.log_history = nlohmann::json::array({{{"loss", 1.5}, {"step", 4}}});
  const auto j = nlohmann::json::parse(trainer_state_text(s));
  for (const char* key : {"best_global_step",
                          "best_metric",
                          "best_model_checkpoint",
                          "epoch",
                          "eval_steps",
                          "global_step",
                          "is_hyper_param_search",
                          "is_local_process_zero",
                          "is_world_process_zero",
                          "log_history",
                          "logging_steps",
                          "max_steps",
                          "num_input_tokens_seen",
                          "num_train_epochs",
                          "save_steps",
                          "stateful_callbacks",
                          "total_flos",
                          "train_batch_size",
                          "trial_name",
                          "trial_params"}) {
    CAPTURE(key);
    CHECK(j.contains(key));
  }
  CHECK(j.size() == 20);
  CHECK(j["global_step"] == 4);

  const fs::path dir = kiln::test::scratch_dir("save_metrics");
  save_metrics(dir.string(), "train", {{"train_loss", 2.0}, {"epoch", 1.0}});
  save_metrics(dir.string(), "eval", {{"eval_loss", 3.0}, {"epoch", 1.0}});
  std::ifstream all(dir / "all_results.json");
  CHECK(nlohmann::json::parse(all) == nlohmann::json({{"train_loss", 2.0}, {"eval_loss", 3.0}, {"epoch", 1.0}}));
  std::ifstream train(dir / "train_results.json");
  CHECK(nlohmann::json::parse(train) == nlohmann::json({{"train_loss", 2.0}, {"epoch", 1.0}}));
}

TEST_CASE("trainer_log.jsonl lines are LLaMA-Factory's, as Python's json.dumps writes them", "[train]") {
  using kiln::train::trainer_log_line;
  // The first line of a real LLaMA-Factory 0.9.5 run (docs/llamafactory.md, section 7).
  const nlohmann::json window = {{"loss", 5.765571117401123},    {"grad_norm", 0.41}, {"learning_rate", 0.0},
                                 {"epoch", 0.15789473684210525}, {"step", 1},         {"tokens_per_second", 10.0}};
  CHECK(
      trainer_log_line(window, 1, 14, 0.4) ==
      R"({"current_steps": 1, "total_steps": 14, "loss": 5.765571117401123, "lr": 0.0, "epoch": 0.15789473684210525, )"
      R"("percentage": 7.14, "elapsed_time": "0:00:00", "remaining_time": "0:00:05"})");
  const nlohmann::json eval = {{"eval_loss", 5.7}, {"eval_perplexity", 300.0}, {"epoch", 1.0}, {"step", 2}};
  CHECK(trainer_log_line(eval, 2, 3, 90000.5) ==
        R"({"current_steps": 2, "total_steps": 3, "eval_loss": 5.7, "epoch": 1.0, "percentage": 66.67, )"
        R"("elapsed_time": "1 day, 1:00:00", "remaining_time": "12:30:00"})");
  // The closing summary: none of the logged keys but the epoch; a NaN loss as Python writes it.
  CHECK(trainer_log_line({{"train_loss", 1.0}, {"epoch", 2.0}, {"step", 14}}, 14, 14, 0) ==
        R"({"current_steps": 14, "total_steps": 14, "epoch": 2.0, "percentage": 100.0, "elapsed_time": "0:00:00", )"
        R"("remaining_time": "0:00:00"})");
  CHECK_THAT(trainer_log_line({{"loss", NAN}, {"step", 1}}, 1, 0, 0),
             Catch::Matchers::Contains(R"("loss": NaN, "percentage": 100,)"));
  CHECK(kiln::train::python_float(1.70370868554659e-05) == "1.70370868554659e-05");
  CHECK(kiln::train::python_float(1e16) == "1e+16");
  CHECK(kiln::train::python_timedelta(2 * 86400 + 59) == "2 days, 0:00:59");
}

TEST_CASE("the model card is transformers' for LLaMA-Factory's arguments", "[train]") {
  kiln::train::ModelCard card;
  card.model_name = "pretrain";
  card.finetuned_from = "models/base: v2";  // quoted in the front matter, as PyYAML would
  card.datasets = {"a"};
  card.log_history = nlohmann::json::array(
      {{{"loss", 2.5}, {"epoch", 0.5}, {"step", 1}},
       {{"eval_loss", 2.123456}, {"eval_perplexity", 8.4}, {"eval_runtime", 0.1}, {"epoch", 0.5}, {"step", 1}},
       {{"train_runtime", 1.0}, {"epoch", 1.0}, {"step", 2}},
       {{"eval_loss", 2.0}, {"epoch", 1.0}, {"step", 2}}});
  card.hyperparameters = {{"learning_rate", "0.001"}};
  card.framework_versions = {"kiln 0.2.0"};
  const std::string text = kiln::train::model_card_text(card);
  CHECK_THAT(text, Catch::Matchers::StartsWith("---\nlibrary_name: transformers\nlicense: other\n"
                                               "base_model: 'models/base: v2'\ntags:\n- llama-factory\n- full\n"
                                               "- generated_from_trainer\nmodel-index:\n- name: pretrain\n"
                                               "  results: []\n---\n"));
  CHECK_THAT(text, Catch::Matchers::Contains("on the a dataset.\nIt achieves the following results on the evaluation "
                                             "set:\n- Loss: 2.0\n\n## Model description"));
  // kiln's eval_perplexity is not a column; values with more than 4 decimals are rounded.
  CHECK_THAT(text, Catch::Matchers::Contains("| Training Loss | Epoch | Step | Validation Loss |\n"
                                             "|:-------------:|:-----:|:----:|:---------------:|\n"
                                             "| 2.5           | 0.5   | 1    | 2.1235          |\n\n"));
  CHECK_THAT(text, Catch::Matchers::EndsWith("### Framework versions\n\n- kiln 0.2.0\n"));
}
