// The output files LLaMA-Factory's and HF's tools read (kiln/train/tensorboard.h, loss_plot.h,
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

#include "kiln/train/loss_plot.h"
#include "kiln/train/run_outputs.h"
#include "kiln/train/tensorboard.h"
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
