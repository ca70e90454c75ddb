// Stop requests: SIGINT/SIGTERM and a host's own stop condition, as the trainer sees them.
//
// A cluster stops a job with SIGTERM (Slurm preemption and time limits, Kubernetes evictions),
// a person with SIGINT. The handler only stores the signal's number in an atomic (all a handler
// may safely do); the trainer asks at points where stopping is clean: before every micro-batch,
// every evaluation batch and every optimizer step, and between chunks of a tokenization. What it
// does then is in trainer.cpp (drop the partial step or evaluation, save the last completed step,
// return) and docs/training.md ("Stopping").
#pragma once

#include <atomic>
#include <exception>
#include <string>

namespace kiln::train {

// Installs the SIGINT and SIGTERM handlers (without SA_RESTART: a blocking call returns EINTR and
// the code around it checks for a stop). kiln-pretrain calls it first thing; a library host that
// wants the same behaviour calls it, or uses Trainer::set_stop_check with its own condition.
void install_stop_signal_handlers();

// The pending signal's number, 0 when none. The tests set it to simulate a signal.
std::atomic<int>& pending_stop_signal();

// "SIGTERM", "SIGINT", or "a stop request" for 0/other.
const char* stop_signal_name(int sig);

// Thrown where a stop request ends work before there is anything to save (while the training data
// is being tokenized, say). Not a std::runtime_error, so that the handlers that turn data errors
// into config errors let it through; kiln-pretrain reports it in one line and exits 0.
class StopRequested : public std::exception {
 public:
  explicit StopRequested(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

}  // namespace kiln::train
