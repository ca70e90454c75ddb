#include "kiln/train/stop_request.h"

#include <csignal>

namespace kiln::train {

namespace {

std::atomic<int> g_pending_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch a lock-free atomic");

void on_signal(int sig) {
  g_pending_signal.store(sig);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

std::atomic<int>& pending_stop_signal() {
  return g_pending_signal;
}

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a stop request";
}

}  // namespace kiln::train
