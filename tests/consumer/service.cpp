// A LibTorch service that continues pretraining a checkpoint on its own in-memory batches,
// stops on a request from another thread, then evaluates and generates: kiln as a library.
#include <kiln/kiln.h>

#include <ATen/ATen.h>
#include <atomic>
#include <cstdio>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 3) return std::fprintf(stderr, "usage: service CHECKPOINT OUTPUT_DIR\n"), 2;
  std::atomic<int> log_lines{0};
  kiln::set_log_handler([&](kiln::LogLevel, std::string_view) { ++log_lines; });  // the host's log
  // The host's data: token ids of a repeating pattern, 4 sequences of 33 per batch.
  const at::Tensor row = at::arange(33, at::kLong).remainder(7) + 10;
  const kiln::BatchSource data = [&]() -> std::optional<kiln::Batch> {
    const at::Tensor ids = row.repeat({4, 1});
    return kiln::Batch{ids, ids};
  };
  int served = 0;  // a held-out set of 2 batches
  const kiln::BatchSource held_out = [&]() -> std::optional<kiln::Batch> {
    return served++ < 2 ? data() : std::nullopt;
  };
  auto config = kiln::train_config_from_yaml(std::string("model_name_or_path: ") + argv[1] +
                                             "\nmax_steps: 1000\nlearning_rate: 3.0e-3\nlogging_steps: 1\n"
                                             "save_steps: 0\ndevice: cpu\noutput_dir: " +
                                             argv[2] + "\n");
  kiln::Trainer trainer(config, data);
  const double before = kiln::evaluate(trainer.model(), held_out).loss;
  std::atomic<int64_t> step{0};
  trainer.set_callbacks({.on_step = [&](int64_t s) { step = s; }});
  kiln::StopToken stop;
  trainer.set_stop_token(stop);
  std::thread watcher([&] {  // e.g. the service's shutdown path
    while (step < 20) std::this_thread::yield();
    stop.request_stop();
  });
  const kiln::TrainResult result = trainer.train();
  watcher.join();
  served = 0;
  const double after = kiln::evaluate(trainer.model(), held_out).loss;
  const auto saved = kiln::Model::from_pretrained(result.last_checkpoint);
  const bool same = at::equal(saved.logits(row.unsqueeze(0)), trainer.model().logits(row.unsqueeze(0)));
  const auto ids = kiln::generate(saved, {10, 11, 12, 13}, {.max_new_tokens = 8, .greedy = true});
  std::printf(
      "kiln %s: stopped=%d at step %lld of %lld, loss %.4f -> %.4f, saved %s (reloads %s), %d log lines,"
      " generated",
      kiln::version().c_str(), result.interrupted, static_cast<long long>(result.global_step),
      static_cast<long long>(trainer.total_steps()), before, after, result.last_checkpoint.c_str(),
      same ? "identically" : "DIFFERENTLY", log_lines.load());
  for (const int64_t id : ids) std::printf(" %lld", static_cast<long long>(id));
  std::printf("\n");
  const std::vector<int64_t> pattern{14, 15, 16, 10, 11, 12, 13, 14};  // what the host's data repeats
  const bool ok = result.interrupted && result.global_step >= 20 && result.global_step < 1000 && after < before &&
                  same && ids == pattern && log_lines > 0;
  return ok ? 0 : 1;
}
