// The entry points of kiln/kiln.h that service.cpp does not use, through the installed package:
// Model::create from a preset and from a model YAML file, the save_pretrained round trip,
// kiln::evaluate against ATen's cross-entropy, and set_log_level(kOff) silencing both a handler
// and the default stderr sink. (The trainer's callbacks in detail: tests/api/test_api.cpp.)
// Prints one line; exits 1 after naming every failed check on stderr.
#include <ATen/ATen.h>
#include <fcntl.h>
#include <kiln/kiln.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

int failures = 0;

void check(bool ok, const char* what, int line) {
  if (ok) return;
  std::fprintf(stderr, "api_check:%d: failed: %s\n", line, what);
  ++failures;
}
#define CHECK(...) check((__VA_ARGS__), #__VA_ARGS__, __LINE__)

// Trains the tiny preset two steps on host batches (a log line per step), in `dir`.
void train_two_steps(const fs::path& dir) {
  const at::Tensor ids = at::arange(66, at::kLong).remainder(50).reshape({2, 33});
  kiln::Trainer trainer(kiln::train_config_from_yaml("model: tiny\nmax_steps: 2\nlogging_steps: 1\ndevice: cpu\n"
                                                     "overwrite_output_dir: true\noutput_dir: " +
                                                     dir.string() + "\n"),
                        [&] {
                          return std::optional(kiln::Batch{ids, ids});
                        });
  trainer.train();
}

// What `fn` writes to file descriptor 2.
template <typename Fn>
std::string stderr_of(const fs::path& file, Fn&& fn) {
  std::fflush(stderr);
  const int saved = ::dup(2), fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: api_check WORK_DIR\n"), 2;
  const fs::path work = argv[1];
  fs::create_directories(work);
  const at::Tensor ids = at::arange(2 * 40, at::kLong).mul(37).remainder(320).reshape({2, 40});

  // A preset: the tiny model, 475,776 parameters, initialised from the seed.
  const kiln::Model tiny = kiln::Model::create("tiny");
  CHECK(tiny.num_parameters() == 475776 && tiny.vocab_size() == 320 && tiny.max_position_embeddings() == 1024);
  CHECK(tiny.device() == c10::Device(c10::kCPU));
  CHECK(tiny.logits(ids).sizes() == at::IntArrayRef({2, 40, 320}));
  CHECK(at::equal(kiln::Model::create("tiny").logits(ids), tiny.logits(ids)));
  CHECK(!at::equal(kiln::Model::create("tiny", {.seed = 7}).logits(ids), tiny.logits(ids)));
  CHECK(kiln::Model::create("tiny", {.dtype = at::kBFloat16}).logits(ids).scalar_type() == at::kBFloat16);

  // A model YAML file: tiny with one decoder layer (196,864 parameters fewer) and a smaller context.
  const fs::path yaml = work / "one-layer.yaml";
  std::ofstream(yaml) << "name: one-layer\nvocab_size: 320\nhidden_size: 128\nintermediate_size: 384\n"
                         "num_hidden_layers: 1\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                         "max_position_embeddings: 256\nrms_norm_eps: 1.0e-5\nrope_theta: 10000.0\n"
                         "tie_word_embeddings: false\ninitializer_range: 0.02\n";
  const kiln::Model one = kiln::Model::create(yaml.string());
  CHECK(one.num_parameters() == 475776 - 196864 && one.max_position_embeddings() == 256);

  // save_pretrained -> from_pretrained: the same model (the logits bit for bit), for both.
  for (const kiln::Model* m : {&tiny, &one}) {
    const fs::path dir = work / (m == &tiny ? "tiny" : "one-layer");
    m->save_pretrained(dir.string());
    CHECK(fs::exists(dir / "config.json") && fs::exists(dir / "model.safetensors"));
    const kiln::Model back = kiln::Model::from_pretrained(dir.string());
    CHECK(back.num_parameters() == m->num_parameters());
    CHECK(back.max_position_embeddings() == m->max_position_embeddings());
    CHECK(at::equal(back.logits(ids), m->logits(ids)));
  }

  // evaluate: the mean next-token cross-entropy over every target (labels -100 score nothing),
  // the same as ATen's on the logits; perplexity = exp(loss).
  at::Tensor labels = ids.clone();
  labels.index_put_({0, at::indexing::Slice(0, 10)}, -100);
  int served = 0;
  const kiln::EvalResult r = kiln::evaluate(tiny, [&]() -> std::optional<kiln::Batch> {
    if (served++ == 2) return std::nullopt;
    return kiln::Batch{ids, labels};
  });
  const at::Tensor logits = tiny.logits(ids).slice(1, 0, -1).reshape({-1, 320});
  const double expected = at::cross_entropy_loss(logits, labels.slice(1, 1).reshape({-1})).item<double>();
  CHECK(served == 3 && r.tokens == 2 * (2 * 39 - 9) && !r.interrupted);
  CHECK(std::abs(r.loss - expected) <= 1e-5 * expected);
  CHECK(r.perplexity == std::exp(r.loss));

  // set_log_level(kOff) silences kiln: a handler receives nothing, and the default sink writes
  // nothing to stderr. (Each time, the same run with kInfo does log: the checks are not vacuous.)
  int records = 0;
  kiln::set_log_handler([&](kiln::LogLevel, std::string_view) { ++records; });
  train_two_steps(work / "loud");
  const int loud = records;
  kiln::set_log_level(kiln::LogLevel::kOff);
  train_two_steps(work / "quiet");
  CHECK(loud >= 2 && records == loud);
  kiln::set_log_handler(nullptr);  // back to the default sink (the bare message on stderr); still off
  const std::string still_off = stderr_of(work / "stderr-still-off", [&] { train_two_steps(work / "quiet"); });
  CHECK(still_off.empty());
  kiln::set_log_level(kiln::LogLevel::kInfo);
  const std::string on = stderr_of(work / "stderr-on", [&] { train_two_steps(work / "loud"); });
  kiln::set_log_level(kiln::LogLevel::kOff);
  const std::string off = stderr_of(work / "stderr-off", [&] { train_two_steps(work / "quiet"); });
  CHECK(on.find("'loss'") != std::string::npos);
  CHECK(off.empty());
  kiln::set_log_level(kiln::LogLevel::kInfo);

  std::printf("api_check: %s (tiny %lld parameters, one-layer YAML %lld, eval loss %.4f over %lld tokens)\n",
              failures == 0 ? "ok" : "FAILED", static_cast<long long>(tiny.num_parameters()),
              static_cast<long long>(one.num_parameters()), r.loss, static_cast<long long>(r.tokens));
  return failures == 0 ? 0 : 1;
}
