// kiln-signal-storm: runs a workload while the process receives thousands of signals a second,
// each caught by a handler that does nothing (installed without SA_RESTART, as kiln-pretrain's).
//
// A signal is delivered on the stack of whatever the interrupted thread is running: code that
// moves its stack pointer into the heap (oneDNN's JIT fp32 GEMM kernels do, oneDNN issue 4845:
// the defect behind kiln's heap corruption after SIGTERM) gets its heap overwritten by the signal
// frame, and a blocking call that does not retry on EINTR fails. Workloads:
//   train        kiln's trainer as kiln-pretrain runs it (steps, evaluations, checkpoint saves and
//                rotation, the loader's prefetch thread), configured by --KEY VALUE pairs; prints
//                its losses as JSON so a caller can compare them with a run without the storm
//   onednn-gemm  ATen's at::mkldnn_linear over oneDNN tensors, which runs oneDNN's JIT fp32 GEMM
//                (the positive control: on a LibTorch whose oneDNN has the defect it corrupts the
//                heap, so the storm is seen to catch it)
//   mm           ATen's at::mm in fp32 (LibTorch's BLAS), the route every kiln fp32 GEMM takes
// Exit 0 when the workload ran to its end; a corrupted heap ends the process in glibc's abort.
// tests/python/test_signal_storm.py runs it with glibc's malloc checking (docs/training.md).
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "kiln/common/process_settings.h"
#include "kiln/train/trainer.h"

namespace {

std::atomic<int64_t> g_caught{0};

void on_signal(int) {
  g_caught.fetch_add(1, std::memory_order_relaxed);
}

// Sends SIGUSR1 every `period` to the process (the kernel picks a thread, as for a real SIGTERM)
// or, with `main_only`, to the main thread.
class Storm {
 public:
  Storm(std::chrono::microseconds period, bool main_only) : main_(pthread_self()) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, nullptr);
    // The sender itself must not take the signals.
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    thread_ = std::thread([this, period, main_only] {
      while (!stop_.load()) {
        if (main_only) {
          pthread_kill(main_, SIGUSR1);
        } else {
          kill(getpid(), SIGUSR1);
        }
        sent_.fetch_add(1);
        std::this_thread::sleep_for(period);
      }
    });
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  ~Storm() { end(); }
  void end() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
  }
  int64_t sent() const { return sent_.load(); }

 private:
  pthread_t main_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> sent_{0};
  std::thread thread_;
};

void report(const std::string& workload, int64_t iterations, const Storm& storm,
            nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json j = {{"workload", workload},
                      {"iterations", iterations},
                      {"signals_sent", storm.sent()},
                      {"signals_caught", g_caught.load()}};
  if (extra.is_object()) j.update(extra);
  fmt::print("{}\n", j.dump());
}

}  // namespace

int main(int argc, char** argv) {
  kiln::pin_cpu_math_threads();
  std::string workload = "train";
  double seconds = 5;
  int64_t period_us = 100;
  bool storm_on = true, main_only = false;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workload" && i + 1 < argc) {
      workload = argv[++i];
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (a == "--period-us" && i + 1 < argc) {
      period_us = std::stoll(argv[++i]);
    } else if (a == "--no-storm") {
      storm_on = false;
    } else if (a == "--main-thread") {
      main_only = true;
    } else {
      rest.push_back(a);
    }
  }
  try {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    if (workload == "train") {
      const auto config = kiln::train::load_pretrain_config("quickstart", kiln::train::parse_overrides(rest));
      kiln::train::Trainer trainer(config);
      Storm storm(std::chrono::microseconds(period_us), main_only);
      if (!storm_on) storm.end();
      const auto r = trainer.train();
      storm.end();
      // The losses of the run, for the caller's bitwise comparison.
      std::ifstream in(std::string(r.last_checkpoint) + "/trainer_state.json");
      const auto state = nlohmann::json::parse(in);
      nlohmann::json losses = nlohmann::json::array();
      for (const auto& e : state.at("log_history")) {
        if (e.contains("loss"))
          losses.push_back(nlohmann::json::array({e.at("step"), e.at("loss"), e.at("grad_norm")}));
        if (e.contains("eval_loss")) losses.push_back(nlohmann::json::array({e.at("step"), e.at("eval_loss")}));
      }
      report(workload, r.global_step, storm, {{"losses", losses}, {"checkpoint", r.last_checkpoint}});
    } else if (workload == "onednn-gemm" || workload == "mm") {
      at::manual_seed(0);
      // K 2048 > the kernels' on-stack workspace, so oneDNN's GEMM takes its heap workspace.
      const at::Tensor x = at::randn({256, 2048}), w = at::randn({512, 2048});
      const at::Tensor xm = workload == "onednn-gemm" ? x.to_mkldnn() : x;
      const at::Tensor wm = workload == "onednn-gemm" ? w.to_mkldnn() : w;
      Storm storm(std::chrono::microseconds(period_us), main_only);
      if (!storm_on) storm.end();
      int64_t n = 0;
      do {
        const at::Tensor y = workload == "mm" ? at::mm(x, w.t()) : at::mkldnn_linear(xm, wm, std::nullopt);
        // Heap traffic between the products, so that a corrupted chunk is met soon.
        std::vector<at::Tensor> churn;
        for (int k = 0; k < 20; ++k) churn.push_back(at::empty({1000 + 37 * ((n + k) % 50)}));
        ++n;
      } while (std::chrono::steady_clock::now() < deadline);
      storm.end();
      report(workload, n, storm);
    } else {
      fmt::print(stderr, "kiln-signal-storm: --workload must be train, onednn-gemm or mm, got '{}'\n", workload);
      return 2;
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln-signal-storm: error: {}\n", e.what());
    return 2;
  }
}
