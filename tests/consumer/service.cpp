// A LibTorch service: continues pretraining a checkpoint on its own batches, stops on request, evaluates, generates.
#include <ATen/ATen.h>
#include <kiln/kiln.h>
#include <atomic>
#include <cstdio>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 3) return std::fprintf(stderr, "usage: service CHECKPOINT OUTPUT_DIR\n"), 2;
  std::atomic<int> log_lines{0};
  kiln::set_log_handler([&](kiln::LogLevel, std::string_view) { ++log_lines; });        // the host's log
  const at::Tensor ids = (at::arange(33, at::kLong).remainder(7) + 10).repeat({4, 1});  // 4 rows of a pattern
  const kiln::BatchSource data = [&] { return std::optional(kiln::Batch{ids, ids}); };
  const auto held_out = [&, n = 0]() mutable { return n++ < 2 ? data() : std::nullopt; };  // 2 batches a use
  const std::string yaml = std::string("model_name_or_path: ") + argv[1] + "\noutput_dir: " + argv[2] +
                           "\nmax_steps: 1000\nlearning_rate: 3.0e-3\ndevice: cpu\n";  // LLaMA-Factory's keys
  kiln::Trainer trainer(kiln::train_config_from_yaml(yaml), data);
  const double before = kiln::evaluate(trainer.model(), held_out).loss;
  std::atomic<int64_t> step{0};
  std::string saved;
  trainer.set_callbacks(
      {.on_step = [&](int64_t s) { step = s; }, .on_save = [&](int64_t, const std::string& dir) { saved = dir; }});
  kiln::StopToken stop;
  trainer.set_stop_token(stop);
  std::thread shutdown([&] {  // e.g. the service's shutdown path
    while (step < 20) std::this_thread::yield();
    stop.request_stop();
  });
  const kiln::TrainResult result = trainer.train();  // stops within a step, saves a checkpoint
  shutdown.join();
  const double after = kiln::evaluate(trainer.model(), held_out).loss;
  const auto reloaded = kiln::Model::from_pretrained(saved);
  const bool same = at::equal(reloaded.logits(ids), trainer.model().logits(ids));
  std::printf("stopped=%d at step %lld, loss %.4f -> %.4f, saved %s (reloads %s), %d log lines\n", result.interrupted,
              static_cast<long long>(result.global_step), before, after, saved.c_str(),
              same ? "identically" : "DIFFERENTLY", log_lines.load());
  const auto out = kiln::generate(reloaded, {10, 11, 12, 13}, {.max_new_tokens = 8, .greedy = true});
  const bool ok = result.interrupted && result.global_step >= 20 && saved == result.last_checkpoint && after < before &&
                  same && out == std::vector<int64_t>{14, 15, 16, 10, 11, 12, 13, 14} && log_lines > 0;
  return ok ? 0 : 1;  // the model learned the data's pattern, and greedy generation continues it
}
